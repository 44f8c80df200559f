"""Assertions and inputs shared by test folders (importable as ``helpers``: pyproject.toml puts ``tests/`` on the path)."""

import gc
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from capsnets.functional import capsule_length
from capsnets.layers import LinearCapsules, PrimaryCapsules
from capsnets.models import ModelOutput


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

    from capsnets import checkpoints

    path = Path(checkpoint)
    with safe_open(path, framework="pt") as handle:
        metadata = dict(handle.metadata())
    payload = json.dumps(
        {**meta, "format_version": checkpoints.FORMAT_VERSION, "checkpoint_id": metadata["checkpoint_id"]}
    )
    metadata.update(
        {checkpoints.EMBEDDED_SIDECAR: payload, checkpoints.SIDECAR_DIGEST: checkpoints._text_digest(payload)}
    )
    save_file(load_file(path), path, metadata=metadata)
    path.with_suffix(".json").write_text(payload)


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


class TinyCapsNet(nn.Module):
    """A capsule network of your own, as ``Trainer.fit`` takes it (built from capsnets.layers, not registered):
    Conv2d -> PrimaryCapsules -> LinearCapsules on 8x8 images; scores are the class capsules' lengths."""

    def __init__(self, channels: int = 8, num_classes: int = 10) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, channels, 3)  # (B, 1, 8, 8) -> (B, C, 6, 6)
        self.primary = PrimaryCapsules(channels, 4, 4, kernel_size=3, stride=2)  # -> (B, 4 * 2 * 2, 4)
        self.classes = LinearCapsules(16, 4, num_classes, 6)  # -> (B, K, 6)

    def forward(self, images):
        capsules = self.classes(self.primary(torch.relu(self.conv(images))))
        return ModelOutput(capsule_length(capsules), "length", capsules)


def tiny_splits():
    """Random 8x8 images of 10 classes for :class:`TinyCapsNet`: 224 training examples (14 full global batches of 16) and 32 for validation."""
    generator = torch.Generator().manual_seed(0)
    images, labels = torch.rand(256, 1, 8, 8, generator=generator), torch.randint(0, 10, (256,), generator=generator)
    return TensorDataset(images[32:], labels[32:]), TensorDataset(images[:32], labels[:32])


#: The tiny offline training of the CLI tests: capsnet_digits, 1 epoch of 2 steps on 64 digits, scored on the 360
#: test digits (add ``--limit-test N`` for fewer).
TINY_TRAIN = [
    "train",
    "--model",
    "capsnet_digits",
    "--dataset",
    "digits",
    "--epochs",
    "1",
    "--batch-size",
    "32",
    "--limit-train",
    "64",
    "--device",
    "cpu",
    "--no-progress",
]


@contextmanager
def only_new_objects():
    """Inside the block the garbage collector sees only the objects made in it: those made before are frozen
    (:func:`gc.freeze`), so that a collection and a count of live objects are quick, and blind to what earlier tests
    left behind. At its end the block's garbage is collected and what it leaves alive is frozen too, as
    tests/conftest.py keeps the heap."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()


def live_tensors() -> int:
    """The tensors the garbage collector still sees after a full collection (inside :func:`only_new_objects`: the
    ones made in its block)."""
    gc.collect()
    return sum(isinstance(obj, torch.Tensor) for obj in gc.get_objects())
