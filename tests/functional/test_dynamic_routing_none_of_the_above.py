"""Dynamic routing with the "none-of-the-above" parent (Sabour, Frosst & Hinton 2017, Sec. 7; the authors' released
code's ``leaky=True``): against the literal float64 reference, its couplings, gradients and spec."""

import json

import pytest
import torch
from torch.autograd import gradcheck

from capsnets.functional import DynamicRouting, dynamic_routing, local_routing, routing_config, routing_from_config
from capsnets.layers import LinearCapsules
from capsnets.testing import reference_dynamic_routing


@pytest.mark.parametrize("iterations", [1, 2, 3, 4])
def test_agrees_with_the_literal_reference(iterations):
    gen = torch.Generator().manual_seed(10 + iterations)
    for _ in range(3):
        batch, children, parents, dim = (int(x) for x in torch.randint(1, 7, (4,), generator=gen))
        u_hat = 3 * torch.randn(batch, children, parents, dim, dtype=torch.float64, generator=gen)
        v, c = dynamic_routing(u_hat, iterations, none_of_the_above=True, return_couplings=True)
        v_ref, c_ref = reference_dynamic_routing(u_hat, iterations, none_of_the_above=True)
        assert v.shape == (batch, parents, dim) and c_ref.shape == (batch, children, parents + 1)
        torch.testing.assert_close(v, v_ref, rtol=0, atol=1e-10)
        torch.testing.assert_close(c, c_ref[..., :parents], rtol=0, atol=1e-10)


def test_couplings_sum_to_one_over_the_parents_and_the_extra_one():
    u_hat = torch.randn(3, 20, 7, 4, dtype=torch.float64)
    _, c = dynamic_routing(u_hat, 3, none_of_the_above=True, return_couplings=True)
    _, c_ref = reference_dynamic_routing(u_hat, 3, none_of_the_above=True)
    torch.testing.assert_close(c_ref.sum(-1), torch.ones(3, 20, dtype=torch.float64))
    extra = c_ref[..., -1]  # what each child sent to no parent: the rest of its coupling
    assert (extra > 0).all() and (c >= 0).all()
    torch.testing.assert_close(c.sum(-1) + extra, torch.ones(3, 20, dtype=torch.float64), rtol=0, atol=1e-12)


def test_first_iteration_splits_each_child_evenly_over_parents_and_the_extra_one():
    u_hat = torch.randn(2, 5, 4, 3, dtype=torch.float64)
    v, c = dynamic_routing(u_hat, 1, none_of_the_above=True, return_couplings=True)
    torch.testing.assert_close(c, torch.full((2, 5, 4), 1 / 5, dtype=torch.float64))
    s = u_hat.sum(1) / 5  # (B, J, D)
    torch.testing.assert_close(v, s * s.norm(dim=-1, keepdim=True) / (1 + s.pow(2).sum(-1, keepdim=True)))


def test_off_by_default_and_the_same_as_before():
    u_hat = torch.randn(2, 6, 3, 4, dtype=torch.float64)
    assert DynamicRouting().none_of_the_above is False
    torch.testing.assert_close(DynamicRouting(3)(u_hat), reference_dynamic_routing(u_hat, 3)[0], rtol=0, atol=1e-10)
    assert not torch.allclose(dynamic_routing(u_hat, 3, none_of_the_above=True), dynamic_routing(u_hat, 3))


def test_gradcheck():
    u_hat = torch.randn(2, 5, 3, 4, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda u: dynamic_routing(u, 3, detach_routing=False, none_of_the_above=True), (u_hat,))
    assert gradcheck(
        lambda u: dynamic_routing(u, 3, detach_routing=False, none_of_the_above=True, return_couplings=True)[1],
        (u_hat,),
    )


def test_a_spec_survives_json_and_names_the_option():
    on = DynamicRouting(2, none_of_the_above=True)
    spec = json.loads(json.dumps(routing_config(on)))
    assert spec == {"type": "dynamic", "iterations": 2, "detach_routing": True, "none_of_the_above": True}
    assert routing_from_config(spec) == on and repr(on).endswith("none_of_the_above=True)")
    assert routing_config(DynamicRouting(2))["none_of_the_above"] is False
    with pytest.raises(ValueError, match="none_of_the_above must be True or False, got 'yes'"):
        routing_from_config({"type": "dynamic", "none_of_the_above": "yes"})


def test_any_layer_routes_with_it():
    layer = LinearCapsules(12, 4, 3, 5, routing={"type": "dynamic", "none_of_the_above": True}, dtype=torch.float64)
    u = torch.randn(2, 12, 4, dtype=torch.float64)
    v, c = layer(u, return_couplings=True)
    v_ref, c_ref = reference_dynamic_routing(layer.predictions(u), 3, none_of_the_above=True)
    torch.testing.assert_close(v, v_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(c, c_ref[..., :3], rtol=0, atol=1e-10)
    # convolutional capsules route at every position with it
    u_hat = torch.randn(2, 3, 4, 5, 2, 2, dtype=torch.float64)  # (B, I, J, D, H, W)
    v_grid, c_grid = local_routing(u_hat, {"type": "dynamic", "none_of_the_above": True}, return_couplings=True)
    v_pos, c_pos = reference_dynamic_routing(u_hat[..., 1, 0], 3, none_of_the_above=True)
    torch.testing.assert_close(v_grid[..., 1, 0], v_pos, rtol=0, atol=1e-10)
    torch.testing.assert_close(c_grid[..., 1, 0], c_pos[..., :4], rtol=0, atol=1e-10)
