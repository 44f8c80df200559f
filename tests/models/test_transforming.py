"""Transforming auto-encoder (Hinton, Krizhevsky & Wang 2011): the known shift is applied to every capsule's
pose, shapes, gradients, training pairs and bad inputs."""

import pytest
import torch

import capsnets
from capsnets.data import shift_pairs
from capsnets.losses import create_loss


def test_registered_with_the_paper_sizes():
    assert capsnets.list_models(task="autoencoder") == ["transforming_autoencoder"]
    model = capsnets.create_model("transforming_autoencoder")
    assert model.num_capsules == 30 and model.recognition.out_features == 300
    assert model.generation_out.shape == (30, 20, 784)
    assert capsnets.count_parameters(model) == 709_474


def test_the_shift_moves_every_pose_before_generation():
    torch.manual_seed(0)
    model = capsnets.create_model("transforming_autoencoder", capsules=4, dtype=torch.float64)
    images = torch.rand(3, 1, 28, 28, dtype=torch.float64)
    shifts = torch.tensor([[1, -2], [0, 0], [2, 1]])
    out = model(images, shifts)
    probabilities, poses = model.encode(images)
    torch.testing.assert_close(out.poses, poses)
    torch.testing.assert_close(out.reconstruction, model.decode(probabilities, poses + shifts.double().unsqueeze(1)))
    assert not torch.allclose(out.reconstruction[0], model(images, torch.zeros(3, 2)).reconstruction[0])
    assert out.reconstruction.shape == images.shape and out.probabilities.shape == (3, 4)
    assert ((out.reconstruction >= 0) & (out.reconstruction <= 1)).all()


def test_an_absent_capsule_contributes_nothing():
    torch.manual_seed(0)
    model = capsnets.create_model("transforming_autoencoder", capsules=3)
    poses = torch.randn(2, 3, 2)
    probabilities = torch.tensor([[1.0, 0.0, 0.5], [1.0, 0.0, 0.5]])
    moved = poses.clone()
    moved[:, 1] += 5.0  # capsule 1 is absent: its pose does not matter
    torch.testing.assert_close(model.decode(probabilities, poses), model.decode(probabilities, moved))


def test_every_parameter_gets_a_gradient_from_the_loss():
    torch.manual_seed(0)
    model = capsnets.create_model("transforming_autoencoder")
    images = torch.rand(5, 1, 28, 28)
    shifts, targets = shift_pairs(images, 2, torch.Generator().manual_seed(0))
    loss, parts = create_loss(model.default_loss)(model(images, shifts), images, targets)
    loss.backward()
    assert set(parts) == {"squared_error"}
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_shift_pairs_shift_columns_by_dx_and_rows_by_dy():
    images = torch.zeros(2, 1, 6, 6)
    images[:, 0, 2, 3] = 1.0
    shifts, shifted = shift_pairs(images, 2, torch.Generator().manual_seed(5))
    assert shifts.shape == (2, 2) and shifts.abs().max() <= 2
    for b in range(2):
        dx, dy = shifts[b].tolist()
        assert shifted[b, 0, 2 + dy, 3 + dx] == 1.0 and shifted[b].sum() == 1.0


def test_bad_inputs_are_explained():
    model = capsnets.create_model("transforming_autoencoder")
    with pytest.raises(ValueError, match=r"\(B, 1, 28, 28\), got \(2, 1, 32, 32\)"):
        model(torch.rand(2, 1, 32, 32), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"shifts must be \(B, 2\) = \(2, 2\)"):
        model(torch.rand(2, 1, 28, 28), torch.zeros(2))
    with pytest.raises(ValueError, match="capsules must be a positive integer"):
        capsnets.create_model("transforming_autoencoder", capsules=0)
