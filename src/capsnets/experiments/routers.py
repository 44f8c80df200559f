"""``routers``: every head of the router zoo on one backbone, for accuracy, cost and generalisation.

Hahn, Pyeon & Kim (2019), "Self-Routing Capsule Networks", NeurIPS: routings compared on one convolutional
backbone against CNN heads, tested on viewpoints never trained on (smallNORB) and on affine transforms never
trained on (affNIST). Here every head of :func:`~capsnets.models.routing_zoo.routing_zoo` (``heads``: the
routings dynamic, EM, self-attention, inverted attention, self-routing, uniform and Heinsen's; homogeneous
vector capsules, which do not route; the CNN heads average pooling, max pooling, fully connected), each with its default loss, is trained on each task with the same recipe, data
order and backbone initialisation, so that the head is the only difference:

- ``fashion_mnist``: ``epochs`` of Fashion-MNIST; test accuracy after every epoch (for the curves; never used to
  stop or choose).
- ``affnist``: MNIST digits placed at random on a 40x40 canvas, each head trained until its accuracy on held-out
  translated digits reaches ``affnist_target``
  (:meth:`~capsnets.experiments.checkpoints.Checkpoints.fit_or_load`, as in the ``affnist`` experiment), then
  tested on translated MNIST test digits and an affNIST-style set (:func:`~capsnets.data.affnist.make_affnist_style`).
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

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from capsnets.data.affnist import RandomPlacement
from capsnets.engine import TrainState
from capsnets.engine.callbacks import checkpoint_name
from capsnets.experiments.common import ExperimentSettings, register_experiment
from capsnets.experiments.matching import error_rate, train_matched
from capsnets.experiments.report import write_report
from capsnets.experiments.report.routers import routers_contrasts, routers_figures, routers_metrics, routers_sections
from capsnets.experiments.router_tasks import (
    CNN_HEADS,
    PROBLEMS,
    REFERENCE,
    SPLITS,
    build_head,
    load_tasks,
    measure_throughput,
)
from capsnets.experiments.training import evaluate_accuracy, minutes_to_seconds
from capsnets.models import count_parameters
from capsnets.models.routing_zoo import HEADS

__all__ = ["CNN_HEADS", "PROBLEMS", "REFERENCE", "Settings", "run"]


@dataclass(frozen=True)
class Settings(ExperimentSettings):
    """Heads and tasks; ``model_args``: ``routing_zoo`` arguments shared by every head (width, capsule_types...);
    training (Adam, ``epochs``: every task's epochs, affNIST's at most); data sizes (None: all; ``test_size``:
    each test set, and each of the familiar and novel views); ``evals_per_epoch`` (viewpoints); the viewpoint
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
    evals_per_epoch: int = 2
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
        self.began, self.total = time.perf_counter(), minutes_to_seconds(s.time_limit_minutes)
        self.each, self.started = minutes_to_seconds(s.train_minutes), False

    def spent(self) -> bool:
        return self.started and self.total is not None and time.perf_counter() - self.began >= self.total

    def limit(self) -> float | None:
        self.started = True
        left = None if self.total is None else max(self.total - (time.perf_counter() - self.began), 1e-3)
        return min((t for t in (self.each, left) if t is not None), default=None)


def _train_head(
    name: str, head: str, model, task: dict, s: Settings, seed: int, checkpoints, limit, target: float | None
) -> dict:
    """Train (or load, or continue) ``model`` on task ``name``: a record with ``history`` (per evaluation, with
    ``time_s`` and the curve's ``accuracy``), ``accuracy`` (the task's headline), ``epochs`` and the task's own
    numbers."""
    key = checkpoint_name(f"routers_{name}_{head}", s.model_args)
    common = dict(lr=s.lr, lr_decay=s.lr_decay, batch_size=s.batch_size, seed=seed, desc=head, time_limit_s=limit)
    if name == "fashion_mnist":  # the target 1.0 stops only a perfect head
        rec = checkpoints.fit_or_load(
            model,
            key,
            task["train"].images,
            task["train"].labels,
            task["test"].images,
            task["test"].labels,
            target=1.0,
            max_epochs=s.epochs,
            **common,
        )
        rec["accuracy"] = rec["val_accuracy"]
    elif name == "affnist":
        rec = checkpoints.fit_or_load(
            model,
            key,
            task["train"].images,
            task["train"].labels,
            task["val"].images,
            task["val"].labels,
            target=s.affnist_target,
            max_epochs=s.epochs,
            augment=RandomPlacement(),
            **common,
        )
        rec["tests"] = {test: evaluate_accuracy(model, d.images, d.labels) for test, d in task["tests"].items()}
        rec["accuracy"], rec["reached"] = rec["tests"]["affNIST-style"], rec["val_accuracy"] >= s.affnist_target
    else:
        rec = _fit_matched(
            model, key, task["views"], target, s, seed, checkpoints, limit, novel_every=1 if head in CNN_HEADS else 0
        )
        rec["accuracy"] = 1.0 - rec["novel_error"]
    for record in rec["history"]:
        record.setdefault("accuracy", record.get("val_accuracy", 1.0 - record.get("familiar_error", 1.0)))
    rec["train_time_s"] = sum(record.get("time_s", 0.0) for record in rec["history"])
    return rec


def _fit_matched(
    model, key: str, views: dict, target: float | None, s: Settings, seed: int, checkpoints, limit, novel_every: int
) -> dict:
    """:func:`train_matched` (or a checkpoint from an earlier run, its record read from the sidecar), as the
    ``viewpoints`` experiment trains its models."""
    record: dict = {}
    state = TrainState()

    def train():
        record.update(
            train_matched(
                model,
                views,
                epochs=s.epochs,
                target=target,
                batch_size=s.batch_size,
                lr=s.lr,
                lr_decay=s.lr_decay,
                seed=seed,
                evals_per_epoch=s.evals_per_epoch,
                time_limit_s=limit,
                novel_every=novel_every,
                state=state,
            )
        )

    recipe = {
        **s.subset(
            "epochs",
            "lr",
            "lr_decay",
            "batch_size",
            "evals_per_epoch",
            "viewpoints_train_size",
            "render_instances",
            "render_lightings",
        ),
        "seed": seed,
        "novel_every": novel_every,
    }
    loaded = checkpoints.load_or_train(model, key, train, meta=record, state=state, recipe=recipe)
    if loaded:
        record = {k: record.get(k) for k in ("history", "epoch", "time_limit")}
        record.update({f"{view}_error": error_rate(model, views[view]) for view in ("familiar", "novel")})
    history = record["history"] or []
    last = history[-1]["epoch"] if history else 0
    record["reached"] = target is None or record["familiar_error"] <= target
    record["epochs"] = (
        f"{last:g} of {s.epochs}, chosen {record['epoch']:g}"
        + (" (time limit)" if record.get("time_limit") else "")
        + (" (loaded)" if loaded else "")
    )
    record["history"] = history
    return record


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


def _run_task(name: str, task: dict, s: Settings, device: str, seed: int, checkpoints, budget: _Budget) -> dict:
    """Train every head on one task (the reference first); ``None`` for a head the time limit left untrained."""
    records: dict[str, dict | None] = {}
    target = None
    for head in [REFERENCE, *(h for h in s.heads if h != REFERENCE)]:
        waits = name in SPLITS and head != REFERENCE and (target is None)
        if budget.spent() or waits:
            records[head] = None
            continue
        model = build_head(head, task, s, device, seed)
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


@register_experiment(
    "routers",
    Settings,
    "every routing and CNN head on one backbone: accuracy, images/s, affine "
    "and novel-viewpoint generalisation (Hahn et al. 2019)",
    contrasts=routers_contrasts,
)
def run(out: Path, s: Settings, *, smoke: bool, device: str, seed: int, data_dir, checkpoints):
    """Train (or load) every head on every task; write ``report.md`` and three or four PNGs into ``out``."""
    budget = _Budget(s)
    tasks = load_tasks(s, device, seed, data_dir)
    results, speeds, speed_by_shape = {}, {}, {}
    for name, task in tasks.items():
        shape = (task["input_size"], task["num_classes"])
        if shape not in speed_by_shape:
            speed_by_shape[shape] = measure_throughput(task, s, device, seed, checkpoints)
        speeds[name] = speed_by_shape[shape]
        results[name] = _run_task(name, task, s, device, seed + 10 * PROBLEMS.index(name), checkpoints, budget)
    sections = routers_sections(results, tasks, speeds, s, device=device, seed=seed, smoke=smoke)
    return write_report(
        out,
        "Routers: every head on one backbone",
        sections,
        figures=routers_figures(results, speeds, out),
        metrics=routers_metrics(results, speeds),
        name="routers",
    )
