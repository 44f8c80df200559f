import pytest
import torch

from capsnets.losses import create_loss, margin_loss, reconstruction_loss
from capsnets.models import ModelOutput


def test_margin_loss_hand_computed():
    lengths = torch.tensor([[0.95, 0.3, 0.05], [0.5, 0.2, 0.8]])
    targets = torch.tensor([0, 2])
    # ex 0: present 0 (0.95 > 0.9); absent: 0.5*(0.2^2) + 0 = 0.02
    # ex 1: present (0.9-0.8)^2 = 0.01; absent 0.5*(0.4^2 + 0.1^2) = 0.085
    expected = (0.02 + 0.01 + 0.085) / 2
    torch.testing.assert_close(margin_loss(lengths, targets), torch.tensor(expected))


def test_margin_loss_several_targets():
    lengths = torch.tensor([[0.6, 0.7, 0.2]])
    multi = torch.tensor([[1.0, 1.0, 0.0]])
    expected = 0.3**2 + 0.2**2 + 0.5 * 0.1**2
    torch.testing.assert_close(margin_loss(lengths, multi), torch.tensor(expected))


def test_reconstruction_loss_hand_computed():
    recon = torch.zeros(2, 1, 2, 2)
    images = torch.tensor([[[[1.0, 0.0], [0.5, 0.0]]], [[[0.0, 0.0], [0.0, 2.0]]]])
    # sums of squares: 1.25 and 4.0 -> mean 2.625
    torch.testing.assert_close(reconstruction_loss(recon, images), torch.tensor(0.0005 * 2.625))
    torch.testing.assert_close(reconstruction_loss(recon, images, weight=1.0), torch.tensor(2.625))


def test_criterion_from_registry_combines_terms():
    lengths = torch.tensor([[0.95, 0.3]])
    out = ModelOutput(lengths, "length", reconstruction=torch.ones(1, 1, 2, 2))
    loss, parts = create_loss("margin")(out, torch.zeros(1, 1, 2, 2), torch.tensor([0]))
    torch.testing.assert_close(loss, torch.tensor(0.5 * 0.2**2 + 0.0005 * 4))
    assert set(parts) == {"margin", "reconstruction"}
    no_reconstruction = create_loss("margin", reconstruction_weight=0)
    loss_off, parts_off = no_reconstruction(out, torch.zeros(1, 1, 2, 2), torch.tensor([0]))
    assert set(parts_off) == {"margin"}


def test_bad_loss_arguments():
    with pytest.raises(ValueError, match="unknown loss"):
        create_loss("nope")
    with pytest.raises(
        ValueError, match=r"loss 'margin' does not take margin( \(did you mean .*\))?; it takes: down_weight, m_neg"
    ):
        create_loss("margin", margin=3)
    with pytest.raises(ValueError, match=r"m_pos must be a number in \[0, 1\], got '0.9'"):
        create_loss("margin", m_pos="0.9")
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        margin_loss(torch.rand(2, 3), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="shape"):
        reconstruction_loss(torch.rand(2, 4), torch.rand(2, 5))


def test_spread_loss_hand_computed():
    from capsnets.losses import spread_loss

    acts = torch.tensor([[0.9, 0.5, 0.1], [0.2, 0.3, 0.6]])
    targets = torch.tensor([0, 1])
    # ex 0, m = 0.5: (0.5 - 0.4)^2 + max(0, 0.5 - 0.8)^2 = 0.01; ex 1: (0.5 - 0.1)^2 + (0.5 + 0.3)^2 = 0.8
    torch.testing.assert_close(spread_loss(acts, targets, 0.5), torch.tensor((0.01 + 0.8) / 2))


def test_spread_margin_schedule():
    loss = create_loss("spread")
    assert loss.margin == pytest.approx(0.2)
    loss.set_progress(0.25, 4)
    assert loss.margin == pytest.approx(0.55)  # half-way through the ramp (half of training)
    loss.set_progress(0.9, 4)
    assert loss.margin == pytest.approx(0.9)
    full = create_loss("spread", ramp=1.0, margin_start=0.1, margin_end=0.5)
    full.set_progress(0.5, 4)
    assert full.margin == pytest.approx(0.3)
    with pytest.raises(ValueError, match="ramp"):
        create_loss("spread", ramp=0)


def test_spread_margin_ramp_in_epochs():
    """yl-1993's schedule: 0.2 to 0.9 over 10 epochs, whatever the training's length."""
    loss = create_loss("spread", ramp_epochs=10)
    loss.set_progress(0.5, 2)  # one epoch done
    assert loss.margin == pytest.approx(0.27)
    loss.set_progress(0.5, 40)  # twenty epochs done
    assert loss.margin == pytest.approx(0.9)
    with pytest.raises(ValueError, match="ramp_epochs"):
        create_loss("spread", ramp_epochs=0)
    with pytest.raises(ValueError, match="not both.*ramp_epochs=null"):
        create_loss("spread", ramp=0.5, ramp_epochs=10)


def test_segcaps_loss_weighs_object_pixels_by_the_batchs_background_to_object_ratio():
    from capsnets.models.segcaps import SegmentationOutput

    masks = torch.zeros(2, 1, 4, 4, dtype=torch.long)
    masks[0, 0, :2, :2] = 1  # 4 object pixels
    masks[1, 0, 0, :2] = 2  # 2 more: 6 object pixels, 26 background ones
    balanced = create_loss("segcaps")
    assert balanced.pos_weight == "balanced" and balanced.class_weight(masks).item() == pytest.approx(26 / 6)
    assert balanced.class_weight(torch.zeros(1, 1, 4, 4)).item() == 1.0  # no object pixels: no weighting
    assert create_loss("binary_segmentation").pos_weight == 1.0  # U-Net's loss keeps the plain cross-entropy
    probabilities = torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    output = SegmentationOutput(probabilities)
    given = create_loss("segcaps", pos_weight=26 / 6)
    torch.testing.assert_close(balanced(output, None, masks)[0], given(output, None, masks)[0])
