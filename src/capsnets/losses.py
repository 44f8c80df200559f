"""Training losses for capsule networks and their baselines.

- Margin loss: Sabour, Frosst & Hinton (2017), Eq. 4 (``m+ = 0.9``, ``m- = 0.1``, ``lambda = 0.5``),
  summed over classes, averaged over the batch; several targets per example are allowed (MultiMNIST).
- Reconstruction loss: sum of squared pixel errors per example, scaled by 0.0005 (Sec. 4.1).
- Binary cross-entropy: each class an independent yes/no (multi-label data), on the sigmoid of logits or on
  capsule lengths / activations taken as probabilities. On multi-label data the margin loss stays the capsule
  models' loss (the paper's MultiMNIST loss: one term per class, present or absent) and the others become
  binary cross-entropy (the multi-label task chooses: :class:`~capsnets.engine.tasks.MultilabelTask`).
- SegCaps loss: LaLonde & Bagci (2018), weighted per-pixel binary cross-entropy of the segmentation
  capsules' lengths plus a reconstruction of the image inside the mask; ``binary_segmentation`` is
  the cross-entropy alone (U-Net). With K > 1 classes (our extension; the paper is binary): the binary
  cross-entropy of each class's capsule length against "the pixel is of this class", averaged over classes
  (lengths are independent, not a softmax), or for logits (U-Net) the softmax cross-entropy over classes.
- Capsule U-Net loss (after 3D-UCaps, Nguyen et al. 2021): the cross-entropy of the decoder's logits plus a
  margin loss of the class capsules' lengths against each class's share of each cell of their grid.
- Transforming auto-encoder loss: Hinton, Krizhevsky & Wang (2011), squared error of the predicted
  transformed image.
- Spread loss: Hinton, Sabour & Frosst (2018), Sec. 4.1, ``sum_{i != t} max(0, m - (a_t - a_i))^2``
  with the margin ``m`` growing linearly from 0.2 to 0.9. The paper does not say over how long; here
  it reaches 0.9 after ``ramp`` (default half) of the training, or after ``ramp_epochs`` epochs whatever the
  training's length (yl-1993/Matrix-Capsules-EM-PyTorch, ``train.py``: 10 epochs), and stays there. (The
  authors' released code grows it by steps, ``0.2 + 0.79 sigmoid(min(10, step / 50000 - 4))``, which stays
  below 0.25 for the first 65,000 steps: ``docs/em_formulations.md``.)

A criterion that has ``set_progress(fraction, epochs)`` is told by the trainer, before every step, which
fraction of the training has been done (0 at the start, approaching 1 at the end) and how many epochs the
training has.

Every criterion built by :func:`create_loss` is called as ``criterion(output, images, targets)`` with a
:class:`~capsnets.models.output.ModelOutput` and returns ``(loss, parts)``; ``parts`` holds the detached
terms for logging.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from capsnets.models.output import ModelOutput, independent_probabilities
from capsnets.validation import (
    Argument,
    ArgumentError,
    keyword_arguments,
    number,
    reject_unknown,
    shown,
    to_float_images,
)


def _as_multi_hot(targets: Tensor, num_classes: int, dtype: torch.dtype) -> Tensor:
    if targets.dim() == 1:
        if targets.numel() and (targets.min() < 0 or targets.max() >= num_classes):
            raise ArgumentError(f"class indices must lie in [0, {num_classes}), got {targets.min()}..{targets.max()}")
        return F.one_hot(targets.long(), num_classes).to(dtype)
    if targets.dim() == 2 and targets.shape[1] == num_classes:
        return targets.to(dtype)
    raise ArgumentError(f"targets must be (B,) indices or (B, {num_classes}) multi-hot, got {tuple(targets.shape)}")


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
        raise ArgumentError(f"lengths must be (B, K), got {tuple(lengths.shape)}")
    t = _as_multi_hot(targets, lengths.shape[1], lengths.dtype)
    present = t * F.relu(m_pos - lengths).pow(2)
    absent = down_weight * (1.0 - t) * F.relu(lengths - m_neg).pow(2)
    return (present + absent).sum(dim=1).mean()


def reconstruction_loss(reconstruction: Tensor, images: Tensor, *, weight: float = 0.0005) -> Tensor:
    """Sum of squared pixel errors per example, averaged over the batch, times ``weight``."""
    if reconstruction.shape != images.shape:
        raise ArgumentError(
            f"reconstruction {tuple(reconstruction.shape)} and images {tuple(images.shape)} differ in shape"
        )
    return weight * (reconstruction - images).pow(2).flatten(1).sum(dim=1).mean()


class MarginLoss(nn.Module):
    """Margin loss plus, when the model reconstructs, the scaled reconstruction loss.

    Args:
        m_pos, m_neg, down_weight: see :func:`margin_loss`.
        reconstruction_weight: scale of the reconstruction term; 0 switches it off.
    """

    def __init__(
        self, *, m_pos: float = 0.9, m_neg: float = 0.1, down_weight: float = 0.5, reconstruction_weight: float = 0.0005
    ) -> None:
        super().__init__()
        m_pos, m_neg = number("m_pos", m_pos, 0.0, 1.0), number("m_neg", m_neg, 0.0, 1.0)
        if not m_neg < m_pos:
            raise ArgumentError(f"need 0 <= m_neg < m_pos <= 1, got m_neg={m_neg}, m_pos={m_pos}", "m_neg")
        down_weight = number("down_weight", down_weight)
        reconstruction_weight = number("reconstruction_weight", reconstruction_weight, 0.0)
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
                output.reconstruction.float(), to_float_images(images), weight=self.reconstruction_weight
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
        label_smoothing = number("label_smoothing", label_smoothing, 0.0, 1.0)
        self.label_smoothing = label_smoothing

    def forward(self, output: ModelOutput, images: Tensor, targets: Tensor):
        loss = F.cross_entropy(output.scores.float(), targets, label_smoothing=self.label_smoothing)
        return loss, {"cross_entropy": loss.detach()}


class BinaryCrossEntropyLoss(nn.Module):
    """Binary cross-entropy of each class's presence, summed over classes and averaged over the batch.

    Logits (the CNN baselines) go through ``binary_cross_entropy_with_logits``; capsule lengths and activations
    are taken as the probabilities, clamped to ``[1e-6, 1 - 1e-6]`` before the log. Targets are ``(B, K)``
    multi-hot or ``(B,)`` class indices (one-hot). No reconstruction term.
    """

    def forward(self, output: ModelOutput, images: Tensor, targets: Tensor):
        if output.scores.dim() != 2:
            raise ArgumentError(f"scores must be (B, K), got {tuple(output.scores.shape)}")
        t = _as_multi_hot(targets, output.scores.shape[1], torch.float32)
        if output.score_kind == "logits":
            per_class = F.binary_cross_entropy_with_logits(output.scores.float(), t, reduction="none")
        else:
            p = independent_probabilities(output).clamp(1e-6, 1.0 - 1e-6)
            per_class = -(t * p.log() + (1.0 - t) * (1.0 - p).log())
        loss = per_class.sum(dim=1).mean()
        return loss, {"binary_cross_entropy": loss.detach()}


def spread_loss(activations: Tensor, targets: Tensor, margin: float) -> Tensor:
    """Spread loss ``sum_{i != t} max(0, m - (a_t - a_i))^2``, averaged over the batch.

    Shape:
        activations ``(B, K)``, targets ``(B,)`` class indices -> scalar.
    """
    if activations.dim() != 2 or targets.shape != activations.shape[:1]:
        raise ArgumentError(
            f"need activations (B, K) and targets (B,), got {tuple(activations.shape)} and {tuple(targets.shape)}"
        )
    target = targets.long().unsqueeze(1)
    a_t = activations.gather(1, target)  # (B, 1)
    per_class = F.relu(margin - (a_t - activations)).pow(2)
    return per_class.scatter(1, target, 0.0).sum(dim=1).mean()


class SpreadLoss(nn.Module):
    """Spread loss with a margin that grows linearly with training progress.

    Args:
        margin_start: margin at the start of training (0.2).
        margin_end: final margin (0.9).
        ramp: fraction of training over which the margin grows (then it stays at ``margin_end``); None: half,
            unless ``ramp_epochs`` is given.
        ramp_epochs: the margin grows over this many epochs instead, whatever the training's length (a
            training of fewer epochs ends below ``margin_end``). Give ``ramp`` or ``ramp_epochs``, not both.

    Examples::

        >>> loss = SpreadLoss(ramp_epochs=10)
        >>> loss.set_progress(0.5, epochs=2)  # one epoch done
        >>> round(loss.margin, 3)
        0.27
    """

    def __init__(
        self,
        *,
        margin_start: float = 0.2,
        margin_end: float = 0.9,
        ramp: float | None = None,
        ramp_epochs: float | None = None,
    ) -> None:
        super().__init__()
        margin_start, margin_end = number("margin_start", margin_start, 0.0), number("margin_end", margin_end)
        if not margin_start <= margin_end:
            raise ArgumentError(f"need 0 <= margin_start <= margin_end, got {margin_start}, {margin_end}", "margin_end")
        if ramp is not None and ramp_epochs is not None:
            raise ArgumentError(
                f"give ramp (a fraction of the training) or ramp_epochs (epochs), not both; got ramp={shown(ramp)} "
                f"and ramp_epochs={shown(ramp_epochs)} (a model's training recipe may give ramp_epochs: "
                "--loss-arg ramp_epochs=null drops it)",
                "ramp",
            )
        ramp = 0.5 if ramp is None and ramp_epochs is None else ramp
        if ramp is not None:
            ramp = number("ramp", ramp, 0.0, 1.0, low_open=True)
        if ramp_epochs is not None:
            ramp_epochs = number("ramp_epochs", ramp_epochs, 0.0, low_open=True)
        self.margin_start, self.margin_end, self.ramp, self.ramp_epochs = margin_start, margin_end, ramp, ramp_epochs
        self.margin = margin_start

    def set_progress(self, fraction: float, epochs: int) -> None:
        """Set the margin for the given fraction of a training of ``epochs`` epochs done."""
        done = max(fraction, 0.0)
        growth = min(done / self.ramp if self.ramp_epochs is None else done * epochs / self.ramp_epochs, 1.0)
        self.margin = self.margin_start + (self.margin_end - self.margin_start) * growth

    def forward(self, output: ModelOutput, images: Tensor, targets: Tensor):
        loss = spread_loss(output.scores.float(), targets, self.margin)
        return loss, {"spread": loss.detach()}

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin:.3f}, margin_start={self.margin_start}, margin_end={self.margin_end}, "
            f"ramp={self.ramp}, ramp_epochs={self.ramp_epochs}"
        )


def binary_segmentation_loss(probabilities: Tensor, masks: Tensor, *, pos_weight: float | Tensor = 1.0) -> Tensor:
    """Per-pixel binary cross-entropy of probabilities (capsule lengths, not logits), averaged over pixels;
    object pixels are weighted by ``pos_weight`` (SegCaps weights them against the background; a tensor that
    broadcasts against ``masks`` weighs each map by its own)."""
    if probabilities.shape != masks.shape:
        raise ArgumentError(
            f"probabilities {tuple(probabilities.shape)} and masks {tuple(masks.shape)} differ in shape"
        )
    masks = masks.to(probabilities.dtype)
    eps = 1e-6  # lengths can reach 0 exactly; the log is taken of values in [eps, 1 - eps]
    p = probabilities.clamp(eps, 1.0 - eps)
    return -(pos_weight * masks * p.log() + (1.0 - masks) * (1.0 - p).log()).mean()


def binary_segmentation_loss_from_logits(logits: Tensor, masks: Tensor, *, pos_weight: float = 1.0) -> Tensor:
    """:func:`binary_segmentation_loss` of ``sigmoid(logits)``, computed from the logits: the clamp there has
    zero gradient once a probability is below 1e-6 (a logit below -13.8), so an object pixel pushed that far
    would never be pulled back; here every logit keeps its gradient."""
    if logits.shape != masks.shape:
        raise ArgumentError(f"logits {tuple(logits.shape)} and masks {tuple(masks.shape)} differ in shape")
    weight = torch.tensor(float(pos_weight), dtype=logits.dtype, device=logits.device)
    return F.binary_cross_entropy_with_logits(logits, masks.to(logits.dtype), pos_weight=weight)


class SegCapsLoss(nn.Module):
    """SegCaps' loss (LaLonde & Bagci 2018, Sec. 3.2): weighted binary cross-entropy of the segmentation
    capsules' lengths, plus the mean squared error of the reconstruction of the image inside the mask.

    Args:
        pos_weight: weight of object pixels in the cross-entropy (with K classes: of the pixels of every class
            but the background, class 0), or ``"balanced"``: the ratio of background to object pixels in each batch's
            masks (1 for a batch without object pixels). Deviation: LaLonde & Bagci's code (lalonderodney/SegCaps,
            ``load_3D_data.py``, ``compute_class_weights``) takes that ratio once, over the training masks.
        reconstruction_weight: scale of the reconstruction term (ours; the paper does not give it).

    Called as ``criterion(output, images, masks)`` with a :class:`~capsnets.models.segcaps.SegmentationOutput`
    (``probabilities`` ``(B, K, H, W)``) and ``(B, 1, H, W)`` masks of class indices (0/1 for ``K = 1``). With
    ``K > 1``: per-class binary cross-entropy of the lengths (see the module docstring), or the softmax
    cross-entropy of the logits; the reconstruction target is the image inside every object (class above 0).

    Examples::

        >>> masks = torch.zeros(1, 1, 4, 4, dtype=torch.long)
        >>> masks[..., :2, :2] = 1  # 4 object pixels, 12 background ones
        >>> SegCapsLoss().class_weight(masks).item()
        3.0
    """

    def __init__(
        self, *, pos_weight: float | Literal["balanced"] = "balanced", reconstruction_weight: float = 1.0
    ) -> None:
        super().__init__()
        if pos_weight != "balanced":
            pos_weight = number("pos_weight", pos_weight, 0.0, low_open=True)
        reconstruction_weight = number("reconstruction_weight", reconstruction_weight, 0.0)
        self.pos_weight, self.reconstruction_weight = pos_weight, reconstruction_weight

    def class_weight(self, masks: Tensor) -> Tensor:
        """The weight of the object pixels of ``masks`` (``(B, 1, H, W)`` class indices): ``pos_weight``, or for
        ``"balanced"`` their background pixels over their object pixels (1 without object pixels)."""
        if self.pos_weight != "balanced":
            return torch.tensor(float(self.pos_weight), device=masks.device)
        objects = (masks > 0).sum().double()
        weight = torch.where(objects > 0, (masks.numel() - objects) / objects.clamp(min=1), torch.ones_like(objects))
        return weight.float()

    def forward(self, output, images: Tensor, masks: Tensor):
        classes = output.probabilities.shape[1]
        weight = self.class_weight(masks)
        if classes > 1:
            bce = self._multi_class(output, masks, classes, weight)
        elif getattr(output, "logits", None) is not None:  # the same cross-entropy, without the clamp's dead zone
            bce = binary_segmentation_loss_from_logits(output.logits.float(), masks, pos_weight=weight)
        else:
            bce = binary_segmentation_loss(output.probabilities.float(), masks, pos_weight=weight)
        parts, loss = {"bce": bce.detach()}, bce
        if output.reconstruction is not None and self.reconstruction_weight > 0:
            target = to_float_images(images) * (masks > 0).to(torch.float32)
            recon = self.reconstruction_weight * (output.reconstruction.float() - target).pow(2).mean()
            parts["reconstruction"] = recon.detach()
            loss = loss + recon
        return loss, parts

    def _multi_class(self, output, masks: Tensor, classes: int, pos_weight: Tensor) -> Tensor:
        """The cross-entropy of ``K > 1`` class maps against ``(B, 1, H, W)`` class indices."""
        if masks.dim() != 4 or masks.shape[1] != 1 or masks.shape[2:] != output.probabilities.shape[2:]:
            raise ArgumentError(
                f"masks must be (B, 1, H, W) class indices for probabilities {tuple(output.probabilities.shape)}, "
                f"got {tuple(masks.shape)}"
            )
        truth = masks[:, 0].long()  # (B, H, W)
        if truth.numel() and (truth.min() < 0 or truth.max() >= classes):
            raise ArgumentError(f"mask classes must lie in [0, {classes}), got {truth.min()}..{truth.max()}")
        if getattr(output, "logits", None) is not None:
            weight = pos_weight.to(truth.device).expand(classes).clone()
            weight[0] = 1.0
            return F.cross_entropy(output.logits.float(), truth, weight=weight)
        one_hot = F.one_hot(truth, classes).permute(0, 3, 1, 2)  # (B, K, H, W)
        weight = pos_weight.to(truth.device).expand(1, classes, 1, 1).clone()
        weight[:, 0] = 1.0  # the background's own pixels are not weighted
        probabilities = output.probabilities.float()
        return binary_segmentation_loss(probabilities, one_hot, pos_weight=weight)

    def extra_repr(self) -> str:
        return f"pos_weight={self.pos_weight}, reconstruction_weight={self.reconstruction_weight}"


class CapsuleUNetLoss(nn.Module):
    """The capsule U-Net's loss (after 3D-UCaps, Nguyen et al. 2021): the cross-entropy of the decoder's logits
    (:class:`SegCapsLoss`'s, without its reconstruction term), plus ``margin_weight`` times the margin loss of the
    class capsules' lengths against the fraction of each class in each cell of their coarser grid.

    Args:
        pos_weight: weight of object pixels in the cross-entropy (as :class:`SegCapsLoss`).
        margin_weight: scale of the capsules' margin loss (3D-UCaps' command-line default, 0.1); 0 switches it off.
        m_pos, m_neg, down_weight: the margin loss's ``m+``, ``m-`` and ``lambda`` (:func:`margin_loss`).

    Called as ``criterion(output, images, masks)`` with a :class:`~capsnets.models.segcaps.SegmentationOutput`
    whose ``capsules`` are ``(B, K', D, h, w)`` (``K' = max(K, 2)``: a binary model's background and object) on a
    grid that divides the masks' ``(H, W)``, and ``(B, 1, H, W)`` masks of class indices. Each cell's target for
    class ``k`` is the fraction of its pixels of class ``k`` (3D-UCaps interpolates the one-hot masks down);
    the margin loss is summed over the classes and averaged over the cells.
    """

    def __init__(
        self,
        *,
        pos_weight: float = 1.0,
        margin_weight: float = 0.1,
        m_pos: float = 0.9,
        m_neg: float = 0.1,
        down_weight: float = 0.5,
    ) -> None:
        super().__init__()
        self.cross_entropy = SegCapsLoss(pos_weight=pos_weight, reconstruction_weight=0.0)
        self.margin_weight = number("margin_weight", margin_weight, 0.0)
        self.m_pos, self.m_neg = number("m_pos", m_pos, 0.0, 1.0), number("m_neg", m_neg, 0.0, 1.0)
        self.down_weight = number("down_weight", down_weight, 0.0)

    def forward(self, output, images: Tensor, masks: Tensor):
        loss, parts = self.cross_entropy(output, images, masks)
        if output.capsules is None or self.margin_weight == 0:
            return loss, parts
        capsules = output.capsules.float()  # (B, K', D, h, w)
        classes, grid = capsules.shape[1], capsules.shape[-2:]
        if masks.dim() != 4 or masks.shape[-2] % grid[0] or masks.shape[-1] % grid[1]:
            raise ArgumentError(
                f"masks must be (B, 1, H, W) class indices on a grid that the capsules' {tuple(grid)} divides, "
                f"got {tuple(masks.shape)}"
            )
        one_hot = F.one_hot(masks[:, 0].long(), classes).permute(0, 3, 1, 2).float()  # (B, K', H, W)
        targets = F.adaptive_avg_pool2d(one_hot, grid)  # (B, K', h, w): each class's share of each cell
        lengths = capsules.norm(dim=2)  # (B, K', h, w)
        flat = lengths.permute(0, 2, 3, 1).reshape(-1, classes)
        wanted = targets.permute(0, 2, 3, 1).reshape(-1, classes)
        margin = margin_loss(flat, wanted, m_pos=self.m_pos, m_neg=self.m_neg, down_weight=self.down_weight)
        parts["margin"] = margin.detach()
        return loss + self.margin_weight * margin, parts

    def extra_repr(self) -> str:
        return (
            f"pos_weight={self.cross_entropy.pos_weight}, margin_weight={self.margin_weight}, m_pos={self.m_pos}, "
            f"m_neg={self.m_neg}, down_weight={self.down_weight}"
        )


class TransformingLoss(nn.Module):
    """Transforming auto-encoder loss (Hinton, Krizhevsky & Wang 2011): squared error between the
    predicted and the actual transformed image, summed over pixels, averaged over the batch.

    Called as ``criterion(output, images, targets)`` with an
    :class:`~capsnets.models.transforming.AutoencoderOutput` and the transformed images as ``targets``.
    """

    def forward(self, output, images: Tensor, targets: Tensor):
        if output.reconstruction.shape != targets.shape:
            raise ArgumentError(
                f"reconstruction {tuple(output.reconstruction.shape)} and targets "
                f"{tuple(targets.shape)} differ in shape"
            )
        error = output.reconstruction.float() - to_float_images(targets, name="targets")
        loss = error.pow(2).flatten(1).sum(dim=1).mean()
        return loss, {"squared_error": loss.detach()}


_LOSSES: dict[str, Callable[..., nn.Module]] = {
    "spread": SpreadLoss,
    "margin": MarginLoss,
    "cross_entropy": CrossEntropyLoss,
    "binary_cross_entropy": BinaryCrossEntropyLoss,
    "segcaps": SegCapsLoss,
    "binary_segmentation": functools.partial(SegCapsLoss, pos_weight=1.0, reconstruction_weight=0.0),
    "capsule_unet": CapsuleUNetLoss,
    "transforming": TransformingLoss,
}


#: What each loss takes, by loss name: the task of the models whose outputs it reads (one of
#: :data:`capsnets.models.registry.MODEL_TASKS`).
LOSS_TASKS: dict[str, str] = {
    "spread": "classification",
    "margin": "classification",
    "cross_entropy": "classification",
    "binary_cross_entropy": "classification",
    "segcaps": "segmentation",
    "binary_segmentation": "segmentation",
    "capsule_unet": "segmentation",
    "transforming": "autoencoder",
}


def list_losses(task: str | None = None) -> list[str]:
    """The loss names, or those for models of ``task`` (e.g. ``"classification"``)."""
    return sorted(name for name in _LOSSES if task is None or LOSS_TASKS[name] == task)


def loss_schema(name: str) -> dict[str, Argument]:
    """The keyword arguments loss ``name`` takes, with their defaults and annotations
    (:class:`~capsnets.validation.Argument`; ``expects`` says in words what each takes)."""
    if name not in _LOSSES:
        raise ArgumentError(f"unknown loss {name!r}; known losses: {', '.join(list_losses())}", "name")
    return keyword_arguments(_LOSSES[name])


def create_loss(name: str, **kwargs) -> nn.Module:
    """Build a criterion by name (see :func:`list_losses`); ``kwargs`` go to its constructor, which checks them
    (an :class:`~capsnets.validation.ArgumentError`, a ``ValueError``, that names the argument, what was given
    and what it takes); a name it does not take is refused with the names it takes."""
    reject_unknown(f"loss {name!r}", kwargs, loss_schema(name))
    try:
        return _LOSSES[name](**kwargs)
    except ArgumentError as err:
        raise ArgumentError(f"loss {name!r}: {err}", err.argument) from None
