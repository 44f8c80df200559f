"""``segmentation``: SegCaps and a capsule U-Net against U-Net (LaLonde & Bagci 2018, "Capsules for Object
Segmentation", Sec. 4; the capsule U-Net after Nguyen et al. 2021, "3D-UCaps").

Paper: on LUNA16 lung CT slices (512x512) SegCaps R3 reaches a Dice score of 98.48% with 1.4M parameters,
U-Net 98.45% with 31M: the capsule network matches the CNN with 95% fewer parameters.

Here: LUNA16 is not available, so the models segment cluttered MNIST digits
(:func:`capsnets.data.segmentation.make_digit_segmentation`): one whole digit plus pieces of other
digits on a black canvas, the mask marking the whole digit. A fresh training set is drawn every epoch;
the test set is fixed by its seed. The models train with Adam on the per-pixel binary cross-entropy
(SegCaps adds its masked reconstruction, the capsule U-Net the margin loss of its class capsules). The report gives the mean per-image Dice of each model and
of thresholding the image itself, which marks every clutter stroke too (the floor a model must beat), and
a table of each model's training loss and Dice on up to 1,000 validation images (built from training
digits) after every epoch, which shows when a model stops learning or collapses to all background; that Dice
chooses each model's best epoch. The models train through the engine's trainer, a training set drawn every epoch.
Deviations: the data (above); SegCaps' loss weighs the object pixels by each batch's ratio of background to object
pixels (its default, ``pos_weight="balanced"``), U-Net's and the capsule U-Net's do not; ``--smoke`` uses
``segcaps_small``, ``capsule_unet_small`` and ``unet_small`` on a few hundred 32x32 images.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor, nn

from capsnets.data import load_dataset
from capsnets.data.segmentation import SegmentationData, make_digit_segmentation
from capsnets.engine.callbacks import checkpoint_name
from capsnets.engine.evaluate import dice_score
from capsnets.experiments.common import ExperimentSettings, register_experiment
from capsnets.experiments.report import save_figure, write_report
from capsnets.experiments.report.segmentation import segmentation_sections
from capsnets.models import count_parameters, create_model
from capsnets.plots import image_rows

__all__ = ["run", "evaluate_dice"]


@dataclass(frozen=True)
class Settings(ExperimentSettings):
    """Data (``size``: canvas side, divisible by 16; ``clutter`` pieces of ``patch`` pixels), training, and the
    three models with their builder arguments (e.g. ``unet_args={"batch_norm": true}``)."""

    train_digits: int = 60000
    images_per_epoch: int = 20000
    epochs: int = 20
    test_digits: int = 10000
    test_images: int = 10000
    size: int = 64
    clutter: int = 8
    patch: int = 8
    batch_size: int = 32
    lr: float = 1e-3
    segcaps: str = "segcaps"
    capsule_unet: str = "capsule_unet"
    unet: str = "unet"
    segcaps_args: dict = field(default_factory=dict)
    capsule_unet_args: dict = field(default_factory=dict)
    unet_args: dict = field(default_factory=dict)
    train_minutes: float | None = None
    SMOKE: ClassVar[dict] = {
        "train_digits": 2000,
        "images_per_epoch": 256,
        "epochs": 1,
        "test_digits": 200,
        "test_images": 64,
        "size": 32,
        "clutter": 4,
        "batch_size": 32,
        "lr": 3e-3,
        "segcaps": "segcaps_small",
        "capsule_unet": "capsule_unet_small",
        "unet": "unet_small",
    }

    def __post_init__(self) -> None:
        if self.size % 16 or self.size < 28:
            raise ValueError(
                f"size must be divisible by 16 (U-Net pools four times) and hold a 28x28 digit, got {self.size}"
            )


@torch.no_grad()
def evaluate_dice(model: nn.Module, data: SegmentationData, batch_size: int = 64) -> float:
    """Mean per-image Dice of the model's thresholded probabilities (eval mode, batch by batch)."""
    model.eval()
    scores = [
        dice_score(model(data.images[i : i + batch_size]).probabilities, data.masks[i : i + batch_size])
        for i in range(0, len(data), batch_size)
    ]
    return torch.cat(scores).mean().item()


@torch.no_grad()
def _plot_examples(models: dict[str, nn.Module], data: SegmentationData, out_png: Path, n: int = 6) -> Path:
    """Rows: input, true mask, each model's predicted probabilities; one column per test image."""
    rows = [("input", data.images[:n]), ("true mask", data.masks[:n])]
    rows += [(name, model.eval()(data.images[:n]).probabilities) for name, model in models.items()]
    fig = image_rows([(label, images[:, :1]) for label, images in rows], figsize=(1.5 * n, 1.6 * len(rows)))
    fig.suptitle("Cluttered-digit segmentation: test images, masks and predicted probabilities", fontsize=9)
    return save_figure(fig, out_png)


def _digits(data_dir, train: bool, count: int, device: str) -> Tensor:
    return load_dataset("mnist", root=data_dir, train=train).images[:count].to(device)


def _contrasts(metrics: dict) -> list[tuple[str, str, str]]:
    return [
        ("SegCaps - U-Net, test Dice", "SegCaps_dice", "U-Net_dice"),
        ("Capsule U-Net - U-Net, test Dice", "Capsule U-Net_dice", "U-Net_dice"),
    ]


@register_experiment(
    "segmentation",
    Settings,
    "segmenting cluttered digits: SegCaps and a capsule U-Net against U-Net (LaLonde & Bagci 2018)",
    contrasts=_contrasts,
)
def run(out: Path, s: Settings, *, smoke: bool, device: str, seed: int, data_dir, runs):
    """Train (or load) SegCaps, the capsule U-Net and U-Net on cluttered digits; write ``report.md`` and a PNG into
    ``out``."""
    shape = {"size": s.size, "clutter": s.clutter, "patch": s.patch}
    train_digits = _digits(data_dir, True, s.train_digits, device)
    test = make_digit_segmentation(
        _digits(data_dir, False, s.test_digits, device), s.test_images, seed=10_000 + seed, **shape
    )

    def epoch_data(epoch: int) -> SegmentationData:
        data = make_digit_segmentation(train_digits, s.images_per_epoch, seed=seed * 1000 + epoch, **shape)
        return dataclasses.replace(data, name="cluttered_digits")

    # chooses each model's best epoch: images from training digits, fixed by their seed
    val = make_digit_segmentation(train_digits, min(1000, s.test_images), seed=20_000 + seed, **shape)
    size = (1, s.size, s.size)
    models = {
        "SegCaps": create_model(s.segcaps, input_size=size, device=device, **s.segcaps_args),
        "Capsule U-Net": create_model(s.capsule_unet, input_size=size, device=device, **s.capsule_unet_args),
        "U-Net": create_model(s.unet, input_size=size, device=device, **s.unet_args),
    }
    builder_args = {"SegCaps": s.segcaps_args, "Capsule U-Net": s.capsule_unet_args, "U-Net": s.unet_args}
    metrics, records = {}, {}
    for name, model in models.items():
        training = runs.fit(
            checkpoint_name(f"segmentation_{model.model_name}", builder_args[name]),
            model,
            None,
            val,
            epochs=s.epochs,
            epoch_data=epoch_data,
            batch_size=s.batch_size,
            lr=s.lr,
            seed=seed,
            train_minutes=s.train_minutes,
            recipe=s.subset("train_digits", "images_per_epoch", "size", "clutter", "patch"),
        )
        dice, params = evaluate_dice(model, test), count_parameters(model)
        metrics.update({f"{name}_dice": dice, f"{name}_parameters": params})
        records[name] = {"model_name": model.model_name, "parameters": params, "dice": dice, "training": training}
    threshold = dice_score(test.images, test.masks).mean().item()
    metrics["threshold_dice"] = threshold
    png = _plot_examples(models, test, out / "examples.png")
    sections = segmentation_sections(
        records,
        s,
        threshold=threshold,
        test_images=len(test),
        object_fraction=test.masks.mean().item(),
        val_images=len(val),
        seed=seed,
        device=device,
        smoke=smoke,
    )
    return write_report(
        out,
        "Segmentation: SegCaps, a capsule U-Net and U-Net (LaLonde & Bagci 2018; Nguyen et al. 2021)",
        sections,
        figures=[png],
        metrics=metrics,
        name="segmentation",
    )
