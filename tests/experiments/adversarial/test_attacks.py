"""FGSM / BIM properties on a small fixed model (no training needed, deterministic)."""

import pytest
import torch
from torch import nn

from capsnets import create_model
from capsnets.experiments.adversarial.attacks import attack_loss, bim, fgsm, random_wrong_targets
from capsnets.experiments.adversarial.scoring import attack_success
from capsnets.models import ModelOutput


class _Linear(nn.Module):
    """A fixed linear classifier on 8x8 images returning logits (cross-entropy attack loss)."""

    default_loss = "cross_entropy"

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(64, 10)
        self.dropout = nn.Dropout(0.5)  # must be off during attacks

    def forward(self, images, labels=None):
        return ModelOutput(self.fc(self.dropout(images.flatten(1))), "logits")


@pytest.fixture(scope="module", params=["linear", "capsnet_digits"])
def model(request):
    torch.manual_seed(0)
    return _Linear() if request.param == "linear" else create_model("capsnet_digits", reconstruction=False)


@pytest.fixture(scope="module")
def batch():
    generator = torch.Generator().manual_seed(1)
    images = torch.rand(16, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 10, (16,), generator=generator)
    return images, labels


def _loss(model, images, labels):
    model.eval()
    with torch.no_grad():
        return attack_loss(model)(model(images), labels).item()


def test_eps_zero_changes_nothing(model, batch):
    images, labels = batch
    target = random_wrong_targets(labels, 10, torch.Generator().manual_seed(0))
    assert torch.equal(fgsm(model, None, images, labels, 0.0), images)
    assert torch.equal(fgsm(model, None, images, labels, 0.0, targeted=True, target=target), images)
    assert torch.equal(bim(model, None, images, labels, 0.0, step_size=0.01, steps=3), images)


@pytest.mark.parametrize("eps", [0.05, 0.2])
def test_untargeted_attacks_raise_the_loss(model, batch, eps):
    images, labels = batch
    clean = _loss(model, images, labels)
    assert _loss(model, fgsm(model, None, images, labels, eps), labels) > clean
    assert _loss(model, bim(model, None, images, labels, eps, step_size=eps / 4, steps=5), labels) > clean


def test_bim_stays_in_its_ball_and_in_unit_range(model, batch):
    images, labels = batch
    eps = 0.1
    adv = bim(model, None, images, labels, eps, step_size=0.06, steps=6)
    assert (adv - images).abs().max() <= eps + 1e-6
    assert adv.min() >= 0 and adv.max() <= 1
    assert (adv - images).abs().max() > eps / 2  # it did move
    fast = fgsm(model, None, images, labels, eps)
    assert (fast - images).abs().max() <= eps + 1e-6 and fast.min() >= 0 and fast.max() <= 1


def test_targeted_attacks_raise_the_target_score(model, batch):
    images, labels = batch
    target = random_wrong_targets(labels, 10, torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        before = model(images).scores.gather(1, target[:, None])
    for adv in (
        fgsm(model, None, images, labels, 0.1, targeted=True, target=target),
        bim(model, None, images, labels, 0.1, step_size=0.03, steps=5, targeted=True, target=target),
    ):
        with torch.no_grad():
            after = model(adv).scores.gather(1, target[:, None])
        assert after.mean() > before.mean()
        assert _loss(model, adv, target) < _loss(model, images, target)


def test_attacks_restore_mode_and_leave_parameter_gradients_alone(batch):
    images, labels = batch
    model = _Linear().train()
    fgsm(model, None, images, labels, 0.1)
    bim(model, None, images, labels, 0.1, step_size=0.05, steps=2)
    assert model.training
    assert all(p.grad is None for p in model.parameters())


def test_custom_loss_and_deterministic(batch):
    images, labels = batch
    model = _Linear()
    calls = []

    def loss_fn(output, classes):
        calls.append(1)
        return torch.nn.functional.cross_entropy(output.scores, classes)

    a = bim(model, loss_fn, images, labels, 0.1, step_size=0.05, steps=3)
    b = bim(model, None, images, labels, 0.1, step_size=0.05, steps=3)
    assert len(calls) == 3 and torch.equal(a, b)


def test_random_wrong_targets_and_success_counts(batch):
    _, labels = batch
    target = random_wrong_targets(labels, 10, torch.Generator().manual_seed(0))
    assert (target != labels).all() and target.min() >= 0 and target.max() < 10
    images = batch[0]
    model = _Linear()
    hits, tries = attack_success(model, images, images, labels)
    assert hits == 0 and 0 <= tries <= len(labels)


def test_bad_arguments(batch):
    images, labels = batch
    model = _Linear()
    with pytest.raises(ValueError, match="eps"):
        fgsm(model, None, images, labels, -0.1)
    with pytest.raises(ValueError, match="target"):
        fgsm(model, None, images, labels, 0.1, targeted=True)
    with pytest.raises(ValueError, match="steps"):
        bim(model, None, images, labels, 0.1, step_size=0.01, steps=0)
    model.default_loss = "unknown"
    with pytest.raises(ValueError, match="loss_fn"):
        fgsm(model, None, images, labels, 0.1)


def test_margin_loss_is_flat_where_cross_entropy_is_not():
    """A confidently right capsule model: every margin-loss hinge is off, so FGSM on it does nothing."""
    from capsnets.experiments.adversarial.attacks import ATTACK_LOSSES
    from capsnets.experiments.adversarial.scoring import zero_gradient_fraction

    class Confident(torch.nn.Module):
        default_loss = "margin"

        def forward(self, images, labels=None):
            lengths = torch.sigmoid(20 * (images.flatten(1)[:, :3] - 0.5)) * 0.98  # (B, 3) in (0, 0.98)
            return ModelOutput(scores=lengths)

    model = Confident()
    images = torch.zeros(4, 1, 2, 2)
    images[:, 0, 0, 0] = 1.0  # class 0 at length ~0.98, the others ~0
    labels = torch.zeros(4, dtype=torch.long)
    assert zero_gradient_fraction(model, attack_loss(model, "own"), images, labels) == 1.0
    assert torch.equal(fgsm(model, attack_loss(model, "own"), images, labels, 0.3), images)
    assert zero_gradient_fraction(model, attack_loss(model, "cross_entropy"), images, labels) == 0.0
    assert not torch.equal(fgsm(model, attack_loss(model, "cross_entropy"), images, labels, 0.3), images)
    assert set(ATTACK_LOSSES) == {"own", "cross_entropy"}
    with pytest.raises(ValueError, match="attack loss kind"):
        attack_loss(model, "hinge")
