"""MultiMNIST: pairs of overlapping MNIST digits (Sabour, Frosst & Hinton 2017, Sec. 6).

Each example puts a digit, shifted by up to ``max_shift`` (4) pixels in each direction on a 36x36 canvas
(the 28x28 digit zero-padded by 4 and translated), over a digit of a *different* class from the same
split, shifted independently in the same way. The two are combined by the pixel-wise **maximum** by
default (``combine="clipped_sum"``: the sum clipped to 1, as in the authors' released generator).

Everything but the random draws runs as batched tensor ops on the device of the source images. The draws
(pair indices and shifts, a few integers per example) come from a CPU ``torch.Generator`` seeded with
``seed``, so a seed gives the same set on every device. The paper makes 1K pairs per training digit
(60M) and per test digit (10M); :func:`make_multimnist` makes any number, and a training loop can draw a
fresh set each epoch with another seed.

Overlap statistics, all in :func:`average_overlap`. The paper: "Considering a digit in a 28x28 image is
bounded in a 20x20 box, two digits bounding boxes on average have 80% overlap."

- ``mode="frame"``: the overlap of the two digits' 28x28 MNIST frames, as a fraction of a frame. With
  independent uniform shifts in [-4, 4] per axis (as here, and in the authors' released generator) its
  expectation is ``(1 - E|s1 - s2| / 28) ** 2`` with ``E|s1 - s2| = 240 / 81``: 79.96%, whatever the
  digits. The 20x20 boxes the paper names would overlap by ``(1 - 240 / (81 * 20)) ** 2`` = 72.6% under
  the same shifts, so the paper's 80% is most likely this statistic, and its pairs overlap as much as these.
- ``mode="smaller"``: intersection of the two digits' tight bounding boxes (pixels ``> threshold``) over the
  area of the smaller box (:func:`box_overlap`); about 73% on MNIST test digits.
- ``mode="union"``: the same boxes' intersection over union; about 45%.

The registered data set ``"multimnist"`` (:func:`load_multimnist`) reads the task as "which digits are present":
a multi-label set of one pair per MNIST digit of the split (60K training, 10K test pairs, fixed seeds) whose
targets are 10-dimensional multi-hot vectors. As in the paper the two digits always differ, so every image has
exactly two labels; same-digit pairs (one label) are not made.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from capsnets.data.base import TensorData
from capsnets.data.mnist import MNIST
from capsnets.validation import ArgumentError

#: seed of the fixed MultiMNIST test set
TEST_SEED = 20171026
#: seed of the registered multi-label set's training pairs (:func:`load_multimnist`)
TRAIN_SEED = 20171027
#: source digits per call of :func:`make_multimnist` in :func:`load_multimnist` (bounds its memory)
_CHUNK = 10_000
COMBINE_MODES = ("max", "clipped_sum")


@dataclass
class MultiMNIST:
    """A generated MultiMNIST set.

    Shape:
        - images: ``(N, 1, S, S)`` with ``S = 28 + 2 * max_shift`` (36), values in ``[0, 1]``
        - labels: ``(N, 2)`` int64, the two classes (always different)
        - digits: ``(N, 2, 1, S, S)`` the two shifted component digits (per-digit reconstruction targets)
        - shifts: ``(N, 2, 2)`` int64 ``(dy, dx)`` of each component relative to the centred digit
        - sources: ``(N, 2)`` int64 indices of the components in the source images
    """

    images: Tensor
    labels: Tensor
    digits: Tensor
    shifts: Tensor
    sources: Tensor

    def __len__(self) -> int:
        return len(self.labels)


def _pick_partners(labels: Tensor, first: Tensor, num_classes: int, generator: torch.Generator) -> Tensor:
    """For each index in ``first``, a uniformly drawn index of an example of another class (CPU, vectorised)."""
    counts = torch.bincount(labels, minlength=num_classes)  # (K,)
    if (counts == 0).any():
        raise ArgumentError(f"every class needs at least one source digit, got counts {counts.tolist()}")
    order = torch.argsort(labels, stable=True)  # indices grouped by class
    starts = torch.cumsum(counts, 0) - counts  # (K,)
    offset = torch.randint(1, num_classes, (len(first),), generator=generator)
    other = (labels[first] + offset) % num_classes  # (N,) a class != the first digit's
    pick = (torch.rand(len(first), generator=generator, dtype=torch.float64) * counts[other]).long()
    return order[starts[other] + pick.clamp(max=counts[other] - 1)]


def _place(images: Tensor, sources: Tensor, shifts: Tensor, max_shift: int) -> Tensor:
    """Each source digit on a canvas padded by ``max_shift``, moved by its ``(dy, dx)``: ``random_shift`` of the
    padded digit (nothing is cut off), written as one slice copy per distinct shift.

    Shape:
        images ``(M, C, H, W)``; sources ``(K,)`` and shifts ``(K, 2)`` on the CPU -> ``(K, C, H + 2m, W + 2m)``.
    """
    channels, height, width = images.shape[1:]
    out = images.new_zeros(len(sources), channels, height + 2 * max_shift, width + 2 * max_shift)
    offsets = shifts + max_shift  # the digit's top-left corner on the canvas
    key = offsets[:, 0] * (2 * max_shift + 1) + offsets[:, 1]
    for value in key.unique().tolist():
        chosen = (key == value).nonzero().squeeze(1)
        top, left = divmod(value, 2 * max_shift + 1)
        where = chosen.to(images.device)
        out[where, :, top : top + height, left : left + width] = images[sources[chosen].to(images.device)]
    return out


def make_multimnist(
    images: Tensor,
    labels: Tensor,
    count: int,
    *,
    seed: int,
    max_shift: int = 4,
    combine: str = "max",
    num_classes: int = 10,
) -> MultiMNIST:
    """Generate ``count`` MultiMNIST examples from single digits.

    The first digit of example ``n`` is source ``n mod M`` (each source digit is used about equally
    often); the second is drawn uniformly among the sources of the other classes.

    Args:
        images: ``(M, 1, H, W)`` source digits in ``[0, 1]`` (MNIST: 28x28), on the target device.
        labels: ``(M,)`` their classes.
        count: number of examples ``N``.
        seed: seed of the pair and shift draws.
        max_shift: each digit moves by ``[-max_shift, max_shift]`` pixels per axis; the canvas is the
            digit padded by ``max_shift`` on every side, so nothing is cut off.
        combine: ``"max"`` (pixel-wise maximum) or ``"clipped_sum"`` (``min(a + b, 1)``).
    """
    if images.dim() != 4 or labels.shape != images.shape[:1]:
        raise ArgumentError(
            f"need images (M, C, H, W) and labels (M,), got {tuple(images.shape)}, {tuple(labels.shape)}"
        )
    if not isinstance(count, int) or count < 1:
        raise ArgumentError(f"count must be a positive int, got {count!r}")
    if not isinstance(max_shift, int) or max_shift < 0:
        raise ArgumentError(f"max_shift must be a non-negative int, got {max_shift!r}")
    if combine not in COMBINE_MODES:
        raise ArgumentError(f"combine must be one of {COMBINE_MODES}, got {combine!r}")
    generator = torch.Generator().manual_seed(seed)
    cpu_labels = labels.cpu().long()
    first = torch.arange(count) % len(cpu_labels)
    sources = torch.stack([first, _pick_partners(cpu_labels, first, num_classes, generator)], 1)  # (N, 2)
    shifts = torch.randint(-max_shift, max_shift + 1, (count, 2, 2), generator=generator)  # (N, 2, 2)
    sources_d, shifts_d = sources.to(images.device), shifts.to(images.device)
    digits = _place(images, sources.flatten(), shifts.view(-1, 2), max_shift)
    digits = digits.view(count, 2, *digits.shape[1:])  # (N, 2, C, S, S)
    if combine == "max":
        combined = digits.amax(dim=1)
    else:
        combined = digits.sum(dim=1).clamp(max=1.0)
    return MultiMNIST(combined, labels[sources_d].long(), digits, shifts_d, sources_d)


def multimnist_test_set(
    images: Tensor, labels: Tensor, *, pairs_per_digit: int = 1, seed: int = TEST_SEED, **kwargs
) -> MultiMNIST:
    """The fixed-seed test set: ``pairs_per_digit`` examples for each source (test) digit (paper: 1K)."""
    return make_multimnist(images, labels, pairs_per_digit * len(labels), seed=seed, **kwargs)


def load_multimnist(root=None, *, train: bool = True, download: bool = False) -> TensorData:
    """The registered ``"multimnist"`` data set: one MultiMNIST pair per MNIST digit of the split, with
    multi-hot targets (see the module docstring).

    The pairs are made in chunks of 10K source digits (partners drawn within a chunk), each with its own seed
    derived from ``TRAIN_SEED`` or ``TEST_SEED``, so a split is the same on every call.

    Args:
        root, download: as for :class:`~capsnets.data.mnist.MNIST`.
        train: the 60K training pairs if True, else the 10K test pairs.

    Shape:
        - images: ``(N, 1, 36, 36)`` in ``[0, 1]``; labels: ``(N, 10)`` float32, two ones per row.
    """
    split = MNIST(root, train=train, download=download)
    digits, classes = split.images.unsqueeze(1).float().div_(255.0), split.labels.long()
    seed = TRAIN_SEED if train else TEST_SEED
    images, pairs = [], []
    for chunk, start in enumerate(range(0, len(classes), _CHUNK)):
        part = slice(start, start + _CHUNK)
        made = make_multimnist(digits[part], classes[part], len(classes[part]), seed=seed + chunk)
        images.append(made.images)
        pairs.append(made.labels)
    targets = torch.zeros(len(classes), len(MNIST.classes)).scatter_(1, torch.cat(pairs), 1.0)
    return TensorData(torch.cat(images), targets, len(MNIST.classes), list(MNIST.classes), "multimnist")


def bounding_boxes(images: Tensor, threshold: float = 0.0) -> Tensor:
    """Inclusive bounding boxes ``(top, left, bottom, right)`` of the pixels ``> threshold``.

    An image with no such pixel gets ``(0, 0, -1, -1)`` (an empty box).

    Shape:
        images ``(..., H, W)`` -> ``(..., 4)`` int64.
    """
    mask = images > threshold
    rows, cols = mask.any(dim=-1), mask.any(dim=-2)  # (..., H), (..., W)

    def span(present: Tensor) -> tuple[Tensor, Tensor]:
        size = present.shape[-1]
        lo = present.int().argmax(dim=-1)
        hi = size - 1 - present.flip(-1).int().argmax(dim=-1)
        empty = ~present.any(dim=-1)
        return lo.masked_fill(empty, 0), hi.masked_fill(empty, -1)

    (top, bottom), (left, right) = span(rows), span(cols)
    return torch.stack([top, left, bottom, right], dim=-1).long()


def box_overlap(boxes_a: Tensor, boxes_b: Tensor, mode: str = "smaller") -> Tensor:
    """Overlap of inclusive pixel boxes: intersection area over the smaller box's area (``"smaller"``)
    or over the union's area (``"union"``); 0 where a box is empty.

    Shape:
        boxes ``(..., 4)`` as from :func:`bounding_boxes` -> ``(...)`` float.
    """
    if mode not in ("smaller", "union"):
        raise ArgumentError(f"mode must be 'smaller' or 'union', got {mode!r}")

    def area(box: Tensor) -> Tensor:
        return ((box[..., 2] - box[..., 0] + 1).clamp(min=0) * (box[..., 3] - box[..., 1] + 1).clamp(min=0)).float()

    inner = torch.cat(
        [torch.maximum(boxes_a[..., :2], boxes_b[..., :2]), torch.minimum(boxes_a[..., 2:], boxes_b[..., 2:])], dim=-1
    )
    intersection, a, b = area(inner), area(boxes_a), area(boxes_b)
    denominator = torch.minimum(a, b) if mode == "smaller" else a + b - intersection
    return torch.where(denominator > 0, intersection / denominator.clamp(min=1), torch.zeros_like(intersection))


def frame_overlap(shifts: Tensor, frame: int = 28) -> Tensor:
    """Overlap of two ``frame`` x ``frame`` squares moved by ``shifts``, as a fraction of a square's area.

    Shape:
        shifts ``(N, 2, 2)`` (``MultiMNIST.shifts``: ``(dy, dx)`` of each component) -> ``(N,)`` float.
    """
    apart = (shifts[:, 0] - shifts[:, 1]).abs()  # (N, 2)
    return ((frame - apart).clamp(min=0).prod(dim=-1) / frame**2).float()


def average_overlap(data: MultiMNIST, *, mode: str = "smaller", threshold: float = 0.0, frame: int = 28) -> float:
    """Mean overlap of the two component digits over the set: of their ``frame`` x ``frame`` source frames
    (``mode="frame"``, :func:`frame_overlap`), or of their tight bounding boxes (``"smaller"``, ``"union"``:
    :func:`box_overlap`); see the module docstring."""
    if mode == "frame":
        return frame_overlap(data.shifts, frame).mean().item()
    boxes = bounding_boxes(data.digits[:, :, 0], threshold)  # (N, 2, 4)
    return box_overlap(boxes[:, 0], boxes[:, 1], mode).mean().item()
