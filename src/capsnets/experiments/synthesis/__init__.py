"""``synthesis``: CapsPix2pix against pix2pix, label map in, image out (Bass et al. 2019,
"Image synthesis with a convolutional capsule generative adversarial network").

Paper: a conditional GAN whose generator is built from convolutional capsule layers synthesises images
from label maps as well as pix2pix does, and individual capsule dimensions control interpretable
properties of the output (the paper compares them qualitatively; it gives no single number).

Here: both generators (:mod:`capsnets.models.capspix2pix`) learn to paint Fashion-MNIST garments inside
their silhouettes (:func:`.label_maps.silhouette_label_maps`: one channel per class), each
against its own PatchGAN discriminator, with pix2pix's losses (adversarial + ``l1_weight`` x L1) and
optimiser (Adam, lr 2e-4, betas 0.5 / 0.999). Reported: the parameter counts, L1 error and PSNR of
the generated test images, examples side by side, and what each final capsule dimension of CapsPix2pix
does to its output when shifted by -0.25 ... +0.25 at every pixel (the analogue of Sabour et al.'s
dimension perturbations). Deviations: the data (above); see the model module for the architectures. The training
is :mod:`.pix2pix`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from torch import Tensor

from capsnets.data import load_dataset
from capsnets.engine.callbacks import checkpoint_name
from capsnets.experiments.common import ExperimentSettings, register_experiment
from capsnets.experiments.report import write_report
from capsnets.experiments.report.synthesis import plot_dimensions, plot_examples, synthesis_sections
from capsnets.experiments.runs import check_minutes
from capsnets.experiments.synthesis.label_maps import silhouette_label_maps
from capsnets.experiments.synthesis.pix2pix import fit_in_run, pix2pix_step, synthesis_errors, train_pix2pix
from capsnets.models import PatchDiscriminator, count_parameters, create_model

__all__ = ["Settings", "pix2pix_step", "run", "silhouette_label_maps", "synthesis_errors", "train_pix2pix"]


@dataclass(frozen=True)
class Settings(ExperimentSettings):
    """Data sizes, pix2pix's training (Adam at ``lr``, ``l1_weight`` x L1), the two generators and the width of
    their discriminators."""

    train_images: int = 60000
    test_images: int = 10000
    epochs: int = 20
    batch_size: int = 32
    lr: float = 2e-4
    l1_weight: float = 100.0
    capsule_model: str = "capspix2pix"
    cnn_model: str = "pix2pix"
    discriminator_width: int = 64
    train_minutes: float | None = None
    SMOKE: ClassVar[dict] = {
        "train_images": 256,
        "test_images": 64,
        "epochs": 1,
        "capsule_model": "capspix2pix_small",
        "cnn_model": "pix2pix_small",
        "discriminator_width": 16,
    }


SIZE = 32


def _data(data_dir, train: bool, count: int, device: str) -> tuple[Tensor, Tensor]:
    data = load_dataset("fashion_mnist", root=data_dir, train=train).subset(count)
    maps, images = silhouette_label_maps(data.images, data.labels, data.num_classes, size=SIZE)
    return maps.to(device), images.to(device)


def _contrasts(metrics: dict) -> list[tuple[str, str, str]]:
    return [
        ("CapsPix2pix - pix2pix, test L1 error", "CapsPix2pix_l1", "pix2pix_l1"),
        ("CapsPix2pix - pix2pix, test PSNR (dB)", "CapsPix2pix_psnr", "pix2pix_psnr"),
    ]


@register_experiment(
    "synthesis", Settings, "label maps to images: CapsPix2pix against pix2pix (Bass et al. 2019)", contrasts=_contrasts
)
def run(out: Path, s: Settings, *, smoke: bool, device: str, seed: int, data_dir, runs):
    """Train (or load) both generators; write ``report.md`` and two PNGs into ``out``."""
    train_maps, train_images = _data(data_dir, True, s.train_images, device)
    test_maps, test_images = _data(data_dir, False, s.test_images, device)
    size = (train_maps.shape[1], SIZE, SIZE)
    models = {
        "CapsPix2pix": create_model(s.capsule_model, input_size=size, device=device),
        "pix2pix": create_model(s.cnn_model, input_size=size, device=device),
    }
    metrics, records = {}, {}
    for name, generator in models.items():
        discriminator = PatchDiscriminator(size[0] + 1, width=s.discriminator_width, device=device)
        recipe = {**s.subset("train_images", "epochs", "batch_size", "lr", "l1_weight", "discriminator_width")}
        out_dir = runs.folder() / checkpoint_name(f"synthesis_{generator.model_name}", {**recipe, "seed": seed})
        training = fit_in_run(
            out_dir,
            generator,
            discriminator,
            train_maps,
            train_images,
            epochs=s.epochs,
            batch_size=s.batch_size,
            lr=s.lr,
            l1_weight=s.l1_weight,
            seed=seed,
            desc=name,
            time_limit_s=None if check_minutes(s.train_minutes) is None else 60.0 * s.train_minutes,
        )
        if training.cut_short:
            runs.cut_short.append(out_dir.name)
        errors, params = synthesis_errors(generator, test_maps, test_images), count_parameters(generator)
        metrics.update({f"{name}_l1": errors["l1"], f"{name}_psnr": errors["psnr"], f"{name}_parameters": params})
        records[name] = {
            "model_name": generator.model_name,
            "parameters": params,
            **errors,
            "discriminator_parameters": count_parameters(discriminator),
            "training": training,
        }
    figures = [
        plot_examples(models, test_maps, test_images, out / "examples.png"),
        plot_dimensions(models["CapsPix2pix"], test_maps[0], out / "capsule_dimensions.png"),
    ]
    sections = synthesis_sections(
        records,
        s,
        size=SIZE,
        classes=size[0],
        inside=test_maps.sum(1).mean().item(),
        seed=seed,
        device=device,
        smoke=smoke,
    )
    return write_report(
        out,
        "Image synthesis: CapsPix2pix vs pix2pix (Bass et al. 2019)",
        sections,
        figures=figures,
        metrics=metrics,
        name="synthesis",
    )
