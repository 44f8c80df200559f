"""Fixtures shared by all test folders."""

import atexit
import gc
import importlib.util
import os
import sys
from pathlib import Path

import pytest


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        # Its results are with the controller once its session ends; the interpreter's teardown of what a thousand
        # tests left (modules, tensors, threads) then took 2-6 s before the controller could end the run. The
        # other exit handlers run first (this one was registered before them).
        atexit.register(_leave_at_once)


def _leave_at_once() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def pytest_sessionstart(session):
    worker = getattr(session.config, "workerinput", None)
    if worker is None and session.config.getoption("dist", "no") != "no":
        return  # pytest -n N: this process hands the tests to N workers and runs none (its environment is theirs)
    # As the capsnets command does: large freed CPU tensors stay in the process (EM routing's training step is
    # about 1.8x faster on the CI machine; capsnets.engine.runtime.retain_freed_memory).
    from capsnets.engine.runtime import retain_freed_memory

    retain_freed_memory()
    # Runs the tests compare bit for bit compute with one thread count: without OMP_NUM_THREADS (or --threads) the
    # command lowers torch's count to the cores the load leaves free, and the load varies while the suite runs.
    # Child processes inherit the variable.
    import torch

    if worker is not None and "OMP_NUM_THREADS" not in os.environ:  # N workers share the cores (more threads spin)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // worker["workercount"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))


def pytest_collection_finish(session):
    # What is alive after a full collection (torch, the tests' modules, and later whatever the tests import:
    # TorchDynamo, sympy, onnx) is frozen (gc.freeze), so that the collector stops walking it again: otherwise
    # each worker spends 10-12 s in full collections. A cycle that was alive then and became garbage since is never
    # collected (nor seen by gc.get_referrers); the workers' peak memory does not grow for it.
    gc.collect()
    gc.freeze()
    gc.callbacks.append(_freeze_after_full_collections)


def _freeze_after_full_collections(phase: str, info: dict) -> None:
    if phase == "stop" and info["generation"] == 2:  # the oldest generation: a full collection
        gc.freeze()


def pytest_unconfigure(config):
    # The interpreter's exit collects what is left (extension modules check that their objects were freed then).
    if _freeze_after_full_collections in gc.callbacks:
        gc.callbacks.remove(_freeze_after_full_collections)
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _session_thread_count():
    """Every test starts with the session's thread count (``OMP_NUM_THREADS``, which child processes inherit): a
    test that sets torch's threads in this process (a benchmark's ``main``, a command with ``--threads``) must not
    make a later test compute in-process with another count than the subprocesses it compares against."""
    import torch

    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    # A -m expression replaces the default "not slow and not gpu and not faults_long" (pyproject.toml); keep
    # GPU, slow and long fault-injection tests out unless it names them, so that `pytest -m "not learning"` is
    # the quick CPU run it reads as.
    expression = config.getoption("markexpr") or ""
    unnamed = [marker for marker in ("gpu", "slow", "faults_long") if marker not in expression]
    keep, drop = [], []
    for item in items:
        (drop if any(item.get_closest_marker(m) for m in unnamed) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    worker = getattr(config, "workerinput", None)
    items[:] = long_tests_first(items, worker["workercount"] if worker else 1)


def long_tests_first(items: list, workers: int) -> list:
    """``items`` reordered so that each pytest-xdist worker starts with its share of the long tests (those marked
    ``learning`` or ``long``): ``--dist worksteal`` hands worker ``i`` the ``i``-th of ``workers`` contiguous
    chunks of the collection and an idle worker steals from the end of another's chunk, so a long test at the end
    of a chunk would finish last, alone. The other tests keep their order."""

    def is_long(item) -> bool:
        return item.get_closest_marker("learning") is not None or item.get_closest_marker("long") is not None

    long = [item for item in items if is_long(item)]
    if not long:
        return items
    short = [item for item in items if not is_long(item)]
    shares: list[list] = [[] for _ in range(workers)]
    for index, item in enumerate(long):  # round robin
        shares[index % workers].append(item)
    ordered, remaining = [], len(items)
    for share, left in zip(shares, range(workers, 0, -1)):
        size = max(remaining // left, len(share))  # worksteal's chunk: what is left, shared by the nodes left
        fill = size - len(share)
        ordered += share + short[:fill]
        short, remaining = short[fill:], remaining - size
    return ordered + short


@pytest.fixture(scope="session")
def shared_data_root() -> Path:
    """The real data: ``$CAPSNETS_DATA``, else ``../shared/data`` beside the repository.

    Outside CI a missing folder skips the test; in CI (``CI`` set) it fails, so a CI run can never pass
    without having trained on the real files.
    """
    root = Path(os.environ.get("CAPSNETS_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
    if not (root / "mnist" / "t10k-labels-idx1-ubyte.gz").is_file():
        message = f"real MNIST files not found under {root}; set CAPSNETS_DATA to the folder holding mnist/"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return root


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def load_benchmark():
    """``load_benchmark(name)``: the module of ``benchmarks/<name>.py``, loaded from its file (the scripts import
    their neighbours ``throughput`` and ``baselines``, so the folder is on ``sys.path`` while one loads), e.g.
    ``load_benchmark("baselines").NaiveDynamicRouting``."""

    def load(name: str):
        sys.path.insert(0, str(BENCHMARKS))
        try:
            spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(BENCHMARKS))
        return module

    return load
