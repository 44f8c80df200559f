"""Router numerics as a property (Hypothesis), over every router of :mod:`capsnets.functional`.

One strategy (:func:`_cases`) draws a router of the zoo (vector capsules: dynamic, local dynamic, self-attention,
inverted attention, uniform, self-routing, Heinsen; matrix capsules: EM routing of votes, and of poses on each of
its paths, the PyTorch one, the fused CPU kernel and the Triton kernels in Triton's interpreter), a shape (batch
1-4, children 1-64, parents 1-16, components 1-16, one of them 0 in about one draw in eight; EM of poses: 4x4
poses, smaller problems on the kernels), a
dtype (float32, bfloat16, float64), the votes' largest magnitude (0, the dtype's largest, or anywhere between,
log-uniform from its smallest subnormal), how the magnitudes spread below it (all tied, or over 1 to 60 binary
orders), a share of zeros, the signs, and the loss weights ``w`` (one per output element, of a largest magnitude
drawn in the same way, so 0 and the dtype's largest among them). The gradients are those of ``sum(w * outputs)``,
``torch.autograd.grad(outputs, inputs, grad_outputs=w)``: the loss itself may overflow, its gradient need not.

The property, for every draw:

1. votes with no parents or no components (``J = 0`` or ``D = 0``) are refused with an
   :class:`~capsnets.validation.ArgumentError` naming the size, the documented rule; everything else is routed;
2. no output (with and without gradients recorded: the inference paths differ), and no gradient (of the votes,
   poses, transforms and EM's activations), holds a NaN;
3. an output is finite wherever its exact value is within the dtype's range: for float32 and bfloat16, where the
   routing of the same (rounded) inputs in float64 gives it finite and at most ``2^-8`` of the dtype's largest;
   for float64, where ``max(1, |u|)^2 <= 2^-64`` of its largest (Heinsen's variances are the votes squared);
4. a gradient is finite wherever the exact one is within the dtype's range: for float32 and bfloat16, where the
   float64 gradient of the same inputs and weights is finite and at most ``2^-8`` of the dtype's largest, and the
   outputs are within 1/16 of their scale of the float64 ones (otherwise the draw sits at a near-tie of the
   couplings that the dtype's rounding resolves otherwise, and its gradient is that of another, nearby routing);
   for float64, where ``max(1, |u|)^2 max(1, |w|) <= 2^-64`` of its largest. Float64 gradients are checked for
   votes up to ``2^256``: beyond, the backward of Heinsen's and EM's variances multiplies the gradient by the votes
   up to four times, and float64 has no wider dtype to route in (float32 and bfloat16 votes are routed in float64
   where theirs would overflow, so they are checked over their whole range).

Every test runs a fixed, derandomized set of examples; the counter-examples found are pinned (``@example``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from capsnets.functional import (
    EMRouting,
    dynamic_routing,
    em_routing_poses,
    heinsen_routing,
    inverted_attention_routing,
    local_dynamic_routing,
    self_attention_routing,
    self_routing,
    uniform_routing,
)
from capsnets.functional.em import kernel as em_kernel
from capsnets.validation import ArgumentError

from helpers import assert_finite

DTYPES = (torch.float32, torch.bfloat16, torch.float64)
F32, BF16, F64 = DTYPES
F32_MAX, BF16_MAX, F64_MAX = (torch.finfo(dtype).max for dtype in DTYPES)


class Case(NamedTuple):
    """One draw: the votes ``(B, I, J, D)`` of ``dtype``, of largest magnitude ``top``, spread over ``spread``
    binary orders below it (0: all tied), a share ``zeros`` of them zero, of ``signs``; loss weights of largest
    magnitude ``weight``; everything else from ``seed``."""

    router: str
    dtype: torch.dtype
    shape: tuple[int, int, int, int]
    top: float
    spread: int = 0
    zeros: float = 0.0
    signs: str = "mixed"
    weight: float = 1.0
    seed: int = 0


class Router(NamedTuple):
    route: Callable  # (inputs, parameters) -> an output or a tuple of outputs
    kind: str = "vector"  # "vector", "self" (and poses), "em" (and activations), "poses" (4x4 poses, transforms)
    limits: tuple[int, int, int, int] = (4, 64, 16, 16)  # the largest B, I, J, D drawn
    path: str = "torch"  # CAPSNETS_EM_KERNEL


def _em(routing):
    return lambda x, p: routing(x["votes"], x["activations"], p["beta_v"], p["beta_a"])


def _poses(routing):
    def route(x, p):
        return em_routing_poses(
            x["poses"], x["transforms"], x["activations"], p["beta_v"], p["beta_a"], routing.iterations,
            formulation=routing.formulation, inverse_temperature=routing.inverse_temperature,
        )  # fmt: skip

    return route


def _vector(route):
    return Router(lambda x, p: route(x["votes"], p))


ROUTERS = {
    "dynamic": _vector(lambda u, p: dynamic_routing(u, 3, return_couplings=True)),
    "dynamic_undetached": _vector(lambda u, p: dynamic_routing(u, 2, detach_routing=False, return_couplings=True)),
    "dynamic_none_of_the_above": _vector(lambda u, p: dynamic_routing(u, 2, none_of_the_above=True)),
    "local_dynamic": _vector(lambda u, p: local_dynamic_routing(u.permute(1, 2, 3, 0)[None, ..., None])),  # B: grid
    "self_attention": _vector(lambda u, p: self_attention_routing(u, p["priors"], return_couplings=True)),
    "self_attention_no_bias": _vector(lambda u, p: self_attention_routing(u, return_couplings=True)),
    "self_attention_sabour": _vector(lambda u, p: self_attention_routing(u, squash="sabour")),
    "inverted_attention": _vector(
        lambda u, p: inverted_attention_routing(u, 3, weight=p["gain"], bias=p["shift"], return_couplings=True)
    ),
    "inverted_attention_plain": _vector(lambda u, p: inverted_attention_routing(u, 2)),
    "uniform": _vector(lambda u, p: uniform_routing(u, return_couplings=True)),
    "uniform_mean_efficient": _vector(lambda u, p: uniform_routing(u, mean=True, squash="efficient")),
    "self_routing": Router(lambda x, p: self_routing(x["votes"], x["poses"], p["weight"], p["bias"]), "self"),
    "heinsen": _vector(lambda u, p: tuple(heinsen_routing(u, p["scores"], p["beta_use"], p["beta_ign"]))),
    "em_paper": Router(_em(EMRouting(3)), "em"),
    "em_paper_mean_std": Router(_em(EMRouting(2, 0.5, cost_normalization="mean_std")), "em"),
    "em_official_conv": Router(_em(EMRouting.official(3, layer="conv")), "em"),
    "em_official_class_detached": Router(_em(EMRouting.official(2, layer="class", detach_routing=True)), "em"),
    "em_poses_torch": Router(_poses(EMRouting(2)), "poses", (4, 16, 8, 0)),
    "em_poses_cpp": Router(_poses(EMRouting(2)), "poses", (4, 32, 8, 0), "cpp"),
    "em_poses_official_cpp": Router(_poses(EMRouting.official(2, layer="class")), "poses", (4, 32, 8, 0), "cpp"),
    "em_poses_triton": Router(_poses(EMRouting(2)), "poses", (2, 4, 3, 0), "triton"),
    "em_poses_official_triton": Router(_poses(EMRouting.official(2, layer="conv")), "poses", (2, 4, 3, 0), "triton"),
}
GROUPS = {  # by cost: the kernels get fewer examples (and the interpreted Triton ones smaller problems)
    "pytorch": [name for name, router in ROUTERS.items() if router.path == "torch"],
    "cpp": [name for name, router in ROUTERS.items() if router.path == "cpp"],
    "triton": [name for name, router in ROUTERS.items() if router.path == "triton"],
}


def _magnitudes(dtype: torch.dtype):
    """0, 1, the dtype's largest, or log-uniform from its smallest subnormal to its largest."""
    info = torch.finfo(dtype)
    low, high = math.log10(info.smallest_normal * info.eps), math.log10(info.max)
    anywhere = st.floats(low, high).map(lambda e: min(10.0 ** min(e, 308.0), info.max))
    return st.one_of(st.just(0.0), st.just(1.0), st.just(info.max), anywhere, anywhere, anywhere)


# Every strategy that _cases draws from, built once: a strategy built inside a draw is validated again at every
# example, which took a third of the property's time.
MAGNITUDES = {dtype: _magnitudes(dtype) for dtype in DTYPES}
ROUTER_NAMES = {group: st.sampled_from(names) for group, names in GROUPS.items()}
SIZES = {limit: st.integers(1, limit) for limit in {limit for r in ROUTERS.values() for limit in r.limits if limit}}
EMPTY = {  # which size is 0: one in about 8 draws
    limits: st.sampled_from(["BIJD"[k] for k in range(4) if limits[k]] + [""] * 24)
    for limits in {r.limits for r in ROUTERS.values()}
}
DTYPE, SPREAD, ZEROS, SIGNS, SEED = (
    st.sampled_from(DTYPES),
    st.sampled_from([0, 1, 8, 60]),
    st.sampled_from([0.0, 0.25, 0.75]),
    st.sampled_from(["mixed", "positive", "negative"]),
    st.integers(0, 2**16),
)


@st.composite
def _cases(draw, group: str) -> Case:
    router = draw(ROUTER_NAMES[group])
    dtype = draw(DTYPE)
    limits = ROUTERS[router].limits
    shape = [draw(SIZES[limit]) if limit else 0 for limit in limits]
    empty = draw(EMPTY[limits])
    if empty:
        shape["BIJD".index(empty)] = 0
    return Case(
        router,
        dtype,
        tuple(shape),
        draw(MAGNITUDES[dtype]),
        draw(SPREAD),
        draw(ZEROS),
        draw(SIGNS),
        draw(MAGNITUDES[dtype]),
        draw(SEED),
    )


def _values(shape, dtype, top, spread, zeros, gen, signs="mixed") -> torch.Tensor:
    sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).double()
    sign = {"mixed": sign, "positive": sign.abs(), "negative": -sign.abs()}[signs]
    scale = torch.exp2(-spread * torch.rand(shape, generator=gen, dtype=torch.float64))
    keep = torch.rand(shape, generator=gen) >= zeros
    top = min(top, torch.finfo(dtype).max)
    return (sign * scale * keep * top).clamp(-top, top).to(dtype)


def _inputs(case: Case) -> tuple[dict, dict]:
    """The inputs that get a gradient (leaves), and the routers' parameters, of ``case``."""
    gen = torch.Generator().manual_seed(case.seed)
    b, i, j, d = case.shape
    kind = ROUTERS[case.router].kind
    votes = (b, i, 4, 4) if kind == "poses" else case.shape
    leaves = {"poses" if kind == "poses" else "votes": _values(votes, case.dtype, *case[3:6], gen, case.signs)}
    if kind == "self":
        leaves["poses"] = _values((b, i, d), case.dtype, *case[3:6], gen, case.signs)
    if kind == "poses":  # each vote component a sum of |W| <= 1/2 times pose components: |V| <= max |M| / 2
        w = torch.randn(max(i, 1), j, 4, 4, generator=gen, dtype=torch.float64)
        leaves["transforms"] = (w / (2 * w.abs().sum(-2, keepdim=True))).to(case.dtype)
    if kind in ("em", "poses"):  # a fifth of the activations 0, a fifth 1
        level, pick = torch.rand(b, i, generator=gen), torch.rand(b, i, generator=gen)
        leaves["activations"] = torch.where(pick < 0.2, 0.0, torch.where(pick < 0.4, 1.0, level)).to(case.dtype)
    randn = lambda *shape, scale=1.0: (scale * torch.randn(shape, generator=gen)).to(case.dtype)  # noqa: E731
    parameters = {
        "priors": randn(i, j),
        "weight": randn(i, j, d),
        "bias": randn(i, j),
        "gain": 1 + randn(d).abs(),
        "shift": randn(d),
        "scores": randn(b, i, scale=4.0),
        "beta_use": randn(i, j),
        "beta_ign": randn(i, j),
        "beta_v": torch.randn(j, generator=gen, dtype=torch.float64),
        "beta_a": torch.randn(j, generator=gen, dtype=torch.float64),
    }
    return {k: v.requires_grad_() for k, v in leaves.items()}, parameters


def _route(case: Case, leaves: dict, parameters: dict, path: str, weights=None):
    """``(outputs, weights, gradients)``: the routing of ``case`` on ``path`` and the gradients of the leaves."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(em_kernel.ENV_VAR, path)
        outputs = ROUTERS[case.router].route(leaves, parameters)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        if weights is None:
            gen = torch.Generator().manual_seed(case.seed + 1)
            weights = [_values(o.shape, o.dtype, case.weight, 60, 0.2, gen) for o in outputs]
        live = [(o, w.to(o.dtype)) for o, w in zip(outputs, weights) if o.requires_grad]
        grads = torch.autograd.grad(
            [o for o, _ in live], list(leaves.values()), [w for _, w in live], allow_unused=True
        )
    return outputs, weights, grads


def _fits(t: torch.Tensor, dtype: torch.dtype) -> bool:
    return bool(t.isfinite().all()) and (t.numel() == 0 or t.abs().max().item() <= torch.finfo(dtype).max / 2**8)


def _close(o: torch.Tensor, reference: torch.Tensor) -> bool:
    both = o.isfinite() & reference.isfinite()
    if not both.any():
        return True
    scale = max(1.0, reference[both].abs().max().item())
    return bool(((o.double() - reference).abs()[both] <= scale / 16).all())


def check(case: Case) -> None:
    """Assert the module's property for ``case``."""
    leaves, parameters = _inputs(case)
    b, i, j, d = case.shape
    if j == 0 or (d == 0 and ROUTERS[case.router].kind != "poses"):
        with pytest.raises(ArgumentError, match=r"needs at least one of the .*\((J|D|H) >= 1\)"):
            _route(case, leaves, parameters, ROUTERS[case.router].path)
        return
    outputs, weights, grads = _route(case, leaves, parameters, ROUTERS[case.router].path)
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:  # the inference paths (no gradient to keep)
        patch.setenv(em_kernel.ENV_VAR, ROUTERS[case.router].path)
        inferred = ROUTERS[case.router].route(leaves, parameters)
    outputs += inferred if isinstance(inferred, tuple) else (inferred,)
    grads = dict(zip(leaves, grads))
    if case.dtype == F64 and case.top > 2.0**256:
        grads = {}  # beyond the float64 gradients checked (module docstring)
    for index, o in enumerate(outputs):
        assert not o.isnan().any(), f"{case}: output {index} has {int(o.isnan().sum())} NaN"
    for name, g in grads.items():
        assert g is None or not g.isnan().any(), f"{case}: the gradient of the {name} has {int(g.isnan().sum())} NaN"
    if case.dtype == F64:
        squares = 2 * math.log2(max(1.0, case.top))  # against 2^-64 of float64's largest, 2^1024
        exact_outputs = [squares <= 960] * len(outputs)
        exact_grads = dict.fromkeys(grads, squares + math.log2(max(1.0, case.weight)) <= 960)
    else:
        wide = {k: v.detach().double().requires_grad_() for k, v in leaves.items()}
        wide_parameters = {k: v.double() for k, v in parameters.items()}
        references, _, wide_grads = _route(case, wide, wide_parameters, "torch", [w.double() for w in weights])
        exact_outputs = [_fits(r, case.dtype) for r in references] * 2
        conditioned = all(_close(o, r) for o, r in zip(outputs, references))
        exact_grads = {k: conditioned and (g is None or _fits(g, case.dtype)) for k, g in zip(leaves, wide_grads)}
    for index, (o, exact) in enumerate(zip(outputs, exact_outputs)):
        if exact:
            assert_finite(o, f"{case}: output {index}")
    for name, g in grads.items():
        if g is not None and exact_grads[name]:
            assert_finite(g, f"{case}: the gradient of the {name}")


def _examples(count: int):
    """A fixed, derandomized set of ``count`` examples, no example database on disk."""
    return settings(max_examples=count, deadline=None, derandomize=True, database=None)


# ---- the property, in CI ------------------------------------------------------------------------------------------


# Pinned: the counter-examples the search found (each failed before the routers were fixed), by the first fix that
# holds it. Loss weights beyond 1 gave NaN gradients in every router: the backward multiplies them by factors above
# 1 (1 / unit, logit scales) and a product of inf and 0 follows (normalized_gradients).
@example(Case("dynamic_none_of_the_above", F32, (1, 48, 2, 12), 1.0, 0, 0.75, "mixed", F32_MAX, 1376))
@example(Case("local_dynamic", F64, (3, 4, 2, 16), 1.0, 8, 0.25, "mixed", F64_MAX, 6217))
@example(Case("em_paper_mean_std", BF16, (3, 43, 4, 1), 0.0, 0, 0.75, "mixed", BF16_MAX, 776))
@example(Case("em_poses_torch", F32, (3, 16, 1, 0), F32_MAX, 1, 0.25, "mixed", F32_MAX, 6))  # the transforms' NaN
@example(Case("heinsen", BF16, (2, 10, 8, 1), 2.1308116979713004e-12, 1, 0.75, "negative", BF16_MAX, 0))
@example(Case("self_attention", F32, (1, 3, 3, 2), 1.469071e36, 0, 0.25, "positive", 1.469071e36, 4286))
@example(Case("self_routing", F32, (2, 38, 7, 7), F32_MAX, 0, 0.0, "positive", F32_MAX, 2))
# Self-attention's logits' scale (about k^2 for votes up to k) overflowed its backward (_Attention)
@example(Case("self_attention", BF16, (1, 39, 11, 9), 5.238685107793792e25, 0, 0.75, "mixed", 1.0, 1664))
@example(Case("self_attention_no_bias", F32, (3, 52, 11, 13), F32_MAX, 0, 0.75, "positive", 1.0, 23144))
@example(Case("self_attention_sabour", BF16, (4, 60, 7, 7), BF16_MAX, 0, 0.25, "mixed", 1.0, 9558))
# The backward of inverted attention, self-routing and Heinsen multiplies the gradient by the votes more than once
# (routed in float64: widened)
@example(Case("inverted_attention_plain", BF16, (2, 43, 16, 15), BF16_MAX, 0, 0.0, "positive", 1.0, 800))
@example(Case("inverted_attention", BF16, (3, 64, 4, 7), BF16_MAX, 0, 0.0, "positive", 4.94421527164877e-19, 37645))
@example(Case("self_routing", BF16, (2, 60, 16, 1), BF16_MAX, 0, 0.25, "positive", 1.0, 45320))
@example(Case("heinsen", F32, (1, 1, 10, 12), F32_MAX, 0, 0.75, "positive", 1.0, 96))
# Outputs: self-routing's float64 logits and means overflowed; Heinsen's variances (the votes squared)
@example(Case("self_routing", F64, (1, 32, 13, 7), F64_MAX, 60, 0.0, "negative", 0.0, 1185))
@example(Case("heinsen", F64, (3, 25, 3, 2), F64_MAX, 8, 0.25, "positive", 1.1296744615471169e-298, 207))
@example(Case("heinsen", F32, (1, 1, 2, 1), F32_MAX, 0, 0.75, "mixed", 0.0))  # inf variances without gradients
# EM of poses on the PyTorch path formed bfloat16 votes of bfloat16 poses: the transforms' gradient overflowed
@example(Case("em_poses_torch", BF16, (1, 3, 5, 0), BF16_MAX, 0, 0.25, "mixed", 1.0, 15942))
# No parents: a ValueError, not the ArgumentError of the rule
@example(Case("uniform", F32, (2, 3, 0, 4), 1.0))
@pytest.mark.long  # started first (tests/conftest.py)
@given(_cases("pytorch"))
@_examples(2000)
def test_routers_are_finite_with_finite_gradients(case):
    check(case)


@example(Case("em_poses_cpp", F32, (4, 24, 0, 0), F32_MAX, 8, 0.0, "negative", 0.0, 345))  # segfaulted: no parents
@example(Case("em_poses_cpp", F32, (3, 13, 7, 0), 1.0, 8, 0.0, "mixed", F32_MAX, 19058))
@example(Case("em_poses_official_cpp", F64, (4, 4, 2, 0), 0.0, 1, 0.25, "negative", F64_MAX, 254))
@given(_cases("cpp"))
@_examples(150)
def test_em_routing_on_the_fused_kernel(case):
    assert em_kernel.load() is not None, f"the fused EM kernel did not build or load: {em_kernel.load_error()}"
    check(case)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # NumPy's, in the interpreter
@example(Case("em_poses_triton", F32, (2, 3, 0, 0), 1.0))  # no parents: a ZeroDivisionError
@example(Case("em_poses_triton", F64, (2, 2, 3, 0), 0.0, 0, 0.25, "negative", F64_MAX, 34123))
@pytest.mark.long
@given(_cases("triton"))
@_examples(10)  # each about 0.6 s in the interpreter; -m slow runs 200
def test_em_routing_on_the_triton_kernels_interpreted(case):
    pytest.importorskip("triton")
    check(case)


# ---- many more examples (pytest -m slow) --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize(("group", "count"), [("pytorch", 20000), ("cpp", 2000), ("triton", 200)])
def test_many_more_examples(group, count):
    if group == "triton":
        pytest.importorskip("triton")
    given(_cases(group))(_examples(count)(lambda case: check(case)))()


# ---- self-attention's gradients of tied huge votes ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("magnitude", ["1e30", "max"])
def test_self_attention_gradients_of_tied_huge_votes(dtype, magnitude):
    # Votes of one magnitude and random signs tie agreements, so that couplings stay between 0 and 1 where the
    # logits' scale (about the votes squared) overflows: the gradient is the float64 one (of the same rounded
    # votes), inf only where that is beyond the dtype (two entries at the dtype's largest), never NaN
    top = 1e30 if magnitude == "1e30" else torch.finfo(dtype).max
    votes = torch.sign(torch.randn(2, 16, 5, 8, generator=torch.Generator().manual_seed(0))) * top
    u = votes.to(dtype).requires_grad_()
    v = self_attention_routing(u)
    v.sum().backward()
    wide = u.detach().double().requires_grad_()
    self_attention_routing(wide).sum().backward()
    assert_finite(v, "self-attention routing")
    assert not u.grad.isnan().any()
    beyond = wide.grad.abs() > torch.finfo(dtype).max
    assert (u.grad.isinf() == beyond).all()
    if magnitude == "1e30":  # finite, and (no tie broken otherwise by rounding in bfloat16) the float64 gradient
        assert not beyond.any()
    if magnitude == "1e30" and dtype == BF16:
        torch.testing.assert_close(u.grad.double(), wide.grad, rtol=0.02, atol=0.0)
