"""Every routing layer returns its couplings (EM routing's assignments) through ``return_couplings=True``: the
output it returns without, and one coupling per child and parent, summing to 1 over the parents where the routing
normalises them so."""

import pytest
import torch

from capsnets.functional import VECTOR_ROUTING_TYPES, EMRouting, em_routing
from capsnets.layers import (
    ClassMatrixCapsules,
    ConvCapsules2d,
    ConvMatrixCapsules,
    ConvTransposeCapsules2d,
    HeinsenCapsules,
    HomogeneousVectorCapsules,
    LinearCapsules,
    MatrixCapsules,
)


def _same(with_couplings, without) -> None:
    """The output returned with the couplings is the one returned without them."""
    if isinstance(without, MatrixCapsules):
        torch.testing.assert_close(with_couplings.pose, without.pose)
        torch.testing.assert_close(with_couplings.activation, without.activation)
    elif isinstance(without, tuple):
        for got, expected in zip(with_couplings, without, strict=True):
            torch.testing.assert_close(got, expected)
    else:
        torch.testing.assert_close(with_couplings, without)


def _sums_to_one(couplings, dim) -> None:
    total = couplings.sum(dim)
    torch.testing.assert_close(total, torch.ones_like(total))


@pytest.mark.parametrize("routing", VECTOR_ROUTING_TYPES)
def test_linear_capsules_return_couplings_over_the_parents(routing):
    torch.manual_seed(0)
    layer, u = LinearCapsules(6, 4, 3, 5, routing=routing), torch.randn(2, 6, 4)
    v, couplings = layer(u, return_couplings=True)
    _same(v, layer(u))
    assert couplings.shape == (2, 6, 3)
    _sums_to_one(couplings, -1)


@pytest.mark.parametrize("layer_type", [ConvCapsules2d, ConvTransposeCapsules2d])
@pytest.mark.parametrize("routing", ["dynamic", "self_attention", "uniform"])
def test_grid_capsules_return_couplings_at_every_position(layer_type, routing):
    torch.manual_seed(0)
    layer, u = layer_type(2, 4, 3, 5, routing=routing), torch.randn(2, 2, 4, 6, 6)
    v, couplings = layer(u, return_couplings=True)
    _same(v, layer(u))
    assert couplings.shape == (2, 2, 3, *v.shape[-2:])  # (B, I, J, H', W')
    _sums_to_one(couplings, 2)


@pytest.mark.parametrize(("scope", "chunks"), [("position", 0), ("position", 3), ("all_parents", 0), ("per_type", 0)])
def test_conv_matrix_capsules_return_their_assignments(scope, chunks):
    torch.manual_seed(0)
    layer = ConvMatrixCapsules(
        3, 4, kernel_size=3, stride=2, routing=EMRouting(2), assignment_scope=scope, checkpoint_chunks=chunks
    )
    caps = MatrixCapsules(torch.randn(2, 3, 7, 7, 4, 4, requires_grad=True), torch.rand(2, 3, 7, 7))
    parents, assignments = layer(caps, return_couplings=True)  # chunks: the checkpointed path (grad enabled)
    _same(parents, layer(caps))
    assert assignments.shape == (2, 3, 3, 3, 4, 3, 3)  # (B, T, K, K, U, H', W')
    assert bool((assignments >= 0).all())
    if scope == "position":  # each position's routing problem on its own: over the parent types there
        _sums_to_one(assignments, 4)
    elif scope == "all_parents":  # a corner child, seen by one position only: over the parent types there
        _sums_to_one(assignments[:, :, 0, 0, :, 0, 0], -1)
    parents.activation.sum().backward()  # the assignments do not stop the gradients
    assert caps.pose.grad is not None


def test_matrix_layers_return_the_assignments_of_a_routing_of_votes():
    """A routing other than EMRouting is called with ``return_assignments=True``: here EM routing of the votes, which
    the layers' fused path must agree with."""
    torch.manual_seed(0)

    def of_votes(votes, activations, beta_v, beta_a, **options):
        return em_routing(votes, activations, beta_v, beta_a, 2, **options)

    caps = MatrixCapsules(torch.randn(2, 3, 5, 5, 4, 4), torch.rand(2, 3, 5, 5))
    fused = ConvMatrixCapsules(3, 4, routing=EMRouting(2))
    votes = ConvMatrixCapsules(3, 4, routing=of_votes)
    votes.load_state_dict(fused.state_dict())
    torch.testing.assert_close(votes(caps, return_couplings=True)[1], fused(caps, return_couplings=True)[1])
    fused_class = ClassMatrixCapsules(3, 6, routing=EMRouting(2))
    votes_class = ClassMatrixCapsules(3, 6, routing=of_votes)
    votes_class.load_state_dict(fused_class.state_dict())
    got, expected = votes_class(caps, return_couplings=True)[1], fused_class(caps, return_couplings=True)[1]
    torch.testing.assert_close(got, expected)


def test_class_matrix_capsules_return_each_childs_assignments_to_the_classes():
    torch.manual_seed(0)
    layer = ClassMatrixCapsules(3, 6, routing=EMRouting(2), coordinate_addition=False, dtype=torch.float64)
    caps = MatrixCapsules(torch.randn(2, 3, 4, 5, 4, 4, dtype=torch.float64), torch.rand(2, 3, 4, 5).double())
    classes, assignments = layer(caps, return_couplings=True)
    _same(classes, layer(caps))
    assert assignments.shape == (2, 3, 4, 5, 6)  # (B, T, H, W, J)
    _sums_to_one(assignments, -1)
    # by hand: the votes of child (t, h, w) for class j, M W[t, j], routed by EM; assignments put back as (T, H, W)
    votes = torch.einsum("bthwik,tjkl->bthwjil", caps.pose, layer.weight).reshape(2, 60, 6, 16)
    _, _, expected = em_routing(
        votes, caps.activation.reshape(2, 60), layer.beta_v, layer.beta_a, 2, return_assignments=True
    )
    torch.testing.assert_close(assignments, expected.view(2, 3, 4, 5, 6))


def test_heinsen_capsules_return_their_couplings():
    torch.manual_seed(0)
    layer = HeinsenCapsules(None, 3, 4, 4, 4)
    scores, poses = torch.randn(2, 7), torch.randn(2, 7, 4, 4)
    out, couplings = layer(scores, poses, return_couplings=True)
    _same(out, layer(scores, poses))
    assert couplings.shape == (2, 7, 3) and couplings is out.couplings
    _sums_to_one(couplings, -1)


def test_homogeneous_capsules_couple_every_child_wholly_to_every_parent():
    torch.manual_seed(0)
    layer, u = HomogeneousVectorCapsules(5, 4, 3).eval(), torch.randn(2, 5, 4)
    v, couplings = layer(u, return_couplings=True)
    _same(v, layer(u))
    assert couplings.shape == (2, 5, 3) and bool((couplings == 1).all())  # no routing: no normalisation
