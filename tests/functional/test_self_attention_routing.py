import pytest
import torch
from torch.autograd import gradcheck

from capsnets.functional import (
    SelfAttentionRouting,
    efficient_squash,
    routing_config,
    routing_from_config,
    self_attention_routing,
)
from capsnets.layers import LinearCapsules
from capsnets.testing import reference_self_attention_routing


@pytest.mark.parametrize("squash", ["efficient", "sabour"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_agrees_with_literal_reference(squash, with_bias):
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        batch, children, parents, dim = (int(x) for x in torch.randint(1, 7, (4,), generator=gen))
        u_hat = torch.randn(batch, children, parents, dim, dtype=torch.float64, generator=gen)
        bias = 0.1 * torch.randn(children, parents, dtype=torch.float64, generator=gen) if with_bias else None
        v, c = self_attention_routing(u_hat, bias, squash=squash, return_couplings=True)
        v_ref, c_ref = reference_self_attention_routing(u_hat, bias, squash=squash)
        torch.testing.assert_close(v, v_ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(c, c_ref, rtol=0, atol=1e-12)
        v32 = self_attention_routing(u_hat.float(), None if bias is None else bias.float(), squash=squash)
        torch.testing.assert_close(v32, v_ref.float(), rtol=1e-5, atol=1e-5)


def test_efficient_squash_matches_the_paper():
    s = torch.randn(5, 7, dtype=torch.float64)
    n = s.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(efficient_squash(s), (1 - 1 / torch.exp(n)) * s / n)
    assert torch.isfinite(efficient_squash(torch.tensor([[3e38, 3e38]]))).all()


def test_couplings_without_bias_sum_to_one_over_parents():
    _, c = self_attention_routing(torch.randn(3, 20, 7, 4, dtype=torch.float64), return_couplings=True)
    torch.testing.assert_close(c.sum(-1), torch.ones(3, 20, dtype=torch.float64))


@pytest.mark.parametrize("squash", ["efficient", "sabour"])
def test_gradcheck(squash):
    u_hat = torch.randn(2, 5, 3, 4, dtype=torch.float64, requires_grad=True)
    bias = 0.1 * torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda u, b: self_attention_routing(u, b, squash=squash), (u_hat, bias))
    assert gradcheck(lambda s: efficient_squash(s), (torch.randn(3, 4, dtype=torch.float64, requires_grad=True),))


@pytest.mark.parametrize("squash", ["efficient", "sabour"])
def test_edge_cases_are_finite(squash):
    routing = SelfAttentionRouting(bias=False, squash=squash)
    zeros = torch.zeros(2, 4, 3, 5, requires_grad=True)
    v = routing(zeros)
    v.sum().backward()
    assert torch.isfinite(v).all() and torch.isfinite(zeros.grad).all() and (v == 0).all()
    huge = torch.full((2, 4, 3, 5), 1e30)
    huge[0, 0] = -3e38
    v, c = routing(huge, return_couplings=True)
    assert torch.isfinite(v).all() and torch.isfinite(c).all()
    assert routing(torch.randn(2, 1, 3, 5)).shape == (2, 3, 5)  # one child
    v, c = routing(torch.randn(2, 4, 1, 5), return_couplings=True)  # one parent: every coupling is 1
    assert v.shape == (2, 1, 5) and (c == 1).all()
    v16 = routing(torch.randn(2, 4, 3, 5, dtype=torch.bfloat16))
    assert v16.dtype == torch.bfloat16 and torch.isfinite(v16).all()


def test_scaling_leaves_moderate_votes_exact():
    # votes beyond [-1, 1] are divided by a power of two before the agreements: same value as the plain formula
    u_hat = 50 * torch.randn(2, 6, 3, 4, dtype=torch.float64)
    v_ref, c_ref = reference_self_attention_routing(u_hat)
    v, c = self_attention_routing(u_hat, return_couplings=True)
    torch.testing.assert_close(c, c_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(v, v_ref, rtol=0, atol=1e-12)


def test_spec_round_trip_and_layer_owns_the_bias():
    for routing in (SelfAttentionRouting(), SelfAttentionRouting(bias=False, squash="sabour")):
        assert routing_from_config(routing_config(routing)) == routing
    layer = LinearCapsules(6, 4, 3, 5, routing={"type": "self_attention"})
    assert routing_config(layer.routing) == SelfAttentionRouting().to_config()
    assert "routing.bias" in dict(layer.named_parameters()) and layer.routing.bias.shape == (6, 3)
    assert "routing.bias" in layer.state_dict()
    u = torch.randn(2, 6, 4, requires_grad=True)
    v, c = layer(u, return_couplings=True)
    assert v.shape == (2, 3, 5) and c.shape == (2, 6, 3)
    v.pow(2).sum().backward()
    assert layer.weight.grad.abs().sum() > 0 and layer.routing.bias.grad.abs().sum() > 0
    double = LinearCapsules(6, 4, 3, 5, routing=SelfAttentionRouting(), dtype=torch.float64)
    assert double.routing.bias.dtype == torch.float64


def test_bad_arguments():
    with pytest.raises(ValueError, match="squash"):
        SelfAttentionRouting(squash="hinton")
    with pytest.raises(ValueError, match="bias"):
        SelfAttentionRouting(bias="yes")
    with pytest.raises(ValueError, match="learns its log priors"):
        SelfAttentionRouting()(torch.randn(2, 4, 3, 5))
    with pytest.raises(ValueError, match="takes no bias"):
        SelfAttentionRouting(bias=False)(torch.randn(2, 4, 3, 5), bias=torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"bias of shape \(I, J\)"):
        self_attention_routing(torch.randn(2, 4, 3, 5), torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"\(B, I, J, D\)"):
        self_attention_routing(torch.randn(3, 4, 5))


def test_conv_capsules_route_locally_with_their_own_log_priors():
    from capsnets.layers.conv import ConvCapsules2d

    layer = ConvCapsules2d(4, 8, 3, 6, kernel_size=3, routing=SelfAttentionRouting())
    assert layer.routing.bias.shape == (4, 3)
    v = layer(torch.randn(2, 4, 8, 5, 5))
    assert v.shape[:3] == (2, 3, 6)
    (v * torch.randn_like(v)).sum().backward()
    assert layer.routing.bias.grad.abs().sum() > 0
