"""Fault class: numerics. Every router of :mod:`capsnets.functional` (the router zoo's heads among them) with hostile
but finite votes: float32 and bfloat16 votes of 1e30, -1e30, the dtype's largest, its negative and both signs mixed
give finite outputs and finite gradients; votes with no children, no parents or zero-length capsules get a
``ValueError`` naming the empty size (an empty batch an empty result); EM routing refuses activations outside
[0, 1], on the PyTorch path and the fused CPU kernel alike."""

from __future__ import annotations

import pytest
import torch

from capsnets.functional import (
    EMRouting,
    dynamic_routing,
    em_routing,
    em_routing_poses,
    inverted_attention_routing,
    local_dynamic_routing,
    self_attention_routing,
    self_routing,
    uniform_routing,
)
from capsnets.functional.em import kernel as em_kernel

B, I, J, D = 2, 5, 3, 4  # noqa: E741 (the dimension legend of the routings)
DTYPES = (torch.float32, torch.bfloat16)
MAGNITUDES = ("1e30", "-1e30", "max", "-max", "mixed")


def _votes(dtype: torch.dtype, magnitude: str, shape=(B, I, J, D)) -> torch.Tensor:
    """Votes of ``magnitude`` times a factor in [0.5, 1] (``mixed``: the dtype's largest with random signs)."""
    gen = torch.Generator().manual_seed(1)
    top = torch.finfo(dtype).max
    factor = 0.5 + 0.5 * torch.rand(shape, generator=gen, dtype=torch.float64)
    if magnitude == "mixed":
        factor = factor * torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).double()
    scale = {"1e30": 1e30, "-1e30": -1e30, "max": top, "-max": -top, "mixed": top}[magnitude]
    return (factor * scale).clamp(-top, top).to(dtype)


def _em(routing):
    def route(u, a):
        return routing(u, a, torch.zeros(u.shape[2]), torch.zeros(u.shape[2]))

    return route


def _parameters(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {
        "weight": torch.randn(I, J, D, generator=gen).to(dtype),
        "bias": torch.randn(I, J, generator=gen).to(dtype),
        "priors": torch.randn(I, J, generator=gen).to(dtype),
    }


#: name -> route(u_hat, parameters) -> outputs (a tensor or a tuple)
VECTOR_ROUTERS = {
    "dynamic": lambda u, p: dynamic_routing(u, 3, return_couplings=True),
    "dynamic_undetached": lambda u, p: dynamic_routing(u, 3, detach_routing=False, return_couplings=True),
    "dynamic_none_of_the_above": lambda u, p: dynamic_routing(u, 2, none_of_the_above=True, return_couplings=True),
    "local_dynamic": lambda u, p: local_dynamic_routing(u.permute(1, 2, 3, 0)[None, ..., None]),  # B as a grid
    "self_attention": lambda u, p: self_attention_routing(u, p["priors"], return_couplings=True),
    "self_attention_no_bias": lambda u, p: self_attention_routing(u, return_couplings=True),
    "self_attention_sabour": lambda u, p: self_attention_routing(u, squash="sabour", return_couplings=True),
    "inverted_attention": lambda u, p: inverted_attention_routing(
        u,
        3,
        weight=torch.linspace(0.5, 1.5, u.shape[-1]),
        bias=torch.linspace(-1, 1, u.shape[-1]),
        return_couplings=True,
    ),
    "inverted_attention_plain": lambda u, p: inverted_attention_routing(u, 3, return_couplings=True),
    "uniform": lambda u, p: uniform_routing(u, return_couplings=True),
    "uniform_mean_efficient": lambda u, p: uniform_routing(u, mean=True, squash="efficient", return_couplings=True),
    "self_routing": lambda u, p: self_routing(u, u[:, :, :1].sum(2), p["weight"], p["bias"], return_couplings=True),
}
EM_ROUTERS = {
    "em_paper": EMRouting(3),
    "em_paper_mean_std": EMRouting(2, 0.5, cost_normalization="mean_std"),
    "em_official_conv": EMRouting.official(3, layer="conv"),
    "em_official_class_detached": EMRouting.official(2, layer="class", detach_routing=True),
}


def _backward(outputs, leaves, what: str) -> None:
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    for o in outputs:
        assert torch.isfinite(o).all(), f"{what}: non-finite output {o}"
    loss = sum(
        (o.double() * torch.linspace(-1, 1, o.numel(), dtype=torch.float64).view_as(o)).sum()
        for o in outputs
        if o.requires_grad
    )
    loss.backward()
    for leaf in leaves:
        assert torch.isfinite(leaf.grad).all(), f"{what}: non-finite gradient {leaf.grad}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(VECTOR_ROUTERS))
def test_vector_routers_are_finite_with_finite_gradients_at_huge_votes(name, dtype):
    for seed in (0, 1):  # weights of their own, whatever the global RNG's state
        for magnitude in MAGNITUDES:
            u = _votes(dtype, magnitude).requires_grad_()
            _backward(VECTOR_ROUTERS[name](u, _parameters(dtype, seed)), [u], f"{name} {dtype} {magnitude}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dynamic_routing_through_every_iteration_has_finite_gradients_for_tied_parents(dtype):
    # two parents with the same votes share every child's coupling: the gradient, about 4e-5 |u_hat| here, fits
    # the dtype, while the backward's products of two votes do not
    for magnitude in ("1e30", "max", "mixed"):
        votes = _votes(dtype, magnitude)
        u = torch.cat([votes[:, :, :1], votes[:, :, :1], votes[:, :, 1:2]], dim=2).requires_grad_()
        outputs = dynamic_routing(u, 3, detach_routing=False, return_couplings=True)
        _backward(outputs, [u], f"dynamic routing through every iteration, {dtype} {magnitude}, tied parents")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(EM_ROUTERS))
def test_em_routing_is_finite_with_finite_gradients_at_huge_votes(name, dtype):
    for magnitude in MAGNITUDES:
        u = _votes(dtype, magnitude).requires_grad_()
        a = torch.rand(B, I, generator=torch.Generator().manual_seed(2)).to(dtype)
        _backward(_em(EM_ROUTERS[name])(u, a), [u], f"{name} {dtype} {magnitude}")
        # the activations' gradient, with a loss in the votes' units (the poses' own grow with the votes)
        a = a.float().requires_grad_()
        mu, act = _em(EM_ROUTERS[name])(u.detach(), a)
        _backward((mu / u.detach().double().abs().max(), act), [a], f"{name} activations {dtype} {magnitude}")


@pytest.mark.parametrize("path", ["torch", "cpp"])
@pytest.mark.parametrize("formulation", ["paper", "official"])
def test_em_routing_of_poses_is_finite_with_finite_gradients_at_huge_poses(monkeypatch, path, formulation):
    monkeypatch.setenv(em_kernel.ENV_VAR, path)
    if path == "cpp":
        assert em_kernel.load() is not None, f"the fused EM kernel did not build or load: {em_kernel.load_error()}"
    for magnitude in MAGNITUDES:  # float32 (the kernel's dtype); an identity transform: the votes are the poses
        poses = _votes(torch.float32, magnitude, (B, I, 4, 4)).requires_grad_()
        weight = torch.eye(4).expand(I, J, 4, 4).clone().requires_grad_()
        acts = torch.rand(B, I, generator=torch.Generator().manual_seed(2))
        outputs = em_routing_poses(poses, weight, acts, 0.0, 0.0, formulation=formulation)
        _backward(outputs, [poses], f"em_routing_poses {path} {formulation} {magnitude}")


def test_huge_votes_route_as_in_float64():
    # routed in float64 and returned in float32: the same values as float64 votes give
    u = _votes(torch.float32, "mixed")
    a = torch.rand(B, I, generator=torch.Generator().manual_seed(2))
    mu, act = em_routing(u, a, 0.0, 0.0)
    mu64, act64 = em_routing(u.double(), a.double(), 0.0, 0.0)
    assert mu.dtype == act.dtype == torch.float32
    torch.testing.assert_close(mu, mu64.float())
    torch.testing.assert_close(act, act64.float())


# ---- empty sizes ------------------------------------------------------------------------------------------------

EMPTY = {"J": (B, I, 0, D), "D": (B, I, J, 0)}


def _all_routers():
    parameters = _parameters(torch.float32)
    for name, route in VECTOR_ROUTERS.items():
        yield name, lambda u, route=route: route(u, {k: v[: u.shape[1], : u.shape[2]] for k, v in parameters.items()})
    for name, routing in EM_ROUTERS.items():
        yield name, lambda u, routing=routing: _em(routing)(u, torch.rand(u.shape[:2]))


@pytest.mark.parametrize("size", sorted(EMPTY))
def test_no_parents_or_empty_capsules_get_a_value_error_naming_them(size):
    u = torch.zeros(EMPTY[size])
    for name, route in _all_routers():
        letter = "H" if size == "D" and name.startswith("em_") else size  # EM's pose components
        with pytest.raises(ValueError, match=rf"at least one of the .*\({letter} >= 1\)"):
            route(u)


def test_no_children_give_parents_with_no_input():
    u = torch.zeros(B, 0, J, D, requires_grad=True)
    for name, route in _all_routers():
        out = route(u)
        v = out[0] if isinstance(out, tuple) else out
        if name == "local_dynamic":  # (1, J, D, B, 1): the batch as a grid
            v = v[0].permute(2, 0, 1, 3).squeeze(-1)
        assert v.shape == (B, J, D), name
        # zero poses; a LayerNorm with an affine gives its bias, the LayerNorm of a zero pose
        expected = torch.linspace(-1, 1, D).expand(B, J, D) if name == "inverted_attention" else torch.zeros(B, J, D)
        torch.testing.assert_close(v.detach().float(), expected, msg=name)


def test_an_empty_batch_gives_empty_results():
    u = torch.zeros(0, I, J, D)
    for name, route in _all_routers():
        out = route(u)
        v = out[0] if isinstance(out, tuple) else out
        assert v.numel() == 0 and v.shape[-1 if name != "local_dynamic" else 2] == D, name


def test_self_routing_refuses_poses_without_components():
    with pytest.raises(ValueError, match=r"D_in >= 1"):
        self_routing(torch.zeros(B, I, J, D), torch.zeros(B, I, 0), torch.zeros(I, J, 0), torch.zeros(I, J))


# ---- EM activations outside [0, 1] ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [5.0, -0.1, 1.0001, float("nan")])
@pytest.mark.parametrize("path", ["torch", "cpp"])
def test_em_activations_outside_the_unit_interval_are_refused(monkeypatch, value, path):
    monkeypatch.setenv(em_kernel.ENV_VAR, path)
    acts = torch.rand(B, I)
    acts[1, 2] = value
    with pytest.raises(ValueError, match=r"activations in \[0, 1\]"):
        em_routing(torch.randn(B, I, J, 16), acts, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"activations in \[0, 1\]"):
        em_routing_poses(torch.randn(B, I, 4, 4), torch.randn(I, J, 4, 4), acts, 0.0, 0.0)


def test_em_activations_at_the_ends_of_the_interval_are_accepted():
    acts = torch.rand(B, I)
    acts[0, 0], acts[1, 1] = 0.0, 1.0
    mu, a = em_routing(torch.randn(B, I, J, 16), acts, 0.0, 0.0)
    assert torch.isfinite(mu).all() and torch.isfinite(a).all()
