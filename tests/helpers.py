"""Assertions and inputs shared by test folders (importable as ``helpers``: pyproject.toml puts ``tests/`` on the path)."""

import torch
from torch import Tensor


def assert_finite(tensor: Tensor, what: str = "tensor") -> None:
    """Raise AssertionError naming ``what`` if ``tensor`` holds NaN or inf."""
    bad = ~tensor.isfinite()
    if bad.any():
        raise AssertionError(f"{what} has {int(bad.sum())} non-finite values of {tensor.numel()}")


def assert_contrasts_resolve(experiment: str, metrics: dict, count: int) -> None:
    """Assert that experiment ``experiment`` declares ``count`` contrasts for ``metrics`` (one of its
    runs' metrics) and that each names two numeric metrics that run produced."""
    from capsnets.experiments.common import get_contrasts

    contrasts = get_contrasts(experiment)(metrics)
    assert len(contrasts) == count, f"{experiment}: {len(contrasts)} contrasts, expected {count}: {contrasts}"
    for label, a, b in contrasts:
        for key in (a, b):
            assert isinstance(metrics.get(key), (int, float)), (
                f"{experiment}: contrast {label!r} names {key!r}, which is not a numeric metric of the run"
            )


def rewrite_sidecar(checkpoint, meta: dict) -> None:
    """Rewrite the checkpoint ``checkpoint`` (a ``.safetensors`` path) with ``meta`` as its sidecar, in the current
    format (the tensors as they are, the digests and the readable ``.json`` copy made anew): a checkpoint as a
    writer that recorded other entries would have left it."""
    import json
    from pathlib import Path

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from capsnets import io

    path = Path(checkpoint)
    with safe_open(path, framework="pt") as handle:
        metadata = dict(handle.metadata())
    payload = json.dumps({**meta, "format_version": io.FORMAT_VERSION, "checkpoint_id": metadata["checkpoint_id"]})
    metadata.update({io.EMBEDDED_SIDECAR: payload, io.SIDECAR_DIGEST: io._text_digest(payload)})
    save_file(load_file(path), path, metadata=metadata)
    path.with_suffix(".json").write_text(payload)


def write_digit_segfolder(root, digits, labels, *, classes=(0, 1, 2), count=400, size=16, seed=0):
    """Write a ``segfolder:PATH`` folder of ``count`` real digits, one per image, in the real format (PNG via
    Pillow): ``root/images/<k>.png`` (grey, ``size x size``) and ``root/masks/<k>.png`` (mode L class indices:
    0 background, ``i + 1`` the pixels above 0.5 of a digit of class ``classes[i]``), plus ``classes.json``.

    Each digit of ``digits`` ``(N, 1, 28, 28)`` in ``[0, 1]`` (with ``labels`` ``(N,)``) whose label is in ``classes``
    is shrunk to ``size - 4`` pixels (bilinear) and put at a random offset of 0 to 4 pixels (seeded). Returns
    ``root``.
    """
    import json
    from pathlib import Path

    import numpy as np
    import torch
    import torch.nn.functional as F
    from PIL import Image

    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    keep = torch.isin(labels, torch.tensor(classes))
    digits, labels = digits[keep][:count], labels[keep][:count]
    side = size - 4
    small = F.interpolate(digits.float(), size=(side, side), mode="bilinear", antialias=True).clamp(0, 1)
    generator = torch.Generator().manual_seed(seed)
    offsets = torch.randint(0, 5, (len(small), 2), generator=generator)
    for k, (digit, label, (dy, dx)) in enumerate(zip(small[:, 0], labels.tolist(), offsets.tolist())):
        image, mask = np.zeros((size, size), np.uint8), np.zeros((size, size), np.uint8)
        image[dy : dy + side, dx : dx + side] = (digit.numpy() * 255).round().astype(np.uint8)
        mask[dy : dy + side, dx : dx + side] = (digit.numpy() > 0.5) * (classes.index(label) + 1)
        Image.fromarray(image, mode="L").save(root / "images" / f"{k:05d}.png")
        Image.fromarray(mask, mode="L").save(root / "masks" / f"{k:05d}.png")
    names = {"background": 0, **{f"digit {c}": i + 1 for i, c in enumerate(classes)}}
    (root / "classes.json").write_text(json.dumps(names))
    return root


def em_poses(batch, children, child_types, parents, *, gen, dtype=torch.float64, scale=1.0):
    """Random EM routing inputs of matrix capsules: poses, transforms, activations (a quarter zero), beta_v, beta_a."""
    poses = scale * torch.randn(batch, children, 4, 4, generator=gen, dtype=dtype)
    weight = torch.randn(child_types, parents, 4, 4, generator=gen, dtype=dtype) / 2
    acts = torch.rand(batch, children, generator=gen, dtype=dtype)
    acts[torch.rand(batch, children, generator=gen) < 0.25] = 0.0  # some inactive children
    beta_v = torch.rand(parents, generator=gen, dtype=dtype)
    beta_a = 0.01 * torch.randn(parents, generator=gen, dtype=dtype)
    return poses, weight, acts, beta_v, beta_a


def em_votes(poses, weight, coords=None):
    """The votes (B, I, J, 16) of poses and transforms shared as ``weight[i % Iw]``, with coordinate addition."""
    full = weight.repeat(poses.shape[1] // weight.shape[0], 1, 1, 1)
    votes = (poses.unsqueeze(2) @ full.unsqueeze(0)).flatten(-2)  # (B, I, J, 16)
    if coords is not None:
        votes = torch.cat([votes[..., :2] + coords.view(1, -1, 1, 2), votes[..., 2:]], dim=-1)
    return votes
