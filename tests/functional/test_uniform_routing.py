import pytest
import torch
from torch.autograd import gradcheck

from capsnets.functional import UniformRouting, dynamic_routing, routing_config, routing_from_config, uniform_routing
from capsnets.layers import LinearCapsules
from capsnets.testing import reference_uniform_routing

SETTINGS = [
    {"mean": False, "squash": "sabour"},
    {"mean": True, "squash": "sabour"},
    {"mean": False, "squash": "efficient"},
    {"mean": True, "squash": "efficient"},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_agrees_with_literal_reference(settings):
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        batch, children, parents, dim = (int(x) for x in torch.randint(1, 7, (4,), generator=gen))
        u_hat = torch.randn(batch, children, parents, dim, dtype=torch.float64, generator=gen)
        v, c = uniform_routing(u_hat, **settings, return_couplings=True)
        v_ref, c_ref = reference_uniform_routing(u_hat, **settings)
        torch.testing.assert_close(v, v_ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(c, c_ref, rtol=0, atol=1e-12)
        v32 = UniformRouting(**settings)(u_hat.float())
        torch.testing.assert_close(v32, v_ref.float(), rtol=1e-5, atol=1e-6)


def test_is_one_iteration_of_dynamic_routing():
    u_hat = torch.randn(3, 9, 4, 5, dtype=torch.float64)
    torch.testing.assert_close(uniform_routing(u_hat), dynamic_routing(u_hat, 1))


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_gradcheck(settings):
    u_hat = torch.randn(2, 5, 3, 4, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda u: uniform_routing(u, **settings), (u_hat,))


@pytest.mark.parametrize("squash", ["sabour", "efficient"])
def test_edge_cases_are_finite(squash):
    routing = UniformRouting(squash=squash)
    zeros = torch.zeros(2, 4, 3, 5, requires_grad=True)
    v = routing(zeros)
    v.sum().backward()
    assert torch.isfinite(v).all() and torch.isfinite(zeros.grad).all() and (v == 0).all()
    huge = torch.full((2, 4, 3, 5), 1e30)
    huge[0, 0] = -3e38
    assert torch.isfinite(routing(huge)).all()
    assert routing(torch.randn(2, 1, 3, 5)).shape == (2, 3, 5)  # one child
    assert routing(torch.randn(2, 4, 1, 5)).shape == (2, 1, 5)  # one parent
    v16 = routing(torch.randn(2, 4, 3, 5, dtype=torch.bfloat16))
    assert v16.dtype == torch.bfloat16 and torch.isfinite(v16).all()


def test_spec_round_trip_and_layer():
    routing = UniformRouting(mean=True, squash="efficient")
    assert routing_from_config(routing_config(routing)) == routing
    assert routing_from_config({"type": "uniform"}) == UniformRouting()
    layer = LinearCapsules(6, 4, 3, 5, routing=routing)
    assert routing_config(layer.routing) == routing.to_config()
    u = torch.randn(2, 6, 4, requires_grad=True)
    v, c = layer(u, return_couplings=True)
    assert v.shape == (2, 3, 5) and c.shape == (2, 6, 3)
    v.pow(2).sum().backward()
    assert torch.isfinite(layer.weight.grad).all() and layer.weight.grad.abs().sum() > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="squash"):
        UniformRouting(squash="hinton")
    with pytest.raises(ValueError, match="mean"):
        UniformRouting(mean=1)
    with pytest.raises(ValueError, match=r"\(B, I, J, D\)"):
        uniform_routing(torch.randn(3, 4, 5))
    with pytest.raises(ValueError, match="does not take .*; it takes: mean, squash"):
        routing_from_config({"type": "uniform", "iterations": 3})


def test_builders_refuse_settings_the_routing_does_not_have():
    import capsnets

    with pytest.raises(ValueError, match="routing type 'uniform' does not take iterations; it takes: mean, squash"):
        capsnets.create_model("capsnet_digits", routing={"type": "uniform", "iterations": 3})
    model = capsnets.create_model("capsnet_digits", routing={"type": "inverted_attention", "iterations": 3})
    assert model.model_args["routing"]["iterations"] == 3
