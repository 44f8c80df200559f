"""Device-side batching and augmentation: the whole data set stays on the training device.

The only augmentation of CapsNet (Sabour, Frosst & Hinton 2017, "Dynamic Routing Between Capsules",
section 5: "shifted by up to 2 pixels in each direction with zero padding") is :func:`random_shift`,
done here as one batched gather, with no per-sample Python loop. :class:`DeviceLoader` shuffles
and shifts as a pure function of ``(seed, epoch)`` and, for distributed training, gives each rank a
contiguous slice of one shared global batch, so any world size sees the same global batches.
Other augmentations (e.g. the smallNORB crop and jitter of :mod:`capsnets.data.transforms`) plug in
as an ``augment(images, generator)`` callable applied to each global batch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from capsnets.validation import ArgumentError

__all__ = ["random_shift", "shift_pairs", "DeviceLoader"]


def _shift_indices(size: int, offsets: Tensor) -> tuple[Tensor, Tensor]:
    """Source index ``i - offset`` (clamped) and its validity, for each row of ``offsets``: ``(B, size)``."""
    source = torch.arange(size, device=offsets.device) - offsets[:, None]
    valid = (source >= 0) & (source < size)
    return source.clamp(0, size - 1), valid


def random_shift(
    images: Tensor, max_shift: int, generator: torch.Generator | None = None, shifts: Tensor | None = None
) -> Tensor:
    """Translate each image by its own integer ``(dy, dx)``, filling uncovered pixels with zeros.

    ``out[b, :, y, x] = images[b, :, y - dy_b, x - dx_b]`` where that lies inside the image, else 0
    (positive ``dy`` moves content down, positive ``dx`` right, as ``torch.roll`` does).

    Args:
        images: the batch, on any device.
        max_shift: shifts are drawn uniformly from ``[-max_shift, max_shift]`` per axis; 0 returns
            ``images`` itself. Ignored when ``shifts`` is given.
        generator: drawn from if given (shifts are drawn on its device, then moved to the images');
            else torch's global RNG on the images' device.
        shifts: explicit integer ``(dy, dx)`` per image instead of drawing them.

    Shape:
        - images: ``(B, C, H, W)``
        - shifts: ``(B, 2)``
        - output: ``(B, C, H, W)``

    Examples:
        >>> x = torch.rand(4, 1, 28, 28)
        >>> random_shift(x, 2, torch.Generator().manual_seed(0)).shape
        torch.Size([4, 1, 28, 28])
    """
    if images.dim() != 4:
        raise ArgumentError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
    batch, channels, height, width = images.shape
    if shifts is None:
        if not isinstance(max_shift, int) or max_shift < 0:
            raise ArgumentError(f"max_shift must be a non-negative int, got {max_shift!r}")
        if max_shift == 0:
            return images
        device = generator.device if generator is not None else images.device
        shifts = torch.randint(-max_shift, max_shift + 1, (batch, 2), generator=generator, device=device)
    if shifts.shape != (batch, 2) or shifts.dtype.is_floating_point or shifts.dtype == torch.bool:
        raise ArgumentError(f"shifts must be an integer ({batch}, 2) tensor, got {shifts.dtype} {tuple(shifts.shape)}")
    shifts = shifts.to(images.device, torch.long)
    rows, row_ok = _shift_indices(height, shifts[:, 0])  # (B, H)
    cols, col_ok = _shift_indices(width, shifts[:, 1])  # (B, W)
    flat = (rows[:, :, None] * width + cols[:, None, :]).view(batch, 1, height * width)  # (B, 1, H*W)
    out = images.reshape(batch, channels, height * width).gather(2, flat.expand(-1, channels, -1))
    outside = ~(row_ok[:, :, None] & col_ok[:, None, :])  # (B, H, W)
    return out.view(batch, channels, height, width).masked_fill(outside[:, None], 0)


def shift_pairs(images: Tensor, max_shift: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Training pairs of a transforming auto-encoder: random integer shifts ``(B, 2)`` as ``(dx, dy)`` in
    ``[-max_shift, max_shift]`` (drawn on the generator's device), and the images shifted by them (zeros
    shifted in), ``(B, C, H, W)``."""
    dxdy = torch.randint(-max_shift, max_shift + 1, (len(images), 2), generator=generator, device=generator.device).to(
        images.device
    )
    shifted = random_shift(images, 0, shifts=dxdy.flip(1))  # random_shift takes (dy, dx)
    return dxdy, shifted


def _epoch_seed(seed: int, epoch: int, *more: int) -> int:
    """A well-mixed 63-bit seed from ``(seed, epoch, *more)`` (numpy SeedSequence), so nearby tuples don't collide."""
    return int(np.random.SeedSequence([seed, epoch, *more]).generate_state(1, np.uint64)[0] >> np.uint64(1))


_AUGMENT_STREAM = 1  # tags the per-batch augment seeds apart from the per-epoch shuffle seed

Targets = Tensor | tuple[Tensor, ...]


def _take(targets: Targets, index: Tensor) -> Targets:
    return tuple(t[index] for t in targets) if isinstance(targets, tuple) else targets[index]


def _split(targets: Targets, parts: int, rank: int) -> Targets:
    if isinstance(targets, tuple):
        return tuple(torch.tensor_split(t, parts)[rank] for t in targets)
    return torch.tensor_split(targets, parts)[rank]


class DeviceLoader:
    """Iterate over ``(images, targets)`` batches of a data set that lives on one device: the batches of the
    trainer and of every experiment.

    Shuffle order and shifts are drawn once per epoch from a CPU ``torch.Generator`` seeded from
    ``(seed, epoch)`` (never torch's global RNG), for all ``N`` examples, then moved to the data's
    device. Like ``DistributedSampler``, the epoch only changes through :meth:`set_epoch`: call it
    before every epoch, or every epoch repeats epoch 0.

    With ``world_size > 1`` every rank draws the same permutation and shifts, and rank ``r`` takes
    the ``r``-th contiguous slice of each global batch: concatenating the ranks' batches in rank
    order gives exactly the ``world_size=1`` batches. A last, short batch (``drop_last=False``) is
    split by ``torch.tensor_split``, so ranks may get unequal (even empty) pieces; use
    ``drop_last=True`` for distributed training.

    An ``augment`` callable ``(images, generator) -> images`` is applied, after the shifts, to each
    whole GLOBAL batch with a fresh CPU generator seeded from ``(seed, epoch, batch index)``; each
    rank then keeps its slice. So augmented batches are reproducible per ``(seed, epoch)`` and
    identical across world sizes, at the cost of every rank transforming the whole global batch
    (cheap next to a forward pass). It may change the image size (a random crop).

    Args:
        data: a :class:`~capsnets.data.TensorData`, or an ``(images, targets)`` pair: targets a tensor of
            ``N`` rows (labels, masks, images) or a tuple of such tensors; None with ``epoch_data``.
        batch_size: the GLOBAL batch size, divisible by ``world_size``.
        shuffle: permute the examples each epoch; else keep stored order.
        drop_last: drop the last global batch if it is short.
        max_shift: :func:`random_shift` range in pixels (0: no augmentation; CapsNet uses 2).
        seed: base seed of shuffle and shifts.
        rank: this process's rank in ``[0, world_size)``.
        world_size: number of processes sharing each global batch.
        augment: the per-batch transform. ``None`` (default): ``data.augment`` if ``data`` has one
            (a :class:`~capsnets.data.TensorData` from ``load_dataset("smallnorb", train=True)``
            does), else none; ``False``: none, even if ``data`` has one; a callable: that one.
        epoch_data: instead of ``data``, ``epoch -> (images, targets)``, called by :meth:`set_epoch` with the
            1-based epoch: a generated data set drawn afresh every epoch.

    Shape:
        - yields images ``(batch_size // world_size, C, H, W)`` (``H, W`` as ``augment`` makes them)
          and targets of as many rows.

    Examples::

        >>> loader = DeviceLoader((torch.rand(10, 1, 8, 8), torch.arange(10)), 4, seed=0)
        >>> loader.set_epoch(0)
        >>> [tuple(labels.shape) for _, labels in loader]
        [(4,), (4,), (2,)]
    """

    def __init__(
        self,
        data,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        max_shift: int = 0,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        augment: Callable[[Tensor, torch.Generator], Tensor] | bool | None = None,
        epoch_data: Callable[[int], tuple[Tensor, Targets]] | None = None,
    ):
        if (data is None) == (epoch_data is None):
            raise ArgumentError("pass either data or epoch_data")
        if not isinstance(world_size, int) or world_size < 1:
            raise ArgumentError(f"world_size must be a positive int, got {world_size!r}")
        if not isinstance(batch_size, int) or batch_size < 1 or batch_size % world_size:
            raise ArgumentError(
                f"batch_size (global) must be a positive multiple of world_size={world_size}, got {batch_size!r}"
            )
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ArgumentError(f"rank must be in [0, {world_size}), got {rank!r}")
        if not isinstance(max_shift, int) or max_shift < 0:
            raise ArgumentError(f"max_shift must be a non-negative int, got {max_shift!r}")
        if augment is None:
            augment = getattr(data, "augment", None)
        elif augment is False:
            augment = None
        if augment is not None and not callable(augment):
            raise ArgumentError(
                f"augment must be None, False or a callable (images, generator) -> images, got {augment!r}"
            )
        self.augment, self.epoch_data = augment, epoch_data
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.max_shift, self.seed, self.rank, self.world_size = max_shift, seed, rank, world_size
        self.epoch = 0
        if data is not None:
            self._set_data(*((data.images, data.labels) if hasattr(data, "images") else data))

    def _set_data(self, images: Tensor, targets: Targets) -> None:
        parts = targets if isinstance(targets, tuple) else (targets,)
        if images.dim() != 4 or not parts or any(t.dim() < 1 or len(t) != len(images) for t in parts):
            shapes = [tuple(t.shape) for t in parts]
            raise ArgumentError(
                f"data must be images (N, C, H, W) and targets of N rows, got {tuple(images.shape)} and {shapes}"
            )
        if any(t.device != images.device for t in parts):
            raise ArgumentError(f"images on {images.device} but targets on {[str(t.device) for t in parts]}")
        if self.max_shift >= min(images.shape[-2:]):
            raise ArgumentError(
                f"max_shift={self.max_shift} is not smaller than the images ({images.shape[-2]}x"
                f"{images.shape[-1]}): shifts that large move whole images out of the frame"
            )
        self.images, self.targets = images, targets

    @property
    def num_examples(self) -> int:
        """Examples in the whole data set (all ranks together)."""
        return len(self.images)

    @property
    def device(self) -> torch.device:
        return self.images.device

    def __len__(self) -> int:
        """Batches per epoch (the same on every rank)."""
        full, rest = divmod(self.num_examples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shuffle and shifts the next iteration uses (and draw its data, with
        ``epoch_data``)."""
        self.epoch = int(epoch)
        if self.epoch_data is not None:
            self._set_data(*self.epoch_data(self.epoch + 1))

    def _draw(self) -> tuple[Tensor, Tensor | None]:
        generator = torch.Generator().manual_seed(_epoch_seed(self.seed, self.epoch))
        n = self.num_examples
        order = torch.randperm(n, generator=generator) if self.shuffle else torch.arange(n)
        shifts = None
        if self.max_shift:
            shifts = torch.randint(-self.max_shift, self.max_shift + 1, (n, 2), generator=generator)
            shifts = shifts.to(self.device)
        return order.to(self.device), shifts

    def _batch(self, order: Tensor, shifts: Tensor | None, positions: Tensor) -> tuple[Tensor, Targets]:
        """Examples at ``positions`` of this epoch's order, shifted (not augmented)."""
        index = order[positions]
        images, targets = self.images[index], _take(self.targets, index)
        if shifts is not None:
            images = random_shift(images, self.max_shift, shifts=shifts[positions])
        return images, targets

    def __iter__(self):
        return self.iter_from(0)

    def iter_from(self, first: int):
        """This epoch's batches from batch ``first`` (0-based) on: what an iteration continues with after
        yielding ``first`` batches, for a training continued within an epoch. ``iter(loader)`` starts at 0."""
        if not isinstance(first, int) or not 0 <= first <= len(self):
            raise ArgumentError(f"first must be a batch index in [0, {len(self)}], got {first!r}")
        return self._batches(first)

    def _batches(self, first: int):
        order, shifts = self._draw()
        for step, start in enumerate(range(0, len(self) * self.batch_size, self.batch_size)):
            if step < first:
                continue
            piece = torch.arange(start, min(start + self.batch_size, self.num_examples), device=self.device)
            if self.augment is None:
                piece = torch.tensor_split(piece, self.world_size)[self.rank]  # positions in this epoch
                yield self._batch(order, shifts, piece)
                continue
            images, targets = self._batch(order, shifts, piece)  # the whole global batch
            generator = torch.Generator().manual_seed(_epoch_seed(self.seed, self.epoch, _AUGMENT_STREAM, step))
            images = self.augment(images, generator)
            yield torch.tensor_split(images, self.world_size)[self.rank], _split(targets, self.world_size, self.rank)

    def __repr__(self) -> str:
        return (
            f"DeviceLoader(num_examples={self.num_examples}, batch_size={self.batch_size}, "
            f"shuffle={self.shuffle}, drop_last={self.drop_last}, max_shift={self.max_shift}, "
            f"seed={self.seed}, rank={self.rank}, world_size={self.world_size}, augment={self.augment!r}, "
            f"device={self.device})"
        )
