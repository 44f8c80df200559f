"""Fine-tuning against training from scratch, measured: a model that starts from an MNIST weight, on Fashion-MNIST.

For each model (``--models``), each size (``--per-class``: training images per class, drawn class by class from the
Fashion-MNIST training split with the run's seed) and each seed, two trainings that differ only in their start:
``scratch`` (the model untrained) and ``pretrained`` (``create_model(model, pretrained=--weight)``, every tensor
loaded, the class layer included: both data sets have 10 classes). Both train the same epochs at the same batch
with the model's recipe, through the one trainer (``Trainer.fit``), with ``--classifier-only-epochs`` for the
``pretrained`` runs if given, and are scored on the first ``--test`` images of the Fashion-MNIST test split. The
epochs grow as the sizes shrink (``--epochs`` per size), so that every run takes a few hundred optimiser steps.
The JSON holds every run and, per model and size, the mean and range over the seeds; it is rewritten after each
run, and a run already in it is not repeated (``--out`` of an interrupted sweep continues it).

    python benchmarks/fine_tuning.py --out benchmarks/results/fine_tuning_cpu.json
    python benchmarks/fine_tuning.py --dry-run        # a few images, one epoch: checks that the script runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capsnets  # noqa: E402
from capsnets.data import load_dataset  # noqa: E402
from capsnets.engine import Trainer  # noqa: E402

from throughput import environment  # noqa: E402

#: Epochs per size (images per class): a few hundred optimiser steps each at the default batch.
EPOCHS = {10: 30, 100: 10, 1000: 5}
BATCH = {10: 16, 100: 32, 1000: 64}
WEIGHTS = {"capsnet_small": "capsnet_small-mnist", "matrix_capsnet_small": "matrix_capsnet_small-mnist"}


def per_class(data, count: int, seed: int):
    """``count`` examples of every class, drawn with ``seed``, in a seeded mixed order."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(data), generator=generator)
    labels = data.labels[order]
    chosen = torch.cat([order[labels == k][:count] for k in range(data.num_classes)])
    return data.select(chosen[torch.randperm(len(chosen), generator=generator)])


def run_one(model_name: str, start: str, count: int, seed: int, train, test, args, out: Path) -> dict:
    torch.manual_seed(seed)
    if start == "pretrained":
        model = capsnets.create_model(model_name, pretrained=WEIGHTS[model_name], input_size=train.image_shape)
    else:
        model = capsnets.create_model(model_name, num_classes=10, input_size=train.image_shape)
    trainer = Trainer(
        out=str(out),
        epochs=args.epochs or EPOCHS.get(count, 5),
        batch_size=args.batch_size or BATCH.get(count, 16),
        seed=seed,
        val_fraction=0,
        test_each_epoch=False,
        classifier_only_epochs=args.classifier_only_epochs if start == "pretrained" else 0,
        threads=args.threads,
        device="cpu",
        progress=False,
        figures=False,
    )
    started = time.perf_counter()
    summary = trainer.fit(model, train, test_data=test)
    return {
        "model": model_name,
        "start": start,
        "per_class": count,
        "seed": seed,
        "epochs": summary["epochs"],
        "batch_size": summary["batch_size"],
        "classifier_only_epochs": trainer.config.classifier_only_epochs,
        "test_accuracy": summary["test_accuracy"],
        "seconds": round(time.perf_counter() - started, 1),
    }


def start_label(run: dict) -> str:
    """``scratch``, ``pretrained``, or ``pretrained_classifier_first_N`` for a run with ``--classifier-only-epochs N``."""
    frozen = run["classifier_only_epochs"]
    return run["start"] if not frozen else f"{run['start']}_classifier_first_{frozen}"


def summarise(runs: list[dict]) -> list[dict]:
    """Per model and size, each start's mean and range over the seeds, and each start's gain over ``scratch``
    (``gain_points``: the plain ``pretrained`` start's; ``gains``: every start's), in points."""
    rows = []
    for key in sorted({(r["model"], r["per_class"]) for r in runs}):
        row = {"model": key[0], "per_class": key[1]}
        for start in sorted({start_label(r) for r in runs if (r["model"], r["per_class"]) == key}, key=len):
            values = [r["test_accuracy"] for r in runs if (r["model"], r["per_class"], start_label(r)) == (*key, start)]
            row[start] = {"mean": statistics.mean(values), "min": min(values), "max": max(values), "n": len(values)}
        if "scratch" in row:
            gains = {
                s: 100 * (v["mean"] - row["scratch"]["mean"]) for s, v in row.items() if s.startswith("pretrained")
            }
            row["gains"] = gains
            if "pretrained" in gains:
                row["gain_points"] = gains["pretrained"]
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--models", nargs="+", default=["capsnet_small"], choices=sorted(WEIGHTS))
    parser.add_argument("--per-class", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, help="every size's epochs (default: by size, see EPOCHS)")
    parser.add_argument("--batch-size", type=int, help="every size's batch (default: by size, see BATCH)")
    parser.add_argument("--classifier-only-epochs", type=int, default=0)
    parser.add_argument("--test", type=int, default=10000, help="test images scored (default: all 10,000)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fine_tuning_cpu.json"))
    parser.add_argument("--dry-run", action="store_true", help="2 images per class, 1 epoch, 100 test images")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.per_class, args.seeds, args.epochs, args.test = [2], args.seeds[:1], 1, 100
    torch.set_num_threads(args.threads)
    full = load_dataset("fashion_mnist", root=args.data_dir, train=True)
    test = load_dataset("fashion_mnist", root=args.data_dir, train=False).subset(args.test)
    record = json.loads(args.out.read_text()) if args.out.is_file() else {}
    runs = record.get("runs", [])
    done = {(r["model"], r["start"], r["per_class"], r["seed"], r["classifier_only_epochs"]) for r in runs}
    with tempfile.TemporaryDirectory() as scratch:
        for model in args.models:
            for count in args.per_class:
                for seed in args.seeds:
                    train = per_class(full, count, seed)
                    for start in ("scratch", "pretrained"):
                        frozen = args.classifier_only_epochs if start == "pretrained" else 0
                        if (model, start, count, seed, frozen) in done:
                            continue
                        out = Path(scratch) / f"{model}-{start}-{count}-{seed}"
                        runs.append(run_one(model, start, count, seed, train, test, args, out))
                        print(json.dumps(runs[-1]), flush=True)
                        record = {
                            **environment(torch.device("cpu"), args),
                            "data": "fashion_mnist",
                            "test_images": len(test),
                            "weights": {m: WEIGHTS[m] for m in args.models},
                            "runs": runs,
                            "summary": summarise(runs),
                        }
                        args.out.parent.mkdir(parents=True, exist_ok=True)
                        args.out.write_text(json.dumps(record, indent=1) + "\n")
    for row in summarise(runs):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
