import pytest
import torch
from torch.autograd import gradcheck

from capsnets.functional import SelfRouting, capsule_length, routing_config, routing_from_config, self_routing
from capsnets.layers import LinearCapsules
from capsnets.layers.conv import ConvCapsules2d
from capsnets.testing import reference_self_routing


def _problem(batch, children, parents, dim, in_dim, dtype=torch.float64, gen=None):
    return (
        torch.randn(batch, children, parents, dim, dtype=dtype, generator=gen),
        torch.randn(batch, children, in_dim, dtype=dtype, generator=gen),
        torch.randn(children, parents, in_dim, dtype=dtype, generator=gen),
        torch.randn(children, parents, dtype=dtype, generator=gen),
    )


@pytest.mark.parametrize("given_activations", [False, True])
def test_agrees_with_literal_reference(given_activations):
    gen = torch.Generator().manual_seed(2)
    for _ in range(4):
        sizes = [int(x) for x in torch.randint(1, 7, (5,), generator=gen)]
        u_hat, poses, weight, bias = _problem(*sizes, gen=gen)
        act = torch.rand(sizes[0], sizes[1], dtype=torch.float64, generator=gen) if given_activations else None
        v, c = self_routing(u_hat, poses, weight, bias, activations=act, return_couplings=True)
        v_ref, c_ref = reference_self_routing(u_hat, poses, weight, bias, act)
        torch.testing.assert_close(v, v_ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(c, c_ref, rtol=0, atol=1e-12)
        f32 = [t.float() for t in (u_hat, poses, weight, bias)]
        v32 = self_routing(*f32, activations=None if act is None else act.float())
        torch.testing.assert_close(v32, v_ref.float(), rtol=1e-5, atol=1e-5)


def test_parent_length_is_its_activation():
    u_hat, poses, weight, bias = _problem(3, 8, 4, 5, 6)
    v = self_routing(u_hat, poses, weight, bias)
    c = torch.softmax(torch.einsum("bic,ijc->bij", poses, weight) + bias, dim=2)
    a = capsule_length(poses)
    expected = (c * a.unsqueeze(-1)).sum(1) / a.sum(1, keepdim=True)
    torch.testing.assert_close(capsule_length(v), expected)
    assert (capsule_length(v) <= 1 + 1e-12).all()


def test_gradcheck():
    tensors = [t.requires_grad_() for t in _problem(2, 4, 3, 4, 3)]
    assert gradcheck(lambda u, p, w, b: self_routing(u, p, w, b), tensors)
    act = torch.rand(2, 4, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda u, a: self_routing(u, tensors[1], tensors[2], tensors[3], activations=a), (tensors[0], act))


def test_edge_cases_are_finite():
    weight, bias = torch.randn(4, 3, 6), torch.randn(4, 3)
    zeros, poses = torch.zeros(2, 4, 3, 5, requires_grad=True), torch.zeros(2, 4, 6, requires_grad=True)
    v = self_routing(zeros, poses, weight, bias)
    v.sum().backward()
    assert torch.isfinite(v).all() and (v == 0).all()
    assert torch.isfinite(zeros.grad).all() and torch.isfinite(poses.grad).all()
    v = self_routing(torch.randn(2, 4, 3, 5), poses, weight, bias, activations=torch.zeros(2, 4))  # all inactive
    assert torch.isfinite(v).all() and (v == 0).all()
    huge, huge_poses = torch.full((2, 4, 3, 5), 1e30), torch.full((2, 4, 6), 1e30)
    huge[0, 0], huge_poses[1, 1] = -3e38, -3e38
    v, c = self_routing(huge, huge_poses, 1e-30 * weight, bias, return_couplings=True)
    assert torch.isfinite(v).all() and torch.isfinite(c).all()
    assert self_routing(torch.randn(2, 1, 3, 5), torch.randn(2, 1, 6), weight[:1], bias[:1]).shape == (2, 3, 5)
    v, c = self_routing(
        torch.randn(2, 4, 1, 5), torch.randn(2, 4, 6), weight[:, :1], bias[:, :1], return_couplings=True
    )  # one parent
    assert v.shape == (2, 1, 5) and (c == 1).all()
    bf16 = [t.bfloat16() for t in (torch.randn(2, 4, 3, 5), torch.randn(2, 4, 6), weight, bias)]
    v16 = self_routing(*bf16)
    assert v16.dtype == torch.bfloat16 and torch.isfinite(v16).all()


def test_spec_round_trip_and_layer_owns_the_routing_networks():
    assert routing_from_config(routing_config(SelfRouting())) == SelfRouting()
    layer = LinearCapsules(6, 4, 3, 5, routing={"type": "self_routing"})
    assert routing_config(layer.routing) == {"type": "self_routing"}
    assert layer.routing.weight.shape == (6, 3, 4) and layer.routing.bias.shape == (6, 3)
    assert {"routing.weight", "routing.bias"} <= set(layer.state_dict())
    u = torch.randn(2, 6, 4, requires_grad=True)
    v, c = layer(u, return_couplings=True)
    assert v.shape == (2, 3, 5) and c.shape == (2, 6, 3)
    torch.testing.assert_close(c, torch.full((2, 6, 3), 1 / 3))  # zero routing networks at the start
    (v * torch.randn_like(v)).sum().backward()
    assert layer.weight.grad.abs().sum() > 0 and layer.routing.weight.grad.abs().sum() > 0
    assert layer.routing.bias.grad.abs().sum() > 0 and u.grad.abs().sum() > 0


def test_bad_arguments():
    u_hat, poses, weight, bias = _problem(2, 4, 3, 5, 6, dtype=torch.float32)
    with pytest.raises(ValueError, match="routing network per child"):
        SelfRouting()(u_hat, poses=poses)
    with pytest.raises(ValueError, match="needs the children's poses"):
        SelfRouting()(u_hat, weight=weight, bias=bias)
    with pytest.raises(ValueError, match="poses of shape"):
        self_routing(u_hat, poses[:, :3], weight, bias)
    with pytest.raises(ValueError, match="weight of shape"):
        self_routing(u_hat, poses, weight[:, :, :5], bias)
    with pytest.raises(ValueError, match="activations of shape"):
        self_routing(u_hat, poses, weight, bias, activations=torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"\(B, I, J, D\)"):
        self_routing(u_hat[0], poses, weight, bias)
    with pytest.raises(ValueError, match="does not take iterations; it takes no arguments"):
        routing_from_config({"type": "self_routing", "iterations": 2})
    with pytest.raises(ValueError, match="children's own poses"):
        ConvCapsules2d(4, 8, 3, 6, routing=SelfRouting())
