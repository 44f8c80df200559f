"""One training epoch: forward, loss, backward, optimizer step, with cheap bookkeeping.

Running sums stay on the device; the host looks at them only every ``check_every`` steps (to update the
progress bar and to check that the losses are finite), so the GPU is not synchronised on every step.
A non-finite loss raises :class:`NonFiniteLossError` naming the epoch and step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from capsnets.engine.distributed import DistContext, all_reduce_sum
from capsnets.engine.runtime import autocast


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


@dataclass
class EpochResult:
    """Training-split figures of one epoch, summed over all ranks."""

    loss: float
    accuracy: float
    examples: int
    time_s: float

    @property
    def images_per_s(self) -> float:
        return self.examples / max(self.time_s, 1e-9)


def train_one_epoch(model: nn.Module, loader, criterion: nn.Module, optimizer: torch.optim.Optimizer, *,
                    epoch: int, device: torch.device, amp_dtype: torch.dtype | None, context: DistContext,
                    progress: bool = True, check_every: int = 20,
                    before_step: Callable[[int], None] | None = None) -> EpochResult:
    """Train ``model`` for one pass over ``loader`` (already ``set_epoch``-ed) and return the figures.

    Args:
        model: the (possibly DDP / compiled) model; called as ``model(images, labels)``.
        loader: iterable of ``(images, labels)`` on ``device``; ``len(loader)`` batches.
        criterion: ``criterion(output, images, labels) -> (loss, parts)``, a mean over the batch.
        epoch: 1-based epoch number, for messages.
        amp_dtype: autocast dtype, or None for full precision.
        context: the distributed context (sums are all-reduced; only rank 0 shows progress).
        progress: show a tqdm bar (it also disables itself when stderr is not a terminal).
        check_every: steps between host-side checks of the losses.
        before_step: called with the 1-based step number before each step (e.g. a loss schedule).
    """
    model.train()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss * n, correct, n
    pending: list[Tensor] = []
    bar = tqdm(total=len(loader), desc=f"epoch {epoch}", leave=False, dynamic_ncols=True,
               disable=None if (progress and context.is_main) else True)
    start = time.perf_counter()
    for step, (images, labels) in enumerate(loader, start=1):
        if before_step is not None:
            before_step(step)
        with autocast(device, amp_dtype):
            output = model(images, labels)
            loss, _ = criterion(output, images, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        correct = (output.scores.detach().argmax(dim=-1) == labels).sum()
        totals += torch.stack([loss.detach().double() * len(labels), correct.double(),
                               totals.new_tensor(len(labels))])
        pending.append(loss.detach())
        if step % check_every == 0 or step == len(loader):
            _check_finite(pending, epoch, step)
            pending.clear()
            _update_bar(bar, step, totals, start, context.world_size)
    bar.close()
    loss_sum, correct, count = all_reduce_sum(totals, context).tolist()
    elapsed = time.perf_counter() - start
    return EpochResult(loss=loss_sum / max(count, 1), accuracy=correct / max(count, 1), examples=int(count),
                       time_s=elapsed)


def _check_finite(losses: list[Tensor], epoch: int, last_step: int) -> None:
    """Raise if any of the losses of steps ``last_step - len(losses) + 1 .. last_step`` is not finite."""
    finite = torch.isfinite(torch.stack(losses).float())
    if bool(finite.all()):
        return
    step = last_step - len(losses) + 1 + int((~finite).nonzero()[0, 0])
    value = float(losses[step - (last_step - len(losses) + 1)])
    raise NonFiniteLossError(f"training loss is {value} at epoch {epoch}, step {step}; the last good checkpoint "
                             "was kept. Lower the learning rate (--lr) or use --amp off, then --resume or retrain")


def _update_bar(bar, step: int, totals: Tensor, start: float, world_size: int) -> None:
    if bar.disable:
        return
    loss_sum, correct, count = totals.tolist()
    speed = count * world_size / max(time.perf_counter() - start, 1e-9)
    bar.set_postfix(loss=f"{loss_sum / count:.4f}", acc=f"{correct / count:.4f}", img_s=f"{speed:,.0f}")
    bar.update(step - bar.n)
