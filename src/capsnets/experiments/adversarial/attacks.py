"""Gradient-sign adversarial attacks: FGSM and BIM, untargeted and targeted.

- FGSM: Goodfellow, Shlens & Szegedy (2015), "Explaining and Harnessing Adversarial Examples", Eq. 3:
  ``x' = clip(x + eps * sign(grad_x L(x, y)))``.
- BIM (basic iterative method): Kurakin, Goodfellow & Bengio (2017), "Adversarial examples in the
  physical world", Sec. 2.2: FGSM steps of ``step_size``, each followed by projection onto the L-inf
  ball of radius ``eps`` around the original image and onto ``[0, 1]``.
- Targeted versions (Kurakin et al., Sec. 2.3, "iterative least-likely class" generalised to any
  target): step *down* the loss of the target class, ``x' = x - eps * sign(grad_x L(x, target))``.
- Capsule context: Hinton, Sabour & Frosst (2018), "Matrix capsules with EM routing", Sec. 6, attack capsules
  and a CNN with both methods. The loss crafted on (:func:`attack_loss`) is either each model's own training
  loss on its scores (``"own"``: margin loss on capsule lengths, cross-entropy on CNN logits, spread loss on
  matrix-capsule activations; the reconstruction term is left out, an attacker targets the class) or the
  cross-entropy of the scores for every model (``"cross_entropy"``).
- Gradient masking: the margin and spread losses are exactly flat for a confidently classified
  example (every hinge inactive), so their input gradient is zero and a sign-gradient attack leaves
  that example unchanged: robustness that is only an absent gradient. Cross-entropy of the scores is
  never flat (for capsules the scores are lengths or activations in [0, 1], so the softmax cannot
  saturate). :func:`~capsnets.experiments.adversarial.scoring.zero_gradient_fraction` measures how often an attack
  loss is flat.

All functions are pure: batched, on the images' device, the model put in ``eval`` mode for the
attack and restored afterwards, no parameter gradients accumulated, inputs assumed in ``[0, 1]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from capsnets.losses import margin_loss, spread_loss
from capsnets.models.output import ModelOutput

__all__ = [
    "AttackLoss",
    "ATTACK_LOSSES",
    "attack_loss",
    "fgsm",
    "bim",
    "random_wrong_targets",
    "eval_mode",
    "input_gradient",
]

#: ``loss_fn(output, labels) -> scalar``: what the attacks raise (untargeted) or lower (targeted).
AttackLoss = Callable[[ModelOutput, Tensor], Tensor]


def _margin(output: ModelOutput, labels: Tensor) -> Tensor:
    return margin_loss(output.scores.float(), labels)


def _cross_entropy(output: ModelOutput, labels: Tensor) -> Tensor:
    return F.cross_entropy(output.scores.float(), labels)


def _spread(output: ModelOutput, labels: Tensor) -> Tensor:
    return spread_loss(output.scores.float(), labels, margin=0.9)  # the final margin of training


_BY_LOSS_NAME: dict[str, AttackLoss] = {"margin": _margin, "cross_entropy": _cross_entropy, "spread": _spread}
#: What :func:`attack_loss` can craft with.
ATTACK_LOSSES = ("own", "cross_entropy")


def attack_loss(model: nn.Module, kind: str = "own") -> AttackLoss:
    """The loss an attack on ``model`` crafts with, applied to its scores only.

    ``kind="own"``: the model's ``default_loss``: ``"margin"`` (vector capsules) -> margin loss of the
    lengths, ``"cross_entropy"`` (CNNs) -> cross-entropy of the logits, ``"spread"`` (matrix capsules)
    -> spread loss with margin 0.9. ``kind="cross_entropy"``: cross-entropy of the scores, whatever the
    model (never flat; see the module docstring on gradient masking).
    """
    if kind not in ATTACK_LOSSES:
        raise ValueError(f"attack loss kind must be one of {ATTACK_LOSSES}, got {kind!r}")
    if kind == "cross_entropy":
        return _cross_entropy
    name = getattr(model, "default_loss", None)
    if name not in _BY_LOSS_NAME:
        raise ValueError(
            f"no attack loss for a model whose default_loss is {name!r}; pass loss_fn "
            f"explicitly (known: {', '.join(sorted(_BY_LOSS_NAME))})"
        )
    return _BY_LOSS_NAME[name]


def _check(images: Tensor, labels: Tensor, eps: float, targeted: bool, target: Tensor | None) -> Tensor:
    """Validate the common arguments; return the class indices the loss is computed against."""
    if images.dim() != 4:
        raise ValueError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
    if labels.shape != images.shape[:1]:
        raise ValueError(f"labels must be ({images.shape[0]},), got {tuple(labels.shape)}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if not targeted:
        if target is not None:
            raise ValueError("target is only used with targeted=True")
        return labels
    if target is None:
        raise ValueError("targeted=True needs target, (B,) class indices (see random_wrong_targets)")
    if target.shape != labels.shape:
        raise ValueError(f"target must be ({labels.shape[0]},), got {tuple(target.shape)}")
    return target.to(labels.device)


def input_gradient(model: nn.Module, loss_fn: AttackLoss, images: Tensor, classes: Tensor) -> Tensor:
    """``d loss_fn(model(images), classes) / d images`` without touching parameter gradients."""
    images = images.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = loss_fn(model(images), classes)
        (grad,) = torch.autograd.grad(loss, images)
    return grad


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model.eval()`` inside the block, its previous train/eval mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def _step(images: Tensor, grad: Tensor, size: float, targeted: bool) -> Tensor:
    direction = -grad.sign() if targeted else grad.sign()
    return images + size * direction


def fgsm(
    model: nn.Module,
    loss_fn: AttackLoss | None,
    images: Tensor,
    labels: Tensor,
    eps: float,
    *,
    targeted: bool = False,
    target: Tensor | None = None,
) -> Tensor:
    """Fast gradient sign method: one step of size ``eps`` along the sign of the input gradient.

    Args:
        model: returns a :class:`~capsnets.models.output.ModelOutput`; run in eval mode.
        loss_fn: ``(output, classes) -> scalar``; ``None``: :func:`attack_loss` of ``model``.
        images: clean inputs in ``[0, 1]``.
        labels: their true classes.
        eps: the L-inf size of the perturbation (``0`` returns the images unchanged).
        targeted: lower the loss of ``target`` instead of raising the loss of ``labels``.
        target: the classes to push towards, needed when ``targeted``.

    Shape:
        images ``(B, C, H, W)``, labels and target ``(B,)`` -> adversarial images ``(B, C, H, W)``,
        detached, in ``[0, 1]`` and within ``eps`` of ``images``.
    """
    classes = _check(images, labels, eps, targeted, target)
    loss_fn = loss_fn if loss_fn is not None else attack_loss(model)
    images = images.detach()
    if eps == 0:
        return images.clone()
    with eval_mode(model):
        grad = input_gradient(model, loss_fn, images, classes)
    return _step(images, grad, eps, targeted).clamp(0.0, 1.0)


def bim(
    model: nn.Module,
    loss_fn: AttackLoss | None,
    images: Tensor,
    labels: Tensor,
    eps: float,
    *,
    step_size: float,
    steps: int,
    targeted: bool = False,
    target: Tensor | None = None,
) -> Tensor:
    """Basic iterative method: ``steps`` FGSM steps of ``step_size``, projected after each step.

    The projection clips to ``[images - eps, images + eps]`` and then to ``[0, 1]``. Kurakin et al.
    use ``step_size = 1/255`` and ``steps = min(255 * eps + 4, 1.25 * 255 * eps)``; a common cheaper
    choice is ``steps = 10``, ``step_size = 2.5 * eps / steps``.

    Args:
        model, loss_fn, images, labels, eps, targeted, target: as :func:`fgsm`.
        step_size: the L-inf size of each step (> 0).
        steps: number of steps (>= 1).

    Shape:
        as :func:`fgsm`.
    """
    classes = _check(images, labels, eps, targeted, target)
    if not step_size > 0:
        raise ValueError(f"step_size must be > 0, got {step_size}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    loss_fn = loss_fn if loss_fn is not None else attack_loss(model)
    original = images.detach()
    if eps == 0:
        return original.clone()
    low, high = (original - eps).clamp(min=0.0), (original + eps).clamp(max=1.0)
    adversarial = original.clone()
    with eval_mode(model):
        for _ in range(steps):
            grad = input_gradient(model, loss_fn, adversarial, classes)
            adversarial = torch.maximum(torch.minimum(_step(adversarial, grad, step_size, targeted), high), low)
    return adversarial.detach()


def random_wrong_targets(labels: Tensor, num_classes: int, generator: torch.Generator | None = None) -> Tensor:
    """A uniformly random class different from each label (for targeted attacks).

    ``generator`` is drawn from on its own device (a CPU generator is fine for CUDA labels).

    Shape:
        labels ``(B,)`` -> ``(B,)`` on the labels' device, ``out != labels`` everywhere.
    """
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2 for a wrong target, got {num_classes}")
    device = generator.device if generator is not None else labels.device
    offset = torch.randint(1, num_classes, labels.shape, generator=generator, device=device)
    return (labels + offset.to(labels.device)) % num_classes
