"""Children shared by the routing problems of a convolutional capsule layer.

In a convolutional capsule layer the parents at each output position are routed as one problem over the
``K * K * T`` children of their receptive field (Hinton, Sabour & Frosst 2018, "Matrix capsules with EM
routing", Sec. 4). Receptive fields overlap, so one child of the grid appears as a *copy* in several
problems. Procedure 1 normalises each child's assignments over its parents; read per problem, each copy's
assignments sum to 1 over the parent types at its position and the child hands out as much assignment as
it has copies. Gritzman (2019, "Avoiding implementation
pitfalls of 'Matrix capsules with EM routing'", arXiv 1907.00652, pitfall 3; the IBM reproduction)
normalises instead over *every* parent of every position whose receptive field holds the child, so that
parents at different positions compete for it (``normalize="all_parents"``). The authors' released code
(google-research/google-research, ``capsule_em/em_layers.py``, ``update_conv_routing``) normalises each
parent type on its own: a child's assignments to the parents of one type, over the positions that see it,
sum to 1 (``normalize="per_type"``). A :class:`ChildGroups` says which copies are one child and how they
are normalised; :func:`group_softmax` is that normalisation.

Dimension legend: ``N`` routing problems (batch * output positions, folded), ``J`` parent types,
``I`` children of one problem, ``G`` distinct children (groups).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from capsnets.functional.patches import patch_index
from capsnets.validation import ArgumentError


@dataclass(frozen=True)
class ChildGroups:
    """Which child slots of a batch of routing problems are copies of one child.

    Attributes:
        index: ``(N, I)`` int64: the child (group) each slot is a copy of, in ``0 .. count - 1``.
        count: ``G``, the number of groups.
        normalize: ``"all_parents"``: a child's assignments sum to 1 over every parent type at every
            position that sees it; ``"per_type"``: for each parent type, they sum to 1 over the positions.
        blocks: ``b > 1`` declares that the problems fall into ``b`` equal, consecutive runs, and the slots
            of run ``k`` belong only to the groups ``k G / b .. (k + 1) G / b - 1`` (:func:`grid_child_groups`:
            one run per example). The fused EM kernel then routes and normalises run by run, in cache, and
            checks the declaration; the PyTorch path does not need it.
    """

    index: Tensor
    count: int
    normalize: str = "all_parents"
    blocks: int = 1

    def __post_init__(self) -> None:
        if self.index.dim() != 2 or self.index.dtype != torch.long:
            raise ArgumentError(
                f"ChildGroups.index must be an (N, I) int64 tensor, got {self.index.dtype} "
                f"of shape {tuple(self.index.shape)}"
            )
        if self.normalize not in ("all_parents", "per_type"):
            raise ArgumentError(f"ChildGroups.normalize must be 'all_parents' or 'per_type', got {self.normalize!r}")
        problems, blocks = self.index.shape[0], self.blocks
        concrete = all(isinstance(v, int) for v in (problems, blocks, self.count))  # not while export traces
        if (
            isinstance(blocks, bool)
            or not isinstance(blocks, (int, torch.SymInt))
            or (concrete and (blocks < 1 or problems % blocks or self.count % blocks))
        ):
            raise ArgumentError(
                f"ChildGroups.blocks must be a positive int dividing both the problems N = {problems} "
                f"and count = {self.count}, got {blocks!r}"
            )

    def copies(self) -> Tensor:
        """``(N, I)`` int64: how many slots (copies) the child of each slot has."""
        flat = self.index.reshape(-1)
        return torch.bincount(flat, minlength=self.count)[flat].view_as(self.index)


def group_softmax(logits: Tensor, groups: ChildGroups) -> Tensor:
    """Assignments from E-step logits, normalised over every (slot, parent) pair of each child.

    ``R[n, j, i] = exp(logits[n, j, i]) / sum exp(logits[n', j', i'])`` over all slots ``(n', i')`` of the
    child of slot ``(n, i)`` and all parent types ``j'`` (``groups.normalize == "all_parents"``; with one
    slot per group this is the softmax over ``J``), or over the slots alone with ``j' = j``
    (``"per_type"``). Computed in log space with a per-child maximum (a constant shift: the result does
    not depend on it, so it carries no gradient).

    Shape:
        logits ``(N, J, I)`` -> ``(N, J, I)``.
    """
    n, parents, i = logits.shape
    if groups.index.shape != (n, i):
        raise ArgumentError(
            f"child groups of shape {tuple(groups.index.shape)} do not match the ({n}, {i}) "
            f"routing problems of the votes"
        )
    if groups.normalize == "per_type":  # one group per (child, parent type): index * J + j, over (N, J, I)
        types = torch.arange(parents, device=logits.device).view(1, parents, 1)
        flat_index = (groups.index.unsqueeze(1) * parents + types).reshape(-1)  # (N*J*I,)
        count, per_slot, shape = groups.count * parents, logits.reshape(-1), (n, parents, i)
    else:
        flat_index = groups.index.reshape(-1)  # (N*I,)
        count, per_slot, shape = groups.count, torch.logsumexp(logits, dim=1).reshape(-1), (n, 1, i)
    with torch.no_grad():
        top = per_slot.new_full((count,), float("-inf"))
        if torch.compiler.is_compiling() and not torch.compiler.is_exporting():  # inductor (torch 2.13) can emit
            # broken code around the extern scatter_reduce; ONNX export has no index_reduce, but has scatter_reduce
            top = top.index_reduce_(0, flat_index, per_slot, "amax")  # this one is lowered
        else:
            top = top.scatter_reduce(0, flat_index, per_slot, reduce="amax")
        top = top.index_select(0, flat_index)  # several times faster than top[flat_index]; ONNX Gather
    total = per_slot.new_zeros(count).index_add(0, flat_index, torch.exp(per_slot - top))
    # log sum over the child's slots (and parents, or of one type)
    log_total = total.log().index_select(0, flat_index) + top
    return torch.exp(logits - log_total.view(shape))


def grid_child_groups(
    batch: int,
    types: int,
    height: int,
    width: int,
    kernel_size: int,
    stride: int = 1,
    padding: int = 0,
    device=None,
    normalize: str = "all_parents",
) -> ChildGroups:
    """The child groups of a convolutional capsule layer, in the slot order of
    :func:`~capsnets.functional.patches.capsule_patches`.

    Each capsule ``(b, t, y, x)`` of the ``(B, T, H, W)`` input grid is one group; the zero-padding slots
    (activation 0, no part in routing) of each example share one further group. The groups of example ``b``
    are ``b (T H W + 1) .. (b + 1) (T H W + 1) - 1`` and its problems the ``b``-th run of ``H' W'``
    (``blocks = B``).

    Returns:
        :class:`ChildGroups` with ``index`` of shape ``(B * H' * W', T * K * K)``.
    """
    per_example = types * height * width + 1  # the last one: the example's padding slots
    slots = patch_index(types, height, width, kernel_size, stride, padding, device)  # (H'*W', I); padding: T*H*W
    offsets = torch.arange(batch, device=slots.device).view(batch, 1, 1) * per_example
    index = slots + offsets  # (B, H'*W', I)
    return ChildGroups(
        index.reshape(-1, slots.shape[1]), batch * per_example, normalize, blocks=torch.sym_max(batch, 1)
    )
