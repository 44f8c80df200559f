"""``routers``: every head of the router zoo on one backbone, for accuracy, cost and generalisation.

Hahn, Pyeon & Kim (2019), "Self-Routing Capsule Networks", NeurIPS: routings compared on one convolutional
backbone against CNN heads, tested on viewpoints never trained on (smallNORB) and on affine transforms never
trained on (affNIST). Here every head of :func:`~capsnets.models.routing_zoo.routing_zoo` (``heads``: the
routings dynamic, EM, self-attention, inverted attention, self-routing, uniform; the CNN heads average pooling,
max pooling, fully connected), each with its default loss, is trained on each task with the same recipe, data
order and backbone initialisation, so that the head is the only difference:

- ``fashion_mnist``: ``epochs`` of Fashion-MNIST; test accuracy after every epoch (for the curves; never used to
  stop or choose).
- ``affnist``: MNIST digits placed at random on a 40x40 canvas, each head trained until its accuracy on held-out
  translated digits reaches ``affnist_target`` (:meth:`~capsnets.experiments.training.Checkpoints.fit_or_load`, as in the
  ``affnist`` experiment), then tested on translated MNIST test digits and an affNIST-style set
  (:func:`~capsnets.data.affnist.make_affnist_style`).
- ``azimuth``, ``elevation``: the two splits of smallNORB (when found) or of the rendered viewpoint set, matched
  on familiar-view error as in the ``viewpoints`` experiment (:func:`~capsnets.experiments.matching.train_matched`):
  the average-pooling head (:data:`REFERENCE`) sets the target with its lowest familiar-view error, every other
  head stops at the first evaluation at or below it (else is kept nearest to it). The CNN heads' novel-view error
  is scored at every evaluation, so each routing head is compared with the best CNN head at its own familiar-view
  error: the first evaluation of each CNN head at or below ``max(head's error, target)``.

Training images/s: every head's training step (:func:`~capsnets.engine.fit`: forward pass, loss, backward pass,
Adam; no augmentation) timed in the same run on the same batches, heads alternated, the median of
``throughput_repeats`` after a warm-up; the ratio to :data:`REFERENCE` is the median of the per-repeat ratios.
Deviations from Hahn et al.: the library's experiment recipe (Adam, per-epoch exponential decay) rather than the
authors' optimiser and schedule, far shorter trainings (the full version fits a 2-core CPU in hours), an
affNIST-style test set drawn from MNIST (the real affNIST is not read), and Fashion-MNIST added.

``time_limit_minutes`` bounds a run's wall-clock time: trainings start only while it lasts, each gets what is
left, and the run then writes its report; with ``--checkpoint-dir`` the same command continues where it stopped.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from matplotlib.figure import Figure

from capsnets.data import TensorData, load_dataset
from capsnets.data.affnist import RandomPlacement, make_affnist_style, translated_test_set
from capsnets.engine import TrainState
from capsnets.engine.fit import fit, training_step
from capsnets.engine.runtime import resolve_amp, seed_everything
from capsnets.experiments.common import ExperimentSettings, register_experiment
from capsnets.experiments.matching import error_rate, load_norb_like, train_matched, viewpoint_split
from capsnets.experiments.report import markdown_table, percent, save_figure, settings_table, write_report
from capsnets.engine.batches import TensorBatches
from capsnets.engine.callbacks import checkpoint_name
from capsnets.experiments.training import default_loss_fn, evaluate_accuracy, minutes_to_seconds
from capsnets.files import atomic_write
from capsnets.models import count_parameters, create_model
from capsnets.models.routing_zoo import HEADS

__all__ = ["CNN_HEADS", "REFERENCE", "TASKS", "Settings", "run"]

TASKS = ("fashion_mnist", "affnist", "azimuth", "elevation")
SPLITS = ("azimuth", "elevation")
CNN_HEADS = ("avg_pool", "max_pool", "fully_connected")
#: The head that sets the viewpoint target and against whose training speed every head is measured.
REFERENCE = "avg_pool"


@dataclass(frozen=True)
class Settings(ExperimentSettings):
    """Heads and tasks; ``model_args``: ``routing_zoo`` arguments shared by every head (width, capsule_types...);
    training (Adam, ``epochs``: every task's epochs, affNIST's at most); data sizes (None: all; ``test_size``:
    each test set, and each of the familiar and novel views); ``evals_per_epoch`` (viewpoints); the viewpoint
    data (``viewpoints_dir``, None: the data dir; ``render_*``: a reduced grid); throughput timing; time limits
    (``train_minutes`` each training, ``time_limit_minutes`` the whole run)."""

    heads: list[str] = field(default_factory=lambda: list(HEADS))
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    model_args: dict = field(default_factory=dict)
    epochs: int = 5
    batch_size: int = 64
    lr: float = 1e-3
    lr_decay: float = 0.96
    fashion_train_size: int | None = 10000
    affnist_train_size: int = 10000
    affnist_val_size: int = 1000
    affnist_target: float = 0.95
    viewpoints_train_size: int | None = None
    test_size: int | None = 2000
    evals_per_epoch: int = 2
    viewpoints_dir: str | None = None
    render_instances: int | None = None
    render_lightings: list[int] | None = None
    throughput_steps: int = 10
    throughput_repeats: int = 3
    train_minutes: float | None = None
    time_limit_minutes: float | None = None
    SMOKE: ClassVar[dict] = {"model_args": {"width": 4, "capsule_types": 4}, "epochs": 1, "batch_size": 32,
                             "lr": 3e-3, "fashion_train_size": 256, "affnist_train_size": 256, "affnist_val_size": 64,
                             "affnist_target": 0.5, "viewpoints_train_size": 128, "test_size": 64,
                             "render_instances": 1, "render_lightings": [0], "throughput_steps": 2,
                             "throughput_repeats": 2}

    def __post_init__(self) -> None:
        for name, allowed in (("heads", HEADS), ("tasks", TASKS)):
            chosen = list(getattr(self, name))
            if not chosen or len(set(chosen)) != len(chosen) or not set(chosen) <= set(allowed):
                raise ValueError(f"{name} must be distinct names from {list(allowed)}, got {chosen!r}")
        if REFERENCE not in self.heads:
            raise ValueError(f"heads must include {REFERENCE!r}, the reference for speed and viewpoints; got "
                             f"{list(self.heads)!r}")
        for name in ("train_minutes", "time_limit_minutes"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be a positive number of minutes (or null for no limit), got {value!r}")


# --------------------------------------------------------------------------------------------------------
# Data and models


def _size(data: TensorData, n: int | None) -> TensorData:
    return data if n is None or n >= len(data) else data.subset(n)


def _tasks(s: Settings, device: str, seed: int, data_dir) -> dict[str, dict]:
    """Per task: ``input_size``, ``num_classes``, ``bench`` (input-sized images and labels for the speed), its
    data and a sentence saying what it is."""
    tasks = {}
    if "fashion_mnist" in s.tasks:
        train = _size(load_dataset("fashion_mnist", root=data_dir, train=True, device=device), s.fashion_train_size)
        test = _size(load_dataset("fashion_mnist", root=data_dir, train=False, device=device), s.test_size)
        tasks["fashion_mnist"] = {"input_size": (1, 28, 28), "num_classes": 10, "train": train, "test": test,
                                  "bench": train, "about": f"Fashion-MNIST, {len(train):,} training and "
                                                           f"{len(test):,} test images."}
    if "affnist" in s.tasks:
        digits = load_dataset("mnist", root=data_dir, train=True, device=device)
        digits = digits.subset(s.affnist_train_size + s.affnist_val_size)
        val = translated_test_set(digits.select(slice(s.affnist_train_size, None)), seed=seed + 1)
        mnist_test = _size(load_dataset("mnist", root=data_dir, train=False, device=device), s.test_size)
        tests = {"translated MNIST": translated_test_set(mnist_test, seed=seed + 2),
                 "affNIST-style": make_affnist_style(mnist_test, seed=seed + 3)[0]}
        tasks["affnist"] = {"input_size": (1, 40, 40), "num_classes": 10, "train": digits.subset(s.affnist_train_size),
                            "val": val, "tests": tests, "bench": val,
                            "about": f"MNIST digits at random positions on a 40x40 canvas ({s.affnist_train_size:,} "
                                     f"training, {len(val):,} held-out for the target), tested on {len(mnist_test):,} "
                                     "translated MNIST test digits and the same digits affNIST-style (rotation "
                                     "+-20 deg, shear +-0.2, scale 0.8-1.2)."}
    splits = [split for split in SPLITS if split in s.tasks]
    if splits:
        train, test, source = load_norb_like(s.viewpoints_dir or data_dir, device, render_instances=s.render_instances,
                                             render_lightings=s.render_lightings)
        for split in splits:
            views = {k: _size(v, s.viewpoints_train_size if k == "train" else s.test_size)
                     for k, v in viewpoint_split(train, test, split).items()}
            tasks[split] = {"input_size": (1, 32, 32), "num_classes": test.num_classes, "views": views,
                            "bench": views["familiar"],
                            "about": f"{split} split of {source}: {len(views['train']):,} training images at familiar "
                                     f"views, {len(views['familiar']):,} familiar and {len(views['novel']):,} novel "
                                     "test images (other toys)."}
    return tasks


def _build(head: str, task: dict, s: Settings, device: str, seed: int):
    """The head on the backbone, seeded so that every head of a task starts from the same backbone."""
    seed_everything(seed)
    return create_model("routing_zoo", head=head, num_classes=task["num_classes"], input_size=task["input_size"],
                        device=device, **s.model_args)


# --------------------------------------------------------------------------------------------------------
# Training images/s, measured in one run


def _throughput(task: dict, s: Settings, device: str, seed: int, checkpoints) -> dict[str, dict]:
    """``{head: {"images_per_s", "ratio"}}`` (see the module docstring); kept in the checkpoint folder for a rerun
    with the same settings, so that every head's number comes from one run."""
    recipe = {"heads": list(s.heads), "model_args": s.model_args, "batch_size": s.batch_size, "device": device,
              "steps": s.throughput_steps, "repeats": s.throughput_repeats, "input_size": list(task["input_size"]),
              "num_classes": task["num_classes"], "torch": torch.__version__}
    recipe, path = json.loads(json.dumps(recipe)), None  # as it reads back from the file
    if checkpoints.directory is not None:
        shape = "x".join(map(str, task["input_size"]))
        path = checkpoints.directory / f"routers_throughput_{shape}_{task['num_classes']}.json"
        if path.is_file() and json.loads(path.read_text()).get("recipe") == recipe:
            return json.loads(path.read_text())["heads"]
    bench, n = task["bench"], s.throughput_steps * s.batch_size
    index = torch.arange(n, device=bench.device) % len(bench)
    batches = TensorBatches(bench.images[index], bench.labels[index], s.batch_size, seed=seed)
    steps = {}
    for head in s.heads:
        model = _build(head, task, s, device, seed)
        loss = default_loss_fn(model)
        steps[head] = training_step(lambda batch, m=model, f=loss: {"loss": f(m, *batch)},
                                    torch.optim.Adam(model.parameters(), lr=s.lr), device=torch.device(device),
                                    amp_dtype=resolve_amp("auto", torch.device(device)), model=model)
    rates: dict[str, list[float]] = {head: [] for head in s.heads}
    for repeat in range(s.throughput_repeats + 1):  # the first round warms up
        for head in (s.heads if repeat % 2 else s.heads[::-1]):
            state = fit(steps[head], batches, epochs=1, progress=False, desc=f"images/s {head}")
            if repeat:
                rates[head].append(n / state.train_time_s)
    reference = rates[REFERENCE]
    result = {head: {"images_per_s": statistics.median(r),
                     "ratio": statistics.median(a / b for a, b in zip(r, reference))} for head, r in rates.items()}
    if path is not None:
        atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps({"recipe": recipe, "heads": result})))
    return result


# --------------------------------------------------------------------------------------------------------
# Training one head on one task


class _Budget:
    """What is left of ``time_limit_minutes`` (counted from the run's start); the time limit of the next training
    (``train_minutes`` too). The first training of a run always starts, so that every run makes progress."""

    def __init__(self, s: Settings) -> None:
        self.began, self.total = time.perf_counter(), minutes_to_seconds(s.time_limit_minutes)
        self.each, self.started = minutes_to_seconds(s.train_minutes), False

    def spent(self) -> bool:
        return self.started and self.total is not None and time.perf_counter() - self.began >= self.total

    def limit(self) -> float | None:
        self.started = True
        left = None if self.total is None else max(self.total - (time.perf_counter() - self.began), 1e-3)
        return min((t for t in (self.each, left) if t is not None), default=None)


def _train_head(name: str, head: str, model, task: dict, s: Settings, seed: int, checkpoints, limit,
                target: float | None) -> dict:
    """Train (or load, or continue) ``model`` on task ``name``: a record with ``history`` (per evaluation, with
    ``time_s`` and the curve's ``accuracy``), ``accuracy`` (the task's headline), ``epochs`` and the task's own
    numbers."""
    key = checkpoint_name(f"routers_{name}_{head}", s.model_args)
    common = dict(lr=s.lr, lr_decay=s.lr_decay, batch_size=s.batch_size, seed=seed, desc=head, time_limit_s=limit)
    if name == "fashion_mnist":  # the target 1.0 stops only a perfect head
        rec = checkpoints.fit_or_load(model, key, task["train"].images, task["train"].labels, task["test"].images,
                          task["test"].labels, target=1.0, max_epochs=s.epochs, **common)
        rec["accuracy"] = rec["val_accuracy"]
    elif name == "affnist":
        rec = checkpoints.fit_or_load(model, key, task["train"].images, task["train"].labels, task["val"].images,
                          task["val"].labels, target=s.affnist_target, max_epochs=s.epochs, augment=RandomPlacement(),
                          **common)
        rec["tests"] = {test: evaluate_accuracy(model, d.images, d.labels) for test, d in task["tests"].items()}
        rec["accuracy"], rec["reached"] = rec["tests"]["affNIST-style"], rec["val_accuracy"] >= s.affnist_target
    else:
        rec = _fit_matched(model, key, task["views"], target, s, seed, checkpoints, limit,
                           novel_every=1 if head in CNN_HEADS else 0)
        rec["accuracy"] = 1.0 - rec["novel_error"]
    for record in rec["history"]:
        record.setdefault("accuracy", record.get("val_accuracy", 1.0 - record.get("familiar_error", 1.0)))
    rec["train_time_s"] = sum(record.get("time_s", 0.0) for record in rec["history"])
    return rec


def _fit_matched(model, key: str, views: dict, target: float | None, s: Settings, seed: int, checkpoints,
                 limit, novel_every: int) -> dict:
    """:func:`train_matched` (or a checkpoint from an earlier run, its record read from the sidecar), as the
    ``viewpoints`` experiment trains its models."""
    record: dict = {}
    state = TrainState()

    def train():
        record.update(train_matched(model, views, epochs=s.epochs, target=target, batch_size=s.batch_size, lr=s.lr,
                                    lr_decay=s.lr_decay, seed=seed, evals_per_epoch=s.evals_per_epoch,
                                    time_limit_s=limit, novel_every=novel_every, state=state))

    recipe = {**s.subset("epochs", "lr", "lr_decay", "batch_size", "evals_per_epoch", "viewpoints_train_size",
                         "render_instances", "render_lightings"), "seed": seed, "novel_every": novel_every}
    loaded = checkpoints.load_or_train(model, key, train, meta=record, state=state, recipe=recipe)
    if loaded:
        record = {k: record.get(k) for k in ("history", "epoch", "time_limit")}
        record.update({f"{view}_error": error_rate(model, views[view]) for view in ("familiar", "novel")})
    history = record["history"] or []
    last = history[-1]["epoch"] if history else 0
    record["reached"] = target is None or record["familiar_error"] <= target
    record["epochs"] = f"{last:g} of {s.epochs}, chosen {record['epoch']:g}" + (
        " (time limit)" if record.get("time_limit") else "") + (" (loaded)" if loaded else "")
    record["history"] = history
    return record


def _matched_cnn(rec: dict, cnn: dict[str, dict], target: float) -> dict | None:
    """The best CNN head's novel-view error at ``rec``'s familiar-view error: for each CNN head, its first
    evaluation at or below ``max(rec's error, target)``; the lowest novel-view error of those."""
    level, found = max(rec["familiar_error"], target), []
    for head, other in cnn.items():
        point = next((h for h in other["history"] if h["familiar_error"] <= level and h.get("novel_error") is not None),
                     None)
        if point is not None:
            found.append({"head": head, **{k: point[k] for k in ("epoch", "familiar_error", "novel_error")}})
    return min(found, key=lambda p: p["novel_error"], default=None)


def _run_task(name: str, task: dict, s: Settings, device: str, seed: int, checkpoints, budget: _Budget) -> dict:
    """Train every head on one task (the reference first); ``None`` for a head the time limit left untrained."""
    records: dict[str, dict | None] = {}
    target = None
    for head in [REFERENCE, *(h for h in s.heads if h != REFERENCE)]:
        waits = name in SPLITS and head != REFERENCE and (target is None)
        if budget.spent() or waits:
            records[head] = None
            continue
        model = _build(head, task, s, device, seed)
        records[head] = rec = _train_head(name, head, model, task, s, seed, checkpoints, budget.limit(), target)
        rec["parameters"] = count_parameters(model)
        if head == REFERENCE and name in SPLITS and not rec.get("time_limit"):
            target = rec["familiar_error"]
    if name in SPLITS and target is not None:
        cnn = {h: r for h, r in records.items() if h in CNN_HEADS and r is not None}
        for head, rec in records.items():
            if rec is not None and head not in CNN_HEADS:
                rec["matched"] = _matched_cnn(rec, cnn, target)
    return {"records": {h: records[h] for h in s.heads}, "target": target}


# --------------------------------------------------------------------------------------------------------
# Report


def _points(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.2f}"


def _task_table(name: str, result: dict, speed: dict) -> str:
    records = result["records"]
    headers = ["head", "kind", "parameters", "train images/s", f"ratio to {REFERENCE}"]
    if name == "fashion_mnist":
        headers += ["test accuracy"]
    elif name == "affnist":
        headers += ["held-out translated (target)", "translated MNIST test", "affNIST-style"]
    else:
        headers += ["familiar error", "novel error", "best CNN head at matched familiar error", "novel difference"]
    headers += ["training time (s)", "epochs"]
    rows = []
    for head, rec in records.items():
        row = [head, "CNN" if head in CNN_HEADS else "routing"]
        row += [None if rec is None else f"{rec['parameters']:,}", f"{speed[head]['images_per_s']:.1f}",
                f"{speed[head]['ratio']:.2f}"]
        if rec is None:
            rows.append(row + ["not trained yet (time limit)"] + ["-"] * (len(headers) - len(row) - 1))
            continue
        if name == "fashion_mnist":
            row += [percent(rec["accuracy"])]
        elif name == "affnist":
            reached = "" if rec["reached"] else " (missed)"
            row += [percent(rec["val_accuracy"]) + reached, *(percent(v) for v in rec["tests"].values())]
        else:
            matched = rec.get("matched")
            row += [percent(rec["familiar_error"]), percent(rec["novel_error"])]
            row += ["-", "-"] if matched is None else [
                f"{matched['head']} at epoch {matched['epoch']:g}: {percent(matched['novel_error'])} novel, "
                f"{percent(matched['familiar_error'])} familiar", _points(rec["novel_error"] - matched["novel_error"])]
        rows.append(row + [f"{rec['train_time_s']:.1f}", rec["epochs"]])
    return markdown_table(headers, rows)


def _answer(results: dict) -> str:
    """Which routing heads beat the best CNN head, per task (this seed)."""
    lines = []
    for name in ("affnist", *SPLITS):
        if name not in results:
            continue
        records = {h: r for h, r in results[name]["records"].items() if r is not None}
        routing = {h: r for h, r in records.items() if h not in CNN_HEADS}
        if name == "affnist":
            cnn = {h: r["accuracy"] for h, r in records.items() if h in CNN_HEADS}
            if not cnn or not routing:
                continue
            best = max(cnn, key=cnn.get)
            wins = [f"{h} {percent(r['accuracy'])}" for h, r in routing.items() if r["accuracy"] > cnn[best]]
            missed = [h for h, r in records.items() if not r["reached"]]
            lines.append(f"- affNIST-style accuracy: best CNN head {best} {percent(cnn[best])}; routing heads above "
                         f"it: {', '.join(wins) or 'none'}."
                         + (f" Not at matched accuracy: {', '.join(missed)} missed the target." if missed else ""))
        else:
            pairs = {h: r for h, r in routing.items() if r.get("matched")}
            wins = [f"{h} {percent(r['novel_error'])} vs {percent(r['matched']['novel_error'])}"
                    for h, r in pairs.items() if r["novel_error"] < r["matched"]["novel_error"]]
            if pairs:
                lines.append(f"- {name} novel-view error, against the best CNN head at matched familiar-view error: "
                             f"routing heads below it: {', '.join(wins) or 'none'} (of {len(pairs)} compared).")
    left = sum(rec is None for r in results.values() for rec in r["records"].values())
    unfinished = (f"**Unfinished**: {left} training(s) not started yet (`time_limit_minutes`; the viewpoint heads wait "
                  f"for a finished {REFERENCE} head). With `--checkpoint-dir`, run the same command again to continue."
                  "\n\n") if left else ""
    if not lines:
        return unfinished + "No routing head was compared with the CNN heads in this run."
    return (unfinished + "\n".join(lines) + "\n\nOne seed cannot separate these differences from run-to-run noise: "
            "`--seeds 0 1 2` gives each difference per seed, with its spread and sign count, in the summary report.")


def _plot_curves(results: dict, out_png: Path) -> Path:
    """Accuracy at each evaluation against training time (evaluation excluded), one panel per task."""
    labels = {"fashion_mnist": "test accuracy", "affnist": "held-out translated accuracy"}
    fig = Figure(figsize=(5 * len(results), 4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(results), squeeze=False)[0])
    for ax, (name, result) in zip(axes, results.items()):
        for k, (head, rec) in enumerate(result["records"].items()):
            if rec is None or not rec["history"]:
                continue
            time_s = np.cumsum([h.get("time_s", 0.0) for h in rec["history"]])
            ax.plot(time_s, [100 * h["accuracy"] for h in rec["history"]], "--" if head in CNN_HEADS else "-",
                    marker="o", ms=3, color=f"C{k}", label=head)
        ax.set_title(name)
        ax.set_xlabel("training time (s)")
        ax.set_ylabel(f"{labels.get(name, 'familiar-view accuracy')} (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return save_figure(fig, out_png)


def _plot_costs(results: dict, speeds: dict, out_png: Path) -> Path:
    """Each task's headline accuracy against parameters and against training images/s, and the ratio to the
    reference's images/s."""
    labels = {"fashion_mnist": "test", "affnist": "affNIST-style"}
    fig = Figure(figsize=(15, 3.6 * len(results)), layout="constrained")
    axes = np.asarray(fig.subplots(len(results), 3, squeeze=False))
    for row, (name, result) in zip(axes, results.items()):
        heads = list(result["records"])
        ratios = [speeds[name][h]["ratio"] for h in heads]
        row[2].bar(range(len(heads)), ratios, color=["tab:grey" if h in CNN_HEADS else "tab:blue" for h in heads])
        row[2].set_xticks(range(len(heads)), heads, rotation=40, ha="right", fontsize=7)
        row[2].axhline(1.0, color="black", lw=0.8)
        row[2].set_ylabel(f"training images/s / {REFERENCE}")
        for ax, key, xlabel in ((row[0], "parameters", "parameters"), (row[1], "images_per_s", "training images/s")):
            for head, rec in result["records"].items():
                if rec is None:
                    continue
                x = rec["parameters"] if key == "parameters" else speeds[name][head]["images_per_s"]
                ax.plot([x], [100 * rec["accuracy"]], "s" if head in CNN_HEADS else "o", color="tab:grey"
                        if head in CNN_HEADS else "tab:blue")
                ax.annotate(head, (x, 100 * rec["accuracy"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
            ax.set_xscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{name}: {labels.get(name, 'novel-view')} accuracy (%)")
            ax.grid(alpha=0.3)
    return save_figure(fig, out_png)


def _plot_novel(results: dict, out_png: Path) -> Path:
    """Per split: each head's novel-view error, and for the routing heads the best CNN head's at their
    familiar-view error."""
    fig = Figure(figsize=(6 * len(results), 4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(results), squeeze=False)[0])
    for ax, (split, result) in zip(axes, results.items()):
        heads = [h for h, r in result["records"].items() if r is not None]
        x = np.arange(len(heads))
        own = [100 * result["records"][h]["novel_error"] for h in heads]
        matched = [100 * (result["records"][h].get("matched") or {}).get("novel_error", np.nan) for h in heads]
        ax.bar(x - 0.2, own, 0.4, label="head", color=["tab:grey" if h in CNN_HEADS else "tab:blue" for h in heads])
        ax.bar(x + 0.2, matched, 0.4, label="best CNN head at its familiar-view error", color="tab:orange")
        ax.set_xticks(x, heads, rotation=40, ha="right", fontsize=7)
        ax.set_ylabel("novel-view test error (%)")
        ax.set_title(f"{split} split")
        ax.legend(fontsize=7)
    return save_figure(fig, out_png)


def _metrics(results: dict, speeds: dict) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    for name, result in results.items():
        for head, rec in result["records"].items():
            prefix = f"{name}_{head}"
            metrics[f"{prefix}_speed_ratio"] = speeds[name][head]["ratio"]
            if rec is None:
                continue
            metrics[f"{prefix}_accuracy"] = rec["accuracy"]
            metrics[f"{prefix}_train_time_s"] = rec["train_time_s"]
            if name in SPLITS:
                metrics[f"{prefix}_familiar_error"] = rec["familiar_error"]
                metrics[f"{prefix}_novel_error"] = rec["novel_error"]
                if rec.get("matched"):
                    metrics[f"{prefix}_matched_cnn_novel_error"] = rec["matched"]["novel_error"]
        if name == "affnist":
            cnn = [r["accuracy"] for h, r in result["records"].items() if h in CNN_HEADS and r is not None]
            if cnn:
                metrics["affnist_best_cnn_accuracy"] = max(cnn)
    metrics["trainings_left"] = sum(rec is None for r in results.values() for rec in r["records"].values())
    return metrics


def _contrasts(metrics: dict) -> list[tuple[str, str, str]]:
    """Each routing head against the best CNN head: affNIST-style accuracy; novel-view error at matched
    familiar-view error (for multi-seed summaries)."""
    found = []
    for head in (h for h in HEADS if h not in CNN_HEADS):
        if f"affnist_{head}_accuracy" in metrics and "affnist_best_cnn_accuracy" in metrics:
            found.append((f"{head} - best CNN head, affNIST-style accuracy", f"affnist_{head}_accuracy",
                          "affnist_best_cnn_accuracy"))
        for split in SPLITS:
            if f"{split}_{head}_matched_cnn_novel_error" in metrics:
                found.append((f"{head} - best CNN head, {split} novel-view error at matched familiar-view error",
                              f"{split}_{head}_novel_error", f"{split}_{head}_matched_cnn_novel_error"))
    return found


@register_experiment("routers", Settings, "every routing and CNN head on one backbone: accuracy, images/s, affine "
                     "and novel-viewpoint generalisation (Hahn et al. 2019)", contrasts=_contrasts)
def run(out: Path, s: Settings, *, smoke: bool, device: str, seed: int, data_dir, checkpoints):
    """Train (or load) every head on every task; write ``report.md`` and three or four PNGs into ``out``."""
    budget = _Budget(s)
    tasks = _tasks(s, device, seed, data_dir)
    results, speeds, speed_by_shape = {}, {}, {}
    for name, task in tasks.items():
        shape = (task["input_size"], task["num_classes"])
        if shape not in speed_by_shape:
            speed_by_shape[shape] = _throughput(task, s, device, seed, checkpoints)
        speeds[name] = speed_by_shape[shape]
        results[name] = _run_task(name, task, s, device, seed + 10 * TASKS.index(name), checkpoints, budget)
    sections = [("Answer: does a routing beat the CNN heads?", _answer(results))]
    for name, task in tasks.items():
        target = results[name]["target"]
        note = {"fashion_mnist": "Test accuracy after the last epoch.",
                "affnist": f"Each head trained until its held-out translated accuracy reached "
                           f"{percent(s.affnist_target)} (or {s.epochs} epochs); \"missed\": it did not, so it is not "
                           "at matched accuracy."}.get(
            name, f"Familiar-view target (the {REFERENCE} head's lowest error): {percent(target)}. Each routing head's "
                  "novel-view error beside the best CNN head's at its familiar-view error; difference in points "
                  "(negative: the routing head generalises better).")
        sections.append((name, f"{task['about']}\n\n{_task_table(name, results[name], speeds[name])}\n\n{note}"))
    sections.append(("Training images/s", f"Measured in one run ({device}; with `--checkpoint-dir`, kept there and "
                     f"reused by later runs with the same settings), batch {s.batch_size}: "
                     f"{s.throughput_steps} training steps per head (forward, loss, backward, Adam; no augmentation), "
                     f"heads alternated, median of {s.throughput_repeats} repeats after a warm-up; the ratio to "
                     f"{REFERENCE} is the median of the per-repeat ratios. Training time excludes evaluation."))
    sections.append(("Settings", settings_table({**s.to_dict(), "seed": seed, "device": device, "smoke": smoke})))
    figures = [_plot_curves(results, out / "accuracy_vs_time.png"),
               _plot_costs(results, speeds, out / "accuracy_vs_cost.png")]
    splits = {name: r for name, r in results.items() if name in SPLITS and r["target"] is not None}
    if splits:
        figures.append(_plot_novel(splits, out / "novel_view_error.png"))
    return write_report(out, "Routers: every head on one backbone", sections, figures=figures,
                        metrics=_metrics(results, speeds), name="routers")
