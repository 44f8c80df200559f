"""``routers``: every head of the router zoo on one backbone, for accuracy, cost and generalisation.

Hahn, Pyeon & Kim (2019), "Self-Routing Capsule Networks", NeurIPS: routings compared on one convolutional
backbone against CNN heads, tested on viewpoints never trained on (smallNORB) and on affine transforms never
trained on (affNIST). Here every head of :func:`~capsnets.models.routing_zoo.routing_zoo` (``heads``: the
routings dynamic, EM, self-attention, inverted attention, self-routing, uniform and Heinsen's; homogeneous
vector capsules, which do not route; the CNN heads average pooling, max pooling, fully connected), each with its default loss, is trained on each task with the same recipe, data
order and backbone initialisation, so that the head is the only difference:

Every head trains through the engine's trainer (:class:`~capsnets.experiments.runs.Runs`):

- ``fashion_mnist``: ``epochs`` of Fashion-MNIST, the best epoch chosen on a tenth of the training images held out;
  test accuracy after every epoch (for the curves; never used to stop or choose), the best epoch's reported.
- ``affnist``: MNIST digits placed at random on a 40x40 canvas, each head trained until its accuracy on held-out
  translated digits reaches ``affnist_target`` (as in the ``affnist`` experiment), then tested on translated MNIST
  test digits and an affNIST-style set (:func:`~capsnets.data.affnist.make_affnist_style`).
- ``azimuth``, ``elevation``: the two splits of smallNORB (when found) or of the rendered viewpoint set, matched
  on familiar-view error as in the ``viewpoints`` experiment (:func:`~capsnets.experiments.views.fit_matched`):
  the average-pooling head (:data:`REFERENCE`) sets the target with its lowest familiar-view error, every other
  head stops at the first epoch at or below it (else is kept nearest to it). The CNN heads' novel-view error
  is scored at every epoch, so each routing head is compared with the best CNN head at its own familiar-view
  error: the first epoch of each CNN head at or below ``max(head's error, target)``.

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

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from capsnets.engine import accuracy as evaluate_accuracy
from capsnets.engine.callbacks import checkpoint_name
from capsnets.experiments.canvas import canvas_training_set
from capsnets.experiments.common import ExperimentSettings, register_experiment
from capsnets.experiments.report import write_report
from capsnets.experiments.report.routers import routers_contrasts, routers_metrics, routers_sections
from capsnets.experiments.report.routers_figures import routers_figures
from capsnets.experiments.router_tasks import (
    CNN_HEADS,
    PROBLEMS,
    REFERENCE,
    SPLITS,
    build_head,
    load_tasks,
    measure_throughput,
)
from capsnets.experiments.runs import check_minutes
from capsnets.experiments.views import fit_matched
from capsnets.models import count_parameters
from capsnets.models.routing_zoo import HEADS

__all__ = ["CNN_HEADS", "PROBLEMS", "REFERENCE", "Settings", "run"]


@dataclass(frozen=True)
class Settings(ExperimentSettings):
    """Heads and tasks; ``model_args``: ``routing_zoo`` arguments shared by every head (width, capsule_types...);
    training (Adam, ``epochs``: every task's epochs, affNIST's at most); data sizes (None: all; ``test_size``:
    each test set, and each of the familiar and novel views); the viewpoint
    data (``viewpoints_dir``, None: the data dir; ``render_*``: a reduced grid); throughput timing; time limits
    (``train_minutes`` each training, ``time_limit_minutes`` the whole run)."""

    heads: list[str] = field(default_factory=lambda: list(HEADS))
    tasks: list[str] = field(default_factory=lambda: list(PROBLEMS))
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
    viewpoints_dir: str | None = None
    render_instances: int | None = None
    render_lightings: list[int] | None = None
    throughput_steps: int = 10
    throughput_repeats: int = 3
    train_minutes: float | None = None
    time_limit_minutes: float | None = None
    SMOKE: ClassVar[dict] = {
        "model_args": {"width": 4, "capsule_types": 4},
        "epochs": 1,
        "batch_size": 32,
        "lr": 3e-3,
        "fashion_train_size": 256,
        "affnist_train_size": 256,
        "affnist_val_size": 64,
        "affnist_target": 0.5,
        "viewpoints_train_size": 128,
        "test_size": 64,
        "render_instances": 1,
        "render_lightings": [0],
        "throughput_steps": 2,
        "throughput_repeats": 2,
    }

    def __post_init__(self) -> None:
        for name, allowed in (("heads", HEADS), ("tasks", PROBLEMS)):
            chosen = list(getattr(self, name))
            if not chosen or len(set(chosen)) != len(chosen) or not set(chosen) <= set(allowed):
                raise ValueError(f"{name} must be distinct names from {list(allowed)}, got {chosen!r}")
        if REFERENCE not in self.heads:
            raise ValueError(
                f"heads must include {REFERENCE!r}, the reference for speed and viewpoints; got {list(self.heads)!r}"
            )
        for name in ("train_minutes", "time_limit_minutes"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be a positive number of minutes (or null for no limit), got {value!r}")


class _Budget:
    """What is left of ``time_limit_minutes`` (counted from the run's start); the time limit of the next training
    (``train_minutes`` too). The first training of a run always starts, so that every run makes progress."""

    def __init__(self, s: Settings) -> None:
        self.began, self.total = time.perf_counter(), _seconds(s.time_limit_minutes)
        self.each, self.started = _seconds(s.train_minutes), False

    def spent(self) -> bool:
        return self.started and self.total is not None and time.perf_counter() - self.began >= self.total

    def limit(self) -> float | None:
        """The next training's time limit in minutes (None: none)."""
        self.started = True
        left = None if self.total is None else max(self.total - (time.perf_counter() - self.began), 1e-3)
        seconds = min((t for t in (self.each, left) if t is not None), default=None)
        return None if seconds is None else seconds / 60.0


def _seconds(minutes: float | None) -> float | None:
    return None if check_minutes(minutes) is None else 60.0 * minutes


def _train_head(name: str, head: str, model, task: dict, s: Settings, seed: int, runs, limit, target) -> dict:
    """Train (or reuse, or continue) ``model`` on task ``name`` through the engine's trainer: a record with
    ``history`` (per epoch, with ``time_s`` and the curve's ``accuracy``), ``accuracy`` (the task's headline),
    ``epochs`` and the task's own numbers."""
    key = checkpoint_name(f"routers_{name}_{head}", s.model_args)
    common = dict(
        epochs=s.epochs, lr=s.lr, lr_decay=s.lr_decay, batch_size=s.batch_size, seed=seed, train_minutes=limit
    )
    if name in SPLITS:
        rec = fit_matched(runs, key, model, task["views"], target=target, novel_each_epoch=head in CNN_HEADS, **common)
        training, rec["accuracy"] = rec["training"], 1.0 - rec["novel_error"]
        curve = [1.0 - r["val_accuracy"] for r in training.history]
        rec["reached"] = target is None or rec["familiar_error"] <= target
    elif name == "fashion_mnist":  # the best epoch chosen on a share of the training images
        training = runs.fit(key, model, task["train"], test=task["test"], max_shift=0, **common)
        rec = {"accuracy": training.summary["best_test_accuracy"]}
        curve = [r.get("test_accuracy") for r in training.history]
    else:
        train = canvas_training_set(task["train"])
        training = runs.fit(key, model, train, task["val"], target=s.affnist_target, **common)
        tests = {test: evaluate_accuracy(model, d.images, d.labels) for test, d in task["tests"].items()}
        rec = {"tests": tests, "accuracy": tests["affNIST-style"], "val_accuracy": training.chosen()}
        rec["reached"], curve = rec["val_accuracy"] >= s.affnist_target, [r["val_accuracy"] for r in training.history]
    records = rec.get("history", training.history)
    rec["history"] = [
        {**r, "accuracy": c, "time_s": t["epoch_time_s"]} for r, c, t in zip(records, curve, training.history)
    ]
    rec["epochs"] = training.epochs + (f", chosen {training.summary['best_epoch']}" if name in SPLITS else "")
    rec["time_limit"] = training.cut_short
    rec["train_time_s"] = sum(r["time_s"] for r in rec["history"])
    return rec


def _matched_cnn(rec: dict, cnn: dict[str, dict], target: float) -> dict | None:
    """The best CNN head's novel-view error at ``rec``'s familiar-view error: for each CNN head, its first
    evaluation at or below ``max(rec's error, target)``; the lowest novel-view error of those."""
    level, found = max(rec["familiar_error"], target), []
    for head, other in cnn.items():
        point = next(
            (h for h in other["history"] if h["familiar_error"] <= level and h.get("novel_error") is not None), None
        )
        if point is not None:
            found.append({"head": head, **{k: point[k] for k in ("epoch", "familiar_error", "novel_error")}})
    return min(found, key=lambda p: p["novel_error"], default=None)


def _run_task(name: str, task: dict, s: Settings, device: str, seed: int, runs, budget: _Budget) -> dict:
    """Train every head on one task (the reference first); ``None`` for a head the time limit left untrained."""
    records: dict[str, dict | None] = {}
    target = None
    for head in [REFERENCE, *(h for h in s.heads if h != REFERENCE)]:
        waits = name in SPLITS and head != REFERENCE and (target is None)
        if budget.spent() or waits:
            records[head] = None
            continue
        model = build_head(head, task, s, device, seed)
        records[head] = rec = _train_head(name, head, model, task, s, seed, runs, budget.limit(), target)
        rec["parameters"] = count_parameters(model)
        if head == REFERENCE and name in SPLITS and not rec.get("time_limit"):
            target = rec["familiar_error"]
    if name in SPLITS and target is not None:
        cnn = {h: r for h, r in records.items() if h in CNN_HEADS and r is not None}
        for head, rec in records.items():
            if rec is not None and head not in CNN_HEADS:
                rec["matched"] = _matched_cnn(rec, cnn, target)
    return {"records": {h: records[h] for h in s.heads}, "target": target}


@register_experiment(
    "routers",
    Settings,
    "every routing and CNN head on one backbone: accuracy, images/s, affine "
    "and novel-viewpoint generalisation (Hahn et al. 2019)",
    contrasts=routers_contrasts,
)
def run(out: Path, s: Settings, *, smoke: bool, device: str, seed: int, data_dir, runs):
    """Train (or load) every head on every task; write ``report.md`` and three or four PNGs into ``out``."""
    budget = _Budget(s)
    tasks = load_tasks(s, device, seed, data_dir)
    results, speeds, speed_by_shape = {}, {}, {}
    for name, task in tasks.items():
        shape = (task["input_size"], task["num_classes"])
        if shape not in speed_by_shape:
            speed_by_shape[shape] = measure_throughput(task, s, device, seed, runs.directory)
        speeds[name] = speed_by_shape[shape]
        results[name] = _run_task(name, task, s, device, seed + 10 * PROBLEMS.index(name), runs, budget)
    sections = routers_sections(results, tasks, speeds, s, device=device, seed=seed, smoke=smoke)
    return write_report(
        out,
        "Routers: every head on one backbone",
        sections,
        figures=routers_figures(results, speeds, out),
        metrics=routers_metrics(results, speeds),
        name="routers",
    )
