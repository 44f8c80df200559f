"""engine.runtime: the malloc setting that keeps freed CPU tensors in the process."""

import json
import os
import platform
import subprocess
import sys

import pytest
import torch

# Allocates a 64 MiB tensor in a fresh interpreter and reports how many bytes glibc has mmapped while it is alive
# (mallinfo2's hblkhd): with the default settings the tensor is one mmapped block, once freed memory is
# retained it comes from the heap.
_PROBE = """
import ctypes, json, sys
import torch
from capsnets.engine.runtime import freed_memory_retained, retain_freed_memory
queried = freed_memory_retained()  # a query: it applies nothing
applied = retain_freed_memory() if sys.argv[1] == "call" else False
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = Info
before = mallinfo2().hblkhd
block = torch.ones(16 * 2**20)
print(json.dumps({"applied": applied, "mmapped": mallinfo2().hblkhd - before,
                  "queried": [queried, freed_memory_retained()]}))
"""


def _probe(mode: str, **env) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True, env={**os.environ, **env}
    )
    return json.loads(out.stdout)


def _glibc_version() -> tuple[int, ...]:
    name, version = platform.libc_ver()
    return tuple(int(part) for part in version.split(".") if part.isdigit()) if name == "glibc" else ()


@pytest.mark.skipif(_glibc_version() < (2, 33), reason="mallopt and mallinfo2 are glibc's (2.33 or later)")
def test_large_tensors_come_from_the_heap_once_freed_memory_is_retained():
    default = _probe("skip")
    assert default["mmapped"] >= 64 * 2**20 and default["queried"] == [False, False]  # a fresh mmap per block
    retained = _probe("call")
    assert retained == {"applied": True, "mmapped": 0, "queried": [False, True]}
    opted_out = _probe("call", CAPSNETS_RETAIN_FREED_MEMORY="0")
    assert not opted_out["applied"] and opted_out["mmapped"] >= 64 * 2**20 and opted_out["queried"] == [False, False]


def test_threads_are_lowered_to_the_free_cores_only_when_nobody_chose():
    from capsnets.engine.runtime import choose_threads, free_cores

    assert [free_cores(2, load) for load in (0.0, 0.4, 0.6, 1.6, 5.0)] == [2, 2, 1, 1, 1]
    busy = dict(torch_threads=2, cpu_count=2, load=1.6)
    threads, note = choose_threads(None, **busy, env={})
    assert threads == 1 and note.count("\n") == 0 and "--threads" in note and "instead of 2" in note
    assert choose_threads(None, torch_threads=2, cpu_count=2, load=0.3, env={}) == (None, None)  # quiet
    assert choose_threads(None, torch_threads=1, cpu_count=2, load=1.9, env={}) == (None, None)  # fits already
    assert choose_threads(2, **busy, env={}) == (2, None)  # --threads is obeyed
    assert choose_threads(None, **busy, env={"OMP_NUM_THREADS": "2"}) == (None, None)  # so is OMP_NUM_THREADS


def test_the_machine_load_is_the_usable_cores_and_the_load_average(monkeypatch):
    from capsnets.engine import runtime

    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 3}, raising=False)  # taskset -c 0,3
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (1.7, 1.0, 0.5))
    assert runtime.machine_load() == (2, 1.7)
    monkeypatch.delattr(runtime.os, "sched_getaffinity")  # macOS, Windows: every core
    monkeypatch.delattr(runtime.os, "getloadavg")  # Windows: no load average
    assert runtime.machine_load() == (8, 0.0)


def test_torch_threads_sets_the_count_for_the_block_only():
    import torch

    from capsnets.engine.runtime import torch_threads

    before = torch.get_num_threads()
    with torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before


def test_stop_on_signals_records_the_first_signal_raises_at_the_second_and_restores_the_handlers():
    import signal

    from capsnets.engine.runtime import stop_on_signals

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with stop_on_signals() as request:
        assert request() is None
        signal.raise_signal(signal.SIGTERM)
        assert request() == signal.SIGTERM  # recorded; the process goes on
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_the_em_kernel_is_built_ahead_only_for_a_model_that_routes_by_em_on_the_cpu(monkeypatch):
    import capsnets
    from capsnets.engine.runtime import compile_em_kernel
    from capsnets.functional.em import kernel

    built, needed = [], [True]
    monkeypatch.setattr(kernel, "build_needed", lambda: needed[0])
    monkeypatch.setattr(kernel, "load", lambda *args, **kwargs: built.append(1))
    matrix = capsnets.create_model("matrix_capsnet_small", device="meta")
    assert compile_em_kernel(capsnets.create_model("capsnet_digits"), torch.device("cpu")) == 0.0 and not built
    assert compile_em_kernel(matrix, torch.device("cuda")) == 0.0 and not built
    assert compile_em_kernel(matrix, torch.device("cpu")) >= 0.0 and built == [1]
    needed[0] = False  # built already
    assert compile_em_kernel(matrix, torch.device("cpu")) == 0.0 and built == [1]
