"""How many right, wrong and out-of-distribution answers ``capsnets.predict`` flags as uncertain.

For each model (a shipped weight such as ``capsnet_small-mnist``, or a run directory / checkpoint file), the
script runs :func:`capsnets.predict` on the test split of the data set it was trained on (MNIST or
Fashion-MNIST), on the other one's test split, on the test split inverted (dark strokes on white), on blank
images, and on two kinds of noise: uniform pixels, and uniform pixels averaged over 5x5 windows then stretched to
``[0, 1]`` (blobs, closer to strokes). It records the fraction flagged among the right answers, the wrong ones
and each out-of-distribution set, twice: ``score_rule`` by the score rule alone
(:func:`capsnets.inference.uncertainty` with ``predict``'s defaults), ``flagged`` by ``predict`` (the score rule,
and for a model with a decoder whose checkpoint records ``reconstruction_limits``, the reconstruction's errors).
``grid`` gives the score rule's fractions for every ``min_score`` and ``min_margin`` of the grid.

By default the images go in as a prepared batch, as the data sets store them; ``--prepare`` hands them to
``predict`` one by one, so that each is prepared as an image file would be (for MNIST weights: inverted where its
border is light, and framed as MNIST's digits were).

Run ``python benchmarks/uncertainty.py --help``; ``benchmarks/README.md`` lists the recorded runs.
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
from pathlib import Path

import torch
from torch.nn import functional as F

import capsnets
from capsnets.data import load_dataset
from capsnets.files import atomic_write
from capsnets.inference import uncertainty
from capsnets.models.hub import load_model
from capsnets.validation import to_float_images

from throughput import environment  # benchmarks/throughput.py, beside this script

DEFAULT_MODELS = [
    "capsnet_small-mnist",
    "capsnet_small-fashion_mnist",
    "efficient_capsnet-mnist",
    "matrix_capsnet_small-mnist",
]
OTHER = {"mnist": "fashion_mnist", "fashion_mnist": "mnist"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, help="shipped weights or checkpoint paths")
    parser.add_argument("--data-dir", default=None, help="data root holding mnist/ and fashion-mnist/")
    parser.add_argument("--limit", type=int, default=10000, help="test images of each data set (the first N)")
    parser.add_argument("--noise", type=int, default=2000, help="noise images of each kind, and inverted images")
    parser.add_argument("--prepare", action="store_true", help="prepare each image as predict prepares a file")
    parser.add_argument("--min-scores", nargs="+", type=float, default=[0.5, 0.6, 0.7, 0.8, 0.9])
    parser.add_argument("--min-margins", nargs="+", type=float, default=[0.0, 0.1, 0.2, 0.3, 0.4])
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="JSON file (default benchmarks/results/uncertainty_<time>.json)")
    return parser.parse_args(argv)


def noise_sets(count: int, size: tuple[int, int, int]) -> dict[str, torch.Tensor]:
    """``count`` images of uniform noise and as many of 5x5-averaged noise stretched to ``[0, 1]`` (seed 0), and
    ten blank ones."""
    generator = torch.Generator().manual_seed(0)
    uniform = torch.rand(count, *size, generator=generator)
    blurred = F.avg_pool2d(torch.rand(count, *size, generator=generator), 5, stride=1, padding=2)
    low, high = blurred.amin((1, 2, 3), keepdim=True), blurred.amax((1, 2, 3), keepdim=True)
    return {"uniform_noise": uniform, "blurred_noise": (blurred - low) / (high - low), "blank": torch.zeros(10, *size)}


def probabilities(predictions) -> torch.Tensor:
    """Every prediction's class scores as ``predict`` judges them: softmax, or capsule scores in ``[0, 1]``."""
    return torch.tensor([list(p.scores.values()) for p in predictions])


def fraction(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def bench_model(source: str, args: argparse.Namespace) -> dict:
    if Path(source).exists():
        model = load_model(source)
        dataset = model.checkpoint_meta["dataset"]
    else:
        name, dataset = source.split("-", 1)
        model = capsnets.create_model(name, pretrained=dataset)
    dataset = dataset.lower().replace("-", "_")
    test = load_dataset(dataset, root=args.data_dir, train=False)
    own = to_float_images(test.images[: args.limit])
    sets = {
        "other_" + OTHER[dataset]: to_float_images(
            load_dataset(OTHER[dataset], root=args.data_dir, train=False).images[: args.limit]
        )
    }
    sets |= {"inverted": 1.0 - own[: args.noise]} | noise_sets(args.noise, tuple(model.input_size))
    defaults = inspect.signature(capsnets.predict).parameters
    rule = {key: defaults[key].default for key in ("min_score", "min_margin")}

    def run(images: torch.Tensor) -> list:
        return capsnets.predict(model, list(images) if args.prepare else images, batch_size=args.batch_size)

    start = time.perf_counter()
    predictions = run(own)
    right = torch.tensor([p.index for p in predictions]) == test.labels[: args.limit]
    groups = {
        "right": [p for p, ok in zip(predictions, right) if ok],
        "wrong": [p for p, ok in zip(predictions, right) if not ok],
    }
    groups |= {key: run(images) for key, images in sets.items()}
    scores = {key: probabilities(group) for key, group in groups.items()}
    grid = []
    for min_score in args.min_scores:
        for min_margin in args.min_margins:
            flagged = {
                key: float(uncertainty(s, min_score=min_score, min_margin=min_margin).float().mean())
                if len(s)
                else None
                for key, s in scores.items()
            }
            grid.append({"min_score": min_score, "min_margin": min_margin, "flagged": flagged})
    row = {
        "model": source,
        "dataset": dataset,
        "accuracy": float(right.float().mean()),
        "unsure_rule": predictions[0].unsure_rule,
        "reconstruction_limits": model.checkpoint_meta.get("reconstruction_limits"),
        "counts": {key: len(group) for key, group in groups.items()},
        "score_rule": {key: fraction(uncertainty(s, **rule).tolist()) if len(s) else None for key, s in scores.items()},
        "flagged": {key: fraction([p.uncertain for p in group]) for key, group in groups.items()},
        "grid": grid,
        "seconds": time.perf_counter() - start,
    }
    shown = "  ".join(
        f"{key} {100 * row['score_rule'][key]:.1f}->{100 * value:.1f}%"
        for key, value in row["flagged"].items()
        if value is not None
    )
    print(f"{source:32s} accuracy {100 * row['accuracy']:.2f}%  flagged (score rule -> predict): {shown}", flush=True)
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    defaults = inspect.signature(capsnets.predict).parameters
    meta = environment(torch.device("cpu"), args) | {
        "defaults": {key: defaults[key].default for key in ("min_score", "min_margin")},
        "prepare": args.prepare,
    }
    rows = [bench_model(source, args) for source in args.models]
    out = Path(args.out or Path(__file__).parent / "results" / f"uncertainty_{time.strftime('%Y%m%d_%H%M%S')}.json")
    atomic_write(out, lambda tmp: Path(tmp).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
