"""SIGTERM, which a cluster's scheduler sends a job before it stops it, stops ``capsnets train`` as Ctrl-C does: at
the next step, with a checkpoint of that step and the command that continues it; the continued run ends bitwise
as the run that was never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability.faults import assert_same_run, train_args

#: 3 epochs of 20 steps: SIGTERM sent once the first epoch is recorded lands within the training. No figures: they
#: are not what is tested, and drawing them is most of a short run's time.
ARGS = [*train_args(3), "--limit-train", "320", "--no-figures"]


@pytest.mark.long  # started first (tests/conftest.py)
def test_sigterm_checkpoints_prints_the_resume_command_and_resume_is_bit_exact(tmp_path):
    from capsnets.cli import main

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"), *sys.path])}
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "capsnets", *ARGS, "--out", str(run)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 1) and process.poll() is None:
        assert time.monotonic() < deadline, "the training wrote no epoch in 300 s"
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err, err
    hint = f"is saved; continue with: capsnets train --out {run} --resume"
    assert "capsnets train: stopped by SIGTERM; a checkpoint (epoch " in err and hint in err, err
    with open(run / "last.json") as handle:
        training = json.load(handle)["training"]
    assert not training["finished"] and training["epoch"] < 3

    assert main(["train", "--resume", "--out", str(run)]) == 0  # the command it printed, in this process

    reference = tmp_path / "reference"
    assert main([*ARGS, "--out", str(reference)]) == 0
    assert_same_run(run, reference)
