"""Segmentation on your own images, measured: capsule models and U-Net on a folder of real digits, per-class Dice.

The folder is :func:`capsnets.data.seg_folder.write_digit_segfolder`'s: ``--count`` images of MNIST training
digits 0, 1 and 2, ``--per-image`` on each (default 1), shrunk to ``--digit-size`` pixels (default ``--size - 4``)
at random places on a ``--size`` canvas, with masks of 4 classes (the background and each digit).
``segfolder:PATH`` splits it 80/20. Each run is ``capsnets train`` on it (the one
trainer, in this process): a model, a seed, and optionally SegCaps' ``pos_weight`` (the weight of the object
classes' pixels in its cross-entropy; by default ``"balanced"``, each batch's ratio of background to object pixels,
as LaLonde & Bagci's code weighs them by that ratio over the training masks). Each model trains at ``--lr``, by
default its training recipe's (``segcaps_small``: 6e-3), else 3e-3 (U-Net). The JSON gets, per run, the last and
the best evaluation's per-class Dice and their mean over the digits, the mean after each epoch, the learning rate
and the run's time; it is rewritten after every run.

    python benchmarks/segfolder_digits.py --out benchmarks/results/segfolder_digits_after_cpu.json
    python benchmarks/segfolder_digits.py --dry-run       # a few images, one epoch: checks that the script runs
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capsnets.data import load_dataset  # noqa: E402
from capsnets.data.seg_folder import write_digit_segfolder  # noqa: E402
from capsnets.engine import TrainConfig, train  # noqa: E402
from capsnets.models import training_recipe  # noqa: E402

from throughput import environment  # noqa: E402

#: The learning rate of a model whose training recipe gives none (U-Net's here).
DEFAULT_LR = 3e-3


def run_one(folder: Path, out: Path, model: str, seed: int, pos_weight: float | None, args) -> dict:
    """One training; its record for the JSON."""
    loss_args = {} if pos_weight is None else {"pos_weight": pos_weight}
    lr = args.lr if args.lr is not None else training_recipe(model).get("lr", DEFAULT_LR)
    started = time.perf_counter()
    summary = train(
        TrainConfig(
            model=model,
            dataset=f"segfolder:{folder}",
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=lr,
            seed=seed,
            device="cpu",
            threads=args.threads,
            progress=False,
            out=str(out),
            loss_args=loss_args,
        )
    )
    digits = [name for name in summary["test_dice"] if name != "background"]
    records = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    return {
        "model": model,
        "seed": seed,
        "pos_weight": pos_weight,
        "lr": lr,
        "epochs": args.epochs,
        "seconds": round(time.perf_counter() - started, 1),
        "test_dice": summary["test_dice"],
        "mean_dice": summary["test_mean_dice"],
        "best_epoch": summary["best_epoch"],
        "best_test_dice": summary["best_test_dice"],
        "best_mean_dice": summary["best_test_mean_dice"],
        "worst_digit_dice": min(summary["test_dice"][name] for name in digits),
        "mean_dice_by_epoch": [record.get("test_mean_dice") for record in records],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--models", nargs="+", default=["unet_small", "segcaps_small"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--pos-weights",
        type=float,
        nargs="+",
        default=None,
        help="SegCaps runs: one per weight (default: the loss's own, 1); other models keep their loss's default",
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"every model's learning rate (default: each model's training recipe's, else {DEFAULT_LR})",
    )
    parser.add_argument("--count", type=int, default=600, help="images in the folder (80%% train, 20%% test)")
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--per-image", type=int, default=1, help="digits on each image (default 1)")
    parser.add_argument("--digit-size", type=int, default=None, help="the digits' side (default: --size - 4)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-dir", default=None, help="the folder holding mnist/ (default: capsnets' data root)")
    parser.add_argument("--dry-run", action="store_true", help="40 images, one epoch, one seed")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.dry_run:
        args.count, args.epochs, args.seeds = 40, 1, args.seeds[:1]
    torch.set_num_threads(args.threads)
    mnist = load_dataset("mnist", root=args.data_dir, train=True).subset(max(5 * args.count * args.per_image, 100))
    result = {**environment(torch.device("cpu"), args), "runs": []}
    with tempfile.TemporaryDirectory() as scratch:
        folder = write_digit_segfolder(
            Path(scratch) / "digits",
            mnist.images,
            mnist.labels,
            count=args.count,
            size=args.size,
            per_image=args.per_image,
            digit_size=args.digit_size,
        )
        runs = [
            (model, weight, seed)
            for model in args.models
            for weight in (args.pos_weights if args.pos_weights and model.startswith("segcaps") else [None])
            for seed in args.seeds
        ]
        for model, weight, seed in runs:
            record = run_one(folder, Path(scratch) / f"run-{len(result['runs'])}", model, seed, weight, args)
            result["runs"].append(record)
            dice = ", ".join(f"{name} {value:.3f}" for name, value in record["test_dice"].items())
            print(f"{model} pos_weight {weight} seed {seed}: {dice}; mean {record['mean_dice']:.3f}", flush=True)
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
