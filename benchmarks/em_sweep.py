"""Resumable sweep of matrix capsules' learning speed: formulation x EM iterations x inverse temperature x recipe.

Each setting trains ``--model`` (``matrix_capsnet_small``) on the first ``--train-size`` MNIST training images at
batch ``--batch-size`` for ``--steps`` steps (whole epochs of those images), from seeds ``--seeds``, and records
the accuracy on the first ``--test-size`` test images at ``--eval-steps`` (default: a quarter, half and all of the
steps). The axes:

- formulation: ``official`` (the authors' released code) or ``paper`` (Procedure 1 as printed);
- routing iterations: 1, 2, 3;
- inverse temperature: fixed ``1e-3``, fixed ``1e-2``, or ``authors``: ``lambda_t = 0.01 (1 - 0.95^(t+1))``
  (google-research/google-research, ``capsule_em/em_layers.py``; the official formulation divides it by 4 in
  the class layer, as that code does; the paper formulation uses it in every layer);
- recipe: ``cli`` (the training command's defaults), ``yl1993`` (yl-1993/Matrix-Capsules-EM-PyTorch,
  ``train.py``) or ``authors`` (the flag defaults of ``capsule_em/experiment.py``); ``em_grid.py`` defines them,
  and ``docs/results/em-recipes.md`` says what each sets and where it comes from.

Every run is a :class:`~capsnets.engine.TrainConfig` trained with the library's one training loop
(:func:`~capsnets.engine.fit`) set up as the trainer sets it up, so that a recorded ``config`` given to
``capsnets train --config`` trains the same model; only the evaluations within the epoch are the sweep's, and
input normalisation, which the config has no field for, is applied to the training batches (after the shifts)
and the test images.

Each finished (setting, seed) is added at once to ``--out`` (a JSON file written atomically, under a lock, so
that pieces may run side by side); a rerun skips what the file holds, so the sweep can be stopped at any time
and continued, and split with ``--piece K/N`` or ``--only``. ``--grid pruned`` (the default) runs stage A, every
formulation x iterations at the ``yl1993`` recipe with each formulation's usual inverse temperature, and once
stage A is complete, stage B: the recipe x inverse temperature axes at the ``--top`` best settings of stage A.
``--plan`` prints what is left per piece and its expected time on cores of its own, from the CPU time of recorded
runs or of a short timing run.

Run ``python benchmarks/em_sweep.py --help``; ``benchmarks/README.md`` lists the recorded runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from capsnets.data import AUGMENTATIONS, DeviceLoader, load_dataset
from capsnets.engine import TrainConfig
from capsnets.engine.callbacks import Hook
from capsnets.engine.evaluate import evaluate
from capsnets.engine.fit import NonFiniteLossError, TrainState, adam_with_decay, fit, training_step
from capsnets.engine.inputs import hold_out
from capsnets.engine.runtime import (
    deterministic_on_cpu,
    resolve_amp,
    resolve_device,
    retain_freed_memory,
    seed_everything,
    torch_threads,
)
from capsnets.files import atomic_write
from capsnets.losses import create_loss
from capsnets.models import model_arguments
from capsnets.models.hub import build_model

from em_grid import (
    ALL_RECIPES,
    ITERATIONS,
    Setting,
    full_grid,
    run_key,
    stage_a,
    stage_b,
)
from throughput import environment

RECORD_FORMAT = 1


def planned(args, runs: dict) -> tuple[list[Setting], str | None]:
    """The settings of ``args.grid`` (in a fixed order: a piece keeps its settings as stage B is added), and a
    note when part of the grid waits on results."""
    if args.grid == "full":
        return full_grid(), None
    b = stage_b(runs, args.seeds, args.top)
    if b is None:
        return stage_a(), "stage B (recipe x inverse temperature at the best of stage A) follows once stage A is done"
    return stage_a() + b, None


def select(settings: list[Setting], args) -> list[tuple[Setting, int]]:
    """The (setting, seed) pairs of this piece that ``--only`` keeps."""
    pairs = [(s, seed) for s in settings for seed in args.seeds]
    k, n = args.piece
    pairs = [p for i, p in enumerate(pairs) if i % n == k - 1]
    return [p for p in pairs if all(word in run_key(*p) for word in args.only)]


# -- one run ------------------------------------------------------------------------------------------------------


def make_config(setting: Setting, seed: int, args) -> tuple[TrainConfig, tuple[float, float] | None]:
    """The run's :class:`TrainConfig` and its input normalisation (None or ``(mean, std)``)."""
    steps_per_epoch = -(-args.train_size // args.batch_size)
    epochs = args.steps // steps_per_epoch
    recipe = ALL_RECIPES[setting.recipe](epochs, steps_per_epoch)
    normalize = recipe.pop("normalize", None)
    config = TrainConfig(
        model=args.model,
        model_args=setting.model_args(),
        dataset=args.dataset,
        data_dir=args.data_dir,
        epochs=epochs,
        batch_size=args.batch_size,
        limit_train=args.train_size,
        limit_test=args.test_size,
        seed=seed,
        device=args.device,
        threads=args.threads,
        progress=False,
        **recipe,
    )
    return config, normalize


def normalizer(mean: float, std: float) -> Callable[[torch.Tensor, torch.Generator], torch.Tensor]:
    def apply(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return (images - mean) / std

    return apply


def train_run(config: TrainConfig, eval_steps, normalize: tuple[float, float] | None = None) -> dict[str, Any]:
    """Train ``config`` as :class:`~capsnets.engine.Trainer` does (same seeding, data, model, loss, optimiser,
    schedule and batches), without a run directory, and return the test accuracy at each of ``eval_steps``."""
    device = resolve_device(config.device)
    with deterministic_on_cpu(device), torch_threads(config.threads):
        seed_everything(config.seed)
        splits = []
        for train, limit in ((True, config.limit_train), (False, config.limit_test)):
            data = load_dataset(config.dataset, root=config.data_dir, train=train)
            splits.append((data.subset(min(limit, len(data))) if limit is not None else data).to(device))
        train_data, test_data = splits
        train_data, _ = hold_out(train_data, config.val_fraction, config.seed)  # as the trainer holds it out
        data_args = {"num_classes": train_data.num_classes, "input_size": list(train_data.input_shape)}
        accepted = model_arguments(config.model)
        data_args = {k: v for k, v in data_args.items() if k in accepted and k not in config.model_args}
        model = build_model(config.model, {**config.model_args, **data_args}).to(device)
        criterion = create_loss(config.loss or model.default_loss, **config.loss_args)
        optimizer, scheduler = adam_with_decay(
            model.parameters(), lr=config.lr, lr_decay=config.lr_decay, weight_decay=config.weight_decay
        )
        state = TrainState()
        state.attach(optimizer, scheduler)
        augment = AUGMENTATIONS[config.augment]() if config.augment is not None else None
        if normalize is not None:  # after the shifts and the data set's or config's augmentation
            scale, first = normalizer(*normalize), augment or train_data.augment
            augment = scale if first is None else (lambda images, gen: scale(first(images, gen)))
            test_data = dataclasses.replace(test_data, images=scale(test_data.images))
        loader = DeviceLoader(
            train_data,
            config.batch_size,
            shuffle=True,
            max_shift=config.resolved_max_shift(train_data.images.shape[-2], train_data.augment),
            seed=config.seed,
            augment=augment,
        )
        schedule = hasattr(criterion, "set_progress")

        def compute(batch):
            images, labels = batch
            if schedule:
                criterion.set_progress(state.fraction(len(loader), config.epochs), config.epochs)
            output = model(images, labels)
            return {"train_loss": criterion(output, images, labels)[0]}

        curve, wanted = [], set(eval_steps)

        def score(step: int, train_loss: float | None) -> None:
            accuracy = evaluate(model, test_data, config.batch_size, device, config.amp)["accuracy"]
            curve.append({"step": step, "test_accuracy": accuracy, "train_loss": train_loss})
            print(f"  step {step:5d}  test accuracy {accuracy:.4f}", flush=True)

        def record(point, final):
            if point["step"] in wanted:
                score(point["step"], point["train_loss"])

        step = training_step(compute, optimizer, device=device, amp_dtype=resolve_amp(config.amp, device), model=model)
        non_finite = None
        try:
            fit(
                step,
                loader,
                epochs=config.epochs,
                state=state,
                schedulers=[scheduler],
                evaluations_per_epoch=len(loader),  # every step is a point; the hook evaluates the wanted ones
                callbacks=[Hook(record)],
                progress=False,
            )
        except NonFiniteLossError as err:  # a result of the setting: recorded with the model as it ended
            non_finite = str(err)
            print(f"  {non_finite}", flush=True)
            score(state.steps, None)
    return {"curve": curve, "train_s": state.train_time_s, "model": model, "non_finite": non_finite}


# -- the record file ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def locked(path: Path):
    """Hold an exclusive lock on the folder of ``path``, so that pieces running side by side add to one record
    file in turn (the file itself is replaced by each write, so it cannot hold the lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)  # releases the lock


def protocol(args) -> dict[str, Any]:
    """What every run of one record file shares: a file holds runs of one protocol only."""
    keys = ("model", "dataset", "train_size", "test_size", "steps", "batch_size", "eval_steps")
    return {key: getattr(args, key) for key in keys}


def read_record(path: Path, expected: dict[str, Any] | None = None) -> dict:
    """The record file's content (an empty record if there is none); with ``expected``, a file of runs of
    another protocol is refused, so that no run is skipped for a run of other sizes."""
    if not path.is_file():
        return {"format": RECORD_FORMAT, "protocol": expected, "runs": {}}
    record = json.loads(path.read_text())
    if record.get("format") != RECORD_FORMAT or not isinstance(record.get("runs"), dict):
        raise SystemExit(f"{path} is not a sweep record of format {RECORD_FORMAT}; pass another --out")
    if expected is not None and record.get("protocol") != expected:
        raise SystemExit(
            f"{path} holds runs of {record.get('protocol')}, not of {expected}; pass another --out for these sizes"
        )
    return record


def add_run(path: Path, key: str, entry: dict, expected: dict[str, Any] | None = None) -> None:
    """Add one run to the record file: read it again under the lock, add, write atomically."""
    with locked(path):
        record = read_record(path, expected)
        record["runs"][key] = entry
        text = json.dumps(record, indent=1, sort_keys=True) + "\n"
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def run_one(setting: Setting, seed: int, args) -> dict:
    config, normalize = make_config(setting, seed, args)
    start, cpu = time.perf_counter(), time.process_time()
    result = train_run(config, args.eval_steps, normalize)
    cpu = time.process_time() - cpu
    config_dict = config.to_dict()
    for key in ("out", "progress", "device", "threads"):
        config_dict.pop(key)
    return {
        "setting": setting._asdict(),
        "seed": seed,
        "config": config_dict,
        "normalize": list(normalize) if normalize else None,
        "curve": result["curve"],
        "final_test_accuracy": result["curve"][-1]["test_accuracy"],
        "non_finite": result["non_finite"],  # None, or the error that stopped a diverging run
        "em_kernel": os.environ.get("CAPSNETS_EM_KERNEL"),  # None: the default execution path
        "train_s": result["train_s"],
        "wall_s": time.perf_counter() - start,
        "cpu_s": cpu,  # all threads together
        "environment": environment(resolve_device(args.device), args),
    }


# -- timing and plan ----------------------------------------------------------------------------------------------


def seconds_per_run(args, runs: dict) -> dict[int, float]:
    """Expected seconds of one run per iteration count on cores of its own: the mean CPU time per thread of
    recorded runs at these sizes and this thread count (their wall time if they recorded none), else a short
    timing run of ``--time-steps`` steps scaled to ``--steps``. CPU time, because other processes on a shared
    machine stretch the wall time of a short run far more than its CPU time."""
    threads, estimate = torch.get_num_threads(), {}
    for iterations in ITERATIONS:
        same = [
            r.get("cpu_s", r["wall_s"] * threads) / threads
            for r in runs.values()
            if r["setting"]["iterations"] == iterations and r["environment"]["threads"] == threads
        ]
        if same:
            estimate[iterations] = sum(same) / len(same)
            continue
        timing = argparse.Namespace(
            **{**vars(args), "steps": args.time_steps, "train_size": args.time_steps * args.batch_size}
        )
        config, normalize = make_config(Setting("official", iterations, "authors", "cli"), 0, timing)
        wall, cpu = time.perf_counter(), time.process_time()
        result = train_run(config, [args.time_steps], normalize)
        wall, cpu = time.perf_counter() - wall, (time.process_time() - cpu) / threads
        train = cpu * result["train_s"] / wall  # the training's share of the CPU time
        estimate[iterations] = train * args.steps / args.time_steps + (cpu - train) * len(args.eval_steps)
        print(f"timing: {iterations} iteration(s), {args.time_steps} steps in {train:.1f} s of CPU", flush=True)
    return estimate


def print_plan(args, runs: dict) -> None:
    settings, note = planned(args, runs)
    estimate = seconds_per_run(args, runs)
    n = args.piece[1]
    print(
        f"{len(runs)} runs recorded in {args.out}; expected time per run at {torch.get_num_threads()} "
        f"thread(s), cores to itself: " + ", ".join(f"{i} it. {s / 60:.1f} min" for i, s in estimate.items())
    )
    for k in range(1, n + 1):
        piece = select(settings, argparse.Namespace(**{**vars(args), "piece": (k, n)}))
        left = [(s, seed) for s, seed in piece if run_key(s, seed) not in runs]
        hours = sum(estimate[s.iterations] for s, _ in left) / 3600
        print(f"piece {k}/{n}: {len(left)} of {len(piece)} runs left, about {hours:.2f} h")
    if note:
        print(note)


def table(runs: dict) -> str:
    """A Markdown table of the recorded runs, one row per setting, best first: the number of seeds, the mean test
    accuracy (%) at each evaluation step, the range over the seeds at the last step, and the mean CPU minutes
    per run (all threads)."""
    groups: dict[str, list[dict]] = {}
    for run in runs.values():
        groups.setdefault(Setting(**run["setting"]).key, []).append(run)
    steps = [point["step"] for point in next(iter(runs.values()))["curve"]] if runs else []

    def mean(values):
        return sum(values) / len(values)

    def at(run, step):
        return next((p["test_accuracy"] for p in run["curve"] if p["step"] == step), float("nan"))

    rows = []
    for key, group in groups.items():
        finals = [100 * run["final_test_accuracy"] for run in group]
        means = [mean([100 * at(run, step) for run in group]) for step in steps]
        diverged = sum(run.get("non_finite") is not None for run in group)
        cpu = mean([run.get("cpu_s", run["wall_s"] * run["environment"]["threads"]) for run in group]) / 60
        rows.append((means[-1] if means else 0.0, key, len(group), means, min(finals), max(finals), diverged, cpu))
    rows.sort(key=lambda row: -row[0])
    header = ["setting", "seeds", *(f"step {step}" for step in steps), "last: min-max", "diverged", "CPU min/run"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, key, n, means, low, high, diverged, cpu in rows:
        cells = [f"`{key}`", str(n), *(f"{m:.1f}" for m in means), f"{low:.1f}-{high:.1f}", str(diverged), f"{cpu:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--grid", choices=("pruned", "full"), default="pruned")
    parser.add_argument("--top", type=int, default=2, help="pruned grid: stage A settings that stage B explores")
    parser.add_argument("--piece", default="1/1", help="K/N: run the K-th of N interleaved pieces of the grid")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run keys must contain this text (repeatable), "
        "e.g. official/it2 or recipe names; keys look like official/it2/lambda=1e-3/cli/seed=0",
    )
    parser.add_argument("--table", action="store_true", help="print the recorded runs as a Markdown table and stop")
    parser.add_argument("--plan", action="store_true", help="print what is left per piece and its expected time")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--model", default="matrix_capsnet_small")
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--data-dir", default=None, help="data root (default: $CAPSNETS_DATA)")
    parser.add_argument("--train-size", type=int, default=12800)
    parser.add_argument("--test-size", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=400, help="a whole number of epochs of --train-size images")
    parser.add_argument("--eval-steps", type=int, nargs="+", default=None, help="default: steps/4, steps/2, steps")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--time-steps", type=int, default=20, help="--plan: steps of the timing runs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "em_sweep.json"))
    args = parser.parse_args(argv)
    try:
        k, n = (int(x) for x in args.piece.split("/"))
        assert 1 <= k <= n
    except (ValueError, AssertionError):
        parser.error(f"--piece must be K/N with 1 <= K <= N, got {args.piece!r}")
    args.piece = (k, n)
    for key in ("train_size", "test_size", "steps", "batch_size", "top", "time_steps"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1")
    per_epoch = -(-args.train_size // args.batch_size)
    if args.steps % per_epoch:
        parser.error(
            f"--steps {args.steps} is not a whole number of epochs of {per_epoch} steps (--train-size "
            f"{args.train_size} at --batch-size {args.batch_size}); use a multiple of {per_epoch}"
        )
    if args.eval_steps is None:
        args.eval_steps = sorted({max(1, args.steps // 4), max(1, args.steps // 2), args.steps})
    if not all(1 <= s <= args.steps for s in args.eval_steps):
        parser.error(f"--eval-steps must lie in 1..{args.steps}, got {args.eval_steps}")
    args.eval_steps = sorted(set(args.eval_steps) | {args.steps})
    args.out = Path(args.out)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    retain_freed_memory()  # as `capsnets --retain-freed-memory` does
    if args.threads:
        torch.set_num_threads(args.threads)
    runs = read_record(args.out, protocol(args))["runs"]
    if args.plan:
        print_plan(args, runs)
        return runs
    if args.table:
        print(table(runs))
        return runs
    while True:
        settings, note = planned(args, runs)
        todo = [(s, seed) for s, seed in select(settings, args) if run_key(s, seed) not in runs]
        if not todo:
            break
        print(f"{len(todo)} runs left in this piece", flush=True)
        for setting, seed in todo:
            key = run_key(setting, seed)
            print(f"== {key}", flush=True)
            entry = run_one(setting, seed, args)
            add_run(args.out, key, entry, protocol(args))
            runs = read_record(args.out, protocol(args))["runs"]
            print(f"   {entry['final_test_accuracy']:.4f} in {entry['wall_s']:.0f} s", flush=True)
        # stage B may have become known: go round again
    if note:
        print(note)
    print(f"nothing left in this piece; {len(runs)} runs in {args.out}")
    return runs


if __name__ == "__main__":
    main()
