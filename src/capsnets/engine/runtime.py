"""Device, precision and seeding helpers shared by the trainer, the evaluator and the CLI.

Nothing here knows about models or data: these functions turn the strings of a
:class:`~capsnets.engine.config.TrainConfig` (``device="auto"``, ``amp="auto"``) into torch objects.
"""
from __future__ import annotations

import contextlib
import random

import numpy as np
import torch

AMP_MODES = ("auto", "bf16", "off")


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Return the device to run on: ``"auto"`` means CUDA when available, else CPU.

    Raises:
        ValueError: if ``device`` is not a valid torch device string, or asks for CUDA without one.
    """
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device={device!r} is not a valid torch device (try 'auto', 'cpu', 'cuda:0')") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} asks for CUDA but torch.cuda.is_available() is False; use 'cpu'")
    return resolved


def resolve_amp(amp: str, device: torch.device) -> torch.dtype | None:
    """Return the autocast dtype for ``amp`` on ``device`` (``None`` = full precision).

    ``"auto"`` is bf16 autocast on CUDA and off elsewhere; ``"bf16"`` forces bf16 (also on CPU).
    """
    if amp not in AMP_MODES:
        raise ValueError(f"amp={amp!r} is not one of {AMP_MODES}")
    if amp == "off" or (amp == "auto" and device.type != "cuda"):
        return None
    return torch.bfloat16


def autocast(device: torch.device, dtype: torch.dtype | None):
    """A ``torch.autocast`` context for ``dtype`` on ``device``, or a no-op when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and every CUDA device) random generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state_tensors() -> dict[str, torch.Tensor]:
    """The torch CPU and CUDA generator states as uint8 tensors (for a checkpoint)."""
    states = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            states[f"rng.cuda.{index}"] = state
    return states


def restore_rng_state(tensors: dict[str, torch.Tensor]) -> None:
    """Inverse of :func:`rng_state_tensors`; CUDA states are restored only where devices exist."""
    if "rng.torch" in tensors:
        torch.set_rng_state(tensors["rng.torch"].to("cpu", torch.uint8))
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            state = tensors.get(f"rng.cuda.{index}")
            if state is not None:
                torch.cuda.set_rng_state(state.to("cpu", torch.uint8), index)


@contextlib.contextmanager
def deterministic_on_cpu(device: torch.device):
    """Within the block, ask torch for deterministic algorithms when running on the CPU.

    On CUDA, deterministic kernels are slower (and some ops have none), so the setting is left alone.
    The previous setting is restored on exit.
    """
    previous, previous_warn = (torch.are_deterministic_algorithms_enabled(),
                               torch.is_deterministic_algorithms_warn_only_enabled())
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=previous_warn)
