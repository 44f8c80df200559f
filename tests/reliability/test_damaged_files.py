"""Torn and corrupted run files: each file of a run directory truncated, emptied, zeroed, garbled, replaced by
JSON of the wrong type, or deleted (and leftover temporary files and a garbled lock file), then
``train --resume``, ``evaluate`` and ``reconstruct``. Each either repairs what it needs (with a warning) and
succeeds with the results of the undamaged run, or exits with status 1 and one line naming the damaged file,
without a traceback and without changing any file.

The run damaged is ``clean_runs[2]`` (best checkpoint: epoch 1, last: epoch 2); ``train --resume --epochs 3``
must end as the uninterrupted 3-epoch run. The short version damages each file once (10 cases, the checkpoint
files also read by evaluate and reconstruct); ``-m faults_long`` every file in every way (53 cases x 3 commands).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from reliability.faults import assert_same_run, copy_run, one_error_line, snapshot

from capsnets.cli import main
from capsnets.engine import reporting

LEFTOVER = ".last.safetensors.k3j4h5g6.tmp"  # what a save cut before its commit point leaves
FILES = (
    "last.safetensors",
    "best.safetensors",
    "last.json",
    "best.json",
    "config.yaml",
    "metrics.jsonl",
    "summary.json",
    LEFTOVER,
    ".lock",
)
CHECKPOINT_FILES = FILES[:4]  # what evaluate and reconstruct read
DAMAGES = ("truncated", "empty", "zeroed", "garbled", "wrong type", "missing")
WRONG_TYPE = {".json": b'["not", "an", "object"]', ".yaml": b"- 1\n- 2\n", ".jsonl": b'[]\n{"epoch": "one"}\n'}


def damage(run: Path, name: str, how: str) -> None:
    """Damage file ``name`` of ``run`` in the way ``how`` (:data:`DAMAGES`); a leftover temporary file is made
    from the last checkpoint."""
    path = run / name
    data = {LEFTOVER: (run / "last.safetensors").read_bytes(), ".lock": b"pid 4242\n"}.get(name) or path.read_bytes()
    if how == "missing":
        path.unlink(missing_ok=True)
        return
    if how == "garbled":  # bytes inverted at the middle and at 8 places drawn from a seeded RNG
        rng, garbled = random.Random(f"{name}-{len(data)}"), bytearray(data)
        for index in {len(data) // 2, *(rng.randrange(len(data)) for _ in range(8))}:
            garbled[index] ^= 0xFF
        data = bytes(garbled)
    else:
        data = {
            "truncated": data[: len(data) // 2],
            "empty": b"",
            "zeroed": bytes(len(data)),
            "wrong type": WRONG_TYPE.get(Path(name).suffix, b"{}"),
        }[how]
    path.write_bytes(data)


def _stub_figures(patch: pytest.MonkeyPatch) -> None:
    """Figures are not what is tested (and take most of the time): tiny files instead."""
    from capsnets import plots

    def stub(*args, **kwargs):
        out = Path(next(a for a in (*args, *kwargs.values()) if isinstance(a, (str, Path)) and str(a).endswith(".png")))
        out.write_bytes(b"png")
        return out

    patch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
    patch.setattr(plots, "plot_confusion_matrix", stub)
    patch.setattr(plots, "plot_reconstructions", stub)


@pytest.fixture(scope="module")
def clean_evaluations(clean_runs, tmp_path_factory) -> dict[str, dict]:
    """evaluate's report of the undamaged best and last checkpoints."""
    run = copy_run(clean_runs[2], tmp_path_factory.mktemp("clean-evaluations") / "run")
    reports = {}
    with pytest.MonkeyPatch.context() as patch:
        _stub_figures(patch)
        for name in ("best", "last"):
            assert main(["evaluate", "--checkpoint", str(run / f"{name}.safetensors"), "--device", "cpu"]) == 0
            reports[name] = _result(json.loads((run / f"evaluation_{name}_digits.json").read_text()))
    return reports


def _result(report: dict) -> dict:
    return {k: report[k] for k in ("epoch", "count", "accuracy", "per_class_accuracy", "confusion_matrix")}


def _command(command: str, run: Path) -> list[str]:
    return {
        "train": ["train", "--resume", "--epochs", "3", "--out", str(run)],
        "evaluate": ["evaluate", "--checkpoint", str(run), "--device", "cpu"],
        "reconstruct": ["reconstruct", "--checkpoint", str(run), "--device", "cpu", "--n", "4"],
    }[command]


def _check(command, name, how, clean_runs, clean_evaluations, tmp_path, capsys, caplog):
    run = copy_run(clean_runs[2], tmp_path / "run")
    damage(run, name, how)
    before = snapshot(run)
    with pytest.MonkeyPatch.context() as patch:
        _stub_figures(patch)
        status = main(_command(command, run))
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Traceback" not in caplog.text
    if status != 0:
        line = one_error_line(err, command)
        assert status == 1 and name in line, f"{name} {how}: {line}"
        assert snapshot(run) == before, f"{command} changed files of the run before failing"
        return "refused"
    if command == "train":
        lost_best = name == "best.safetensors" and how == "missing"  # removed by hand: its epoch is lost
        if lost_best:
            assert "best.safetensors is missing" in caplog.text and not (run / name).exists()
            (run / "best.safetensors").write_bytes((clean_runs[3] / "best.safetensors").read_bytes())
            (run / "best.json").write_text((clean_runs[3] / "best.json").read_text())
        assert_same_run(run, clean_runs[3])
        warned = any(name in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
        return "repaired" if warned else "succeeded"
    outputs = {n for n in snapshot(run) if n.startswith(("evaluation_", "reconstructions_"))}
    assert {n: v for n, v in snapshot(run).items() if n not in outputs} == before, f"{command} changed the run"
    if command == "evaluate":
        [report] = [json.loads((run / n).read_text()) for n in outputs if n.endswith(".json")]
        assert _result(report) == clean_evaluations[Path(report["checkpoint"]).stem], "other results"
    return "succeeded"


#: The short version: each file once, every kind of damage at least once.
SHORT = [
    ("last.safetensors", "garbled"),
    ("best.safetensors", "truncated"),
    ("last.json", "wrong type"),
    ("best.json", "zeroed"),
    ("config.yaml", "empty"),
    ("metrics.jsonl", "garbled"),
    ("summary.json", "wrong type"),
    (LEFTOVER, "truncated"),
    (".lock", "garbled"),
    ("config.yaml", "missing"),
]


@pytest.mark.parametrize("name, how", SHORT)
def test_a_damaged_run_file(clean_runs, clean_evaluations, tmp_path, capsys, caplog, record_property, name, how):
    for command in ("train", "evaluate", "reconstruct") if name in CHECKPOINT_FILES else ("train",):
        outcome = _check(command, name, how, clean_runs, clean_evaluations, tmp_path / command, capsys, caplog)
        record_property(f"{name} {how}: {command}", outcome)  # repaired, succeeded or refused (--junitxml)


@pytest.mark.faults_long
@pytest.mark.parametrize("command", ["train", "evaluate", "reconstruct"])
@pytest.mark.parametrize("name", FILES)
def test_every_damage_of_every_file(
    clean_runs, clean_evaluations, tmp_path, capsys, caplog, record_property, command, name
):
    for how in DAMAGES:
        if name == LEFTOVER and how == "missing":
            continue
        outcome = _check(
            command, name, how, clean_runs, clean_evaluations, tmp_path / how.replace(" ", "_"), capsys, caplog
        )
        record_property(f"{name} {how}: {command}", outcome)
