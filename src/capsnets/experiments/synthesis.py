"""``synthesis``: CapsPix2pix against pix2pix, label map in, image out (Bass et al. 2019; SPEC §3).

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

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import Tensor, nn
from tqdm.auto import tqdm

from capsnets.data import load_dataset
from capsnets.data.synthesis import silhouette_label_maps
from capsnets.engine.checkpoint import join_optimizer_state, split_optimizer_state
from capsnets.engine.runtime import autocast, resolve_amp
from capsnets.experiments.common import (markdown_table, merge_settings, percent, register_experiment, save_figure,
                                         settings_table, training_cell, write_report)
from capsnets.experiments.training import (TrainingState, check_time_limit, epochs_trained, load_or_train,
                                           minutes_to_seconds)
from capsnets.models import PatchDiscriminator, count_parameters, create_model

__all__ = ["run", "train_pix2pix", "synthesis_errors"]

FULL = {"train_images": 60000, "test_images": 10000, "epochs": 20, "batch_size": 32, "lr": 2e-4, "l1_weight": 100.0,
        "capsule_model": "capspix2pix", "cnn_model": "pix2pix", "discriminator_width": 64, "train_minutes": None}
SMOKE = {"train_images": 256, "test_images": 64, "epochs": 1, "batch_size": 32, "lr": 2e-4, "l1_weight": 100.0,
         "capsule_model": "capspix2pix_small", "cnn_model": "pix2pix_small", "discriminator_width": 16,
         "train_minutes": None}
SIZE = 32


def train_pix2pix(generator: nn.Module, discriminator: nn.Module, label_maps: Tensor, images: Tensor, *,
                  epochs: int, batch_size: int = 32, lr: float = 2e-4, l1_weight: float = 100.0, seed: int = 0,
                  desc: str = "pix2pix", progress: bool = True, amp: str = "auto",
                  time_limit_s: float | None = None, state: TrainingState | None = None) -> list[dict[str, Any]]:
    """Train a generator and its discriminator with pix2pix's losses (Isola et al. 2017, Sec. 3).

    Per batch: the discriminator's loss is the mean of the binary cross-entropies of real pairs (target 1)
    and generated pairs (target 0); the generator's is the cross-entropy of its pairs against target 1 plus
    ``l1_weight`` times the mean absolute error to the real image. Batches are shuffled on the device by a
    CPU generator seeded from ``(seed, epoch)``. Returns one ``{"epoch", "generator", "discriminator", "l1",
    "time_s"}`` record per epoch. ``time_limit_s``: as in
    :func:`~capsnets.experiments.training.train_classifier` (the last record then has ``"time_limit": True``).
    ``state``: as in :func:`~capsnets.experiments.training.train_classifier`, with the generator as the model;
    a training cut short also keeps the discriminator and its optimizer in it, so a later run continues both.
    """
    check_time_limit(time_limit_s)
    options = {"lr": lr, "betas": (0.5, 0.999)}
    opt_g, opt_d = torch.optim.Adam(generator.parameters(), **options), torch.optim.Adam(discriminator.parameters(),
                                                                                         **options)
    amp_dtype, history, began = resolve_amp(amp, images.device), [], time.perf_counter()
    checkpoint = state.attach(opt_g) if state is not None else None
    first_epoch = 1 if checkpoint is None else _continue_pix2pix(state, checkpoint, discriminator, opt_d)
    generator.train()
    discriminator.train()
    for epoch in range(first_epoch, epochs + 1):
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        totals, start = torch.zeros(3, dtype=torch.float64, device=images.device), time.perf_counter()
        for first in tqdm(range(0, len(images), batch_size), desc=f"{desc} epoch {epoch}", leave=False,
                          disable=None if progress else True):
            index = order[first:first + batch_size].to(images.device)
            x, y = label_maps[index], images[index]
            with autocast(images.device, amp_dtype):
                fake = generator(x).images
                real_logits, fake_logits = discriminator(x, y), discriminator(x, fake.detach())
                loss_d = 0.5 * (_bce(real_logits, 1.0) + _bce(fake_logits, 0.0))
            opt_d.zero_grad(set_to_none=True)
            loss_d.backward()
            opt_d.step()
            with autocast(images.device, amp_dtype):
                l1 = (fake.float() - y.float()).abs().mean()
                loss_g = _bce(discriminator(x, fake), 1.0) + l1_weight * l1
            opt_g.zero_grad(set_to_none=True)
            loss_g.backward()
            opt_g.step()
            totals += torch.stack([loss_g.detach(), loss_d.detach(), l1.detach()]).double() * len(index)
        mean = (totals / len(images)).tolist()
        if not all(np.isfinite(mean)):
            raise FloatingPointError(f"{desc}: non-finite losses {mean} in epoch {epoch}; lower the learning rate")
        history.append({"epoch": epoch, "generator": mean[0], "discriminator": mean[1], "l1": mean[2],
                        "time_s": time.perf_counter() - start})
        if state is not None:
            state.epoch = epoch
        if time_limit_s is not None and epoch < epochs and time.perf_counter() - began >= time_limit_s:
            history[-1]["time_limit"] = True
            break
    if state is not None:
        state.finished = not (history and history[-1].get("time_limit"))
        if not state.finished:  # the discriminator's side, which the generator's checkpoint does not hold
            optim_d, state.position = split_optimizer_state(opt_d.state_dict(), prefix="optim_d.")
            weights = {f"discriminator.{k}": v.detach().clone() for k, v in discriminator.state_dict().items()}
            state.tensors = {**weights, **optim_d}
    generator.eval()
    discriminator.eval()
    return history


def _continue_pix2pix(state: TrainingState, checkpoint, discriminator: nn.Module, opt_d) -> int:
    """Restore the discriminator's side of what :func:`train_pix2pix` kept when its time limit stopped it (the
    generator's weights come from ``load_or_train``, its optimizer and the RNG from ``state.attach``);
    returns the epoch to start with."""
    extra = {k[len("extra."):]: v for k, v in checkpoint.tensors.items() if k.startswith("extra.")}
    discriminator.load_state_dict({k[len("discriminator."):]: v for k, v in extra.items()
                                   if k.startswith("discriminator.")})
    opt_d.load_state_dict(join_optimizer_state(extra, state.position, opt_d, prefix="optim_d."))
    return state.epoch + 1


def _bce(logits: Tensor, target: float) -> Tensor:
    return F.binary_cross_entropy_with_logits(logits.float(), torch.full_like(logits.float(), target))


@torch.no_grad()
def synthesis_errors(generator: nn.Module, label_maps: Tensor, images: Tensor, batch_size: int = 256) -> dict:
    """Mean absolute error and mean per-image PSNR (peak 1) of the generated images against the real ones."""
    generator.eval()
    l1, psnr = [], []
    for first in range(0, len(images), batch_size):
        fake = generator(label_maps[first:first + batch_size]).images.float()
        real = images[first:first + batch_size].float()
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
    return [("CapsPix2pix - pix2pix, test L1 error", "CapsPix2pix_l1", "pix2pix_l1"),
            ("CapsPix2pix - pix2pix, test PSNR (dB)", "CapsPix2pix_psnr", "pix2pix_psnr")]


@register_experiment("synthesis", contrasts=_contrasts)
def run(out: Path, *, smoke: bool = False, device: str = "cpu", seed: int = 0, data_dir=None, checkpoint_dir=None,
        **options):
    """Train (or load) both generators; write ``report.md`` and two PNGs into ``out``.

    Options (override the smoke / full settings): ``train_images``, ``test_images``, ``epochs``, ``batch_size``,
    ``lr``, ``l1_weight``, ``capsule_model``, ``cnn_model``, ``discriminator_width``.
    """
    s = merge_settings("synthesis", SMOKE if smoke else FULL, options)
    train_maps, train_images = _data(data_dir, True, s["train_images"], device)
    test_maps, test_images = _data(data_dir, False, s["test_images"], device)
    size = (train_maps.shape[1], SIZE, SIZE)
    models = {"CapsPix2pix": create_model(s["capsule_model"], input_size=size, device=device),
              "pix2pix": create_model(s["cnn_model"], input_size=size, device=device)}
    rows, metrics = [], {}
    for name, generator in models.items():
        discriminator = PatchDiscriminator(size[0] + 1, width=s["discriminator_width"], device=device)

        history: list = []

        state = TrainingState()  # lets a later run continue a training its time limit cut short

        def fit(generator=generator, discriminator=discriminator, name=name, history=history, state=state):
            history += train_pix2pix(generator, discriminator, train_maps, train_images, epochs=s["epochs"],
                                     batch_size=s["batch_size"], lr=s["lr"], l1_weight=s["l1_weight"], seed=seed,
                                     desc=name, time_limit_s=minutes_to_seconds(s["train_minutes"]), state=state)

        recipe = {**{k: s[k] for k in ("train_images", "epochs", "batch_size", "lr", "l1_weight",
                                        "discriminator_width")}, "seed": seed}
        loaded = load_or_train(generator, f"synthesis_{generator.model_name}", fit, checkpoint_dir=checkpoint_dir,
                               meta={"history": history}, state=state, recipe=recipe)
        errors, params = synthesis_errors(generator, test_maps, test_images), count_parameters(generator)
        metrics.update({f"{name}_l1": errors["l1"], f"{name}_psnr": errors["psnr"],
                        f"{name}_parameters": params})
        rows.append((f"{name} ({generator.model_name})", f"{params:,}", f"{count_parameters(discriminator):,}",
                     f"{errors['l1']:.4f}", f"{errors['psnr']:.2f} dB",
                     training_cell(f"{epochs_trained(history, s['epochs'])} x {s['train_images']:,} images", history,
                                   loaded)))
    figures = [_plot_examples(models, test_maps, test_images, out / "examples.png"),
               _plot_dimensions(models["CapsPix2pix"], test_maps[0], out / "capsule_dimensions.png")]
    headers = ["generator", "parameters", "discriminator parameters", "test L1 error", "test PSNR", "training"]
    sections = [
        ("Results", markdown_table(headers, rows) + "\n\nL1: mean absolute pixel error of the generated test images "
         "(pixels in [0, 1]); PSNR: mean per image of -10 log10(MSE). Both reward the average garment inside the "
         "silhouette; the examples show what the numbers do not (texture, seams, sharpness). The paper compares "
         "the generators qualitatively and gives no number to put beside these."),
        ("Data", f"Fashion-MNIST, 28x28 padded to {SIZE}x{SIZE}: {s['train_images']:,} training and "
                 f"{s['test_images']:,} test images; the label map has one channel per class ({size[0]}), the "
                 f"garment's silhouette (pixels above 0.05) in the channel of its class. "
                 f"{percent(test_maps.sum(1).mean().item())} of the test pixels are inside a silhouette."),
        ("Settings", settings_table({**s, "seed": seed, "device": device, "smoke": smoke})),
    ]
    return write_report(out, "Image synthesis: CapsPix2pix vs pix2pix (Bass et al. 2019)", sections, figures=figures,
                        metrics=metrics, name="synthesis")
