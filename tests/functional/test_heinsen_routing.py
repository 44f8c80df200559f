import pytest
import torch
from torch.autograd import gradcheck

from capsnets.functional import HeinsenRouting, heinsen_routing, routing_config, routing_from_config
from capsnets.layers import HeinsenCapsules
from capsnets.testing import reference_heinsen_routing
from capsnets.validation import ArgumentError


def _problem(batch, children, parents, dim, shared=False, dtype=torch.float64, gen=None):
    rows = 1 if shared else children
    return (
        torch.randn(batch, children, parents, dim, dtype=dtype, generator=gen),
        torch.randn(batch, children, dtype=dtype, generator=gen) * 2,
        torch.randn(rows, parents, dtype=dtype, generator=gen),
        torch.randn(rows, parents, dtype=dtype, generator=gen),
    )


@pytest.mark.parametrize("iterations", [1, 2, 3])
@pytest.mark.parametrize("shared", [False, True])
def test_agrees_with_literal_algorithm_1(iterations, shared):
    gen = torch.Generator().manual_seed(iterations)
    for _ in range(3):
        batch, children, parents, dim = (int(x) for x in torch.randint(1, 6, (4,), generator=gen))
        problem = _problem(batch, children, parents, dim, shared, gen=gen)
        out = heinsen_routing(*problem, iterations=iterations)
        expected = reference_heinsen_routing(*problem, iterations=iterations)
        for got, want in zip(out, expected):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        out32 = heinsen_routing(*(t.float() for t in problem), iterations=iterations)
        torch.testing.assert_close(out32.scores, expected[0].float(), rtol=1e-4, atol=1e-4)


def test_first_iteration_splits_each_child_evenly():
    u_hat, a, beta_use, beta_ign = _problem(2, 5, 3, 4)
    out = heinsen_routing(u_hat, a, beta_use, beta_ign, iterations=1)
    f = torch.sigmoid(a).unsqueeze(-1)
    expected = (beta_use * f / 3).sum(1) - (beta_ign * f * 2 / 3).sum(1)
    torch.testing.assert_close(out.scores, expected)
    torch.testing.assert_close(out.couplings, torch.full((2, 5, 3), 1 / 3, dtype=torch.float64))
    weights = f.unsqueeze(-1) / 3  # (B, I, 1, 1): each child's data, a third to each parent
    torch.testing.assert_close(out.mu, (weights * u_hat).sum(1) / (weights.sum(1) + 1e-5))


def test_couplings_sum_to_one_over_parents():
    out = heinsen_routing(*_problem(3, 7, 4, 6))
    torch.testing.assert_close(out.couplings.sum(-1), torch.ones(3, 7, dtype=torch.float64))


def test_gradcheck():
    tensors = [t.requires_grad_() for t in _problem(2, 4, 3, 3)]
    assert gradcheck(lambda *t: tuple(heinsen_routing(*t, iterations=3)[:3]), tensors)


def test_float16_votes_route_in_float32():
    u_hat, a, bu, bi = _problem(2, 4, 3, 4, dtype=torch.float32)
    out = heinsen_routing(u_hat.half(), a.half(), bu.half(), bi.half())
    assert out.scores.dtype == torch.float16 and torch.isfinite(out.sigma2).all()


def test_bad_shapes_and_settings_are_named():
    u_hat, a, bu, bi = _problem(2, 4, 3, 4)
    with pytest.raises(ValueError, match=r"activations of shape \(2, 4\)"):
        heinsen_routing(u_hat, a[:, :3], bu, bi)
    with pytest.raises(ValueError, match=r"beta_ign of shape \(4, 3\) or \(1, 3\)"):
        heinsen_routing(u_hat, a, bu, bi[:2])
    with pytest.raises(ValueError, match=r"parent capsules \(J >= 1\)"):
        heinsen_routing(u_hat[:, :, :0], a, bu[:, :0], bi[:, :0])
    with pytest.raises(ArgumentError, match="iterations"):
        HeinsenRouting(iterations=0)
    with pytest.raises(ArgumentError, match="eps"):
        HeinsenRouting(eps=0.0)
    with pytest.raises(ValueError, match="give it to a layer"):
        HeinsenRouting()(u_hat, activations=a)


def test_spec_round_trip():
    routing = HeinsenRouting(iterations=2, eps=1e-4)
    assert routing_from_config(routing_config(routing)) == routing
    assert routing_config(routing.build(4, 16, 3, 16)) == routing.to_config()


@pytest.mark.parametrize("shared", [False, True])
def test_layer_votes_are_pose_times_weight_plus_bias(shared):
    torch.manual_seed(0)
    layer = HeinsenCapsules(None if shared else 6, 3, 2, 4, 5, routing={"type": "heinsen", "iterations": 2}).double()
    with torch.no_grad():
        layer.bias.normal_()
    poses, scores = torch.randn(2, 6, 2, 4, dtype=torch.float64), torch.randn(2, 6, dtype=torch.float64)
    w, b = layer.weight.expand(6, -1, -1, -1), layer.bias.expand(6, -1, -1, -1)
    votes = torch.stack([torch.stack([poses[:, i] @ w[i, j] + b[i, j] for j in range(3)], 1) for i in range(6)], 1)
    torch.testing.assert_close(layer.votes(poses), votes.flatten(-2))
    out = layer(scores, poses)
    expected = heinsen_routing(votes.flatten(-2), scores, layer.routing.beta_use, layer.routing.beta_ign, iterations=2)
    torch.testing.assert_close(out.mu, expected.mu.view(2, 3, 2, 5))
    assert out.scores.shape == (2, 3) and layer.routing.beta_use.shape == (1 if shared else 6, 3)
    with pytest.raises(ValueError, match=r"poses of shape \(B, .*, 2, 4\)"):
        layer(scores, poses[..., :3])
