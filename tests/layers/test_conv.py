"""Convolutional capsules (LaLonde & Bagci 2018, Sec. 3.1): local routing against its literal reference, the
shared-weight predictions against a per-child-type convolution, gradients, shapes and bad inputs."""

import pytest
import torch
import torch.nn.functional as F

from capsnets.functional import DynamicRouting, dynamic_routing, local_dynamic_routing, local_routing
from capsnets.layers import ConvCapsules2d, ConvTransposeCapsules2d
from capsnets.testing import reference_local_dynamic_routing


@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_local_routing_matches_the_literal_reference(iterations):
    torch.manual_seed(iterations)
    u_hat = torch.randn(2, 3, 4, 5, 3, 2, dtype=torch.float64)  # (B, I, J, D, H, W)
    v, couplings = local_dynamic_routing(u_hat, iterations, return_couplings=True)
    ref_v, ref_c = reference_local_dynamic_routing(u_hat, iterations)
    assert v.shape == (2, 4, 5, 3, 2) and couplings.shape == (2, 3, 4, 3, 2)
    torch.testing.assert_close(v, ref_v, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(couplings, ref_c, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(couplings.sum(dim=2), torch.ones(2, 3, 3, 2, dtype=torch.float64))


def test_positions_route_independently():
    torch.manual_seed(0)
    u_hat = torch.randn(2, 3, 4, 5, 3, 3, dtype=torch.float64)
    v = local_dynamic_routing(u_hat, 3)
    torch.testing.assert_close(v[..., 1, 2], dynamic_routing(u_hat[..., 1, 2], 3))
    changed = u_hat.clone()
    changed[..., 0, 0] += 1.0
    torch.testing.assert_close(local_dynamic_routing(changed, 3)[..., 1:, 1:], v[..., 1:, 1:])


def test_local_routing_takes_any_routing_callable(load_benchmark):
    NaiveDynamicRouting = load_benchmark("baselines").NaiveDynamicRouting
    torch.manual_seed(0)
    u_hat = torch.randn(2, 3, 4, 5, 2, 2, dtype=torch.float64)
    torch.testing.assert_close(
        local_routing(u_hat, NaiveDynamicRouting(3)), local_routing(u_hat, DynamicRouting(3)), rtol=0, atol=1e-7
    )
    with pytest.raises(ValueError, match=r"\(B, I, J, D, H, W\)"):
        local_routing(u_hat[..., 0])


@pytest.mark.parametrize(
    "cls, kwargs, grid",
    [
        (ConvCapsules2d, {"kernel_size": 3, "stride": 1}, (5, 4)),
        (ConvCapsules2d, {"kernel_size": 5, "stride": 2}, (3, 2)),
        (ConvTransposeCapsules2d, {}, (10, 8)),
    ],
)
def test_predictions_are_one_shared_convolution_per_child_type(cls, kwargs, grid):
    torch.manual_seed(0)
    layer = cls(3, 4, 2, 5, dtype=torch.float64, **kwargs)
    u = torch.randn(2, 3, 4, 5, 4, dtype=torch.float64)  # (B, I=3, D_in=4, H=5, W=4)
    u_hat = layer.predictions(u)
    assert u_hat.shape == (2, 3, 2, 5, *grid)
    conv = F.conv2d if cls is ConvCapsules2d else F.conv_transpose2d
    for i in range(3):  # each child type alone, through the same weights
        maps = conv(u[:, i], layer.conv.weight, layer.conv.bias, stride=layer.stride, padding=layer.padding)
        torch.testing.assert_close(u_hat[:, i], maps.view(2, 2, 5, *grid))
    ref_v, _ = reference_local_dynamic_routing(u_hat, 3)
    torch.testing.assert_close(layer(u), ref_v, rtol=1e-10, atol=1e-12)


def test_gradcheck_through_the_layer():
    torch.manual_seed(0)
    layer = ConvCapsules2d(
        2, 3, 2, 3, kernel_size=3, routing=DynamicRouting(2, detach_routing=False), dtype=torch.float64
    )
    u = torch.randn(1, 2, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: layer(x), (u,))
    up = ConvTransposeCapsules2d(2, 3, 2, 2, routing=DynamicRouting(3, detach_routing=False), dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda x: up(x), (torch.randn(1, 2, 3, 2, 2, dtype=torch.float64, requires_grad=True),)
    )


def test_every_parameter_gets_a_finite_gradient_and_zero_input_is_safe():
    layer = ConvCapsules2d(2, 4, 3, 4)
    out = layer(torch.zeros(2, 2, 4, 6, 6))
    assert out.shape == (2, 3, 4, 6, 6) and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


def test_bad_inputs_and_arguments_are_explained():
    layer = ConvCapsules2d(2, 4, 3, 4)
    with pytest.raises(ValueError, match=r"\(B, 2, 4, H, W\).*got \(1, 3, 4, 6, 6\)"):
        layer(torch.zeros(1, 3, 4, 6, 6))
    with pytest.raises(ValueError, match=r"\(B, 2, 4, H, W\)"):
        layer(torch.zeros(1, 8, 6, 6))
    with pytest.raises(ValueError, match="out_types must be a positive integer, got 0"):
        ConvCapsules2d(2, 4, 0, 4)
    with pytest.raises(ValueError, match="padding must be a non-negative integer"):
        ConvTransposeCapsules2d(2, 4, 2, 4, padding=-1)
    assert "out_types=3" in repr(layer) and "DynamicRouting(iterations=3" in repr(layer)
