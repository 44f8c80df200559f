"""What the fault-injection tests share: the tiny training they break, and the checks that a run recovered
from a fault is the run that was never broken (importable as ``reliability.faults``)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file


def train_args(epochs: int = 3) -> list[str]:
    """The tiny offline training every case breaks: ``epochs`` epochs of 2 steps on 32 digits, tested on 16."""
    return [
        "train",
        "--model",
        "capsnet_digits",
        "--dataset",
        "digits",
        "--epochs",
        str(epochs),
        "--batch-size",
        "16",
        "--limit-train",
        "32",
        "--limit-test",
        "16",
        "--device",
        "cpu",
        "--no-progress",
        "--model-arg",
        "routing.iterations=2",
    ]


TRAIN = train_args(3)
#: Record entries that measure time: they differ between any two runs.
TIMINGS = ("epoch_time_s", "train_time_s", "images_per_s", "time_s")
#: A temporary file of :func:`capsnets.files.atomic_write` (``.<name>.<random>.tmp``): the name it stands for.
TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]+\.tmp$")


def target_name(path: str | Path) -> str:
    """The file a path writes: its own name, or the name its temporary file will be renamed to."""
    name = Path(path).name
    match = TEMPORARY.match(name)
    return match.group("name") if match else name


def records(run: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl`` without its timings."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in lines]


def copy_run(source: Path, target: Path) -> Path:
    """A copy of run ``source`` at ``target`` (its lock file left out)."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(".lock"))
    return target


def snapshot(run: Path) -> dict[str, bytes]:
    """Every file of a run directory (not the lock), by name."""
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file() and p.name != ".lock"}


def assert_same_run(run: Path, reference: Path, *, figures: bool = False) -> None:
    """``run`` ended as ``reference``, bitwise: every tensor of ``last`` (weights, Adam state, RNG), the weights
    of ``best``, the metrics, the history in the checkpoint; and it is tidy: no temporary file, each ``.json``
    the copy of its checkpoint's sidecar, a summary (and the figures, with ``figures``)."""
    for name, prefix in (("last", ""), ("best", "model.")):
        ours, theirs = load_file(run / f"{name}.safetensors"), load_file(reference / f"{name}.safetensors")
        keys = sorted(k for k in theirs if k.startswith(prefix))
        assert sorted(k for k in ours if k.startswith(prefix)) == keys, f"{name}: other tensors"
        differ = [k for k in keys if not torch.equal(ours[k], theirs[k])]
        assert not differ, f"{run.name}/{name}.safetensors differs from the uninterrupted run in {differ[:5]}"
        assert sidecar(run / f"{name}.safetensors") == json.loads((run / f"{name}.json").read_text()), (
            f"{name}.json is not the copy of {name}.safetensors' sidecar"
        )
    assert records(run) == records(reference), "metrics.jsonl differs from the uninterrupted run"
    history = [
        {k: v for k, v in r.items() if k not in TIMINGS}
        for r in sidecar(run / "last.safetensors")["training"]["history"]
    ]
    assert history == records(reference)
    leftovers = [p.name for p in run.iterdir() if p.name.endswith(".tmp")]
    assert not leftovers, f"temporary files left in {run}: {leftovers}"
    summary, expected = (json.loads((r / "summary.json").read_text()) for r in (run, reference))
    for key in ("epochs", "test_accuracy", "best_epoch", "best_test_accuracy"):
        assert summary[key] == expected[key], key
    if figures:
        missing = [
            n for n in ("training_curves.png", "confusion_matrix.png", "reconstructions.png") if not (run / n).is_file()
        ]
        assert not missing, f"figures missing after recovery: {missing}"


def sidecar(path: Path) -> dict[str, Any]:
    """The sidecar embedded in a checkpoint."""
    with safe_open(path, framework="pt") as handle:
        return json.loads(handle.metadata()["sidecar"])


def next_command(run: Path) -> list[str]:
    """What a user runs after a crash: ``--resume`` when the run has a checkpoint, else the command again."""
    if (run / "last.safetensors").is_file():
        return ["train", "--resume", "--out", str(run)]
    return [*TRAIN, "--out", str(run)]


def recovery(argv: list[str], run: Path) -> list[str]:
    """The command a user runs after ``argv`` failed on ``run``: the same again, with ``--resume`` once the run has
    a checkpoint (the flags that start it are those it was started with)."""
    if "--resume" not in argv and (run / "last.safetensors").is_file():
        return [*[a for a in argv if a != "--overwrite"], "--resume"]
    return argv


def one_error_line(err: str, command: str = "train") -> str:
    """The error line of a failed command's stderr, after checking that there is exactly one and no traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"capsnets {command}: error:")]
    assert len(lines) == 1, err
    return lines[0]


class CrashRunner:
    """Drives ``crash_runner.py``: ``run(argv, kill=...)`` runs one command in a forked child and returns its
    exit status (``-9`` when it was killed) and stderr."""

    def __init__(self, logs: Path) -> None:
        self.logs, self.count = logs, 0
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("crash_runner.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert json.loads(self.process.stdout.readline()) == {"ready": True}

    def run(
        self, argv: list[str], *, kill: dict | None = None, figures: bool | str = False
    ) -> tuple[int, str, dict | None]:
        """Run ``argv``; returns (exit status or -signal, the child's stderr and stdout, site call counts)."""
        self.count += 1
        log, counts = self.logs / f"{self.count}.log", self.logs / f"{self.count}.counts"
        request = {"argv": argv, "kill": kill, "figures": figures, "log": str(log), "counts": str(counts)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        return answer["status"], log.read_text() if log.is_file() else "", answer["counts"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
