"""Label maps for image synthesis: an offline stand-in for CapsPix2pix's data.

pix2pix-style generators (Isola et al. 2017) turn a semantic label map (one channel per class, 1 where that
class is) into an image. Bass et al. (2019, "Image synthesis with a convolutional capsule generative
adversarial network", CapsPix2pix) synthesise retinal and MRI images from segmentations, which are not
available here. :func:`silhouette_label_maps` makes the same kind of task from a labelled image set such as
Fashion-MNIST: each image's silhouette (pixels above ``threshold``) is drawn into the channel of its
class, and the generator must paint the garment (shading, texture, seams) inside it.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def silhouette_label_maps(
    images: Tensor, labels: Tensor, num_classes: int, *, size: int | None = None, threshold: float = 0.05
) -> tuple[Tensor, Tensor]:
    """Label maps ``(N, K, S, S)`` and target images ``(N, C, S, S)``, both zero-padded (centred) to ``size``.

    Args:
        images: ``(N, C, H, W)`` in ``[0, 1]``.
        labels: ``(N,)`` class indices in ``[0, num_classes)``.
        size: canvas side (default: the images' own; must be at least ``H`` and ``W``).
        threshold: pixels whose mean over channels exceeds it form the silhouette.
    """
    if images.dim() != 4 or labels.shape != (len(images),):
        raise ValueError(
            f"need images (N, C, H, W) and labels (N,), got {tuple(images.shape)} and {tuple(labels.shape)}"
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got {labels.min().item()}..{labels.max().item()}")
    height, width = images.shape[-2:]
    size = size or max(height, width)
    if size < max(height, width):
        raise ValueError(f"size {size} is smaller than the images ({height}x{width})")
    top, left = (size - height) // 2, (size - width) // 2
    padded = F.pad(images, (left, size - width - left, top, size - height - top))
    silhouette = (padded.mean(dim=1) > threshold).to(images.dtype)  # (N, S, S)
    onehot = F.one_hot(labels.long(), num_classes).to(images.dtype)  # (N, K)
    return onehot[:, :, None, None] * silhouette[:, None], padded
