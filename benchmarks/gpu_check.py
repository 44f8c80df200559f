"""Everything a session with a GPU should measure, in one command of a few minutes: tests, speed, memory, and
time to accuracy, each result a JSON file in one folder, with a summary table.

Steps, each a child process with a time budget (a step past its budget is stopped and recorded as such, and the
next one runs), the budgets cut so that the whole run ends within ``--total-minutes`` (7 by default: with the
install, the check fits 8 minutes of a lent machine):

1. ``gpu_tests``: ``pytest -m gpu`` (``tests/gpu/``: the library on CUDA against the CPU); ``em_no_sync``, its
   check that EM routing never waits on the host (a step of ``matrix_capsnet`` under
   ``torch.cuda.set_sync_debug_mode("error")``, both EM paths, training and inference), on its own line.
2. ``throughput``: training and inference images/s and peak memory (``benchmarks/throughput.py``, bf16, batch
   128) of ``capsnet``, ``cnn_baseline``, ``matrix_capsnet`` and ``efficient_capsnet``; the matrix capsule model
   once per EM routing path (``CAPSNETS_EM_KERNEL``), each path this version has.
3. ``em_one_epoch``: ``capsnets train --model matrix_capsnet_small --dataset mnist --epochs 1 --batch-size 32``
   with the model's recipe in bf16: the test accuracy after one epoch and its training seconds.
4. ``time_to_accuracy``: ``capsnets train --model capsnet --dataset mnist`` in bf16, scored after every epoch,
   for at most 2 minutes: the training seconds until the test accuracy first reaches 99.5%.

``--dry-run`` runs the same steps on the CPU at tiny sizes (the small models, batch 4, one epoch of 256 digits and
one of 64 MNIST images, the GPU tests collected but not run, the Triton EM path left out: on the CPU it runs in
Triton's interpreter), so that the script is tested wherever the tests run.

    python benchmarks/gpu_check.py --out benchmarks/results/gpu_check_h100 --data-dir ../shared/data
    python benchmarks/gpu_check.py --dry-run --out /tmp/gpu_check
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The models whose throughput is measured, and those of the dry run.
MODELS = ("capsnet", "cnn_baseline", "matrix_capsnet", "efficient_capsnet")
DRY_MODELS = ("capsnet_small", "cnn_baseline_narrow", "matrix_capsnet_small", "efficient_capsnet")
#: The EM routing paths to time (``CAPSNETS_EM_KERNEL``), where this version has them.
EM_PATHS = ("torch", "triton")
#: The tests (``pytest -k``) of ``tests/gpu`` that hold EM routing to no host synchronisation.
NO_SYNC_TESTS = "without_waiting_on_the_host"
#: The time budget of the one-epoch EM training (seconds).
EM_EPOCH_S = 150.0
#: The accuracy whose training time is measured.
TARGET_ACCURACY = 0.995


def run_step(name: str, command: list[str], out: Path, budget_s: float, env: dict | None = None) -> dict:
    """Run ``command`` for at most ``budget_s`` seconds; its record (``ok``, ``returncode``, ``seconds``, the end of
    its output) is also written to ``out/name.log``."""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=budget_s, env={**os.environ, **(env or {})}
        )
        returncode, output, timed_out = done.returncode, done.stdout + done.stderr, False
    except subprocess.TimeoutExpired as err:
        returncode, timed_out = None, True
        output = "".join(part.decode() if isinstance(part, bytes) else part or "" for part in (err.stdout, err.stderr))
    return step_record(name, command, out, start, returncode, output, timed_out)


def step_record(
    name: str, command: list[str], out: Path, start: float, returncode: int | None, output: str, timed_out: bool
) -> dict:
    """A step's record, its output written to ``out/name.log``; ``start`` is its ``time.perf_counter()``."""
    (out / f"{name}.log").write_text(output)
    return {
        "ok": returncode == 0,
        "returncode": returncode,
        "timed_out": timed_out,
        "seconds": round(time.perf_counter() - start, 1),
        "command": command,
        "output_tail": output[-2000:],
    }


def pytest_counts(output: str) -> dict:
    """``{"passed": n, "failed": n, ...}`` from pytest's last summary line."""
    return {
        word: int(n)
        for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|tests? collected)", output)
    }


def em_paths() -> list[str]:
    """The EM routing paths of :data:`EM_PATHS` that ``CAPSNETS_EM_KERNEL`` accepts in this version."""
    sys.path.insert(0, str(ROOT / "src"))
    from capsnets.functional.em import kernel

    return [path for path in EM_PATHS if path in kernel.MODES]


def time_to_accuracy(run_dir: Path, target: float) -> dict:
    """The run's per-epoch test accuracies and the training seconds until the first at or above ``target``."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [
        {"epoch": r["epoch"], "train_time_s": r.get("train_time_s"), "test_accuracy": r.get("test_accuracy")}
        for r in records
    ]
    reached = next((r for r in curve if r["test_accuracy"] is not None and r["test_accuracy"] >= target), None)
    return {
        "target": target,
        "reached": reached is not None,
        "seconds_to_target": None if reached is None else reached["train_time_s"],
        "epochs_to_target": None if reached is None else reached["epoch"],
        "best_accuracy": max((r["test_accuracy"] or 0.0 for r in curve), default=None),
        "curve": curve,
    }


def summary_table(results: dict) -> str:
    lines = ["| step | result | seconds |", "|---|---|---|"]
    for name, rec in results["steps"].items():
        if "skipped" in rec:
            lines.append(f"| {name} | skipped: {rec['skipped']} | - |")
            continue
        if rec.get("timed_out"):
            result = "stopped at its time budget"
        elif not rec["ok"]:
            result = f"failed (exit {rec['returncode']})"
        else:
            result = rec.get("headline", "ok")
        lines.append(f"| {name} | {result} | {rec['seconds']} |")
    return "\n".join(lines) + "\n"


def _throughput_headline(path: Path) -> str:
    """``path train img/s, peak MiB`` of each row of a ``throughput.py`` result."""
    parts = []
    for row in json.loads(path.read_text()).get("rows", []):
        memory = row.get("train_peak_memory_bytes")
        text = f"{row['path']} {row['train_images_per_s']:,.0f} img/s"
        parts.append(text + (f", {memory / 2**20:,.0f} MiB" if memory else ""))
    return "; ".join(parts) or "ok"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON files, logs and summary")
    parser.add_argument("--data-dir", default=os.environ.get("CAPSNETS_DATA"), help="folder holding mnist/")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (what CI runs)")
    parser.add_argument("--minutes", type=float, default=2.0, help="time-to-accuracy budget (training minutes)")
    parser.add_argument(
        "--total-minutes", type=float, default=7.0, help="the whole run's budget (the steps' budgets shrink to fit it)"
    )
    args = parser.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    python, started = sys.executable, time.perf_counter()
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    if args.data_dir:
        env["CAPSNETS_DATA"] = str(args.data_dir)
    results: dict = {"dry_run": args.dry_run, "steps": {}}
    deadline = started + 60.0 * args.total_minutes

    def budget(own: float, reserve: float) -> float:
        """A step's time budget: its own, cut to what the deadline leaves after ``reserve`` seconds for the
        steps after it (at least 10 s)."""
        return max(10.0, min(own, deadline - time.perf_counter() - reserve))

    models = DRY_MODELS if args.dry_run else MODELS
    timings = sum(len(em_paths()) if m.startswith("matrix") else 1 for m in models)  # throughput steps
    minimum_step, minimum_training = 30.0, 90.0 + EM_EPOCH_S  # reserved for each later step

    def record(name: str, rec: dict) -> None:
        results["steps"][name] = rec
        results["seconds"] = round(time.perf_counter() - started, 1)
        (out / "gpu_check.json").write_text(json.dumps(results, indent=1) + "\n")
        (out / "summary.md").write_text(summary_table(results))
        print(f"{name}: {summary_table({'steps': {name: rec}}).splitlines()[-1]}", flush=True)

    tests = [python, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests/gpu"]
    reserve = timings * minimum_step + minimum_training
    rec = run_step("gpu_tests", tests + (["--collect-only"] if args.dry_run else []), out, budget(180, reserve), env)
    rec["counts"] = pytest_counts(rec["output_tail"])
    rec["headline"] = ", ".join(f"{n} {w}" for w, n in rec["counts"].items()) or "ok"
    record("gpu_tests", rec)
    if args.dry_run:  # the same pytest command with -k: gpu_tests collected its tests
        record("em_no_sync", {"skipped": "dry run: gpu_tests collected its tests"})
    else:
        rec = run_step("em_no_sync", tests + ["-k", NO_SYNC_TESTS], out, budget(60, reserve), env)
        rec["counts"] = pytest_counts(rec["output_tail"])
        rec["headline"] = ", ".join(f"{n} {w}" for w, n in rec["counts"].items()) or "ok"
        record("em_no_sync", rec)

    device, sizes = (["--device", "cpu", "--amp", "off"], ["--batch-sizes", "4", "--steps", "1", "--warmup", "1"])
    if not args.dry_run:
        device, sizes = (
            ["--device", "cuda", "--amp", "bf16"],
            ["--batch-sizes", "128", "--steps", "10", "--warmup", "3"],
        )
    for model in models:
        paths = em_paths() if model.startswith("matrix") else [None]
        skipped = {path: f"no {path} EM path in this version" for path in EM_PATHS if path not in paths}
        if args.dry_run and "triton" in paths:  # on CPU tensors the kernels run in Triton's interpreter
            paths.remove("triton")
            skipped["triton"] = "dry run: on the CPU the Triton kernels run in Triton's interpreter (tested by pytest)"
        for path in paths:
            name = f"throughput_{model}" + (f"_{path}" if path else "")
            target = out / f"{name}.json"
            command = [python, "benchmarks/throughput.py", "--models", model, *device, *sizes, "--repeats", "1"]
            command += ["--skip-naive", "--out", str(target)]
            timings -= 1
            rec = run_step(
                name,
                command,
                out,
                budget(90, timings * minimum_step + minimum_training),
                {**env, **({"CAPSNETS_EM_KERNEL": path} if path else {})},
            )
            if rec["ok"] and target.is_file():
                rec["result"] = str(target.relative_to(out))
                rec["headline"] = _throughput_headline(target)
            record(name, rec)
        for path, why in skipped.items() if model.startswith("matrix") else ():
            record(f"throughput_{model}_{path}", {"skipped": why})

    em_dir = out / "matrix_capsnet_small_mnist"
    train = ["--model", "matrix_capsnet_small", "--dataset", "mnist", "--epochs", "1", "--batch-size", "32"]
    if args.dry_run:
        train += ["--limit-train", "64", "--limit-test", "64", "--device", "cpu", "--amp", "off"]
    else:
        train += ["--device", "cuda", "--amp", "bf16"]
    command = [python, "-m", "capsnets", "train", *train, "--out", str(em_dir), "--no-progress", "--no-figures"]
    rec = run_step("em_one_epoch", command, out, budget(EM_EPOCH_S, minimum_training - EM_EPOCH_S), env)
    if rec["ok"]:
        summary = json.loads((em_dir / "summary.json").read_text())
        rec["result"] = {key: summary.get(key) for key in ("test_accuracy", "train_time_s", "device_name")}
        rec["headline"] = f"{summary['test_accuracy']:.2%} after 1 epoch, {summary['train_time_s']:.1f} s of training"
    record("em_one_epoch", rec)

    run_dir = out / "capsnet_mnist"
    if args.dry_run:
        train = ["--model", "capsnet_digits", "--dataset", "digits", "--epochs", "1", "--limit-train", "256"]
        train += ["--limit-test", "128", "--device", "cpu", "--amp", "off", "--batch-size", "32"]
    else:  # training for what the deadline leaves, less a minute for loading and the last evaluation
        minutes = max(0.5, min(args.minutes, (deadline - time.perf_counter() - 60.0) / 60.0))
        train = ["--model", "capsnet", "--dataset", "mnist", "--epochs", "50", "--batch-size", "128"]
        train += ["--device", "cuda", "--amp", "bf16", "--time-limit", f"{minutes:.2f}"]
    command = [python, "-m", "capsnets", "train", *train, "--eval-every", "1", "--out", str(run_dir)]
    command += ["--no-progress", "--no-figures"]  # the training is what is timed
    rec = run_step("time_to_accuracy", command, out, budget(args.minutes * 60 + 60, 0.0), env)
    if rec["ok"]:
        rec["result"] = time_to_accuracy(run_dir, TARGET_ACCURACY)
        rec["headline"] = (
            f"{rec['result']['seconds_to_target']:.1f} s to {TARGET_ACCURACY:.1%}"
            if rec["result"]["reached"]
            else f"best {rec['result']['best_accuracy']:.2%}, {TARGET_ACCURACY:.1%} not reached"
        )
    record("time_to_accuracy", rec)
    print(f"\n{summary_table(results)}\nwrote {out / 'gpu_check.json'} and {out / 'summary.md'}")
    return 0 if all(r.get("ok", True) for r in results["steps"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
