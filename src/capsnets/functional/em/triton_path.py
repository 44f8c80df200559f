"""EM routing of matrix capsules on the GPU with the votes recomputed, never stored.

The procedure's iterations (:func:`~capsnets.functional.em.procedure.iterate`) see the votes only through two
products with ``xx = [x, x^2]``, ``x = V / scale - c`` (:class:`~capsnets.functional.em.procedure.VoteProducts`).
Here each product is a Triton kernel (:mod:`capsnets.functional.em.triton_votes`) that computes the votes
``V = M W`` of a block of children from the poses ``M`` and transforms ``W`` in registers, forward and backward,
so the ``(B, J, I, 16)`` votes and their squares are never written to memory. Everything else (the per-parent
algebra of the M-step, the E-step's softmax, the child groups) is the PyTorch path's own code, differentiated by
autograd; the products are :class:`torch.autograd.Function` s whose backward passes are the same two products
and one kernel that turns ``d loss / d xx`` (an outer product) into the gradients of the poses and transforms.

It runs for 4x4 pose matrices on CUDA (``CAPSNETS_EM_KERNEL=auto`` or ``triton``), in float32, or float64
for float64 inputs and for votes too large for float32 gradients (as the other paths). Half-precision inputs
are routed in float32. With ``CAPSNETS_EM_KERNEL=triton`` it also runs on CPU tensors, in Triton's interpreter
(NumPy on the host: slow, but the same kernels), which is how the tests check it without a GPU.
"""

from __future__ import annotations

import threading
import warnings

import torch
from torch import Tensor

from capsnets.functional.child_groups import ChildGroups
from capsnets.functional.em import recomputed, triton_votes
from capsnets.functional.em.kernel import ENV_VAR, kernel_mode
from capsnets.functional.em.procedure import Scale, iterate
from capsnets.functional.em.recomputed import FusedVotes
from capsnets.functional.em.spec import EMSettings

__all__ = ["applies", "route_poses", "works_on"]

#: Whether the kernels ran on each device tried, by ``(type, index)`` (:func:`works_on`).
_works: dict[tuple[str, int | None], bool] = {}
_works_lock = threading.Lock()


def applies(poses: Tensor, weight: Tensor, coordinates: Tensor | None) -> bool:
    """Whether :func:`route_poses` routes these poses: with ``CAPSNETS_EM_KERNEL=auto``, 4x4 poses on CUDA when
    Triton is installed, outside ``torch.compile`` and tracing; with ``triton``, every 4x4 pose (CPU tensors in
    Triton's interpreter), and an error if Triton is not installed. Learned coordinates (that need a gradient)
    go to the PyTorch path."""
    mode = kernel_mode()
    if mode not in ("auto", "triton"):
        return False
    four = tuple(poses.shape[-2:]) == (4, 4) and weight.dtype == poses.dtype
    if coordinates is not None and coordinates.requires_grad:
        four = False  # learned coordinates: the PyTorch path differentiates them
    if mode == "auto":
        return (
            four
            and poses.is_cuda
            and triton_votes.available()
            and not (torch.compiler.is_compiling() or torch.jit.is_scripting() or torch.jit.is_tracing())
            and works_on(poses.device)
        )
    if four and not triton_votes.available():
        raise RuntimeError(
            f"{ENV_VAR}=triton, but Triton is not installed, or is a version the kernels are not built for: "
            f"pip install 'triton>=3.9', or set {ENV_VAR}=auto"
        )
    return four


def works_on(device: torch.device) -> bool:
    """Whether the kernels compile and run on ``device``, tried once per device (per process) on a small routing,
    forward and backward. Where they fail, for example on a GPU that Triton cannot compile for, it warns once and
    :func:`applies` sends that device's routing to the PyTorch path in ``auto`` mode (``triton`` mode raises the
    kernels' own error instead)."""
    key = (device.type, device.index)
    with _works_lock:
        if key not in _works:
            try:
                _trial(device)
                _works[key] = True
            except Exception as error:  # any failure to compile or run: the PyTorch path remains
                _works[key] = False
                warnings.warn(
                    f"EM routing's Triton kernels failed on {device} ({type(error).__name__}: {error}); EM routing "
                    f"there takes the PyTorch path. {ENV_VAR}=triton shows the whole error, {ENV_VAR}=torch skips "
                    "the trial",
                    RuntimeWarning,
                    stacklevel=2,
                )
    return _works[key]


def _trial(device: torch.device) -> None:
    """Route 8 children to 2 parents on ``device`` by the kernels, forward and backward, so that every kernel
    compiles and runs once."""
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):
        poses = torch.randn(2, 8, 4, 4, generator=gen).to(device).requires_grad_()
        weight = (torch.randn(8, 2, 4, 4, generator=gen) / 2).to(device).requires_grad_()
        activations = torch.rand(2, 8, generator=gen).to(device)
        settings = EMSettings((1.0, 1.0), 1e-8)
        mu, a_out = route_poses(poses, weight, activations, 0.0, 0.0, settings)
        (mu.square().sum() + a_out.sum()).backward()
    if not (torch.isfinite(poses.grad).all() and torch.isfinite(weight.grad).all()):
        raise FloatingPointError("the trial routing's gradients are not finite")


class RecomputedVotes(FusedVotes):
    """:class:`~capsnets.functional.em.procedure.VoteProducts` computed by the Triton kernels from the poses and
    transforms (:class:`~capsnets.functional.em.recomputed.FusedVotes`' fields), with gradients for both."""

    def moments(self, w: Tensor) -> Tensor:
        return _Moments.apply(w, self.pose, self.weight, self.coord, self.c, self.inv)

    def quadratic(self, coef: Tensor) -> Tensor:
        return _Quadratic.apply(coef, self.pose, self.weight, self.coord, self.c, self.inv)


class _Moments(torch.autograd.Function):
    """``sum_i w xx`` (B, J, 32) from the weights ``w`` (B, J, I); its backward: ``d w = xx . g`` (the E-step's
    product) and the poses' and transforms' gradients of the outer product ``w g``."""

    @staticmethod
    def forward(ctx, w, pose, weight, coord, c, inv):
        w = w.contiguous()
        ctx.save_for_backward(w, pose, weight, coord, c, inv)
        return triton_votes.moments(pose, weight, coord, c, inv, w)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        w, pose, weight, coord, c, inv = ctx.saved_tensors
        g = g.contiguous()
        grad_w = triton_votes.quadratic(pose, weight, coord, c, inv, g) if ctx.needs_input_grad[0] else None
        grad_pose = grad_weight = None
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            grad_pose, grad_weight = triton_votes.votes_backward(pose, weight, coord, c, inv, w, g)
        return grad_w, grad_pose, grad_weight, None, None, None


class _Quadratic(torch.autograd.Function):
    """``xx . coef`` (B, J, I) from the coefficients ``coef`` (B, J, 32); its backward: ``d coef = sum_i g xx``
    (the M-step's product) and the poses' and transforms' gradients of the outer product ``g coef``."""

    @staticmethod
    def forward(ctx, coef, pose, weight, coord, c, inv):
        coef = coef.contiguous()
        ctx.save_for_backward(coef, pose, weight, coord, c, inv)
        return triton_votes.quadratic(pose, weight, coord, c, inv, coef)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        coef, pose, weight, coord, c, inv = ctx.saved_tensors
        g = g.contiguous()
        grad_coef = triton_votes.moments(pose, weight, coord, c, inv, g) if ctx.needs_input_grad[0] else None
        grad_pose = grad_weight = None
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            grad_pose, grad_weight = triton_votes.votes_backward(pose, weight, coord, c, inv, g, coef)
        return grad_coef, grad_pose, grad_weight, None, None, None


def route_poses(
    poses: Tensor,
    weight: Tensor,
    activations: Tensor,
    beta_v,
    beta_a,
    settings: EMSettings,
    coordinates: Tensor | None = None,
    child_groups: ChildGroups | None = None,
    return_assignments: bool = False,
):
    """:func:`~capsnets.functional.em_routing_poses` by the Triton kernels (the shapes already checked, and
    :func:`applies` true)."""
    return recomputed.route_poses(
        triton_votes.votes_stats,
        _iterations,
        poses,
        weight,
        activations,
        beta_v,
        beta_a,
        settings,
        coordinates,
        child_groups,
        return_assignments,
    )


def _iterations(votes: FusedVotes, a_in, beta_v, beta_a, settings: EMSettings, scale: Scale, groups):
    """The PyTorch path's iterations on the products of the Triton kernels."""
    return iterate(RecomputedVotes(*votes), votes.c.unsqueeze(2), scale, a_in, beta_v, beta_a, settings, groups)
