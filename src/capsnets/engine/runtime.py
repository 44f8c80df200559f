"""Device, precision and seeding helpers shared by the trainer, the evaluator and the CLI.

Nothing here knows about models or data: these functions turn the strings of a
:class:`~capsnets.engine.config.TrainConfig` (``device="auto"``, ``amp="auto"``) into torch objects.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import random
import signal
import threading
import time
from collections.abc import Mapping

import numpy as np
import torch

from capsnets.validation import ArgumentError, available_devices, check_device

AMP_MODES = ("auto", "bf16", "off")
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
_retained = False


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Return the device to run on: ``"auto"`` means CUDA when available, else CPU.

    Raises:
        ValueError: (an :class:`~capsnets.validation.ArgumentError`) ``device`` is not a torch device name,
            or names one this build of PyTorch or this machine lacks (``cuda`` on a CPU-only build, ``cuda:7``
            with one GPU, ``mps``, ``xpu``), or is ``meta``, which holds no data to train or evaluate on; the
            message lists the devices that are available.
    """
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = check_device(device, "device")
    except ArgumentError as err:
        raise ArgumentError(f"{err}, or 'auto'") from None
    if resolved.type == "meta":
        raise ArgumentError(
            f"device={device!r}: the meta device holds shapes but no data, so nothing can be trained "
            f"or evaluated on it; use one of: {', '.join(available_devices())}, or 'auto'"
        )
    return resolved


def resolve_amp(amp: str, device: torch.device) -> torch.dtype | None:
    """Return the autocast dtype for ``amp`` on ``device`` (``None`` = full precision).

    ``"auto"`` is bf16 autocast on CUDA and off elsewhere; ``"bf16"`` forces bf16 (also on CPU).
    """
    if amp not in AMP_MODES:
        raise ArgumentError(f"amp={amp!r} is not one of {AMP_MODES}")
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


def compile_em_kernel(model: torch.nn.Module, device: torch.device) -> float:
    """Build the fused EM kernel now if ``model`` routes by EM on the CPU of ``device`` and the kernel is not built
    yet, so that a training's or an evaluation's timings leave the one-time compile out; the seconds it took
    (0.0 when nothing was built)."""
    # the EM modules: imported here, as most runs route otherwise
    from capsnets.functional.em import kernel  # noqa: PLC0415
    from capsnets.functional.em.routing import EMRouting  # noqa: PLC0415

    if device.type != "cpu" or not kernel.build_needed():
        return 0.0
    if not any(isinstance(getattr(module, "routing", None), EMRouting) for module in model.modules()):
        return 0.0
    start = time.perf_counter()
    kernel.load()
    return time.perf_counter() - start


@contextlib.contextmanager
def deterministic_on_cpu(device: torch.device):
    """Within the block, ask torch for deterministic algorithms when running on the CPU.

    On CUDA, deterministic kernels are slower (and some ops have none), so the setting is left alone.
    The previous setting is restored on exit.
    """
    previous, previous_warn = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=previous_warn)


#: The most threads a run may ask torch for (``--threads``, ``TrainConfig.threads``): a bound on what one small
#: argument can make torch start.
MAX_THREADS = 1024


def free_cores(cpu_count: int, load: float) -> int:
    """The cores that a busy machine leaves free: ``cpu_count`` less their load (:func:`machine_load`), rounded, at least 1.

    Examples:
        >>> free_cores(2, 1.3), free_cores(2, 0.2), free_cores(8, 12.0)
        (1, 2, 1)
    """
    return max(1, round(cpu_count - load))


def machine_load() -> tuple[int, float]:
    """``(cores this process may run on, how busy the machine is)``: ``os.sched_getaffinity`` (``os.cpu_count``
    where the system has no affinity masks) and the 1-minute load average (0 where the system gives none)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        return cores, os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return cores, 0.0


def choose_threads(
    requested: int | None, *, torch_threads: int, cpu_count: int, load: float, env: Mapping[str, str]
) -> tuple[int | None, str | None]:
    """The number of threads torch should compute with, and the one line that says why it was lowered.

    An explicit count (``requested``, the ``--threads`` flag) or ``OMP_NUM_THREADS`` in ``env`` (which torch
    reads at start) is obeyed. Otherwise torch's count stays unless it exceeds :func:`free_cores`: threads
    beyond the free cores wait on each other (each parallel operation ends at its slowest thread), which
    makes a CPU training many times slower on a busy machine than with one thread per free core.

    Args:
        requested: the count asked for, or None.
        torch_threads: torch's count (``torch.get_num_threads()``).
        cpu_count, load: the cores and how busy they are (:func:`machine_load`).
        env: the environment (``os.environ``).

    Returns:
        ``(threads, message)``: the count to set, or None to keep torch's; the message, or None.

    Examples:
        >>> choose_threads(None, torch_threads=2, cpu_count=2, load=1.6, env={})[0]
        1
        >>> choose_threads(None, torch_threads=2, cpu_count=2, load=0.1, env={})
        (None, None)
    """
    if requested is not None:
        return requested, None
    if env.get("OMP_NUM_THREADS"):
        return None, None
    free = free_cores(cpu_count, load)
    if torch_threads <= free:
        return None, None
    return free, (
        f"capsnets: the machine's load ({load:.1f} on {cpu_count} cores) leaves {free} core{'s' if free > 1 else ''} "
        f"free, so torch computes with {free} thread{'s' if free > 1 else ''} instead of {torch_threads} "
        "(--threads N or OMP_NUM_THREADS=N to choose)"
    )


@contextlib.contextmanager
def torch_threads(count: int | None):
    """Within the block, torch computes with ``count`` threads (None: as it does); the count is restored after."""
    previous = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class StopRequest:
    """What :func:`stop_on_signals` received: calling it returns the signal's number, or None before one came."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self) -> int | None:
        return self.signum


@contextlib.contextmanager
def stop_on_signals(signals=(signal.SIGINT, signal.SIGTERM)):
    """Within the block, the first of ``signals`` (Ctrl-C, or SIGTERM, which a cluster's scheduler sends
    before it stops a job) does not stop the process: it is recorded in the :class:`StopRequest` the block
    gets, for the training loop to stop at its next step (``fit(..., interrupt=request)``). A second one
    raises ``KeyboardInterrupt`` at once. The previous handlers are restored after the block. Outside the
    main thread, where Python takes no signal handler, nothing is installed.
    """
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handle(signum, frame):
        if request.signum is not None:
            raise KeyboardInterrupt
        request.signum = signum
        name = signal.Signals(signum).name
        os.write(2, f"capsnets: {name}: stopping after this step with a checkpoint ({name} again: at once)\n".encode())

    previous = {signum: signal.signal(signum, handle) for signum in signals}
    try:
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def freed_memory_retained() -> bool:
    """Whether :func:`retain_freed_memory` is in effect in this process (a query: it changes nothing)."""
    return _retained


def retain_freed_memory() -> bool:
    """Keep the memory of freed CPU tensors in the process for reuse, instead of returning it (glibc only).

    glibc serves large allocations (over 32 MiB at the latest: its threshold adapts up to that) with a fresh
    ``mmap`` and returns them with ``munmap`` when freed, so each such CPU tensor is faulted in (and zeroed
    by the kernel) page by page on first touch. EM routing allocates several per step, the votes and their
    gradients: ``matrix_capsnet_small`` spends about half of a training step there on a 2-core virtual
    machine. This sets ``M_MMAP_MAX`` to 0 and ``M_TRIM_THRESHOLD`` to 2 GiB, so large blocks come from the
    heap and stay there once freed: a training step then touches memory it already has. The price is that
    the process's resident memory stays near its peak.

    It changes the whole process, so the library never calls it on import: the ``capsnets`` command calls it
    when asked (``--retain-freed-memory`` or ``CAPSNETS_RETAIN_FREED_MEMORY=1``), as do the benchmarks and the
    test suite. Set ``CAPSNETS_RETAIN_FREED_MEMORY=0`` to leave malloc alone.

    Returns:
        True if the settings are in effect (now or from an earlier call), False where the C library is not
        glibc or the variable opts out.
    """
    global _retained
    if _retained:
        return True
    if os.environ.get("CAPSNETS_RETAIN_FREED_MEMORY", "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _retained = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    return _retained
