"""EM routing's products with the votes as Triton kernels: the GPU counterpart of the fused CPU kernel, with the
votes recomputed in registers instead of stored.

Matrix capsule layers route the votes ``V[n, i, j] = M[n, i] W[i % Iw, j]`` of their child poses ``M`` and
transforms ``W`` (4x4 matrices flattened row-major to 16 components; with coordinate addition, ``coord[i]`` is
added to components 0 and 1 of every vote of child ``i``), and EM routing uses them only through products with
``xx = [x, x^2]`` (32 components), ``x[n, j, i] = V[n, i, j] inv[n] - c[n, j]``
(:mod:`capsnets.functional.em.procedure`, the PyTorch path, is the reference these kernels are tested against;
:mod:`capsnets.functional.em.kernel` computes the same products on the CPU). Each kernel recomputes the 4x4
products of a block of children in registers, so the ``(N, J, I, 16)`` vote tensor is never written to memory,
forward or backward:

- :func:`votes_stats`: each problem's origin and scale, ``sum_i w0[n, i] V[n, i, j]`` and ``max |V[n]|``;
- :func:`moments`: the M-step's ``out[n, j, k] = sum_i w[n, j, i] xx[n, j, i, k]``;
- :func:`quadratic`: the E-step's ``out[n, j, i] = sum_k xx[n, j, i, k] coef[n, j, k]``;
- :func:`votes_backward`: the gradients of ``sum left[n, j, i] right[n, j, k] xx[n, j, i, k]`` with respect to
  the poses and the transforms.

Layout (every tensor contiguous, float32 or float64, on one device): ``pose`` ``(N, I, 16)``, ``weight``
``(Iw, J, 16)`` with child ``i`` using ``weight[i % Iw]`` (``Iw == I`` for a convolutional layer, the child types
for a class layer whose children are (position, type) with the type last), ``coord`` ``(I, 2)`` or empty,
``c`` ``(N, J, 16)`` in the units of ``inv`` ``(N,)``; per-child factors ``(N, J, I)``, per-parent ones
``(N, J, 32)``. ``N`` is the batch of routing problems and goes on the grid's first axis (the only one without a
limit of 65535).

Blocks: a block of ``BLOCK_I`` = 32 children holds its 4x4 matrices as ``(32, 16)`` tensors, component
``h = 4 row + col``. Every operand of a 4x4 product is loaded already gathered to the components where it is used
(``V[h] = sum_k M[h // 4, k] W[k, h % 4]``: the row of ``M`` and the column of ``W`` of each component, from the
cache), so the products are plain multiply-adds on values of one layout, with no reduction or exchange between
threads inside the kernels' loops:

- :func:`votes_stats`, :func:`moments`: a program per ``(n, j)``, looping over the children block by block with
  ``(32, 16)`` accumulators, summed over the block at the end (``votes_stats`` writes each ``(n, j)``'s largest
  ``|V|``, and the host takes the maximum over ``j``);
- :func:`quadratic`: a program per ``(n, j, block of children)``;
- :func:`votes_backward`: the poses' gradient ``dM = dV W^T`` by a program per ``(n, block of children)``, looping
  over the parents (for each column ``col``: the votes ``V[row, col]`` times ``W[h % 4, col]``); the transforms'
  gradient ``dW = sum M^T dV`` by a program per ``(block of BLOCK_W = 16 transforms, j, slice of the problems)``,
  looping over its problems and over the children that share its transforms (``i = iw, iw + Iw, ...``; for each
  row: ``M[row, h // 4]`` times the votes ``V[row, h % 4]``). The slices (about ``PROGRAMS`` = 512 programs in all,
  a number chosen from the sizes alone) write partial sums ``(S, Iw, J, 16)`` that ``torch.sum`` adds in a fixed
  order: deterministic, no atomics, for one small buffer.

Every size is masked (tails of blocks, ``N``, ``I`` or ``J`` of 1, ``Iw < I``); empty sizes launch nothing. The
grid's first axis is ``N`` (the only axis without CUDA's limit of 65535); offsets that grow with ``N`` are 64-bit.
On CUDA the products are contracted to fused multiply-adds (``enable_fp_fusion``).

Triton is imported on first use (``import capsnets`` works without it; :func:`available` says whether it
imports with the parts the kernels are built with, so that another version falls back to the PyTorch path). The
interpreter: ``triton.jit`` reads ``TRITON_INTERPRET`` when it decorates a function and returns an
interpreted or a compiled kernel for good, so a module-level ``@triton.jit`` fixes the mode when the module is
imported, which a test cannot control (another module, or another xdist worker's collection, may import it first).
The same holds of Triton's own library of ``@jit`` functions (``tl.sum``, ``tl.max``, ``tl.zeros``), decorated when
``triton.language`` is imported. So the kernels are plain functions that call only Triton's builtins (``tl.reduce``
with the library's combine functions, which the interpreter recognises and never calls, in place of ``tl.sum`` and
``tl.max``; ``tl.full`` for ``tl.zeros``), and on first use each is wrapped both ways, as ``triton.jit`` would
(``JITFunction`` and the interpreter's ``InterpretedFunction``). Each launch chooses: the interpreter (NumPy on the
host) for CPU tensors, or wherever ``TRITON_INTERPRET=1`` is set at the time of the launch; the compiled kernel
otherwise. The kernels therefore run on CPU tensors in a plain ``pytest`` run, with no environment variable and
the same in every worker, and CUDA launches in the same process compile as usual. Two limits: the interpreter
patches ``triton.language`` while one of its launches runs (and restores it after), so none should run in one
thread while another compiles; and a process that imported Triton with ``TRITON_INTERPRET=1`` set can only
interpret (its library is interpreted), which the launchers do as long as the variable stays set.
"""

from __future__ import annotations

import os
import threading

import torch
from torch import Tensor

from capsnets.validation import ArgumentError

#: Children per block (the first axis of the kernels' ``(BLOCK_I, 16)`` tensors).
BLOCK_I = 32
#: Transforms per block of the transforms' gradient.
BLOCK_W = 16
#: About how many programs the transforms' gradient is split into (by slices of the problems).
PROGRAMS = 512
NUM_WARPS = 4

# Bound on first use (_kernels): triton.language, and the combine functions of its tl.sum and tl.max
tl = _add = _max = None
_lock = threading.Lock()
_state: dict = {}


def available() -> bool:
    """Whether Triton imports and has what the kernels are built with (tried once per process)."""
    if "available" not in _state:
        try:
            _kernels()
            _state["available"] = True
        except Exception:  # not installed, broken, or a version without those parts: the PyTorch path remains
            _state["available"] = False
    return _state["available"]


# ---------------------------------------------------------------------------------------------------------------
# The kernels, as plain functions (wrapped on first use: the module docstring). A block of children ``ii``
# (block, 1) holds 4x4 matrices as (block, 16) tensors, component ``h = 4 row + col``, every value in one layout:
# a product's operands are loaded already gathered to the positions they meet at (a matrix's row ``h // 4`` or
# column ``h % 4``), so the sums over ``k`` are plain multiply-adds, with no reduction or exchange between threads
# inside the loops. Masked children load 0.
# ---------------------------------------------------------------------------------------------------------------


def _stats_kernel(
    pose, weight, coord, w0, mean, top, children, parents, types, HAS_COORD: tl.constexpr, BLOCK: tl.constexpr
):
    n = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    h = tl.arange(0, 16)[None, :]
    acc = tl.full([BLOCK, 16], 0, pose.dtype.element_ty)  # sum_i w0 V
    big = tl.full([BLOCK, 16], 0, pose.dtype.element_ty)  # max_i |V|
    nan = tl.full([BLOCK, 16], 0, pose.dtype.element_ty)  # NaN once a vote is NaN (the maximum may skip NaN)
    for i0 in range(0, children, BLOCK):
        ii = (i0 + tl.arange(0, BLOCK))[:, None]
        inside = ii < children
        rows = pose + (n * children + ii) * 16 + (h // 4) * 4  # M[i, h // 4, 0]
        cols = weight + ((ii % types) * parents + j) * 16 + h % 4  # W[i, 0, h % 4]
        v = tl.load(rows, mask=inside, other=0.0) * tl.load(cols, mask=inside, other=0.0)
        for k in tl.static_range(1, 4):
            v += tl.load(rows + k, mask=inside, other=0.0) * tl.load(cols + 4 * k, mask=inside, other=0.0)
        if HAS_COORD:
            v += tl.load(coord + 2 * ii + h, mask=inside & (h < 2), other=0.0)
        acc += tl.load(w0 + n * children + ii, mask=inside, other=0.0) * v
        big = tl.maximum(big, tl.abs(v))
        nan += tl.where(v != v, v, 0.0)
    tl.store(mean + (n * parents + j) * 16 + h, tl.reduce(acc, 0, _add, keep_dims=True))
    tl.store(top + n * parents + j, tl.reduce(big, None, _max) + tl.reduce(nan, None, _add))


def _moments_kernel(
    pose, weight, coord, c, inv, w, out, children, parents, types, HAS_COORD: tl.constexpr, BLOCK: tl.constexpr
):
    n = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    h = tl.arange(0, 16)[None, :]
    u = tl.load(inv + n)
    centre = tl.load(c + (n * parents + j) * 16 + h)
    s1 = tl.full([BLOCK, 16], 0, pose.dtype.element_ty)  # sum_i w x
    s2 = tl.full([BLOCK, 16], 0, pose.dtype.element_ty)  # sum_i w x^2
    for i0 in range(0, children, BLOCK):
        ii = (i0 + tl.arange(0, BLOCK))[:, None]
        inside = ii < children
        rows = pose + (n * children + ii) * 16 + (h // 4) * 4
        cols = weight + ((ii % types) * parents + j) * 16 + h % 4
        v = tl.load(rows, mask=inside, other=0.0) * tl.load(cols, mask=inside, other=0.0)
        for k in tl.static_range(1, 4):
            v += tl.load(rows + k, mask=inside, other=0.0) * tl.load(cols + 4 * k, mask=inside, other=0.0)
        if HAS_COORD:
            v += tl.load(coord + 2 * ii + h, mask=inside & (h < 2), other=0.0)
        x = v * u - centre
        wx = tl.load(w + (n * parents + j) * children + ii, mask=inside, other=0.0) * x
        s1 += wx
        s2 += wx * x
    tl.store(out + (n * parents + j) * 32 + h, tl.reduce(s1, 0, _add, keep_dims=True))
    tl.store(out + (n * parents + j) * 32 + 16 + h, tl.reduce(s2, 0, _add, keep_dims=True))


def _quadratic_kernel(
    pose, weight, coord, c, inv, coef, out, children, parents, types, HAS_COORD: tl.constexpr, BLOCK: tl.constexpr
):
    n = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    h = tl.arange(0, 16)[None, :]
    i1 = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    ii = i1[:, None]
    inside = ii < children
    rows = pose + (n * children + ii) * 16 + (h // 4) * 4
    cols = weight + ((ii % types) * parents + j) * 16 + h % 4
    v = tl.load(rows, mask=inside, other=0.0) * tl.load(cols, mask=inside, other=0.0)
    for k in tl.static_range(1, 4):
        v += tl.load(rows + k, mask=inside, other=0.0) * tl.load(cols + 4 * k, mask=inside, other=0.0)
    if HAS_COORD:
        v += tl.load(coord + 2 * ii + h, mask=inside & (h < 2), other=0.0)
    x = v * tl.load(inv + n) - tl.load(c + (n * parents + j) * 16 + h)
    k1 = tl.load(coef + (n * parents + j) * 32 + h)  # the coefficients of x
    k2 = tl.load(coef + (n * parents + j) * 32 + 16 + h)  # and of x^2
    tl.store(out + (n * parents + j) * children + i1, tl.reduce(x * (k1 + x * k2), 1, _add), mask=i1 < children)


def _grad_pose_kernel(
    pose,
    weight,
    coord,
    c,
    inv,
    left,
    right,
    grad,
    children,
    parents,
    types,
    HAS_COORD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # dM[i, r, k] = sum_col dV[i, r, col] W[i, k, col], at h = (r, k): for each col, the votes V[i, r, col] are
    # formed (the same for every k) and multiply W[i, h % 4, col]
    n = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, 16)[None, :]
    ii = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK))[:, None]
    inside = ii < children
    u = tl.load(inv + n)
    rows = pose + (n * children + ii) * 16 + (h // 4) * 4
    m0 = tl.load(rows, mask=inside, other=0.0)  # M[i, h // 4, k], k = 0 .. 3
    m1 = tl.load(rows + 1, mask=inside, other=0.0)
    m2 = tl.load(rows + 2, mask=inside, other=0.0)
    m3 = tl.load(rows + 3, mask=inside, other=0.0)
    g = tl.full([BLOCK, 16], 0, pose.dtype.element_ty)  # d loss / d M
    for j in range(0, parents):
        base = n * parents + j
        transform = weight + ((ii % types) * parents + j) * 16  # (block, 1)
        le = tl.load(left + base * children + ii, mask=inside, other=0.0)
        for col in tl.static_range(4):
            v = m0 * tl.load(transform + col, mask=inside, other=0.0)
            v += m1 * tl.load(transform + 4 + col, mask=inside, other=0.0)
            v += m2 * tl.load(transform + 8 + col, mask=inside, other=0.0)
            v += m3 * tl.load(transform + 12 + col, mask=inside, other=0.0)
            if HAS_COORD and col < 2:
                v += tl.where(h < 4, tl.load(coord + 2 * ii + col, mask=inside, other=0.0), 0.0)
            e = (h // 4) * 4 + col  # the component (r, col)
            x = v * u - tl.load(c + base * 16 + e)
            dv = le * (tl.load(right + base * 32 + e) + 2.0 * x * tl.load(right + base * 32 + 16 + e)) * u
            g += dv * tl.load(transform + (h % 4) * 4 + col, mask=inside, other=0.0)
    tl.store(grad + (n * children + ii) * 16 + h, g, mask=inside)


def _grad_weight_kernel(
    pose,
    weight,
    coord,
    c,
    inv,
    left,
    right,
    partial,
    problems,
    children,
    parents,
    types,
    CHUNK,
    HAS_COORD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # dW[k, col] = sum_r M[r, k] dV[r, col], at h = (k, col): for each r, the votes V[i, r, col] are formed (the
    # same for every k) and multiply M[i, r, h // 4]
    j = tl.program_id(1)
    s = tl.program_id(2).to(tl.int64)
    h = tl.arange(0, 16)[None, :]
    wi = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK))[:, None]  # the block's transforms
    inside = wi < types
    cols = weight + (wi * parents + j) * 16 + h % 4
    w0 = tl.load(cols, mask=inside, other=0.0)  # W[iw, k, h % 4], k = 0 .. 3
    w1 = tl.load(cols + 4, mask=inside, other=0.0)
    w2 = tl.load(cols + 8, mask=inside, other=0.0)
    w3 = tl.load(cols + 12, mask=inside, other=0.0)
    g = tl.full([BLOCK, 16], 0, pose.dtype.element_ty)  # d loss / d W
    start = s * CHUNK
    for n in range(start, tl.minimum(start + CHUNK, problems)):  # this slice's problems (int64)
        u = tl.load(inv + n)
        base = n * parents + j
        for t in range(0, children // types):  # the children that use these transforms, in order
            ii = t * types + wi
            child = pose + (n * children + ii) * 16  # (block, 1)
            le = tl.load(left + base * children + ii, mask=inside, other=0.0)
            for r in tl.static_range(4):
                v = tl.load(child + 4 * r, mask=inside, other=0.0) * w0
                v += tl.load(child + 4 * r + 1, mask=inside, other=0.0) * w1
                v += tl.load(child + 4 * r + 2, mask=inside, other=0.0) * w2
                v += tl.load(child + 4 * r + 3, mask=inside, other=0.0) * w3
                if HAS_COORD and r == 0:
                    v += tl.load(coord + 2 * ii + h % 4, mask=inside & (h % 4 < 2), other=0.0)
                e = 4 * r + h % 4  # the component (r, col)
                x = v * u - tl.load(c + base * 16 + e)
                dv = le * (tl.load(right + base * 32 + e) + 2.0 * x * tl.load(right + base * 32 + 16 + e)) * u
                g += tl.load(child + 4 * r + h // 4, mask=inside, other=0.0) * dv
    tl.store(partial + ((s * types + wi) * parents + j) * 16 + h, g, mask=inside)


_KERNELS = (_stats_kernel, _moments_kernel, _quadratic_kernel, _grad_pose_kernel, _grad_weight_kernel)


def _kernels() -> dict:
    """Each kernel's name -> ``(compiled, interpreted)``, made on first use with the import of Triton."""
    with _lock:
        if "kernels" not in _state:
            # an optional dependency, imported on first use; the two wrappers are what triton.jit returns without
            # and with TRITON_INTERPRET=1
            import triton.language  # noqa: PLC0415
            from triton.runtime.interpreter import InterpretedFunction  # noqa: PLC0415
            from triton.runtime.jit import JITFunction  # noqa: PLC0415

            global tl, _add, _max
            tl = triton.language
            _add, _max = tl.standard._sum_combine, tl.standard._elementwise_max
            _state["kernels"] = {fn.__name__: (JITFunction(fn), InterpretedFunction(fn)) for fn in _KERNELS}
    return _state["kernels"]


def _interpreting(device: torch.device) -> bool:
    """Whether a launch on ``device`` runs in Triton's interpreter: CPU tensors, or ``TRITON_INTERPRET=1``."""
    if device.type == "cpu":
        return True
    try:
        import triton  # noqa: PLC0415  (imported already by _kernels)

        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # a Triton without knobs reads the variable itself
        return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _launch(name: str, grid: tuple[int, ...], device: torch.device, *args, **constants) -> None:
    compiled, interpreted = _kernels()[name]
    if _interpreting(device):
        interpreted[grid](*args, **constants)
    else:
        with torch.cuda.device(device):
            compiled[grid](*args, num_warps=NUM_WARPS, enable_fp_fusion=True, **constants)


def _check(pose: Tensor, weight: Tensor, coord: Tensor, **others: tuple[Tensor, tuple[int, ...]]) -> None:
    """Raise a ``ValueError`` unless the tensors have the layout of the module docstring (``others``: each
    tensor with the shape it must have)."""
    if pose.dim() != 3 or pose.shape[2] != 16 or weight.dim() != 3 or weight.shape[2] != 16:
        raise ArgumentError(
            f"pose must be (N, I, 16) and weight (Iw, J, 16); got {tuple(pose.shape)}, {tuple(weight.shape)}"
        )
    children, types = pose.shape[1], weight.shape[0]
    if types == 0 or children % types:
        raise ArgumentError(f"pose's I = {children} must be a multiple of weight's Iw = {types} (Iw >= 1)")
    if coord.numel() and tuple(coord.shape) != (children, 2):
        raise ArgumentError(f"coord must be (I, 2) = {(children, 2)} or empty; got {tuple(coord.shape)}")
    tensors = {"pose": (pose, tuple(pose.shape)), "weight": (weight, tuple(weight.shape)), **others}
    if coord.numel():
        tensors["coord"] = (coord, (children, 2))
    for name, (tensor, shape) in tensors.items():
        if tuple(tensor.shape) != shape:
            raise ArgumentError(f"{name} must have shape {shape}; got {tuple(tensor.shape)}")
        if tensor.dtype != pose.dtype or tensor.device != pose.device or not tensor.is_contiguous():
            raise ArgumentError(
                f"{name} must be contiguous, with pose's dtype and device ({pose.dtype}, {pose.device})"
            )
    if pose.dtype not in (torch.float32, torch.float64):
        raise ArgumentError(f"the kernels take float32 or float64 tensors; got {pose.dtype}")


def _coord(pose: Tensor, coord: Tensor) -> tuple[Tensor, bool]:
    """The coordinates' pointer argument (any tensor when there are none) and whether there are any."""
    return (coord, True) if coord.numel() else (pose, False)


def votes_stats(pose: Tensor, weight: Tensor, coord: Tensor, w0: Tensor) -> tuple[Tensor, Tensor]:
    """Each routing problem's ``w0``-weighted sum of the votes and largest ``|vote|``:
    ``mean[n, j] = sum_i w0[n, i] V[n, i, j]`` and ``top[n] = max_{i, j, h} |V[n, i, j, h]|`` (0 without votes;
    NaN where a vote is NaN).

    Shape:
        - pose: ``(N, I, 16)``; weight: ``(Iw, J, 16)``; coord: ``(I, 2)`` or empty; w0: ``(N, I)``
        - output: mean ``(N, J, 16)``, top ``(N,)``
    """
    n, children, parents = pose.shape[0], pose.shape[1], weight.shape[1]
    _check(pose, weight, coord, w0=(w0, (n, children)))
    if n == 0 or children == 0 or parents == 0:
        return pose.new_zeros(n, parents, 16), pose.new_zeros(n)
    mean, tops = pose.new_empty(n, parents, 16), pose.new_empty(n, parents)
    xy, has_coord = _coord(pose, coord)
    _launch(
        "_stats_kernel", (n, parents), pose.device, pose, weight, xy, w0, mean, tops,
        children, parents, weight.shape[0], HAS_COORD=has_coord, BLOCK=BLOCK_I,
    )  # fmt: skip
    return mean, tops.amax(dim=1)


def moments(pose: Tensor, weight: Tensor, coord: Tensor, c: Tensor, inv: Tensor, w: Tensor) -> Tensor:
    """The M-step's product: ``out[n, j] = sum_i w[n, j, i] [x, x^2]`` with ``x = V[n, i, j] inv[n] - c[n, j]``
    (0 without children).

    Shape:
        - pose: ``(N, I, 16)``; weight: ``(Iw, J, 16)``; coord: ``(I, 2)`` or empty; c: ``(N, J, 16)``;
          inv: ``(N,)``; w: ``(N, J, I)``
        - output: ``(N, J, 32)``, the sums of ``x`` then of ``x^2``
    """
    n, children, parents = pose.shape[0], pose.shape[1], weight.shape[1]
    _check(pose, weight, coord, c=(c, (n, parents, 16)), inv=(inv, (n,)), w=(w, (n, parents, children)))
    if n == 0 or children == 0 or parents == 0:
        return pose.new_zeros(n, parents, 32)
    out = pose.new_empty(n, parents, 32)
    xy, has_coord = _coord(pose, coord)
    _launch(
        "_moments_kernel", (n, parents), pose.device, pose, weight, xy, c, inv, w, out,
        children, parents, weight.shape[0], HAS_COORD=has_coord, BLOCK=BLOCK_I,
    )  # fmt: skip
    return out


def quadratic(pose: Tensor, weight: Tensor, coord: Tensor, c: Tensor, inv: Tensor, coef: Tensor) -> Tensor:
    """The E-step's product: ``out[n, j, i] = [x, x^2] . coef[n, j]`` with ``x = V[n, i, j] inv[n] - c[n, j]``.

    Shape:
        - pose: ``(N, I, 16)``; weight: ``(Iw, J, 16)``; coord: ``(I, 2)`` or empty; c: ``(N, J, 16)``;
          inv: ``(N,)``; coef: ``(N, J, 32)``, the coefficients of ``x`` then of ``x^2``
        - output: ``(N, J, I)``
    """
    n, children, parents = pose.shape[0], pose.shape[1], weight.shape[1]
    _check(pose, weight, coord, c=(c, (n, parents, 16)), inv=(inv, (n,)), coef=(coef, (n, parents, 32)))
    out = pose.new_empty(n, parents, children)
    if out.numel() == 0:
        return out
    xy, has_coord = _coord(pose, coord)
    _launch(
        "_quadratic_kernel", (n, parents, _cdiv(children, BLOCK_I)), pose.device, pose, weight, xy, c, inv,
        coef, out, children, parents, weight.shape[0], HAS_COORD=has_coord, BLOCK=BLOCK_I,
    )  # fmt: skip
    return out


def votes_backward(
    pose: Tensor, weight: Tensor, coord: Tensor, c: Tensor, inv: Tensor, left: Tensor, right: Tensor
) -> tuple[Tensor, Tensor]:
    """The gradients with respect to ``pose`` and ``weight`` of ``sum left[n, j, i] right[n, j, k] xx[n, j, i, k]``,
    ``xx = [x, x^2]``, ``x = V[n, i, j] inv[n] - c[n, j]`` (``c`` and ``inv`` constants): with
    ``dV = inv left (right[:16] + 2 x right[16:])``, ``grad_pose[n, i] = sum_j dV W^T`` and
    ``grad_weight[iw, j] = sum_n sum_{i = iw mod Iw} M^T dV`` (4x4 matrices). The transforms' gradient is summed
    in a fixed order (no atomics): the same bits from run to run.

    Shape:
        - pose: ``(N, I, 16)``; weight: ``(Iw, J, 16)``; coord: ``(I, 2)`` or empty; c: ``(N, J, 16)``;
          inv: ``(N,)``; left: ``(N, J, I)``; right: ``(N, J, 32)``
        - output: grad_pose ``(N, I, 16)``, grad_weight ``(Iw, J, 16)``
    """
    n, children, parents, types = pose.shape[0], pose.shape[1], weight.shape[1], weight.shape[0]
    _check(
        pose, weight, coord,
        c=(c, (n, parents, 16)), inv=(inv, (n,)), left=(left, (n, parents, children)), right=(right, (n, parents, 32)),
    )  # fmt: skip
    if n == 0 or children == 0 or parents == 0:
        return pose.new_zeros(pose.shape), weight.new_zeros(weight.shape)
    grad_pose, grad_weight = pose.new_empty(pose.shape), weight.new_empty(weight.shape)  # every element written
    xy, has_coord = _coord(pose, coord)
    args = (pose, weight, xy, c, inv, left, right)
    _launch(
        "_grad_pose_kernel", (n, _cdiv(children, BLOCK_I)), pose.device, *args, grad_pose,
        children, parents, types, HAS_COORD=has_coord, BLOCK=BLOCK_I,
    )  # fmt: skip
    blocks = _cdiv(types, BLOCK_W)
    chunk = _cdiv(n, min(n, _cdiv(PROGRAMS, blocks * parents)))  # problems per slice
    slices = _cdiv(n, chunk)
    partial = grad_weight if slices == 1 else weight.new_empty(slices, *weight.shape)
    _launch(
        "_grad_weight_kernel", (blocks, parents, slices), pose.device, *args, partial,
        n, children, parents, types, chunk, HAS_COORD=has_coord, BLOCK=BLOCK_W,
    )  # fmt: skip
    if slices > 1:
        torch.sum(partial, dim=0, out=grad_weight)
    return grad_pose, grad_weight


def _cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ``a >= 0``, ``b >= 1`` (``triton.cdiv``, without importing Triton)."""
    return -(-a // b)
