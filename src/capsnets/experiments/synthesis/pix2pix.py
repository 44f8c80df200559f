"""pix2pix's training (Isola et al. 2017, "Image-to-Image Translation with Conditional Adversarial Networks",
Sec. 3): a generator and its PatchGAN discriminator, each with its own Adam optimiser, trained through the engine's
one loop (:func:`~capsnets.engine.fit`) with a step that holds both optimisers (``pix2pix_step``); and the
errors of a generator's images (:func:`synthesis_errors`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from capsnets.data import DeviceLoader
from capsnets.engine.callbacks import TimeLimit, checkpoint_path, resume_state
from capsnets.engine.checkpoint import join_optimizer_state, split_optimizer_state
from capsnets.engine.fit import TrainState, fit, save_state
from capsnets.engine.runtime import autocast, resolve_amp
from capsnets.experiments.runs import Training

__all__ = ["fit_in_run", "pix2pix_step", "synthesis_errors", "train_pix2pix"]


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
    :func:`~capsnets.engine.fit` with a step that holds both optimisers (``pix2pix_step``).

    Batches are shuffled on the device by a CPU generator seeded from ``(seed, epoch)``. Returns the records of
    the epochs trained in this call, with the mean ``generator``, ``discriminator`` and ``l1`` losses.
    ``time_limit_s``: training ends after the first epoch that ends past that many seconds. ``state``: a
    :class:`~capsnets.engine.TrainState` to record progress in, with the generator as the model; a training cut
    short also keeps the discriminator and its optimizer in it, and a state read from such a checkpoint
    (``fit_in_run``) is continued, both networks and optimisers restored.
    """
    options = {"lr": lr, "betas": (0.5, 0.999)}
    opt_g, opt_d = (
        torch.optim.Adam(generator.parameters(), **options),
        torch.optim.Adam(discriminator.parameters(), **options),
    )
    state = state if state is not None else TrainState()
    checkpoint = state.attach(opt_g)
    if checkpoint is not None:  # the generator's weights came from the checkpoint (fit_in_run); the discriminator's:
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


def fit_in_run(out: Path, generator: nn.Module, discriminator: nn.Module, *data: Tensor, epochs: int, **train_args):
    """:func:`train_pix2pix` kept in the run directory ``out``: its ``last`` checkpoint (the generator, with the
    training's state) is reused when the training finished, and continued when a time limit cut it short; the
    GAN has no validation split, so there is no ``best``.

    Returns:
        a :class:`~capsnets.experiments.runs.Training` (its summary empty).
    """
    path, state = checkpoint_path(out, "last"), TrainState()
    before = 0
    if path.is_file():
        state = resume_state(path, generator)
        before = len(state.history)
    if not state.finished:
        train_pix2pix(generator, discriminator, *data, epochs=epochs, state=state, **train_args)
        meta = {"model": generator.model_name, "model_args": generator.model_args}
        out.mkdir(parents=True, exist_ok=True)
        save_state(path, generator, state, meta, resumable=not state.finished)
    generator.eval()
    loaded = before > 0 and len(state.history) == before
    return Training(state.history, {}, loaded=loaded, cut_short=not state.finished, planned=epochs)


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
