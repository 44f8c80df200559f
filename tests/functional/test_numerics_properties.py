"""Numerical robustness of squash, safe lengths, dynamic routing and EM routing, as properties (Hypothesis).

Over every float dtype and wide magnitude ranges (1e-30 .. 1e30 for float32/float64, the whole finite range of
float16/bfloat16): outputs and gradients are finite, and outputs agree with the literal float64 references of
:mod:`capsnets.testing` (run on the same, dtype-rounded, inputs) wherever those are finite. Edge cases (zero
vectors, all-zero activations, one child, one parent, the largest finite inputs) are plain tests at the end.
Every property runs a fixed, derandomized set of examples, so the file is deterministic.
"""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from capsnets.functional import ChildGroups, EMRouting, capsule_length, dynamic_routing, em_routing, safe_norm, squash
from capsnets.functional.em.spec import GRADIENT_MASS_FLOOR as _GRADIENT_MASS_FLOOR
from capsnets.testing import reference_dynamic_routing, reference_em_routing

from helpers import assert_finite

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
EM_ROUTINGS = {
    "paper": EMRouting(3, [0.05, 0.1, 0.2]),
    "paper-mean_std": EMRouting(2, 0.5, cost_normalization="mean_std"),
    "paper-mass": EMRouting(2, 0.5, cost_normalization="mass"),
    "paper-detached": EMRouting(3, [0.05, 0.1, 0.2], detach_routing=True),
    "official-conv": EMRouting.official(3, layer="conv"),
    "official-class": EMRouting.official(2, layer="class", detach_routing=True),
}


def _examples(count: int):
    """Per-test settings: a fixed, derandomized set of ``count`` examples, no example database on disk."""
    return settings(max_examples=count, deadline=None, derandomize=True, database=None)


def _exponents(dtype: torch.dtype) -> tuple[float, float]:
    """log10 of the smallest and largest magnitudes drawn for ``dtype``."""
    if dtype in (torch.float32, torch.float64):
        return -30.0, 30.0
    info = torch.finfo(dtype)
    return math.log10(info.smallest_normal * info.eps), math.log10(info.max)  # subnormals included


@st.composite
def _tensors(draw, shape, dtype, top_exponent=None):
    """Elements drawn one by one: zero, or a signed magnitude anywhere in the dtype's range (``_exponents``),
    up to ``10 ** top_exponent`` if given."""
    low, high = _exponents(dtype)
    high = high if top_exponent is None else min(high, top_exponent)
    magnitude = st.floats(low, high).map(lambda e: min(10.0**e, torch.finfo(dtype).max))
    element = st.one_of(st.just(0.0), magnitude, magnitude.map(lambda x: -x))
    values = draw(st.lists(element, min_size=math.prod(shape), max_size=math.prod(shape)))
    return torch.tensor(values, dtype=torch.float64).to(dtype).view(shape)


def _generic(shape, dtype, seed: int, exponent: float) -> torch.Tensor:
    """Normal values times ``10 ** exponent``, rounded to ``dtype`` (no structure, so no near-ties)."""
    gen = torch.Generator().manual_seed(seed)
    top = torch.finfo(dtype).max / 8
    values = (torch.randn(shape, generator=gen, dtype=torch.float64) * 10.0**exponent).clamp(-top, top)
    return values.to(dtype)


def _assume_well_conditioned(reference, inputs, outputs, relative: float, tolerance: float, seed: int) -> None:
    """Skip (``hypothesis.assume``) an example whose float64 reference moves by more than a quarter of
    ``tolerance`` when the first input moves by ``relative`` of itself (about the backward error of a routing
    computed in the dtype): near-ties of the couplings or assignments, where no precision is enough."""
    gen = torch.Generator().manual_seed(seed)
    first = inputs[0].double()
    moved = reference(
        first * (1 + relative * torch.randn(first.shape, generator=gen, dtype=torch.float64)), *inputs[1:]
    )
    scales = [max(1.0, o.abs().max().item()) for o in outputs]
    assume(all(((m - o).abs().max() / s).item() <= tolerance / 4 for m, o, s in zip(moved, outputs, scales)))


def _grads_finite(outputs, leaves, what: str) -> None:
    """Backpropagate a fixed weighting of ``outputs``; the outputs and the leaves' gradients must be finite."""
    for o in outputs:
        assert_finite(o, what)
    loss = sum((o.double() * torch.linspace(-1, 1, o.numel(), dtype=torch.float64).view_as(o)).sum() for o in outputs)
    loss.backward()
    for leaf in leaves:
        assert_finite(leaf.grad, f"gradient of {what}")


# ---- squash and safe lengths ----------------------------------------------------------------------------------


@st.composite
def _capsules(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 8)))
    return draw(_tensors(shape, dtype))


@given(_capsules())
@_examples(100)
def test_squash_and_lengths_are_finite_with_finite_gradients(s):
    for fn in (squash, capsule_length, lambda x: safe_norm(x, keepdim=True)):
        leaf = s.clone().requires_grad_()
        _grads_finite([fn(leaf)], [leaf], "squash / length")


@given(_capsules())
@_examples(100)
def test_squash_follows_the_reference_equation(s):
    # reference_dynamic_routing with one child, one parent and one iteration is the paper's squash, in float64
    ref, _ = reference_dynamic_routing(s.view(-1, 1, 1, s.shape[-1]), 1)
    ref = ref.view(s.shape)
    v = squash(s).double()
    info = torch.finfo(s.dtype)
    # a few roundings of the output; the norm's eps (|v - v_paper| <= eps / 2 componentwise); underflow
    tolerance = 4 * info.eps * ref.norm(dim=-1, keepdim=True) + info.eps**2 / 2 + info.smallest_normal
    assert ((v - ref).abs() <= tolerance).all(), (s, v, ref)
    assert (capsule_length(v.to(s.dtype)).double() < 1 + 2 * info.eps).all()


@given(_capsules())
@_examples(100)
def test_safe_norm_is_the_euclidean_norm(s):
    exact = torch.tensor([math.sqrt(math.fsum(float(x) ** 2 for x in row)) for row in s.double()], dtype=torch.float64)
    eps = torch.finfo(s.dtype).eps ** 2
    info = torch.finfo(s.dtype)
    n = capsule_length(s).double()
    within = exact <= info.max
    assert (n[~within] == info.max).all()  # beyond the dtype's range: saturated
    tolerance = 2 * info.eps * exact + math.sqrt(eps)  # rounding, and sqrt(|s|^2 + eps) - |s| <= sqrt(eps)
    assert ((n - exact).abs()[within] <= tolerance[within]).all(), (s, n, exact)


# ---- dynamic routing --------------------------------------------------------------------------------------------


@st.composite
def _votes(draw, max_children=4, max_parents=3, max_dim=4, top_exponents=None):
    dtype = draw(st.sampled_from(DTYPES))
    shape = (
        draw(st.integers(1, 2)),
        draw(st.integers(1, max_children)),
        draw(st.integers(1, max_parents)),
        draw(st.integers(1, max_dim)),
    )
    return draw(_tensors(shape, dtype, (top_exponents or {}).get(dtype)))


@given(_votes(), st.integers(1, 3))
@_examples(40)
def test_dynamic_routing_is_finite(u_hat, iterations):
    v, c = dynamic_routing(u_hat, iterations, return_couplings=True)
    assert v.dtype == c.dtype == u_hat.dtype
    assert_finite(v, "dynamic routing")
    assert_finite(c, "dynamic routing's couplings")
    assert (capsule_length(v).double() < 1.01).all()
    torch.testing.assert_close(c.double().sum(-1), torch.ones(c.shape[:2], dtype=torch.float64), rtol=0, atol=0.02)


# The backward of an iteration multiplies the gradient of the agreements by the votes twice (through the
# couplings into the next iteration's sums), so its intermediate values grow as |u_hat| squared: in float32
# votes of 1e24 overflow there, although the float64 gradient is small (two parents tied at 1e24 show it).
# Gradients are held finite for float32 votes up to 1e15.
@given(_votes(top_exponents={torch.float32: 15.0}), st.integers(1, 3), st.booleans())
@_examples(40)
def test_dynamic_routing_is_finite_with_finite_gradients(u_hat, iterations, detach):
    leaf = u_hat.clone().requires_grad_()
    v, c = dynamic_routing(leaf, iterations, detach_routing=detach, return_couplings=True)
    assert v.dtype == c.dtype == u_hat.dtype
    _grads_finite([v, c], [leaf], "dynamic routing")
    assert (capsule_length(v).double() < 1.01).all()
    torch.testing.assert_close(c.double().sum(-1), torch.ones(c.shape[:2], dtype=torch.float64), rtol=0, atol=0.02)


@given(
    st.sampled_from(DTYPES),
    st.integers(0, 2**16),
    st.floats(-30, 30),
    st.integers(1, 3),
    st.tuples(st.integers(1, 2), st.integers(1, 5), st.integers(1, 3), st.integers(1, 4)),
)
@_examples(60)
def test_dynamic_routing_follows_the_reference_procedure(dtype, seed, exponent, iterations, shape):
    low, high = _exponents(dtype)
    u_hat = _generic(shape, dtype, seed, min(max(exponent, low), high - 1))
    v, c = dynamic_routing(u_hat, iterations, return_couplings=True)
    v_ref, c_ref = reference_dynamic_routing(u_hat, iterations)
    # float16 is routed in float32, bfloat16 in bfloat16: a few roundings of logits of size |u|^2 move the
    # couplings by a bfloat16 ulp times that, so bfloat16 is compared where |u| <= 1 only
    if dtype == torch.bfloat16 and u_hat.abs().max() > 1:
        return
    tolerance = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 5e-2}[dtype]
    relative = {torch.float64: 1e-15, torch.bfloat16: 1e-2}.get(dtype, 1e-6)  # float16 is routed in float32
    _assume_well_conditioned(
        lambda x: reference_dynamic_routing(x, iterations), (u_hat,), (v_ref, c_ref), relative, tolerance, seed
    )
    torch.testing.assert_close(v.double(), v_ref, rtol=0, atol=tolerance)
    torch.testing.assert_close(c.double(), c_ref, rtol=0, atol=tolerance)


# ---- EM routing -------------------------------------------------------------------------------------------------


@st.composite
def _em_inputs(draw, top_exponents=None):
    votes = draw(_votes(top_exponents=top_exponents))
    batch, children, parents = votes.shape[:3]
    level = st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0))
    activations = torch.tensor(
        draw(st.lists(level, min_size=batch * children, max_size=batch * children)), dtype=votes.dtype
    ).view(batch, children)
    normalize = draw(st.sampled_from([None, "all_parents", "per_type"]))
    groups = None
    if normalize is not None:  # slots n * I + i are copies of child (n * I + i) // 2: pairs across the batch
        groups = ChildGroups(
            torch.arange(batch * children).view(batch, children) // 2, (batch * children + 1) // 2, normalize
        )
    return votes, activations, groups


@given(_em_inputs(), st.sampled_from(sorted(EM_ROUTINGS)))
@_examples(60)
def test_em_routing_is_finite(inputs, name):
    votes, activations, groups = inputs
    parents = votes.shape[2]
    poses, a, r = EM_ROUTINGS[name](
        votes,
        activations,
        torch.full((parents,), 0.5),
        torch.full((parents,), 0.01),
        return_assignments=True,
        child_groups=groups,
    )
    for what, value in (("poses", poses), ("activations", a), ("assignments", r)):
        assert_finite(value, f"EM {what} ({name})")
    assert ((a >= 0) & (a <= 1)).all()
    # a pose is a weighted mean of votes with weights summing to at most 1 (official: blended with the last one)
    assert (poses.double().abs() <= votes.double().abs().max() * (1 + 1e-5)).all()


# The derivative of an activation in a child's activation is that of log sigma^2 in it, as large as
# (V - mu)^2 / floor (the variance floor bounds sigma^2 from below): for votes of 1e30 and the floor 1e-6 it is
# 1e66, which float32 cannot hold. Gradients are checked where they fit: float32 (and bfloat16, routed in float32)
# votes up to 1e6, float16 and float64 over the whole range of the outputs' check.
_GRADIENT_EXPONENTS = {torch.float32: 6.0, torch.bfloat16: 6.0}


@given(_em_inputs(_GRADIENT_EXPONENTS), st.sampled_from(sorted(EM_ROUTINGS)))
@_examples(50)
def test_em_routing_has_finite_gradients(inputs, name):
    votes, activations, groups = inputs
    parents = votes.shape[2]
    # Half-precision inputs are routed in float32 (em_routing): their gradients are float32 ones cast to the
    # half dtype, which cannot hold the real derivatives near the variance floor (d log var / d a ~ V^2 / floor
    # exceeds 65504 for votes of 10). Those leaves are float32 here, holding the same, half-rounded, values.
    dtype = votes.dtype if votes.dtype in (torch.float32, torch.float64) else torch.float32
    leaves = [
        votes.to(dtype).requires_grad_(),
        activations.to(dtype).requires_grad_(),
        torch.full((parents,), 0.5, requires_grad=True),
        torch.full((parents,), 0.01, requires_grad=True),
    ]
    poses, a, r = EM_ROUTINGS[name](*leaves, return_assignments=True, child_groups=groups)
    # The loss takes the poses in the votes' units: a finite gradient then means finite derivatives of the
    # routing (a loss of size 1e38 has no representable gradient). It leaves out the assignments, returned for
    # inspection: their derivative in a variance is (V - mu)^2 / sigma^4, beyond float32 for a vote far from
    # a parent at its variance floor (where they are saturated, and carry no gradient to poses or activations).
    _grads_finite([poses / max(1.0, votes.double().abs().max().item()), a], leaves, f"EM routing ({name})")


@given(
    st.sampled_from(DTYPES),
    st.integers(0, 2**16),
    st.floats(-30, 30),
    st.sampled_from(["paper", "official"]),
    st.tuples(st.integers(1, 2), st.integers(2, 5), st.integers(1, 3), st.integers(1, 4)),
)
@_examples(40)
def test_em_routing_follows_the_reference_procedure(dtype, seed, exponent, formulation, shape):
    low, high = _exponents(dtype)
    votes = _generic(shape, dtype, seed, min(max(exponent, low), high - 1))
    gen = torch.Generator().manual_seed(seed)
    activations = torch.rand(shape[:2], generator=gen, dtype=torch.float64).to(dtype)
    beta_v, beta_a = 0.1 * torch.randn(shape[2], generator=gen, dtype=torch.float64), torch.zeros(shape[2])
    lambdas = [0.01, 0.02, 0.03]
    routing = EMRouting(3, lambdas, formulation=formulation)
    mu, a, r = routing(votes, activations, beta_v, beta_a, return_assignments=True)
    settings = (3, lambdas, routing.eps, routing.variance_floor)
    mu_ref, a_ref, r_ref = reference_em_routing(votes, activations, beta_v, beta_a, *settings)
    scale = votes.double().abs().max().item()
    _assume_well_conditioned(
        lambda x, *rest: reference_em_routing(x, *rest, *settings),
        (votes, activations, beta_v, beta_a),
        (mu_ref, a_ref, r_ref),
        1e-15 if dtype == torch.float64 else 1e-6,
        1e-9 if dtype == torch.float64 else 1e-3,
        seed,
    )
    # Computed in float32 for every dtype but float64, on the same (rounded) inputs. The variance comes from
    # moments about the votes' weighted mean (module docstring), which cancel in float32 where one child
    # dominates a parent: the activations then move by up to a few 1e-3 (as before the scaling existed).
    mu_tol, a_tol, r_tol = (1e-9, 1e-9, 1e-9) if dtype == torch.float64 else (1e-3, 1e-2, 5e-3)
    torch.testing.assert_close(mu.double(), mu_ref, rtol=mu_tol, atol=mu_tol * scale)
    torch.testing.assert_close(a.double(), a_ref, rtol=0, atol=a_tol)
    torch.testing.assert_close(r.double(), r_ref, rtol=0, atol=r_tol)


# ---- edge cases -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_vectors(dtype):
    s = torch.zeros(3, 8, dtype=dtype, requires_grad=True)
    v = squash(s)
    (v.sum() + capsule_length(s).sum()).backward()
    assert (v == 0).all() and torch.isfinite(s.grad).all()
    assert (capsule_length(s) == torch.tensor(torch.finfo(dtype).eps, dtype=dtype)).all()  # sqrt(eps^2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_largest_finite_inputs(dtype):
    top = torch.finfo(dtype).max
    s = torch.tensor([[top, top, -top, 0.0], [top, 0.0, 0.0, 0.0]], dtype=dtype, requires_grad=True)
    v = squash(s)
    (v.sum() + capsule_length(s).sum()).backward()
    torch.testing.assert_close(
        v.double(),
        torch.tensor([[1, 1, -1, 0], [math.sqrt(3), 0, 0, 0]], dtype=torch.float64) / math.sqrt(3),
        rtol=0,
        atol=0.01,
    )
    torch.testing.assert_close(
        capsule_length(s).double(), torch.full((2,), top, dtype=torch.float64), rtol=4 * torch.finfo(dtype).eps, atol=0
    )  # the first saturates there
    assert torch.isfinite(s.grad).all()
    u_hat = torch.full((2, 5, 3, 4), top, dtype=dtype)
    u_hat[1, :, 1] = -top
    assert_finite(dynamic_routing(u_hat, 3), "dynamic routing of the largest votes")
    for formulation in ("paper", "official"):
        poses, a = em_routing(u_hat, torch.ones(2, 5, dtype=dtype), 0.0, 0.0, formulation=formulation)
        assert_finite(poses, "EM poses of the largest votes")
        assert_finite(a, "EM activations of the largest votes")
        torch.testing.assert_close(poses[0].double(), u_hat[0, 0].double(), rtol=0.01, atol=0)  # the common vote


@pytest.mark.parametrize("formulation", ["paper", "official"])
@pytest.mark.parametrize("detach", [False, True])
def test_em_activation_gradients_stay_bounded_at_zero_activations(formulation, detach):
    # The guarded equations' slope in the activations is 1/eps at zero mass (about 1e7 here); the gradient
    # is taken as if the mass were _GRADIENT_MASS_FLOOR there, so it no longer depends on eps.
    gen = torch.Generator().manual_seed(0)
    votes = torch.randn(2, 18, 5, 16, generator=gen, requires_grad=True)
    bound = 16 * votes.detach().abs().max() / _GRADIENT_MASS_FLOOR  # sum over H of R |V| / floor, R <= 1
    for eps in (1e-5, 1e-9):
        activations = torch.zeros(2, 18, requires_grad=True)
        beta_v, beta_a = torch.randn(5, generator=gen), torch.randn(5, generator=gen)
        poses, a = em_routing(
            votes, activations, beta_v, beta_a, 3, eps=eps, formulation=formulation, detach_routing=detach
        )
        assert (poses == 0).all()
        (poses.sum() + a.sum()).backward()
        assert torch.isfinite(activations.grad).all() and activations.grad.abs().max() <= bound
        assert activations.grad.abs().max() > 0


def test_em_gradients_exact_above_the_mass_floor():
    # Above the floor the gradient is the guarded equations' own (gradcheck at small but ordinary masses).
    gen = torch.Generator().manual_seed(1)
    votes = torch.randn(1, 3, 2, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    activations = torch.full((1, 3), 0.01, dtype=torch.float64, requires_grad=True)  # masses about 0.015
    beta = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda v, a, b: em_routing(v, a, b, b, 2, inverse_temperature=0.1), (votes, activations, beta)
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_child_one_parent(dtype):
    u_hat = torch.tensor([[[[3.0, 4.0]]]], dtype=dtype)
    v, c = dynamic_routing(u_hat, 3, return_couplings=True)
    torch.testing.assert_close(v.double(), reference_dynamic_routing(u_hat, 3)[0], rtol=0, atol=0.01)
    assert (c == 1).all()
    one_parent = _generic((2, 6, 1, 4), dtype, 0, 0.0)
    v, c = dynamic_routing(one_parent, 3, return_couplings=True)
    torch.testing.assert_close(v.double(), reference_dynamic_routing(one_parent, 3)[0], rtol=0, atol=0.01)
    assert (c == 1).all()
    for formulation in ("paper", "official"):
        for votes in (u_hat, one_parent, _generic((2, 1, 3, 4), dtype, 1, 0.0)):
            acts = torch.full(votes.shape[:2], 0.7, dtype=dtype)
            routing = EMRouting(3, [0.1, 0.2, 0.3], formulation=formulation)
            mu, a, r = routing(votes, acts, 0.5, 0.1, return_assignments=True)
            mu_ref, a_ref, r_ref = reference_em_routing(
                votes, acts, 0.5, 0.1, 3, [0.1, 0.2, 0.3], routing.eps, routing.variance_floor
            )
            for got, want in ((mu, mu_ref), (a, a_ref), (r, r_ref)):
                torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_empty_inputs():
    assert squash(torch.empty(0, 8)).shape == (0, 8) and capsule_length(torch.empty(0, 8)).shape == (0,)
    assert dynamic_routing(torch.empty(0, 5, 3, 4), 3).shape == (0, 3, 4)
    assert dynamic_routing(torch.empty(2, 0, 3, 4), 3).shape == (2, 3, 4)
    for batch, children in ((0, 5), (2, 0)):
        poses, a = em_routing(torch.empty(batch, children, 3, 4), torch.empty(batch, children), 0.0, 0.0)
        assert poses.shape == (batch, 3, 4) and a.shape == (batch, 3)
