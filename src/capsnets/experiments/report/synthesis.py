"""The report of the ``synthesis`` experiment (Bass et al. 2019): the generators' errors on the test label maps,
what those numbers measure, the data section, examples side by side and what each final capsule dimension does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from capsnets.experiments.report import markdown_table, percent, save_figure, settings_table
from capsnets.plots import image_rows

__all__ = ["plot_dimensions", "plot_examples", "synthesis_sections"]


def synthesis_sections(
    models: dict[str, dict], s: Any, *, size: int, classes: int, inside: float, seed: int, device: str, smoke: bool
) -> list[tuple[str, str]]:
    """The report's sections: results, data and settings.

    Args:
        models: name -> ``{"model_name", "parameters", "discriminator_parameters", "l1", "psnr", "training"}`` (a
            :class:`~capsnets.experiments.runs.Training`).
        s: the experiment's settings; size: the images' side; classes: the label maps' channels; inside: the
            fraction of test pixels inside a silhouette.
    """
    rows = [
        (
            f"{name} ({m['model_name']})",
            f"{m['parameters']:,}",
            f"{m['discriminator_parameters']:,}",
            f"{m['l1']:.4f}",
            f"{m['psnr']:.2f} dB",
            f"{m['training'].epochs} x {s.train_images:,} images",
        )
        for name, m in models.items()
    ]
    headers = ["generator", "parameters", "discriminator parameters", "test L1 error", "test PSNR", "training"]
    return [
        (
            "Results",
            markdown_table(headers, rows) + "\n\nL1: mean absolute pixel error of the generated test images "
            "(pixels in [0, 1]); PSNR: mean per image of -10 log10(MSE). Both reward the average garment inside the "
            "silhouette; the examples show what the numbers do not (texture, seams, sharpness). The paper compares "
            "the generators qualitatively and gives no number to put beside these.",
        ),
        (
            "Data",
            f"Fashion-MNIST, 28x28 padded to {size}x{size}: {s.train_images:,} training and "
            f"{s.test_images:,} test images; the label map has one channel per class ({classes}), the "
            f"garment's silhouette (pixels above 0.05) in the channel of its class. "
            f"{percent(inside)} of the test pixels are inside a silhouette.",
        ),
        ("Settings", settings_table({**s.to_dict(), "seed": seed, "device": device, "smoke": smoke})),
    ]


@torch.no_grad()
def plot_examples(models: dict[str, nn.Module], label_maps: Tensor, images: Tensor, out_png: Path, n: int = 8):
    """Rows: the label maps, the real images and each generator's images; one column per test example."""
    rows = [("label map", label_maps[:n].sum(dim=1, keepdim=True)), ("real", images[:n])]
    rows += [(name, model(label_maps[:n]).images) for name, model in models.items()]
    fig = image_rows([(label, batch[:n, :1]) for label, batch in rows], figsize=(1.3 * n, 1.4 * len(rows)))
    fig.suptitle("Label maps (silhouettes), real garments and generated ones", fontsize=9)
    return save_figure(fig, out_png)


@torch.no_grad()
def plot_dimensions(generator: nn.Module, label_map: Tensor, out_png: Path) -> Path:
    """Each final capsule dimension shifted by -0.25 ... +0.25 at every pixel (rows: dimensions)."""
    capsules = generator(label_map[None]).capsules  # (1, D, H, W)
    deltas = torch.linspace(-0.25, 0.25, 11)
    dims = capsules.shape[1]
    rows = []
    for k in range(dims):
        shifted = capsules.repeat(len(deltas), 1, 1, 1)
        shifted[:, k] += deltas.to(shifted)[:, None, None]
        rows.append((f"dim {k}", generator.decode(shifted)[:, :1]))
    titles = [[(f"{delta:+.2f}", "black") for delta in deltas.tolist()]]
    fig = image_rows(rows, figsize=(1.1 * len(deltas), 1.1 * dims), titles=titles, label_size=7)
    fig.suptitle("CapsPix2pix: one final capsule dimension shifted at every pixel", fontsize=9)
    return save_figure(fig, out_png)
