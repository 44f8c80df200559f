import pytest
import torch
from torch.autograd import gradcheck

from capsnets.functional import (
    InvertedAttentionRouting,
    concurrent_inverted_attention_routing,
    inverted_attention_routing,
    routing_config,
    routing_from_config,
)
from capsnets.layers import LinearCapsules
from capsnets.testing import reference_inverted_attention_routing


@pytest.mark.parametrize("iterations", [1, 2, 3, 4])
@pytest.mark.parametrize("affine", [False, True])
def test_agrees_with_literal_reference(iterations, affine):
    gen = torch.Generator().manual_seed(iterations)
    for _ in range(3):
        batch, children, parents, dim = (int(x) for x in torch.randint(1, 7, (4,), generator=gen))
        dim += 1  # a LayerNorm over one number is zero
        u_hat = torch.randn(batch, children, parents, dim, dtype=torch.float64, generator=gen)
        affine_args = (
            {
                "weight": 1 + 0.1 * torch.randn(dim, dtype=torch.float64, generator=gen),
                "bias": 0.1 * torch.randn(dim, dtype=torch.float64, generator=gen),
            }
            if affine
            else {}
        )
        v, c = inverted_attention_routing(u_hat, iterations, **affine_args, return_couplings=True)
        v_ref, c_ref = reference_inverted_attention_routing(u_hat, iterations, **affine_args)
        torch.testing.assert_close(v, v_ref, rtol=0, atol=1e-10)
        torch.testing.assert_close(c, c_ref, rtol=0, atol=1e-12)
        v32 = inverted_attention_routing(u_hat.float(), iterations, **{k: t.float() for k, t in affine_args.items()})
        torch.testing.assert_close(v32, v_ref.float(), rtol=1e-4, atol=1e-4)


def test_given_parents_agree_with_reference():
    u_hat, parents = torch.randn(2, 5, 3, 4, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    v, c = inverted_attention_routing(u_hat, 2, parents=parents, return_couplings=True)
    v_ref, c_ref = reference_inverted_attention_routing(u_hat, 2, parents=parents)
    torch.testing.assert_close(v, v_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(c, c_ref, rtol=0, atol=1e-12)


def test_layer_norm_matches_torch():
    u_hat = torch.randn(3, 7, 4, 6, dtype=torch.float64)
    weight, bias = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    s = u_hat.sum(dim=1) / 4  # the first iteration: couplings 1/J
    expected = torch.nn.functional.layer_norm(s, (6,), weight, bias, eps=1e-5)
    torch.testing.assert_close(inverted_attention_routing(u_hat, 1, weight=weight, bias=bias), expected)


def test_gradcheck():
    u_hat = torch.randn(2, 5, 3, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda u, w, b: inverted_attention_routing(u, 3, weight=w, bias=b), (u_hat, weight, bias))


def test_edge_cases_are_finite():
    routing = InvertedAttentionRouting(3, affine=False)
    zeros = torch.zeros(2, 4, 3, 5, requires_grad=True)
    v = routing(zeros)
    v.sum().backward()
    assert torch.isfinite(v).all() and torch.isfinite(zeros.grad).all() and (v == 0).all()
    huge = torch.full((2, 4, 3, 5), 1e30)
    huge[0, 0] = -3e38
    huge[1, :, :, 0] = 3e38
    v, c = routing(huge, return_couplings=True)
    assert torch.isfinite(v).all() and torch.isfinite(c).all()
    assert routing(torch.randn(2, 1, 3, 5)).shape == (2, 3, 5)  # one child
    v, c = routing(torch.randn(2, 4, 1, 5), return_couplings=True)  # one parent
    assert v.shape == (2, 1, 5) and (c == 1).all()
    v16 = routing(torch.randn(2, 4, 3, 5, dtype=torch.bfloat16))
    assert v16.dtype == torch.bfloat16 and torch.isfinite(v16).all()


def test_spec_round_trip_and_layer_owns_the_layer_norm():
    for routing in (InvertedAttentionRouting(), InvertedAttentionRouting(4, affine=False, eps=1e-3)):
        assert routing_from_config(routing_config(routing)) == routing
    layer = LinearCapsules(6, 4, 3, 5, routing={"type": "inverted_attention", "iterations": 3})
    assert routing_config(layer.routing) == InvertedAttentionRouting(3).to_config()
    assert {"routing.weight", "routing.bias"} <= set(layer.state_dict())
    u = torch.randn(2, 6, 4, requires_grad=True)
    v, c = layer(u, return_couplings=True)
    assert v.shape == (2, 3, 5) and c.shape == (2, 6, 3)
    (v * torch.randn_like(v)).sum().backward()
    assert layer.weight.grad.abs().sum() > 0 and layer.routing.weight.grad.abs().sum() > 0
    assert layer.routing.bias.grad.abs().sum() > 0


def test_concurrent_routing_follows_the_released_procedure():
    torch.manual_seed(0)
    stack = [
        LinearCapsules(6, 4, 5, 3, routing=InvertedAttentionRouting(3)),
        LinearCapsules(5, 3, 2, 4, routing=InvertedAttentionRouting(3, affine=False)),
    ]
    u = torch.randn(2, 6, 4, dtype=torch.float32)
    values = concurrent_inverted_attention_routing(stack, u)
    assert [tuple(v.shape) for v in values] == [(2, 5, 3), (2, 2, 4)]
    # by hand: a uniform bottom-up pass, then every layer from the previous iteration's capsules (Jacobi-style)
    first = stack[0].routing(stack[0].predictions(u), iterations=1)
    second = stack[1].routing(stack[1].predictions(first), iterations=1)
    for _ in range(2):
        first, second = (
            stack[0].routing(stack[0].predictions(u), parents=first, iterations=1),
            stack[1].routing(stack[1].predictions(first), parents=second, iterations=1),
        )
    torch.testing.assert_close(values[0], first)
    torch.testing.assert_close(values[1], second)
    # with one layer it is the sequential routing of that layer
    torch.testing.assert_close(concurrent_inverted_attention_routing(stack[:1], u)[0], stack[0](u))
    (values[1] * torch.randn_like(values[1])).sum().backward()
    assert stack[0].weight.grad.abs().sum() > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="iterations"):
        InvertedAttentionRouting(0)
    with pytest.raises(ValueError, match="eps"):
        InvertedAttentionRouting(eps=0)
    with pytest.raises(ValueError, match="affine"):
        InvertedAttentionRouting(affine=None)
    with pytest.raises(ValueError, match="learns its LayerNorm"):
        InvertedAttentionRouting()(torch.randn(2, 4, 3, 5))
    with pytest.raises(ValueError, match="takes no weight"):
        InvertedAttentionRouting(affine=False)(torch.randn(2, 4, 3, 5), weight=torch.ones(5), bias=torch.zeros(5))
    with pytest.raises(ValueError, match="parents of shape"):
        inverted_attention_routing(torch.randn(2, 4, 3, 5), 2, parents=torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"\(B, I, J, D\)"):
        inverted_attention_routing(torch.randn(3, 4, 5), 2)
    with pytest.raises(ValueError, match="not inverted dot-product attention"):
        concurrent_inverted_attention_routing([LinearCapsules(6, 4, 5, 3)], torch.randn(2, 6, 4))
    with pytest.raises(ValueError, match="at least one layer"):
        concurrent_inverted_attention_routing([], torch.randn(2, 6, 4))
