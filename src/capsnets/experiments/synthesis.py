"""``synthesis``: CapsPix2pix against pix2pix, label map in, image out (Bass et al. 2019,
"Image synthesis with a convolutional capsule generative adversarial network").

Paper: a conditional GAN whose generator is built from convolutional capsule layers synthesises images
from label maps as well as pix2pix does, and individual capsule dimensions control interpretable
properties of the output (the paper compares them qualitatively; it gives no single number).

Here: both generators (:mod:`capsnets.models.capspix2pix`) learn to paint Fashion-MNIST garments inside
their silhouettes (:func:`capsnets.data.synthesis.silhouette_label_maps`: one channel per class), each
against its own PatchGAN discriminator, with pix2pix's losses (adversarial + ``l1_weight`` x L1) and
optimiser (Adam, lr 2e-4, betas 0.5 / 0.999). Reported: the parameter counts, L1 error and PSNR of
the generated test images, examples side by side, and what each final capsule dimension of CapsPix2pix
does to its output when shifted by -0.25 ... +0.25 at every pixel (the analogue of Sabour et al.'s
dimension perturbations). Deviations: the data (above); see the model module for the architectures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import Tensor, nn

from capsnets.data import DeviceLoader, load_dataset
from capsnets.data.synthesis import silhouette_label_maps
from capsnets.engine.callbacks import TimeLimit
from capsnets.engine.checkpoint import join_optimizer_state, split_optimizer_state
from capsnets.engine.fit import TrainState, fit
from capsnets.engine.runtime import autocast, resolve_amp
from capsnets.experiments.common import ExperimentSettings, register_experiment
from capsnets.experiments.report import save_figure, write_report
from capsnets.experiments.report.synthesis import synthesis_sections
from capsnets.experiments.training import minutes_to_seconds
from capsnets.models import PatchDiscriminator, count_parameters, create_model

__all__ = ["run", "pix2pix_step", "train_pix2pix", "synthesis_errors"]


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


def train_pix2pix(
    generator: nn.Module,
    discriminator: nn.Module,
    label_maps: Tensor,
    images: Tensor,
    *,
    epochs: int,
    batch_size: int = 32,
    lr: float = 2e-4,
    l1_weight: float = 100.0,
    seed: int = 0,
    desc: str = "pix2pix",
    progress: bool = True,
    amp: str = "auto",
    time_limit_s: float | None = None,
    state: TrainState | None = None,
) -> list[dict[str, Any]]:
    """Train a generator and its discriminator with pix2pix's losses (Isola et al. 2017, Sec. 3), through
    :func:`~capsnets.engine.fit` with a step that holds both optimisers (:func:`pix2pix_step`).

    Batches are shuffled on the device by a CPU generator seeded from ``(seed, epoch)``. Returns the records of
    the epochs trained in this call, with the mean ``generator``, ``discriminator`` and ``l1`` losses.
    ``time_limit_s``, ``state``: as in :func:`~capsnets.experiments.training.train_classifier`, with the generator
    as the model; a training cut short also keeps the discriminator and its optimizer, so a later run
    continues both.
    """
    options = {"lr": lr, "betas": (0.5, 0.999)}
    opt_g, opt_d = (
        torch.optim.Adam(generator.parameters(), **options),
        torch.optim.Adam(discriminator.parameters(), **options),
    )
    state = state if state is not None else TrainState()
    checkpoint = state.attach(opt_g)
    if checkpoint is not None:  # the generator's weights came from load_or_train; the discriminator's side:
        extra = {k[len("extra.") :]: v for k, v in checkpoint.tensors.items() if k.startswith("extra.")}
        discriminator.load_state_dict(
            {k[len("discriminator.") :]: v for k, v in extra.items() if k.startswith("discriminator.")}
        )
        opt_d.load_state_dict(join_optimizer_state(extra, state.extra["optim_d"], opt_d, prefix="optim_d."))
    generator.train()
    discriminator.train()
    first = len(state.history)
    step = pix2pix_step(
        generator,
        discriminator,
        opt_g,
        opt_d,
        l1_weight=l1_weight,
        device=images.device,
        amp_dtype=resolve_amp(amp, images.device),
    )
    fit(
        step,
        DeviceLoader((label_maps, images), batch_size, seed=seed),
        epochs=epochs,
        state=state,
        callbacks=[TimeLimit(time_limit_s)],
        desc=desc,
        progress=progress,
    )
    if not state.finished:  # the discriminator's side, which the generator's checkpoint does not hold
        optim_d, state.extra["optim_d"] = split_optimizer_state(opt_d.state_dict(), prefix="optim_d.")
        weights = {f"discriminator.{k}": v.detach().clone() for k, v in discriminator.state_dict().items()}
        state.tensors = {**weights, **optim_d}
    generator.eval()
    discriminator.eval()
    return state.history[first:]


def pix2pix_step(
    generator: nn.Module,
    discriminator: nn.Module,
    opt_g: torch.optim.Optimizer,
    opt_d: torch.optim.Optimizer,
    *,
    l1_weight: float,
    device: torch.device,
    amp_dtype: torch.dtype | None,
):
    """One pix2pix step on a ``(label maps, images)`` batch: the discriminator's loss is the mean of the binary
    cross-entropies of real pairs (target 1) and generated pairs (target 0); then the generator's, the
    cross-entropy of its pairs against target 1 plus ``l1_weight`` times the mean absolute error to the real
    image. Each takes its own optimiser step."""

    def step(batch) -> dict[str, Tensor]:
        x, y = batch
        with autocast(device, amp_dtype):
            fake = generator(x).images
            real_logits, fake_logits = discriminator(x, y), discriminator(x, fake.detach())
            loss_d = 0.5 * (_bce(real_logits, 1.0) + _bce(fake_logits, 0.0))
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()
        with autocast(device, amp_dtype):
            l1 = (fake.float() - y.float()).abs().mean()
            loss_g = _bce(discriminator(x, fake), 1.0) + l1_weight * l1
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        opt_g.step()
        return {"generator": loss_g, "discriminator": loss_d, "l1": l1}

    return step


def _bce(logits: Tensor, target: float) -> Tensor:
    return F.binary_cross_entropy_with_logits(logits.float(), torch.full_like(logits.float(), target))


@torch.no_grad()
def synthesis_errors(generator: nn.Module, label_maps: Tensor, images: Tensor, batch_size: int = 256) -> dict:
    """Mean absolute error and mean per-image PSNR (peak 1) of the generated images against the real ones."""
    generator.eval()
    l1, psnr = [], []
    for first in range(0, len(images), batch_size):
        fake = generator(label_maps[first : first + batch_size]).images.float()
        real = images[first : first + batch_size].float()
        l1.append((fake - real).abs().flatten(1).mean(1))
        mse = (fake - real).pow(2).flatten(1).mean(1).clamp(min=1e-10)
        psnr.append(-10.0 * torch.log10(mse))
    return {"l1": torch.cat(l1).mean().item(), "psnr": torch.cat(psnr).mean().item()}


@torch.no_grad()
def _plot_examples(models: dict[str, nn.Module], label_maps: Tensor, images: Tensor, out_png: Path, n: int = 8):
    rows = [("label map", label_maps[:n].sum(dim=1, keepdim=True)), ("real", images[:n])]
    rows += [(name, model(label_maps[:n]).images) for name, model in models.items()]
    fig = Figure(figsize=(1.3 * n, 1.4 * len(rows)), layout="constrained")
    axes = np.asarray(fig.subplots(len(rows), n, squeeze=False))
    for r, (label, batch) in enumerate(rows):
        for c in range(n):
            axes[r, c].imshow(batch[c, 0].float().cpu().numpy(), cmap="gray", vmin=0, vmax=1)
            axes[r, c].set_xticks([]), axes[r, c].set_yticks([])
        axes[r, 0].set_ylabel(label, fontsize=8)
    fig.suptitle("Label maps (silhouettes), real garments and generated ones", fontsize=9)
    return save_figure(fig, out_png)


@torch.no_grad()
def _plot_dimensions(generator: nn.Module, label_map: Tensor, out_png: Path) -> Path:
    """Each final capsule dimension shifted by -0.25 ... +0.25 at every pixel (rows: dimensions)."""
    capsules = generator(label_map[None]).capsules  # (1, D, H, W)
    deltas = torch.linspace(-0.25, 0.25, 11)
    dims = capsules.shape[1]
    fig = Figure(figsize=(1.1 * len(deltas), 1.1 * dims), layout="constrained")
    axes = np.asarray(fig.subplots(dims, len(deltas), squeeze=False))
    for k in range(dims):
        shifted = capsules.repeat(len(deltas), 1, 1, 1)
        shifted[:, k] += deltas.to(shifted)[:, None, None]
        outputs = generator.decode(shifted)
        for c in range(len(deltas)):
            axes[k, c].imshow(outputs[c, 0].float().cpu().numpy(), cmap="gray", vmin=0, vmax=1)
            axes[k, c].set_xticks([]), axes[k, c].set_yticks([])
        axes[k, 0].set_ylabel(f"dim {k}", fontsize=7)
    for c, delta in enumerate(deltas.tolist()):
        axes[0, c].set_title(f"{delta:+.2f}", fontsize=7)
    fig.suptitle("CapsPix2pix: one final capsule dimension shifted at every pixel", fontsize=9)
    return save_figure(fig, out_png)


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
def run(out: Path, s: Settings, *, smoke: bool, device: str, seed: int, data_dir, checkpoints):
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

        state = TrainState()  # lets a later run continue a training its time limit cut short

        def train(generator=generator, discriminator=discriminator, name=name, state=state):
            train_pix2pix(
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
                time_limit_s=minutes_to_seconds(s.train_minutes),
                state=state,
            )

        recipe = {
            **s.subset("train_images", "epochs", "batch_size", "lr", "l1_weight", "discriminator_width"),
            "seed": seed,
        }
        loaded = checkpoints.load_or_train(
            generator, f"synthesis_{generator.model_name}", train, state=state, recipe=recipe
        )
        errors, params = synthesis_errors(generator, test_maps, test_images), count_parameters(generator)
        metrics.update({f"{name}_l1": errors["l1"], f"{name}_psnr": errors["psnr"], f"{name}_parameters": params})
        records[name] = {
            "model_name": generator.model_name,
            "parameters": params,
            **errors,
            "discriminator_parameters": count_parameters(discriminator),
            "history": state.history,
            "loaded": loaded,
        }
    figures = [
        _plot_examples(models, test_maps, test_images, out / "examples.png"),
        _plot_dimensions(models["CapsPix2pix"], test_maps[0], out / "capsule_dimensions.png"),
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
