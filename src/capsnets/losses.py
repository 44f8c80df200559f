"""Training losses for capsule networks and their baselines.

- Margin loss: Sabour, Frosst & Hinton (2017), Eq. 4 (``m+ = 0.9``, ``m- = 0.1``, ``lambda = 0.5``),
  summed over classes, averaged over the batch; several targets per example are allowed (MultiMNIST).
- Reconstruction loss: sum of squared pixel errors per example, scaled by 0.0005 (Sec. 4.1).

Every criterion built by :func:`create_loss` is called as ``criterion(output, images, targets)`` with a
:class:`~capsnets.models.output.ModelOutput` and returns ``(loss, parts)``; ``parts`` holds the detached
terms for logging.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from capsnets.models.output import ModelOutput


def _as_multi_hot(targets: Tensor, num_classes: int, dtype: torch.dtype) -> Tensor:
    if targets.dim() == 1:
        if targets.numel() and (targets.min() < 0 or targets.max() >= num_classes):
            raise ValueError(f"class indices must lie in [0, {num_classes}), got {targets.min()}..{targets.max()}")
        return F.one_hot(targets.long(), num_classes).to(dtype)
    if targets.dim() == 2 and targets.shape[1] == num_classes:
        return targets.to(dtype)
    raise ValueError(f"targets must be (B,) indices or (B, {num_classes}) multi-hot, got {tuple(targets.shape)}")


def margin_loss(
    lengths: Tensor,
    targets: Tensor,
    *,
    m_pos: float = 0.9,
    m_neg: float = 0.1,
    down_weight: float = 0.5,
) -> Tensor:
    """Margin loss ``sum_k T_k max(0, m+ - |v_k|)^2 + lambda (1 - T_k) max(0, |v_k| - m-)^2``.

    Args:
        lengths: ``(B, K)`` class capsule lengths.
        targets: ``(B,)`` class indices or ``(B, K)`` multi-hot (several present classes).
        m_pos, m_neg: the margins ``m+`` and ``m-``.
        down_weight: ``lambda``, the weight of the absent-class term.

    Returns:
        scalar: the per-example sum over classes, averaged over the batch.
    """
    if lengths.dim() != 2:
        raise ValueError(f"lengths must be (B, K), got {tuple(lengths.shape)}")
    t = _as_multi_hot(targets, lengths.shape[1], lengths.dtype)
    present = t * F.relu(m_pos - lengths).pow(2)
    absent = down_weight * (1.0 - t) * F.relu(lengths - m_neg).pow(2)
    return (present + absent).sum(dim=1).mean()


def reconstruction_loss(reconstruction: Tensor, images: Tensor, *, weight: float = 0.0005) -> Tensor:
    """Sum of squared pixel errors per example, averaged over the batch, times ``weight``."""
    if reconstruction.shape != images.shape:
        raise ValueError(
            f"reconstruction {tuple(reconstruction.shape)} and images {tuple(images.shape)} differ in shape"
        )
    return weight * (reconstruction - images).pow(2).flatten(1).sum(dim=1).mean()


class MarginLoss(nn.Module):
    """Margin loss plus, when the model reconstructs, the scaled reconstruction loss.

    Args:
        m_pos, m_neg, down_weight: see :func:`margin_loss`.
        reconstruction_weight: scale of the reconstruction term; 0 switches it off.
    """

    def __init__(self, *, m_pos=0.9, m_neg=0.1, down_weight=0.5, reconstruction_weight=0.0005) -> None:
        super().__init__()
        if not 0 <= m_neg < m_pos <= 1:
            raise ValueError(f"need 0 <= m_neg < m_pos <= 1, got m_neg={m_neg}, m_pos={m_pos}")
        if reconstruction_weight < 0:
            raise ValueError(f"reconstruction_weight must be >= 0, got {reconstruction_weight}")
        self.m_pos, self.m_neg, self.down_weight = m_pos, m_neg, down_weight
        self.reconstruction_weight = reconstruction_weight

    def forward(self, output: ModelOutput, images: Tensor, targets: Tensor):
        margin = margin_loss(
            output.scores.float(), targets, m_pos=self.m_pos, m_neg=self.m_neg, down_weight=self.down_weight
        )
        parts = {"margin": margin.detach()}
        loss = margin
        if output.reconstruction is not None and self.reconstruction_weight > 0:
            recon = reconstruction_loss(
                output.reconstruction.float(), images.float(), weight=self.reconstruction_weight
            )
            parts["reconstruction"] = recon.detach()
            loss = loss + recon
        return loss, parts

    def extra_repr(self) -> str:
        return (
            f"m_pos={self.m_pos}, m_neg={self.m_neg}, down_weight={self.down_weight}, "
            f"reconstruction_weight={self.reconstruction_weight}"
        )


class CrossEntropyLoss(nn.Module):
    """Cross-entropy on ``output.scores`` taken as logits (the CNN baselines)."""

    def __init__(self, *, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.label_smoothing = label_smoothing

    def forward(self, output: ModelOutput, images: Tensor, targets: Tensor):
        loss = F.cross_entropy(output.scores.float(), targets, label_smoothing=self.label_smoothing)
        return loss, {"cross_entropy": loss.detach()}


_LOSSES: dict[str, Callable[..., nn.Module]] = {
    "margin": MarginLoss,
    "cross_entropy": CrossEntropyLoss,
}


def list_losses() -> list[str]:
    return sorted(_LOSSES)


def create_loss(name: str, **kwargs) -> nn.Module:
    """Build a criterion by name (see :func:`list_losses`); ``kwargs`` go to its constructor."""
    if name not in _LOSSES:
        raise ValueError(f"unknown loss {name!r}; known losses: {', '.join(list_losses())}")
    try:
        return _LOSSES[name](**kwargs)
    except TypeError as err:
        raise ValueError(f"bad arguments for loss {name!r}: {err}") from None
