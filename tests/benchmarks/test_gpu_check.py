"""benchmarks/gpu_check.py: its dry run (what a GPU session runs, at tiny sizes on the CPU) completes and records
every step, so that the script cannot rot between the sessions that have a GPU."""

import io
import json
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest

from capsnets.cli import main as capsnets_main


def _steps_in_this_process(bench, load_benchmark, monkeypatch) -> None:
    """``bench.run_step`` with the steps that run ``capsnets`` or ``benchmarks/throughput.py`` called in this
    process, with the same arguments through the same entry points and the step's environment variables (a child
    process spends 2-3 s importing torch and TorchDynamo); the other steps (pytest) stay child processes."""
    child = bench.run_step

    def run_step(name, command, out, budget_s, env=None):
        if command[1:3] == ["-m", "capsnets"]:
            entry, argv = capsnets_main, command[3:]
        elif command[1] == "benchmarks/throughput.py":
            entry, argv = load_benchmark("throughput").main, command[2:]
        else:
            return child(name, command, out, budget_s, env)
        start, printed, errors = time.perf_counter(), io.StringIO(), io.StringIO()
        with monkeypatch.context() as patch, redirect_stdout(printed), redirect_stderr(errors):
            for key, value in (env or {}).items():
                patch.setenv(key, value)
            returncode = entry(argv)
        return bench.step_record(name, command, out, start, returncode, printed.getvalue() + errors.getvalue(), False)

    monkeypatch.setattr(bench, "run_step", run_step)


@pytest.mark.long  # a child process (pytest collecting the GPU tests), throughput runs, two trainings
def test_dry_run_records_every_step(load_benchmark, shared_data_root, tmp_path, monkeypatch):
    bench = load_benchmark("gpu_check")
    _steps_in_this_process(bench, load_benchmark, monkeypatch)
    # One of the four models: the one with EM paths, whose steps are named by path; the other three are the same
    # command with another --models and no path.
    monkeypatch.setattr(bench, "DRY_MODELS", ("matrix_capsnet_small",))
    args = ["--dry-run", "--out", str(tmp_path), "--data-dir", str(shared_data_root), "--total-minutes", "20"]
    assert bench.main(args) == 0  # the budget of a loaded CI machine
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    steps = results["steps"]
    assert results["dry_run"] and steps["gpu_tests"]["counts"]["tests collected"] > 0
    assert "skipped" in steps["em_no_sync"]  # its tests are among those collected, 2 EM paths x training, inference
    assert (tmp_path / "gpu_tests.log").read_text().count(bench.NO_SYNC_TESTS) == 4
    assert steps["em_one_epoch"]["ok"] and 0 <= steps["em_one_epoch"]["result"]["test_accuracy"] <= 1
    for model in bench.DRY_MODELS:
        names = [n for n in steps if n.startswith(f"throughput_{model}")]
        assert names, model
        for name in names:
            rec = steps[name]
            assert "skipped" in rec or (rec["ok"] and (tmp_path / rec["result"]).is_file()), (name, rec)
    run = steps["time_to_accuracy"]
    assert run["ok"] and len(run["result"]["curve"]) == 1 and run["result"]["target"] == bench.TARGET_ACCURACY
    summary = (tmp_path / "summary.md").read_text()
    assert all(f"| {name} |" in summary for name in steps)


def test_time_to_accuracy_is_the_first_epoch_at_the_target(load_benchmark, tmp_path):
    bench = load_benchmark("gpu_check")
    accuracies = [0.98, 0.9952, 0.994, 0.996]
    lines = [
        json.dumps({"epoch": e + 1, "train_time_s": 2.0 * (e + 1), "test_accuracy": a})
        for e, a in enumerate(accuracies)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    result = bench.time_to_accuracy(tmp_path, 0.995)
    assert (result["reached"], result["epochs_to_target"], result["seconds_to_target"]) == (True, 2, 4.0)
    assert result["best_accuracy"] == 0.996
    assert bench.pytest_counts("3 failed, 37 passed, 2 deselected in 9.1s") == {
        "failed": 3,
        "passed": 37,
        "deselected": 2,
    }
