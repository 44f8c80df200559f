"""Run ``capsnets`` command lines in child processes that SIGKILL themselves at a chosen point.

A fork server: this process imports capsnets (torch, scikit-learn, matplotlib: ~10 s on 2 cores) once and
runs no tensor operation itself; each request is run by a forked child, so each costs the command's own work
only. Requests come one JSON object a line on stdin, answers go one a line to stdout:

    {"argv": [...], "kill": null | {"site": S, "call": N, "mode": M} | {"after_s": T}, "figures": true,
     "log": PATH, "counts": PATH}
    -> {"status": exit status, or minus the signal that ended the child, "counts": {site: calls} or null}

The child makes the ``N``-th call at site ``S`` SIGKILL it (:data:`SITES`), or this process kills it ``T``
seconds after starting it. ``log`` receives the child's stdout and stderr; ``counts`` the calls each site saw
(written when the child ends by itself). ``figures: false`` replaces the run's figures by nothing (drawing them
takes most of a short run's time), ``"stub"`` by tiny files written the same way (:func:`stub_figures`).
"""

from __future__ import annotations

import builtins
import io
import json
import os
import signal
import sys
import time
from pathlib import Path

#: Where a child can be killed, and how (the first mode is the default).
SITES = {
    "step": ("before",),  # the N-th optimiser step: mid-epoch
    "save_file": ("before", "torn", "after"),  # safetensors writing a checkpoint's temporary file
    "replace": ("before", "after"),  # os.replace: the commit point of every atomic write, and --overwrite
    "fsync": ("before",),
    "write": ("torn",),  # the N-th write() to a file opened for writing: half of it written, then killed
    "unlink": ("before",),  # removing leftovers, temporary files, the run a --overwrite replaced
}


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _Plan:
    """Counts the calls at every site and kills the process at the planned one."""

    def __init__(self, kill: dict | None) -> None:
        self.kill = kill
        self.counts = {site: 0 for site in SITES}

    def tick(self, site: str, mode: str) -> None:
        """Count a call at ``site`` (once per call: tick with the call's first mode); die if it is the planned
        one and ``mode`` is the planned mode."""
        if mode == SITES[site][0]:
            self.counts[site] += 1
        if self.fires(site, mode):
            _die()

    def fires(self, site: str, mode: str) -> bool:
        kill = self.kill
        return (
            kill is not None
            and kill.get("site") == site
            and kill.get("mode", SITES[site][0]) == mode
            and kill["call"] == self.counts[site]
        )


class _Writer:
    """A file opened for writing whose planned ``write`` (site ``write``) writes half its data, flushes and
    kills the process: what a crash in the middle of a write leaves."""

    def __init__(self, handle, plan: _Plan) -> None:
        self._handle, self._plan = handle, plan

    def write(self, data):
        self._plan.counts["write"] += 1
        if self._plan.fires("write", "torn"):
            self._handle.write(data[: len(data) // 2])
            self._handle.flush()
            _die()
        return self._handle.write(data)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)

    def __iter__(self):
        return iter(self._handle)


def _install(plan: _Plan, figures: bool | str) -> None:
    import safetensors.torch
    import torch

    from capsnets import checkpoints as capsnets_checkpoints
    from capsnets.engine import reporting

    if not figures:
        reporting.save_figures = lambda *args, **kwargs: []
    elif figures == "stub":
        stub_figures()

    adam_step = torch.optim.Adam.step

    def step(self, *args, **kwargs):
        plan.tick("step", "before")
        return adam_step(self, *args, **kwargs)

    torch.optim.Adam.step = step

    real_save_file = safetensors.torch.save_file

    def save_file(tensors, filename, metadata=None):
        plan.tick("save_file", "before")
        result = real_save_file(tensors, filename, metadata=metadata)
        if plan.fires("save_file", "torn"):
            with open(filename, "rb+") as handle:
                handle.truncate(os.path.getsize(filename) // 2)
            _die()
        plan.tick("save_file", "after")
        return result

    capsnets_checkpoints.save_file = save_file

    real_replace, real_fsync, real_unlink = os.replace, os.fsync, os.unlink

    def replace(src, dst, **kwargs):
        plan.tick("replace", "before")
        result = real_replace(src, dst, **kwargs)
        plan.tick("replace", "after")
        return result

    def fsync(fd):
        plan.tick("fsync", "before")
        return real_fsync(fd)

    def unlink(path, **kwargs):
        plan.tick("unlink", "before")
        return real_unlink(path, **kwargs)

    os.replace, os.fsync, os.unlink, os.remove = replace, fsync, unlink, unlink
    real_open = io.open

    def open_(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        return handle if isinstance(file, int) or not set(mode) & set("wax+") else _Writer(handle, plan)

    builtins.open = io.open = open_


FIGURES = ("plot_training_curves", "plot_confusion_matrix", "plot_reconstructions")


def figure_stub(*args, **kwargs):
    """A stand-in for a :mod:`capsnets.plots` function: a tiny file written (atomically) where and as the figure
    is. Drawing takes seconds; what the tests look at is how the file is written."""
    from capsnets.files import atomic_write

    out = next(a for a in (*args, *kwargs.values()) if isinstance(a, (str, os.PathLike)) and str(a).endswith(".png"))
    return atomic_write(out, lambda tmp: Path(tmp).write_bytes(b"\x89PNG stand-in"))


def stub_figures() -> None:
    """Replace the drawing of every figure by :func:`figure_stub`."""
    from capsnets import plots

    for name in FIGURES:
        setattr(plots, name, figure_stub)


def _child(request: dict) -> None:
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 2)
    os.dup2(log, 1)
    plan = _Plan(request.get("kill"))
    status = 1
    try:
        _install(plan, request.get("figures", True))
        from capsnets.cli import main

        try:
            status = main(request["argv"])
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # a traceback from main: the test reads it in the log
        import traceback

        traceback.print_exc()
        status = 99
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        counts = request.get("counts")
        if counts:
            Path(counts).write_text(json.dumps(plan.counts))
        os._exit(status)


def _preload() -> None:
    """Import what a training imports, without running it (no thread pool may exist when forking)."""
    import matplotlib

    matplotlib.use("Agg")
    import sklearn.datasets  # noqa: F401  the digits
    import torch._dynamo  # noqa: F401  torch.use_deterministic_algorithms imports it

    import capsnets.cli  # noqa: F401
    import capsnets.engine.trainer  # noqa: F401
    import capsnets.plots  # noqa: F401
    from capsnets.data import load_dataset  # noqa: F401
    from capsnets.models import list_models

    list_models()


def _wait(pid: int, kill_after_s: float | None) -> int:
    """Wait for child ``pid``, SIGKILLing it after ``kill_after_s`` seconds (if given); its wait status."""
    if kill_after_s is None:
        return os.waitpid(pid, 0)[1]
    deadline = time.monotonic() + kill_after_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1]
        time.sleep(0.002)


def serve() -> None:
    _preload()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        status = _wait(pid, (request.get("kill") or {}).get("after_s"))
        code = os.waitstatus_to_exitcode(status)
        counts = request.get("counts")
        answer = {
            "status": code,
            "counts": json.loads(Path(counts).read_text()) if counts and code >= 0 and Path(counts).is_file() else None,
        }
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    serve()
