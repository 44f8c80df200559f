"""The tasks and heads of the ``routers`` experiment (Hahn, Pyeon & Kim 2019): the data of each task, every head
built on the same backbone, and the training images/s of every head, measured in one run.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import torch

from capsnets.data import DeviceLoader, TensorData, load_dataset
from capsnets.data.affnist import make_affnist_style, translated_test_set
from capsnets.engine.fit import fit, training_step
from capsnets.engine.runtime import resolve_amp, seed_everything
from capsnets.experiments.views import load_norb_like, viewpoint_split
from capsnets.files import atomic_write
from capsnets.losses import create_loss
from capsnets.models import create_model
from capsnets.outputs import json_header

__all__ = ["CNN_HEADS", "REFERENCE", "PROBLEMS", "SPLITS", "build_head", "load_tasks", "measure_throughput"]

#: The benchmark problems of the experiment (its ``tasks`` setting names some of them): a data set each, or a
#: viewpoint split of smallNORB (:data:`SPLITS`).
PROBLEMS = ("fashion_mnist", "affnist", "azimuth", "elevation")
SPLITS = ("azimuth", "elevation")
CNN_HEADS = ("avg_pool", "max_pool", "fully_connected")
#: The head that sets the viewpoint target and against whose training speed every head is measured.
REFERENCE = "avg_pool"


def _size(data: TensorData, n: int | None) -> TensorData:
    return data if n is None or n >= len(data) else data.subset(n)


def load_tasks(s: Any, device: str, seed: int, data_dir) -> dict[str, dict]:
    """The tasks ``s.tasks`` names (``s``: the experiment's settings). Per task: ``input_size``, ``num_classes``,
    ``bench`` (input-sized images and labels for the speed), its data and a sentence saying what it is."""
    tasks = {}
    if "fashion_mnist" in s.tasks:
        train = _size(load_dataset("fashion_mnist", root=data_dir, train=True, device=device), s.fashion_train_size)
        test = _size(load_dataset("fashion_mnist", root=data_dir, train=False, device=device), s.test_size)
        tasks["fashion_mnist"] = {
            "input_size": (1, 28, 28),
            "num_classes": 10,
            "train": train,
            "test": test,
            "bench": train,
            "about": f"Fashion-MNIST, {len(train):,} training and {len(test):,} test images.",
        }
    if "affnist" in s.tasks:
        digits = load_dataset("mnist", root=data_dir, train=True, device=device)
        digits = digits.subset(s.affnist_train_size + s.affnist_val_size)
        val = translated_test_set(digits.select(slice(s.affnist_train_size, None)), seed=seed + 1)
        mnist_test = _size(load_dataset("mnist", root=data_dir, train=False, device=device), s.test_size)
        tests = {
            "translated MNIST": translated_test_set(mnist_test, seed=seed + 2),
            "affNIST-style": make_affnist_style(mnist_test, seed=seed + 3)[0],
        }
        tasks["affnist"] = {
            "input_size": (1, 40, 40),
            "num_classes": 10,
            "train": digits.subset(s.affnist_train_size),
            "val": val,
            "tests": tests,
            "bench": val,
            "about": f"MNIST digits at random positions on a 40x40 canvas ({s.affnist_train_size:,} "
            f"training, {len(val):,} held-out for the target), tested on {len(mnist_test):,} "
            "translated MNIST test digits and the same digits affNIST-style (rotation "
            "+-20 deg, shear +-0.2, scale 0.8-1.2).",
        }
    splits = [split for split in SPLITS if split in s.tasks]
    if splits:
        train, test, source = load_norb_like(
            s.viewpoints_dir or data_dir,
            device,
            render_instances=s.render_instances,
            render_lightings=s.render_lightings,
        )
        for split in splits:
            views = {
                k: _size(v, s.viewpoints_train_size if k == "train" else s.test_size)
                for k, v in viewpoint_split(train, test, split).items()
            }
            tasks[split] = {
                "input_size": (1, 32, 32),
                "num_classes": test.num_classes,
                "views": views,
                "bench": views["familiar"],
                "about": f"{split} split of {source}: {len(views['train']):,} training images at familiar "
                f"views, {len(views['familiar']):,} familiar and {len(views['novel']):,} novel "
                "test images (other toys).",
            }
    return tasks


def build_head(head: str, task: dict, s: Any, device: str, seed: int):
    """The head on the backbone, seeded so that every head of a task starts from the same backbone."""
    seed_everything(seed)
    return create_model(
        "routing_zoo",
        head=head,
        num_classes=task["num_classes"],
        input_size=task["input_size"],
        device=device,
        **s.model_args,
    )


def measure_throughput(task: dict, s: Any, device: str, seed: int, folder: Path | None) -> dict[str, dict]:
    """``{head: {"images_per_s", "ratio"}}`` (see the module docstring); kept in ``folder`` (``--checkpoint-dir``) for
    a rerun with the same settings, so that every head's number comes from one run."""
    recipe = {
        "heads": list(s.heads),
        "model_args": s.model_args,
        "batch_size": s.batch_size,
        "device": device,
        "steps": s.throughput_steps,
        "repeats": s.throughput_repeats,
        "input_size": list(task["input_size"]),
        "num_classes": task["num_classes"],
        "torch": torch.__version__,
    }
    recipe, path = json.loads(json.dumps(recipe)), None  # as it reads back from the file
    if folder is not None:
        shape = "x".join(map(str, task["input_size"]))
        path = folder / f"routers_throughput_{shape}_{task['num_classes']}.json"
        if path.is_file() and json.loads(path.read_text()).get("recipe") == recipe:
            return json.loads(path.read_text())["heads"]
    bench, n = task["bench"], s.throughput_steps * s.batch_size
    index = torch.arange(n, device=bench.device) % len(bench)
    batches = DeviceLoader((bench.images[index], bench.labels[index]), s.batch_size, seed=seed, augment=False)
    steps = {}
    for head in s.heads:
        model = build_head(head, task, s, device, seed)
        loss = create_loss(model.default_loss)
        steps[head] = training_step(
            lambda batch, m=model, f=loss: {"loss": f(m(*batch), *batch)[0]},
            torch.optim.Adam(model.parameters(), lr=s.lr),
            device=torch.device(device),
            amp_dtype=resolve_amp("auto", torch.device(device)),
            model=model,
        )
    rates: dict[str, list[float]] = {head: [] for head in s.heads}
    for repeat in range(s.throughput_repeats + 1):  # the first round warms up
        for head in s.heads if repeat % 2 else s.heads[::-1]:
            state = fit(steps[head], batches, epochs=1, progress=False, desc=f"images/s {head}")
            if repeat:
                rates[head].append(n / state.train_time_s)
    reference = rates[REFERENCE]
    result = {
        head: {"images_per_s": statistics.median(r), "ratio": statistics.median(a / b for a, b in zip(r, reference))}
        for head, r in rates.items()
    }
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(
            path,
            lambda tmp: Path(tmp).write_text(
                json.dumps({**json_header("throughput"), "recipe": recipe, "heads": result})
            ),
        )
    return result
