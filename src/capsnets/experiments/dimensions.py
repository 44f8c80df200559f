"""What the individual dimensions of a class capsule represent (Sabour, Frosst & Hinton 2017, Sec. 5.1, Fig. 4),
and which primary capsules route to the winning class.

For chosen MNIST test digits, each of the 16 dimensions of the active (longest) class capsule is moved
by -0.25 ... +0.25 in steps of 0.05 and the result is decoded: one grid per digit, rows = dimensions,
columns = perturbations. The routing picture shows what each primary capsule ``i`` sends to the winning
class ``j``: its final coupling ``c[i, j]`` times its length ``|u_i|`` (a coupling alone says nothing where
the capsule is absent, as in the empty background), summed over capsule types on the 6x6 primary grid,
upsampled to the input size and drawn over the input.

The model is loaded from ``--checkpoint-dir`` when that is a trainer run directory (``best``/``last``); else it is
trained on MNIST through the engine's trainer, its run kept in ``--checkpoint-dir`` (full: the paper's ``capsnet``,
10 epochs, shifts of 2 px; smoke: ``capsnet_small`` on 2,000 images, 1 epoch), the ``best`` epoch chosen on a tenth
of the training images held out (the trainer's ``val_fraction``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import Tensor, nn

from capsnets.checkpoints import CheckpointError
from capsnets.data import load_dataset
from capsnets.engine import accuracy as evaluate_accuracy
from capsnets.engine.callbacks import checkpoint_path
from capsnets.experiments.common import ExperimentSettings, register_experiment
from capsnets.experiments.report import ExperimentResult, save_figure, write_report
from capsnets.experiments.report.dimensions import dimensions_sections
from capsnets.functional import capsule_length
from capsnets.models import count_parameters, create_model
from capsnets.models.hub import load_model
from capsnets.plots import perturbation_grid, plot_perturbation_grid


@dataclass(frozen=True)
class Settings(ExperimentSettings):
    """The model (trained unless ``--checkpoint-dir`` holds one), its training, and how many digits to show."""

    model: str = "capsnet"
    train_images: int = 60000
    epochs: int = 10
    test_images: int = 10000
    max_shift: int = 2
    batch_size: int = 128
    digits: int = 3
    train_minutes: float | None = None
    SMOKE: ClassVar[dict] = {
        "model": "capsnet_small",
        "train_images": 2000,
        "epochs": 1,
        "test_images": 500,
        "max_shift": 0,
        "batch_size": 32,
        "digits": 2,
    }


@torch.no_grad()
def routing_map(model: nn.Module, image: Tensor, return_couplings: bool = False):
    """Couplings of the primary capsules to the winning class times their lengths, summed over types.

    Shape:
        image ``(C, H, W)`` -> ``(H', W')`` map on the primary grid and the winning class; with
        ``return_couplings`` also the couplings ``(I,)`` of every primary capsule to the winning class.
    """
    primary = model.primary_capsules(image[None])  # (1, T*H'*W', D_p), ordered (type, row, col)
    capsules, couplings = model.class_capsules(primary, return_couplings=True)  # (1, K, D), (1, I, K)
    winner = int(capsule_length(capsules)[0].argmax())
    grid = model.primary_grid()  # (H', W')
    routed = couplings[0, :, winner] * capsule_length(primary[0])  # (T*H'*W',): c[i, j] |u_i|
    heat = routed.view(-1, *grid).sum(dim=0)
    return (heat, winner, couplings[0, :, winner]) if return_couplings else (heat, winner)


def plot_routing(images: Tensor, maps: list[Tensor], winners: list[int], out_png: str | Path) -> Path:
    """Each input with the upsampled coupling map to its winning class drawn over it."""
    fig = Figure(figsize=(2.2 * len(images), 2.4))
    for i, (image, heat, winner) in enumerate(zip(images, maps, winners)):
        up = F.interpolate(heat[None, None], size=image.shape[-2:], mode="bilinear", align_corners=False)[0, 0]
        ax = fig.add_subplot(1, len(images), i + 1)
        ax.imshow(image[0].cpu().numpy(), cmap="gray", vmin=0, vmax=1)
        ax.imshow(up.cpu().numpy(), cmap="inferno", alpha=0.55)
        ax.set_title(f"routed to class {winner}", fontsize=8)
        ax.set_xticks([]), ax.set_yticks([])
    return save_figure(fig, out_png)


def _model(cfg: Settings, data, device: str, seed: int, runs) -> tuple[nn.Module, dict]:
    """The model, and how it was made: ``{"folder"}`` (loaded from a trainer run directory given as
    ``--checkpoint-dir``) or ``{"training", "images"}`` (trained in ``runs``)."""
    folder = runs.directory
    if folder is not None and checkpoint_path(folder, "last").is_file():
        try:
            return load_model(folder, device), {"folder": folder}
        except CheckpointError:
            pass
    model = create_model(cfg.model, device=device)
    train = data.subset(min(cfg.train_images, len(data))).to(device)
    training = runs.fit(
        "dimensions_capsnet",
        model,
        train,
        epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        max_shift=cfg.max_shift,
        seed=seed,
        train_minutes=cfg.train_minutes,
    )
    return model, {"training": training, "images": len(train)}


@register_experiment(
    "dimensions",
    Settings,
    "what each dimension of a class capsule encodes, and what routes to it (Sabour et al. 2017, Fig. 4)",
)
def run(out: Path, cfg: Settings, *, smoke: bool, device: str, seed: int, data_dir, runs) -> ExperimentResult:
    """Perturbation grids and routing pictures for ``digits`` MNIST test digits of different classes."""
    model, how = _model(cfg, load_dataset("mnist", root=data_dir, train=True), device, seed, runs)
    model.eval()
    test = load_dataset("mnist", root=data_dir, train=False)
    images, labels = test.images[: cfg.test_images].to(device), test.labels[: cfg.test_images].to(device)
    accuracy = evaluate_accuracy(model, images, labels)
    chosen = [int((labels == k).nonzero()[0]) for k in range(cfg.digits)]  # the first test digit of 0, 1, ...
    figures, maps, winners, couplings = [], [], [], []
    for index in chosen:
        grid, winner = perturbation_grid(model, images[index])
        figures.append(plot_perturbation_grid(grid, winner, out / f"dimensions_digit{int(labels[index])}.png"))
        heat, winner, coupled = routing_map(model, images[index], return_couplings=True)
        maps.append(heat), winners.append(winner), couplings.append(coupled)
    figures.append(plot_routing(images[chosen], maps, winners, out / "routing.png"))
    digits = [(int(labels[i]), w, i, c) for i, w, c in zip(chosen, winners, couplings)]
    sections = dimensions_sections(
        cfg,
        parameters=count_parameters(model),
        accuracy=accuracy,
        test_images=len(images),
        training=how,
        digits=digits,
        num_classes=model.num_classes,
        seed=seed,
        device=device,
    )
    return write_report(
        out,
        "What capsule dimensions represent (Sabour et al. 2017, Sec. 5.1)",
        sections,
        figures=figures,
        metrics={"test_accuracy": accuracy},
        name="dimensions",
    )
