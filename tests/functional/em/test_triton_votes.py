"""The Triton kernels of EM routing's vote products (capsnets.functional.em.triton_votes) against literal float64
references that build the votes: each launcher in float32 and float64, with and without coordinates, with fewer
transforms than children, sizes of 1, blocks with tails; the backward against autograd. They run on CPU tensors
under Triton's interpreter (no environment variable needed), and compile for CUDA without a GPU."""

import pytest
import torch

pytest.importorskip("triton")

from capsnets.functional.em import triton_votes  # noqa: E402

# (N, I, Iw, J, coordinates): the batch of problems, children, transforms, parents
CASES = {
    "fewer_transforms_coordinates": (3, 10, 5, 4, True),
    "a_transform_per_child": (3, 10, 10, 4, False),
    "ones": (1, 1, 1, 1, True),
    "tails": (2, 40, 20, 2, True),  # 32 + 8 children, 16 + 4 transforms, two slices of the problems
}
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}  # of the sum of the terms' magnitudes


def _inputs(case: str, dtype: torch.dtype, seed: int = 0) -> dict:
    n, children, types, parents, coordinates = CASES[case]
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    return {
        "pose": rand(n, children, 16),
        "weight": rand(types, parents, 16),
        "coord": rand(children, 2) if coordinates else torch.empty(0, dtype=dtype),
        "c": rand(n, parents, 16),
        "inv": torch.exp2(torch.randint(-2, 3, (n,), generator=g)).to(dtype),  # powers of two, as the scales
        "w0": torch.rand(n, children, generator=g, dtype=torch.float64).to(dtype),
        "w": torch.rand(n, parents, children, generator=g, dtype=torch.float64).to(dtype),
        "coef": rand(n, parents, 32),
        "left": rand(n, parents, children),
        "right": rand(n, parents, 32),
    }


def _votes(pose, weight, coord):
    """The votes ``V[n, i, j] = M[n, i] W[i % Iw, j]`` (+ coordinates on components 0 and 1), (N, I, J, 16)."""
    n, children, _ = pose.shape
    types, parents, _ = weight.shape
    full = weight.repeat(children // types, 1, 1)  # (I, J, 16): child i's transforms are weight[i % Iw]
    v = torch.einsum("nirk,ijkc->nijrc", pose.view(n, children, 4, 4), full.view(children, parents, 4, 4))
    v = v.reshape(n, children, parents, 16)
    if coord.numel():
        v = v + torch.nn.functional.pad(coord, (0, 14)).view(1, children, 1, 16)
    return v


def _xx(pose, weight, coord, c, inv):
    """``[x, x^2]`` (N, J, I, 32) with ``x = V inv - c``."""
    x = _votes(pose, weight, coord).permute(0, 2, 1, 3) * inv.view(-1, 1, 1, 1) - c.unsqueeze(2)
    return torch.cat([x, x * x], dim=-1)


def _f64(t: dict, absolute: bool = False) -> dict:
    """The inputs in float64; ``absolute``: their magnitudes, with ``c`` negated, so that every term of a
    reference formula is the magnitude of the term it stands for (the scale of the rounding errors)."""
    out = {k: v.double() for k, v in t.items()}
    if absolute:
        out = {k: v.abs() for k, v in out.items()}
        out["c"] = -out["c"]
    return out


def _assert_close(got, ref, magnitude, dtype):
    assert got.dtype == dtype and got.shape == ref.shape
    err = (got.double() - ref).abs()
    bound = TOLERANCE[dtype] * magnitude + torch.finfo(torch.float64).tiny
    assert torch.all(err <= bound), f"largest error {err.max():.3g}, relative {(err / bound).max():.3g} of the bound"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", list(CASES))
def test_votes_stats(case, dtype):
    t = _inputs(case, dtype)
    mean, top = triton_votes.votes_stats(t["pose"], t["weight"], t["coord"], t["w0"])
    r, a = _f64(t), _f64(t, absolute=True)
    v, va = _votes(r["pose"], r["weight"], r["coord"]), _votes(a["pose"], a["weight"], a["coord"])
    _assert_close(mean, torch.einsum("ni,nijh->njh", r["w0"], v), torch.einsum("ni,nijh->njh", a["w0"], va), dtype)
    _assert_close(top, v.abs().amax(dim=(1, 2, 3)), va.amax(dim=(1, 2, 3)), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", list(CASES))
def test_moments(case, dtype):
    t = _inputs(case, dtype)
    got = triton_votes.moments(t["pose"], t["weight"], t["coord"], t["c"], t["inv"], t["w"])
    r, a = _f64(t), _f64(t, absolute=True)
    ref = torch.einsum("nji,njik->njk", r["w"], _xx(r["pose"], r["weight"], r["coord"], r["c"], r["inv"]))
    magnitude = torch.einsum("nji,njik->njk", a["w"], _xx(a["pose"], a["weight"], a["coord"], a["c"], a["inv"]))
    _assert_close(got, ref, magnitude, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", list(CASES))
def test_quadratic(case, dtype):
    t = _inputs(case, dtype)
    got = triton_votes.quadratic(t["pose"], t["weight"], t["coord"], t["c"], t["inv"], t["coef"])
    r, a = _f64(t), _f64(t, absolute=True)
    ref = torch.einsum("njik,njk->nji", _xx(r["pose"], r["weight"], r["coord"], r["c"], r["inv"]), r["coef"])
    magnitude = torch.einsum("njik,njk->nji", _xx(a["pose"], a["weight"], a["coord"], a["c"], a["inv"]), a["coef"])
    _assert_close(got, ref, magnitude, dtype)


def _outer_product_gradients(r: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of ``sum left[n, j, i] right[n, j, k] xx[n, j, i, k]`` for pose and weight, by autograd."""
    pose, weight = r["pose"].requires_grad_(), r["weight"].requires_grad_()
    xx = _xx(pose, weight, r["coord"], r["c"], r["inv"])
    loss = (r["left"].unsqueeze(-1) * r["right"].unsqueeze(2) * xx).sum()
    return torch.autograd.grad(loss, (pose, weight))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", list(CASES))
def test_votes_backward_is_autograd_of_the_outer_product(case, dtype):
    t = _inputs(case, dtype)
    grad_pose, grad_weight = triton_votes.votes_backward(
        t["pose"], t["weight"], t["coord"], t["c"], t["inv"], t["left"], t["right"]
    )
    ref_pose, ref_weight = _outer_product_gradients(_f64(t))
    magnitude_pose, magnitude_weight = _outer_product_gradients(_f64(t, absolute=True))
    _assert_close(grad_pose, ref_pose, magnitude_pose, dtype)
    _assert_close(grad_weight, ref_weight, magnitude_weight, dtype)


def test_a_nan_vote_makes_its_problems_largest_vote_nan():
    t = _inputs("fewer_transforms_coordinates", torch.float32)
    t["pose"][1, 7, 5] = float("nan")
    _, top = triton_votes.votes_stats(t["pose"], t["weight"], t["coord"], t["w0"])
    assert top[1].isnan() and torch.isfinite(top[[0, 2]]).all()


@pytest.mark.parametrize("sizes", [(0, 4, 2, 3), (2, 0, 1, 3), (2, 4, 2, 0)], ids=["N0", "I0", "J0"])
def test_empty_sizes_launch_nothing(sizes, monkeypatch):
    n, children, types, parents = sizes

    def no_launch(*args, **kwargs):
        raise AssertionError("launched a kernel for an empty size")

    monkeypatch.setattr(triton_votes, "_launch", no_launch)
    pose, weight, coord = torch.randn(n, children, 16), torch.randn(types, parents, 16), torch.empty(0)
    c, inv = torch.randn(n, parents, 16), torch.ones(n)
    mean, top = triton_votes.votes_stats(pose, weight, coord, torch.rand(n, children))
    assert mean.shape == (n, parents, 16) and not mean.any() and top.shape == (n,) and not top.any()
    m = triton_votes.moments(pose, weight, coord, c, inv, torch.rand(n, parents, children))
    assert m.shape == (n, parents, 32) and not m.any()
    q = triton_votes.quadratic(pose, weight, coord, c, inv, torch.randn(n, parents, 32))
    assert q.shape == (n, parents, children)
    grads = triton_votes.votes_backward(
        pose, weight, coord, c, inv, torch.randn(n, parents, children), torch.randn(n, parents, 32)
    )
    assert [g.shape for g in grads] == [pose.shape, weight.shape] and not any(g.any() for g in grads)


def test_the_layout_is_checked():
    t = _inputs("fewer_transforms_coordinates", torch.float32)
    with pytest.raises(ValueError, match="multiple"):
        triton_votes.votes_stats(t["pose"][:, :9].contiguous(), t["weight"], torch.empty(0), t["w0"][:, :9])
    with pytest.raises(ValueError, match="dtype"):
        triton_votes.moments(t["pose"], t["weight"], t["coord"], t["c"].double(), t["inv"], t["w"])
    with pytest.raises(ValueError, match="shape"):
        triton_votes.quadratic(t["pose"], t["weight"], t["coord"], t["c"], t["inv"], t["coef"][..., :16])


@pytest.mark.parametrize(
    "name", ["_stats_kernel", "_moments_kernel", "_quadratic_kernel", "_grad_pose_kernel", "_grad_weight_kernel"]
)
def test_the_kernels_compile_for_cuda(name):
    """Each compiled kernel builds to a CUDA binary (sm_90, float32, with coordinates) by Triton's compiler and the
    ptxas it ships, no GPU needed; after an interpreted launch in the same process, which must leave
    ``triton.language`` as it found it."""
    import triton.language
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile
    from triton.runtime.jit import JITFunction

    if not isinstance(triton.language.standard._sum_combine, JITFunction):
        pytest.skip("TRITON_INTERPRET=1 was set when Triton was imported: its standard library is interpreted only")
    t = _inputs("ones", torch.float32)
    triton_votes.moments(t["pose"], t["weight"], t["coord"], t["c"], t["inv"], t["w"])  # interpreted
    compiled, _ = triton_votes._kernels()[name]
    constants = {"HAS_COORD": True, "BLOCK": triton_votes.BLOCK_W if "weight" in name else triton_votes.BLOCK_I}
    integers = {"children", "parents", "types", "problems", "CHUNK"}
    signature = {p.name: "i32" if p.name in integers else "*fp32" for p in compiled.params if not p.is_constexpr}
    signature.update(dict.fromkeys(constants, "constexpr"))
    source = ASTSource(
        compiled, signature, constexprs={(compiled.arg_names.index(k),): v for k, v in constants.items()}
    )
    binary = compile(
        source,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": triton_votes.NUM_WARPS, "enable_fp_fusion": True},
    )
    assert binary.asm["cubin"]
