"""EM routing's fused CPU kernel: the procedure computed from poses and transforms, in cache, with one
hand-written backward.

Matrix capsule layers route the votes ``V = M W`` of their child poses ``M`` and transforms ``W``, and EM
routing uses the votes only through products with ``[x, x^2]``, ``x = V / scale - c``
(:mod:`capsnets.functional.em.procedure`). ``csrc/em_votes.cpp`` computes each product straight from ``M`` and
``W``, one routing problem at a time in cache, so the ``(N, J, I, 16)`` vote tensor is never written to memory,
forward or backward (the backward recomputes the votes it needs). Its ``route`` runs the whole procedure
(M-steps, E-steps, the child groups' normalisation) and keeps what the backward needs: every iteration with
exact gradients, the last one with ``detach_routing``, nothing without gradients; without child groups it runs
each problem's iterations in turn, so that the children's ``x``, made by the first M-step, stay in cache for the
later ones (child groups couple the problems, so there each iteration runs over all of them). The backward
(:class:`_FusedEM`) is the procedure's derivative written out by hand, in reverse order, every step of it
in the kernel; it covers every setting of :class:`~capsnets.functional.em.spec.EMSettings` and agrees with
autograd through the PyTorch path (the tests compare them, and gradcheck it in float64). Without child groups
(and the ``mean_std`` cost normalisation) it runs as one pass over the routing problems, each problem's votes
made once and its rows of every intermediate kept in cache; otherwise each step runs over all problems in turn.

Inside each routing problem the loops over children run on chunks of 16 vote components held in vector
registers (GCC and Clang vector extensions: the kernel builds with those compilers only; elsewhere the PyTorch
path runs). In float32, the child groups' exponentials and the log variances use the polynomials of Cephes'
``expf`` and ``logf`` (within 2 ulp) instead of the C library's calls, which do not vectorise; float64 uses
the library's.

The kernel is C++ with OpenMP (``at::parallel_for``), compiled by PyTorch's extension tooling
(:func:`torch.utils.cpp_extension.load`, with the compiler and ninja that are on the machine) the first time
it is needed, with a one-line notice on stderr, and kept in a build directory of its own per source, flags,
CPU, torch and Python (:mod:`capsnets.functional.em.build`: under ``TORCH_EXTENSIONS_DIR`` when set, else
``~/.cache/capsnets/em_kernel``); later processes load it from there. :func:`build_needed` says whether
the next use compiles; ``python -m capsnets.functional.em.kernel`` builds it ahead of time. It is compiled on
the machine rather than at ``pip install``: a build-time step would need torch inside pip's isolated build
environment, which fetches a torch build of its own (possibly another version, breaking the extension's ABI).

Which path runs is set by the environment variable ``CAPSNETS_EM_KERNEL``:

- ``auto`` (default): the kernel for float32/float64 pose matrices (4x4) on the CPU, when it builds and
  loads; otherwise the PyTorch path, with one warning that says why. On CUDA, the Triton kernels
  (:mod:`capsnets.functional.em.triton_path`) when Triton is installed, else the PyTorch path;
- ``cpp``: the kernel wherever it applies, and an error if it cannot be built or loaded;
- ``torch``: always the PyTorch path (the reference, and the path for half precision, ``torch.compile``
  and export);
- ``triton``: the Triton kernels for every 4x4 pose (CPU tensors run in Triton's interpreter: slow, for
  tests), and an error without a usable Triton.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import threading
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from capsnets.functional.child_groups import ChildGroups
from capsnets.functional.em import build
from capsnets.functional.em.procedure import Scale, initial_assignments
from capsnets.functional.em.recomputed import FusedVotes
from capsnets.functional.em.spec import BETA_A_SCALE, BLEND, COST_NORMALIZATIONS, GRADIENT_MASS_FLOOR, EMSettings
from capsnets.validation import ArgumentError

ENV_VAR = "CAPSNETS_EM_KERNEL"
MODES = ("auto", "cpp", "torch", "triton")
_SOURCE = build.SOURCE
_lock = threading.Lock()
_state: dict = {"tried": False, "module": None, "error": None, "warned": False, "building": False}


def kernel_mode() -> str:
    """The path chosen by ``CAPSNETS_EM_KERNEL``: ``"auto"``, ``"cpp"``, ``"torch"`` or ``"triton"``."""
    mode = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ArgumentError(f"{ENV_VAR} must be one of {MODES}, got {os.environ.get(ENV_VAR)!r}")
    return mode


def load(verbose: bool = False):
    """Build (the first time for this source, torch and Python: :func:`build_needed`) and load the extension.
    Returns the module, or None if it cannot be built or loaded (:func:`load_error` says why). Tried once per
    process. A build says so in one line on stderr first (:func:`~capsnets.functional.em.build.compile_notice`)."""
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            try:
                directory = build.build_directory()
                library = build.library_path(directory)
                if library.is_file() and not (directory / "lock").exists():  # built, and no build under way
                    _state["module"] = _import(library)
                else:
                    print(build.compile_notice(directory), file=sys.stderr, flush=True)
                    _state["building"] = True
                    _state["module"] = _build(directory, verbose)
            except Exception as exc:  # no compiler, no ninja, a failed build: the PyTorch path remains
                last = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
                _state["error"] = f"{type(exc).__name__}: {last}"
            finally:
                _state["building"] = False
    return _state["module"]


def build_needed() -> bool:
    """Whether the next use of the kernel in this process waits for it to compile: it is being compiled now,
    or it is not loaded yet and its build directory (:func:`~capsnets.functional.em.build.build_directory`)
    holds no library. False with ``CAPSNETS_EM_KERNEL=torch``. Compiles nothing."""
    if kernel_mode() == "torch":
        return False
    if _state.get("building"):
        return True
    return not _state["tried"] and not build.library_path(build.build_directory()).is_file()


def _build(directory: Path, verbose: bool):
    """Compile the extension in ``directory`` (PyTorch's extension tooling, with ninja) and load it. The source
    is copied there first, so that every build of it runs the same commands, whatever the checkout."""
    # the extension tooling: slow to import, needed once per process
    from torch.utils.cpp_extension import load as load_extension  # noqa: PLC0415

    path = os.environ.get("PATH", "")
    try:
        try:  # the ninja of the pip package (a dependency), also when the environment is not activated
            import ninja  # noqa: PLC0415

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + path
        except ImportError:
            pass
        directory.mkdir(parents=True, exist_ok=True)
        source = directory / build.SOURCE.name
        if not source.is_file() or source.read_bytes() != build.SOURCE.read_bytes():
            shutil.copyfile(build.SOURCE, source)
        return load_extension(
            name=build.NAME,
            sources=[str(source)],
            extra_cflags=list(build.CFLAGS),
            extra_ldflags=list(build.LDFLAGS),
            build_directory=str(directory),
            verbose=verbose,
        )
    finally:
        os.environ["PATH"] = path


def _import(library: Path):
    """Load a built extension from its library file, without running the build tool."""
    spec = importlib.util.spec_from_file_location(build.NAME, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the fused EM kernel from {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_error() -> str | None:
    """Why the extension could not be built or loaded (None if it loaded or was not tried)."""
    return _state["error"]


def fused_kernel(pose: Tensor):
    """The extension module to use for poses like ``pose`` ``(..., 4, 4)``, or None for the PyTorch path.

    None when ``CAPSNETS_EM_KERNEL=torch``, off the CPU, for dtypes other than float32/float64, for poses
    other than 4x4, or while ``torch.compile``/export traces the model. With ``cpp``, raises if the kernel
    cannot be loaded; with ``auto``, warns once and returns None.
    """
    mode = kernel_mode()
    if (
        mode in ("torch", "triton")
        or pose.device.type != "cpu"
        or pose.dtype not in (torch.float32, torch.float64)
        or tuple(pose.shape[-2:]) != (4, 4)
        or torch.compiler.is_compiling()
        or torch.jit.is_scripting()
        or torch.jit.is_tracing()
    ):
        return None
    module = load()
    if module is None:
        if mode == "cpp":
            raise RuntimeError(
                f"{ENV_VAR}=cpp, but the fused EM kernel could not be built or loaded "
                f"({load_error()}). Install a C++ compiler and ninja (pip install ninja), or "
                f"set {ENV_VAR}=torch for the PyTorch path."
            )
        if not _state["warned"]:
            _state["warned"] = True
            warnings.warn(
                f"capsnets: the fused EM kernel could not be built or loaded ({load_error()}); EM "
                f"routing uses the PyTorch path (same results, slower). Set {ENV_VAR}=torch to "
                f"silence this.",
                RuntimeWarning,
                stacklevel=3,
            )
    return module


class _GatherRows(torch.autograd.Function):
    """The kernel's ``gather_rows`` with ``scatter_rows`` as its backward."""

    @staticmethod
    def forward(ctx, values, index, kernel):
        ctx.kernel, ctx.rows = kernel, values.shape[1]
        ctx.save_for_backward(index)
        return kernel.gather_rows(values, index)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return ctx.kernel.scatter_rows(grad.contiguous(), index, ctx.rows), None, None


def gather_patches(kernel, values: Tensor, index: Tensor) -> Tensor:
    """:func:`capsnets.functional.patches.gather_patches` by the kernel (from :func:`fused_kernel`): the same
    receptive fields, gathered per image in parallel and differentiated by a parallel sum over each image's slots
    instead of ``index_add``. Slots equal to ``T * H * W`` (the zero padding) read zeros, so no zero capsule is
    appended.

    Shape:
        - values: ``(B, T * H * W)`` or ``(B, T * H * W, F)``, float32 or float64 on the CPU
        - index: ``(H' * W', T * K * K)`` (:func:`~capsnets.functional.patches.patch_index`)
        - output: ``(B * H' * W', T * K * K)`` or ``(B * H' * W', T * K * K, F)``
    """
    batch = values.shape[0]
    rows = values.reshape(batch, values.shape[1], -1).contiguous()
    out = _GatherRows.apply(rows, index.reshape(-1), kernel)
    return out.view(batch * index.shape[0], index.shape[1], *values.shape[2:])


class _Iteration(NamedTuple):
    """What the backward needs of one iteration: its M-step's assignments ``r`` (N, J, I), the M-step product
    ``m = [sum_i w x, sum_i w x^2]`` (N, J, 32), the centre ``d``, ``var``, ``log_var`` (N, J, 16), the
    activation logit ``pre`` and the mass ``sum_i r a`` (N, J)."""

    r: Tensor
    m: Tensor
    d: Tensor
    var: Tensor
    log_var: Tensor
    pre: Tensor
    mass: Tensor


def route_fused(
    kernel,
    votes: FusedVotes,
    a_in: Tensor,
    beta_v: Tensor,
    beta_a: Tensor,
    settings: EMSettings,
    scale: Scale,
    groups: ChildGroups | None,
    want_r: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """EM routing of ``votes`` by the kernel: poses (N, J, 16), activations (N, J) and, with ``want_r``, the
    assignments (N, J, I) (else an empty tensor). ``a_in`` (N, 1, I), ``beta_v``, ``beta_a`` (J,) or (1,)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (votes.pose, votes.weight, a_in, beta_v, beta_a)):
        return _FusedEM.apply(
            votes.pose, votes.weight, a_in, beta_v, beta_a, votes, kernel, settings, scale, groups, want_r
        )
    r, d, pre = _route(kernel, votes, a_in, beta_v, beta_a, settings, scale, groups, keep=0)[:3]
    return _poses(d, votes), torch.sigmoid(pre), r if want_r else r.new_empty(0)


def _route(
    kernel,
    votes: FusedVotes,
    a_in,
    beta_v,
    beta_a,
    settings: EMSettings,
    scale: Scale,
    groups: ChildGroups | None,
    keep: int,
) -> list[Tensor]:
    """``kernel.route``: ``[r, d, pre]`` of the last M-step, then what is kept of the last (``keep`` 1) or of
    every iteration (``keep`` 2), as the fields of :class:`_Iteration` with a leading iteration axis."""
    with torch.no_grad():
        parents = votes.weight.shape[1]
        r0 = initial_assignments(votes.c, a_in, groups).contiguous()  # routed in place by the kernel
        index = groups.index.contiguous() if groups is not None else votes.pose.new_empty(0, dtype=torch.long)
        return kernel.route(
            *votes,
            a_in.squeeze(1).contiguous(),
            beta_v.expand(parents).contiguous(),
            beta_a.expand(parents).contiguous(),
            scale.floor.reshape(-1).contiguous(),
            scale.log_var.reshape(-1).contiguous(),
            r0,
            index,
            list(settings.inverse_temperatures),
            settings.eps,
            settings.official,
            COST_NORMALIZATIONS.index(settings.cost_normalization),
            1 if groups is not None and groups.normalize == "per_type" else 0,
            groups.count if groups is not None else 0,
            groups.blocks if groups is not None else 1,
            keep,
        )


def _poses(d: Tensor, votes: FusedVotes) -> Tensor:
    """The centres ``d`` (N, J, 16) about the origin, in scaled units, as poses in real units (clamped only
    against rounding at the very top)."""
    top = torch.finfo(d.dtype).max
    return ((d + votes.c) / votes.inv.view(-1, 1, 1)).clamp(-top, top)


class _FusedEM(torch.autograd.Function):
    """EM routing by the kernel, differentiated by hand (the module docstring).

    Every use of the votes is a product with ``xx = [x, x^2]``, so ``d loss / d xx`` is a sum of outer
    products, one per product: ``left (K, N, J, I)`` by ``right (N, J, K, 32)``, from which the kernel forms
    ``d pose`` and ``d weight`` (``votes_backward``), recomputing the votes."""

    @staticmethod
    def forward(ctx, pose, weight, a_in, beta_v, beta_a, votes, kernel, settings, scale, groups, want_r):
        keep = 1 if settings.detach_routing else 2  # detached: the assignments before the last M-step are constants
        r, d, pre, *kept = _route(kernel, votes, a_in, beta_v, beta_a, settings, scale, groups, keep)
        ctx.kernel, ctx.votes, ctx.settings, ctx.groups = kernel, votes, settings, groups
        ctx.kept = kept
        ctx.iterations = [_Iteration(*(k[t] for k in kept)) for t in range(kept[0].shape[0])]
        ctx.want_r = want_r
        ctx.save_for_backward(a_in, beta_v, beta_a)
        return _poses(d, votes), torch.sigmoid(pre), (r if want_r else r.new_empty(0))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_mu, g_a, g_r):
        a_in, beta_v, beta_a = ctx.saved_tensors
        g_r = g_r if ctx.want_r else None
        if _one_pass(ctx):
            return (*_backward_fused(ctx, a_in, beta_v, beta_a, g_mu, g_a, g_r), None, None, None, None, None, None)
        grads, left, right = _backward(ctx, a_in, beta_v, beta_a, g_mu, g_a, g_r)
        grad_pose = grad_weight = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            grad_pose, grad_weight = ctx.kernel.votes_backward(*ctx.votes, left, right)
        return (grad_pose, grad_weight, *grads, None, None, None, None, None, None)


def _one_pass(ctx) -> bool:
    """Whether the backward runs as the kernel's ``backward_fused``, one routing problem at a time: without child
    groups (which couple the problems) and without the ``mean_std`` cost normalisation (whose gradient
    :func:`_cost_gradient` forms across the parents between the kernel's steps)."""
    return ctx.groups is None and ctx.settings.cost_normalization != "mean_std"


def _start(ctx, g_mu, g_a) -> tuple[Tensor, Tensor]:
    """The gradients the backward starts from: of the last centre ``d`` (scaled units, (N, J, 16)) and of the last
    activation logit ``pre`` (N, J), zeros where the output's gradient is None."""
    votes, last_pre = ctx.votes, ctx.iterations[-1].pre
    g_d = torch.zeros_like(votes.c) if g_mu is None else (g_mu / votes.inv.view(-1, 1, 1)).contiguous()
    g_pre = (
        torch.zeros_like(last_pre)
        if g_a is None
        else (g_a * torch.sigmoid(last_pre) * torch.sigmoid(-last_pre)).contiguous()
    )
    return g_d, g_pre


def _backward_fused(ctx, a_in, beta_v, beta_a, g_mu, g_a, g_r):
    """The gradients of the poses, transforms, ``a_in``, ``beta_v`` and ``beta_a`` by the kernel's
    ``backward_fused`` (where :func:`_one_pass`): the steps of :func:`_backward` and ``votes_backward``, one
    routing problem at a time, each problem's votes made once and its intermediates kept in cache."""
    settings, votes = ctx.settings, ctx.votes
    g_d, g_pre = _start(ctx, g_mu, g_a)
    n, _, children = a_in.shape
    parents, height = votes.c.shape[1:]
    scale = parents / (children * height) if settings.cost_normalization == "mass" else 0.0
    g_pose, g_weight, g_a_in, g_bv, g_ba = ctx.kernel.backward_fused(
        *votes,
        ctx.kept,
        a_in.reshape(n, children).contiguous(),
        beta_v.expand(parents).contiguous(),
        g_d,
        g_pre,
        a_in.new_empty(0) if g_r is None else g_r.contiguous(),
        list(settings.inverse_temperatures[-len(ctx.iterations) :]),
        settings.eps,
        settings.official,
        scale,
        GRADIENT_MASS_FLOOR,
        BLEND,
        BETA_A_SCALE,
    )
    return g_pose, g_weight, g_a_in.view_as(a_in), _reduce_like(g_bv, beta_v), _reduce_like(g_ba, beta_a)


def _backward(ctx, a_in, beta_v, beta_a, g_mu, g_a, g_r):
    """The gradients of ``a_in``, ``beta_v``, ``beta_a`` and the votes' outer-product factors ``(left, right)``,
    by the derivative of each equation of the M- and E-steps in reverse order, all in the kernel. For each
    iteration: the per-parent algebra before its M-step (``mstep_parents``: the variance about the centre,
    the centre and the activation logit), the M-step's per-child work (``mstep_back``, with the product that
    needs the votes), the child groups' sums (``group_sum``), the E-step's per-child work (``estep_back``)
    and the per-parent algebra after it (``estep_parents``: the log densities' parameters). With
    ``detach_routing`` only the last M-step is differentiated. No autograd graph of the procedure is built."""
    kernel, votes, settings, groups, saved = ctx.kernel, ctx.votes, ctx.settings, ctx.groups, ctx.iterations
    lambdas = settings.inverse_temperatures[-len(saved) :]
    cc = votes.c
    last_pre = saved[-1].pre
    g_d, g_pre = _start(ctx, g_mu, g_a)  # the state carried from step to step, updated in place by the kernel
    g_var = torch.zeros_like(cc)  # from the E-step that used this iteration's parameters
    g_sum_log, g_bv, g_ba = (torch.zeros_like(last_pre) for _ in range(3))
    n, _, children = a_in.shape
    a_flat = a_in.reshape(n, children).contiguous()
    g_a_in = a_in.new_zeros(n, children)  # accumulated in place by the kernel
    empty = a_in.new_empty(0)
    g_r_extra = empty if g_r is None else g_r.contiguous()
    bv = beta_v.expand(cc.shape[1]).contiguous()
    left = a_in.new_empty(2 * len(saved) - 1, *saved[0].r.shape)  # (K, N, J, I)
    right = a_in.new_empty(*cc.shape[:2], len(left), 2 * cc.shape[-1])  # (N, J, K, 32)
    constants = (settings.official, GRADIENT_MASS_FLOOR, BLEND, BETA_A_SCALE)
    col = 0
    for t in range(len(saved) - 1, -1, -1):
        st = saved[t]
        g_cost = _cost_gradient(settings, lambdas[t], g_pre, st, bv, children)
        coef, guard, floored, slope, base = kernel.mstep_parents(
            st.m,
            st.d,
            st.var,
            st.log_var,
            st.mass,
            cc,
            bv,
            g_cost,
            g_d,
            g_var,
            g_pre,
            g_sum_log,
            g_bv,
            g_ba,
            right,
            col,
            float(lambdas[t]),
            settings.eps,
            *constants,
        )
        # per child: g_w = [x, x^2] . coef; g_R' = g_w / floored + g_mass; d a_in += sum_j g_R' r;
        # left[col] = R' / guard (the M-step's weights); for the E-step before it g_r = g_R' a (+ the output
        # assignments' gradient, last step) and y = r g_r
        extra = g_r_extra if t == len(saved) - 1 else empty
        g_r_t, y = kernel.mstep_back(
            *votes, coef, st.r, a_flat, guard, floored, slope, base, extra, left[col], g_a_in, t > 0
        )
        col += 1
        if t == 0:
            break
        # E-step t-1: r = softmax over each child's normalisation group of z, with
        # z = logsigmoid(pre) - 0.5 (sum_h (x - d)^2 / var + sum_h log_var + H log 2 pi);
        # gz = r (g_r - group sum of r g_r) goes to left[col], with sum_i gz [x, x^2] and sum_i gz
        if groups is None:
            total = y.sum(dim=1, keepdim=True)
        else:
            total = kernel.group_sum(
                y, groups.index.contiguous(), groups.count, groups.normalize == "per_type", groups.blocks
            )
        s12, s0 = kernel.estep_back(*votes, st.r, g_r_t, total, left[col])
        prev = saved[t - 1]
        kernel.estep_parents(s12, s0, prev.d, prev.var, prev.pre, g_d, g_var, g_pre, g_sum_log, right, col)
        col += 1
    grads = (g_a_in.view_as(a_in), _reduce_like(g_bv, beta_v), _reduce_like(g_ba, beta_a))
    return grads, left, right


def _cost_gradient(
    settings: EMSettings, lam: float, g_pre: Tensor, st: _Iteration, beta_v: Tensor, children: int
) -> Tensor:
    """The gradient (N, J) of the paper's cost ``(H beta_v + 0.5 sum_h log_var) mass`` through its
    normalisation, from that of the logit ``lam (beta_a - normalised cost)``; empty without a normalisation
    (the kernel then takes ``-lam g_pre``)."""
    if settings.cost_normalization is None:
        return g_pre.new_empty(0)
    g_z = -lam * g_pre  # the normalised cost's gradient
    height = st.d.shape[-1]
    if settings.cost_normalization == "mass":
        return (g_z * (st.mass.shape[1] / (children * height))).contiguous()
    # mean_std: z = (cost - mean) / sqrt(var + eps) across the parents, differentiated as a layer norm
    cost = (height * beta_v + 0.5 * st.log_var.sum(dim=-1)) * st.mass
    centred = cost - cost.mean(dim=1, keepdim=True)
    rs = torch.rsqrt(centred.square().mean(dim=1, keepdim=True) + settings.eps)
    z = centred * rs
    return (rs * (g_z - g_z.mean(dim=1, keepdim=True) - z * (g_z * z).mean(dim=1, keepdim=True))).contiguous()


def _reduce_like(grad: Tensor, like: Tensor) -> Tensor:
    """``grad`` (N, J) summed to the shape of a ``beta`` (``(J,)`` or ``(1,)``)."""
    grad = grad.sum(dim=0)
    return grad.sum().reshape(1) if like.numel() == 1 else grad


if __name__ == "__main__":  # python -m capsnets.functional.em.kernel: build ahead of time and report
    module = load(verbose=True)
    if module is None:
        raise SystemExit(f"the fused EM kernel could not be built: {load_error()}")
    print(f"fused EM kernel ready: {module.__file__}")
