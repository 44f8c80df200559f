"""Assertions shared by test folders (importable as ``helpers``: pyproject.toml puts ``tests/`` on the path)."""

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
