"""The set-up of EM routing from matrix capsules' poses and transforms, shared by the CPU kernel
(:mod:`capsnets.functional.em.kernel`) and the Triton kernels (:mod:`capsnets.functional.em.triton_path`): the
inputs checked, each problem's origin and scale (:class:`~capsnets.functional.em.procedure.Scale`), float64 for votes
too large for float32 gradients (:mod:`capsnets.functional.em`); the iterations are the backend's."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from capsnets.functional.child_groups import ChildGroups
from capsnets.functional.em.procedure import scale_from_top
from capsnets.functional.em.spec import (
    EMSettings,
    check_activations,
    check_beta,
    check_child_groups,
    checking,
    device_scale_limit,
    host_reads,
    routing_dtype,
    without_autocast,
)
from capsnets.validation import ArgumentError

__all__ = ["FusedVotes", "route_poses"]


class FusedVotes(NamedTuple):
    """The votes ``V[b, i, j] = M[b, i] W[i % Iw, j]`` (+ coordinates) as the kernels see them, never stored."""

    pose: Tensor  # (B, I, 16) child poses
    weight: Tensor  # (Iw, J, 16) transforms
    coord: Tensor  # (I, 2) coordinates added to components 0 and 1, or empty
    c: Tensor  # (B, J, 16) the per-parent origin, in the units of inv
    inv: Tensor  # (B,) 1 / each problem's power-of-two scale


def route_poses(
    votes_stats: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]],
    iterations: Callable[..., tuple[Tensor, Tensor, Tensor]],
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
    """:func:`~capsnets.functional.em_routing_poses` of 4x4 poses (the shapes checked; coordinates without
    gradient) by a backend: ``votes_stats(pose, weight, coord, w0)`` gives each problem's ``sum_i w0 V`` (B, J, 16)
    and largest ``|V|`` (B,); ``iterations(votes, a_in, beta_v, beta_a, settings, scale, child_groups)`` routes the
    :class:`FusedVotes` to poses (B, J, 16), activations (B, J) and assignments (B, J, I)."""
    batch, children = poses.shape[:2]
    if not isinstance(activations, Tensor) or tuple(activations.shape) != (batch, children):
        got = tuple(activations.shape) if isinstance(activations, Tensor) else type(activations).__name__
        raise ArgumentError(f"activations must have shape (B, I) = {(batch, children)} to match poses; got {got}")
    check_child_groups(child_groups, (batch, children), "poses")
    if checking():
        check_activations(activations)
    dtype = poses.dtype if poses.dtype in (torch.float32, torch.float64) else torch.float32
    with without_autocast(poses.device.type):
        pose = poses.to(dtype).reshape(batch, children, 16).contiguous()
        w = weight.to(dtype).reshape(weight.shape[0], weight.shape[1], 16).contiguous()
        coord = pose.new_empty(0) if coordinates is None else coordinates.to(dtype).detach().contiguous()
        a_in = activations.to(dtype).unsqueeze(1)  # (B, 1, I)
        beta_v_t = check_beta(beta_v, "beta_v", w.shape[1], pose)
        beta_a_t = check_beta(beta_a, "beta_a", w.shape[1], pose)
        with torch.no_grad():  # the origin c (the activation-weighted mean vote) and the scale: constants
            w0 = (a_in / (a_in.sum(dim=-1, keepdim=True) + settings.eps)).squeeze(1).contiguous()
            mean, top = votes_stats(pose.detach(), w.detach(), coord, w0)
            floor = settings.variance_floor if settings.official else settings.eps
            if host_reads(pose.device):
                wide = batch and routing_dtype(dtype, float(top.max()), pose.device) != dtype
                scale = scale_from_top(top, 16, floor)
            else:  # decided on the device: the scale stands in for float64
                wide = False
                scale = scale_from_top(top, 16, floor, device_scale_limit(dtype))
            inv = scale.inv.reshape(-1).contiguous()
            c = (mean * inv.view(-1, 1, 1)).contiguous()
        if wide:  # votes too large for float32 gradients: routed in float64 (the em module docstring)
            f64 = torch.float64
            routed = route_poses(
                votes_stats, iterations, poses.to(f64), weight.to(f64), activations.to(f64), beta_v, beta_a,
                settings, coordinates, child_groups, return_assignments,
            )  # fmt: skip
            return tuple(t.to(dtype) for t in routed)
        votes = FusedVotes(pose, w, coord, c, inv)
        mu, a_out, r = iterations(votes, a_in, beta_v_t, beta_a_t, settings, scale, child_groups)
    if return_assignments:
        return mu, a_out, r.transpose(1, 2)
    return mu, a_out
