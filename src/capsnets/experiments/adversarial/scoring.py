"""How the ``adversarial`` experiment scores the attacks: success rates of every (attack, kind, eps, crafted-on,
evaluated-on) combination, and how often an attack loss is flat (Hinton, Sabour & Frosst 2018, Sec. 6).

A success counts only among the test examples that the evaluated model classifies correctly when clean;
targeted attacks use one wrong class per example (:func:`~.attacks.random_wrong_targets`). BIM takes ``steps``
steps of ``2.5 * eps / steps``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from capsnets.experiments.adversarial.attacks import AttackLoss, attack_loss, bim, eval_mode, fgsm, input_gradient

__all__ = ["attack_success", "attack_table", "craft", "zero_gradient_fraction"]


def craft(
    attack: str,
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    eps: float,
    targets: Tensor | None,
    steps: int,
    loss: str = "own",
) -> Tensor:
    """Adversarial images of ``attack`` (``"fgsm"`` or ``"bim"``) on ``model``, crafted with the attack loss
    ``loss`` (:func:`~.attacks.attack_loss`); targeted towards ``targets`` unless it is None."""
    targeted, loss_fn = targets is not None, attack_loss(model, loss)
    if attack == "fgsm":
        return fgsm(model, loss_fn, images, labels, eps, targeted=targeted, target=targets)
    return bim(
        model, loss_fn, images, labels, eps, step_size=2.5 * eps / steps, steps=steps, targeted=targeted, target=targets
    )


@torch.no_grad()
def attack_success(
    model: nn.Module, clean: Tensor, adversarial: Tensor, labels: Tensor, target: Tensor | None = None
) -> tuple[int, int]:
    """Count successful attacks among the examples ``model`` classifies correctly when clean.

    Untargeted (``target is None``): success = the adversarial prediction differs from the label.
    Targeted: success = the adversarial prediction is the target.

    Returns:
        ``(successes, attempts)``; ``attempts`` is the number of correctly classified clean examples.
    """
    with eval_mode(model):
        clean_ok = model(clean).scores.argmax(dim=1) == labels
        predicted = model(adversarial).scores.argmax(dim=1)
    hit = predicted != labels if target is None else predicted == target
    return int((hit & clean_ok).sum()), int(clean_ok.sum())


def zero_gradient_fraction(
    model: nn.Module, loss_fn: AttackLoss | None, images: Tensor, labels: Tensor, batch_size: int = 256
) -> float:
    """Fraction of examples whose input gradient of ``loss_fn`` is exactly zero (the attack cannot move them).

    Examples are independent in eval mode, so the gradient of the batch loss with respect to one image
    is that image's own gradient (up to the batch-mean scale).
    """
    loss_fn = loss_fn if loss_fn is not None else attack_loss(model)
    flat = 0
    with eval_mode(model):
        for first in range(0, len(images), batch_size):
            x, y = images[first : first + batch_size].detach(), labels[first : first + batch_size]
            grad = input_gradient(model, loss_fn, x, y)
            flat += int((grad.flatten(1) == 0).all(dim=1).sum())
    return flat / max(len(images), 1)


def attack_table(
    models: dict[str, nn.Module],
    images: Tensor,
    labels: Tensor,
    wrong: Tensor,
    eps_values: Sequence[float],
    *,
    bim_steps: int,
    batch_size: int = 256,
    loss: str = "own",
) -> list[dict]:
    """Success rates of every (attack, targeted, eps, crafted-on, evaluated-on) combination.

    ``models`` maps names to models; examples crafted on each model are scored on every model
    (itself: white-box; the others: transfer). ``wrong`` holds the targeted attacks' classes.
    ``loss`` is the attack loss kind (:func:`~.attacks.attack_loss`).

    Returns:
        records ``{"loss", "attack", "targeted", "eps", "source", "victim", "successes", "attempts",
        "rate"}``.
    """
    counts: dict[tuple, list[int]] = {}
    for first in range(0, len(images), batch_size):
        x, y, t = (v[first : first + batch_size] for v in (images, labels, wrong))
        for attack in ("fgsm", "bim"):
            for targeted in (False, True):
                for eps in eps_values:
                    for source, crafter in models.items():
                        adv = craft(attack, crafter, x, y, eps, t if targeted else None, bim_steps, loss)
                        for victim, model in models.items():
                            hits, tries = attack_success(model, x, adv, y, t if targeted else None)
                            total = counts.setdefault((attack, targeted, float(eps), source, victim), [0, 0])
                            total[0] += hits
                            total[1] += tries
    keys = ("attack", "targeted", "eps", "source", "victim")
    return [
        {"loss": loss, **dict(zip(keys, key)), "successes": s, "attempts": n, "rate": s / n if n else float("nan")}
        for key, (s, n) in counts.items()
    ]


@torch.no_grad()
def predict(model: nn.Module, images: Tensor) -> Tensor:
    """``(B,)`` the classes ``model`` predicts for ``images``, in eval mode."""
    with eval_mode(model):
        return model(images).scores.argmax(dim=1)
