"""The ``capsnets`` command: ``train``, ``evaluate``, ``reconstruct``, ``list-models`` and ``experiment``.

Quick start (offline, 8x8 scikit-learn digits; ``--model capsnet_digits --dataset digits`` are the
defaults)::

    capsnets train --epochs 5 --out runs/digits
    capsnets evaluate --checkpoint runs/digits
    capsnets train --model capsnet --dataset mnist --download --epochs 50 --out runs/mnist
    capsnets experiment multimnist --smoke --out runs/multimnist_smoke   # report.md + PNGs

Flags override the values of ``--config FILE`` (YAML or JSON with :class:`TrainConfig` keys), which
override the defaults. Errors are reported as one line on stderr with a non-zero exit status (set
``CAPSNETS_DEBUG=1`` for the traceback).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

#: ``train`` flags that map one-to-one onto TrainConfig fields (argparse dest == field name).
_CONFIG_FLAGS = ("model", "dataset", "epochs", "out", "batch_size", "lr", "lr_decay", "weight_decay", "seed",
                 "device", "amp", "compile", "data_dir", "download", "limit_train", "limit_test", "max_shift",
                 "loss", "eval_every", "checkpoint_every", "progress", "time_limit_minutes")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = build_parser().parse_args(argv)
    from capsnets.engine.runtime import retain_freed_memory

    retain_freed_memory()  # this process is ours: freed CPU tensors stay for the next step (engine.runtime)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        return args.handler(args) or 0
    except KeyboardInterrupt:
        print("capsnets: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, FloatingPointError) as err:  # CheckpointError, DatasetError...
        if os.environ.get("CAPSNETS_DEBUG"):
            raise
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"capsnets {args.command}: error: {message}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with its sub-commands."""
    parser = argparse.ArgumentParser(prog="capsnets", description="Capsule networks: train, evaluate, inspect.")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_train(commands.add_parser("train", help="train a model and write a run directory"))
    evaluate = commands.add_parser("evaluate", help="accuracy and confusion matrix of a checkpoint")
    _add_checkpoint_args(evaluate)
    evaluate.add_argument("--out", help="where to write the JSON and PNG (default: the checkpoint's directory)")
    evaluate.add_argument("--batch-size", type=int, default=256)
    evaluate.set_defaults(handler=_evaluate)
    reconstruct = commands.add_parser("reconstruct", help="inputs vs reconstructions of a checkpoint")
    _add_checkpoint_args(reconstruct)
    reconstruct.add_argument("--n", type=int, default=16, help="number of test images (default 16)")
    reconstruct.add_argument("--out", required=True, help="directory for reconstructions.png")
    reconstruct.set_defaults(handler=_reconstruct)
    commands.add_parser("list-models", help="registered models and their parameter counts").set_defaults(
        handler=_list_models)
    _add_experiment(commands.add_parser("experiment", help="run a paper experiment, write DIR/report.md + PNGs"))
    return parser


def _add_experiment(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("name", nargs="?", help="experiment name (see --list)")
    add("--list", action="store_true", help="list the registered experiments and exit")
    add("--smoke", action="store_true", help="tiny CPU-sized version (minutes)")
    add("--out", help="directory for report.md and the figures")
    add("--device", default="auto", help="auto (default), cpu, cuda, cuda:1 ...")
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=0)
    seeds.add_argument("--seeds", type=int, nargs="+", metavar="SEED",
                       help="run once per seed into DIR/seed-N and summarise the spread in DIR/report.md")
    add("--data-dir", help="folder holding the data sets (default: $CAPSNETS_DATA or the library's default)")
    add("--checkpoint-dir", help="load trained models from here if present, else save them here "
                                 "(with --seeds: from its seed-N folders)")
    add("--set", action="append", default=[], metavar="KEY=VALUE", help="experiment-specific setting")
    parser.set_defaults(handler=_experiment)


def _experiment(args: argparse.Namespace) -> int:
    from capsnets.experiments import list_experiments, run_experiment, run_experiment_seeds

    if args.list:
        print("\n".join(list_experiments()))
        return 0
    if not args.name:
        raise ValueError(f"name an experiment (one of: {', '.join(list_experiments())}) or pass --list")
    if not args.out:
        raise ValueError("--out DIR is required: the directory for report.md and the figures")
    common = dict(smoke=args.smoke, device=args.device, data_dir=args.data_dir, checkpoint_dir=args.checkpoint_dir,
                  **parse_key_values(args.set, "--set"))
    if args.seeds is not None:
        result = run_experiment_seeds(args.name, args.out, args.seeds, **common)
    else:
        result = run_experiment(args.name, args.out, seed=args.seed, **common)
    print(f"wrote {result.report} and {len(result.figures)} figure(s)")
    for key, value in result.metrics.items():
        print(f"  {key}: {value:.4g}" if isinstance(value, float) else f"  {key}: {value}")
    if result.cut_short:
        how = ("run the same command again to continue them from --checkpoint-dir" if args.checkpoint_dir else
               "with --checkpoint-dir DIR they are kept, and running the same command again continues them")
        print(f"train_minutes cut {len(result.cut_short)} training(s) short ({', '.join(result.cut_short)}); {how}")
    return 0


def _add_train(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--config", help="YAML/JSON file of TrainConfig keys (flags override it)")
    add("--model", help="registered model name (default capsnet_digits; see list-models)")
    add("--dataset", help="digits (default, offline), mnist or fashion_mnist")
    add("--epochs", type=int)
    add("--out", help="run directory (default runs/capsnet)")
    add("--batch-size", type=int, help="global batch size (default 128)")
    add("--lr", type=float, help="Adam learning rate (default 1e-3)")
    add("--lr-decay", type=float, help="per-epoch exponential decay of the learning rate (default 0.96)")
    add("--weight-decay", type=float)
    add("--loss", help="loss name (default: the model's default loss)")
    add("--seed", type=int)
    add("--device", help="auto (default), cpu, cuda, cuda:1 ...")
    add("--amp", choices=["auto", "bf16", "off"], help="auto: bf16 autocast on CUDA, off on CPU")
    add("--compile", action="store_true", default=None, help="use torch.compile")
    add("--resume", action="store_true", help="continue from <out>/last.safetensors (reuses <out>/config.yaml)")
    add("--data-dir")
    add("--download", action="store_true", default=None, help="download missing data set files")
    add("--limit-train", type=int, help="use only the first N training images")
    add("--limit-test", type=int, help="use only the first N test images")
    add("--max-shift", type=int, help="random shift in pixels (default 2; 0 for images of 16 px or less)")
    add("--eval-every", type=int)
    add("--checkpoint-every", type=int)
    add("--model-arg", action="append", default=[], metavar="KEY=VALUE", help="model builder override")
    add("--loss-arg", action="append", default=[], metavar="KEY=VALUE", help="loss argument")
    add("--no-progress", dest="progress", action="store_false", default=None, help="no progress bar")
    add("--time-limit", dest="time_limit_minutes", type=float, metavar="MINUTES",
        help="stop after the first epoch that ends past MINUTES of wall-clock time (evaluated, checkpointed "
             "and summarised as usual); --resume continues the run")
    parser.set_defaults(handler=_train)


def _add_checkpoint_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="run directory (uses best) or .safetensors file")
    parser.add_argument("--dataset", help="data set to use (default: the one the model was trained on)")
    parser.add_argument("--data-dir")
    parser.add_argument("--device", default="auto")


def parse_key_values(items: Sequence[str], flag: str) -> dict[str, Any]:
    """``["a=1", "b=[1, 8, 8]"]`` -> ``{"a": 1, "b": [1, 8, 8]}`` (values parsed as YAML scalars/lists;
    ``1e-3`` is a float)."""
    from capsnets.engine.config import load_yaml

    values = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {item!r} must look like KEY=VALUE")
        try:
            values[key.strip()] = load_yaml(text)
        except yaml.YAMLError as err:
            raise ValueError(f"{flag} {item!r}: cannot parse the value ({err})") from err
    return values


def config_from_args(args: argparse.Namespace):
    """The :class:`TrainConfig` described by parsed ``train`` arguments."""
    from capsnets.engine.config import build_config

    config_file = args.config
    if config_file is None and args.resume and args.out and (Path(args.out) / "config.yaml").is_file():
        config_file = Path(args.out) / "config.yaml"
    overrides = {name: getattr(args, name) for name in _CONFIG_FLAGS}
    overrides["model_args"] = parse_key_values(args.model_arg, "--model-arg") or None
    overrides["loss_args"] = parse_key_values(args.loss_arg, "--loss-arg") or None
    return build_config(config_file, **overrides)


def _train(args: argparse.Namespace) -> int:
    from capsnets.engine.trainer import train

    summary = train(config_from_args(args), resume=args.resume)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    print(f"model {summary['model']} ({summary['parameters']:,} parameters) on {summary['dataset']}, "
          f"{summary['epochs']} epochs, {summary['train_time_s']:.1f} s of training on {summary['device']}")
    print(f"test accuracy {_pct(summary['test_accuracy'])} (best {_pct(summary['best_test_accuracy'])} "
          f"at epoch {summary['best_epoch']})")
    if summary.get("time_limited"):
        print(f"stopped by the time limit after epoch {summary['epochs']} of {summary['planned_epochs']}; "
              f"continue with: capsnets train --out {summary['run_dir']} --resume")
    print(f"run directory: {summary['run_dir']} (figures: "
          f"{', '.join(Path(p).name for p in summary.get('figures', [])) or 'none'})")
    return 0


def _load(args: argparse.Namespace):
    """Model, checkpoint, test data and device for ``evaluate`` / ``reconstruct``."""
    from capsnets.data import load_dataset
    from capsnets.engine.checkpoint import load_model
    from capsnets.engine.runtime import resolve_device

    device = resolve_device(args.device)
    model, checkpoint = load_model(args.checkpoint, device)
    dataset = args.dataset or checkpoint.meta.get("dataset")
    if dataset is None:
        raise ValueError(f"checkpoint '{checkpoint.path}' does not record its data set; pass --dataset")
    data_dir = args.data_dir or checkpoint.meta.get("config", {}).get("data_dir")
    data = load_dataset(dataset, root=data_dir, train=False).to(device)
    if tuple(data.images.shape[1:]) != tuple(model.input_size) or data.num_classes != model.num_classes:
        raise ValueError(f"data set {dataset!r} ({data.num_classes} classes of {tuple(data.images.shape[1:])}) "
                         f"does not fit the model ({model.num_classes} classes of {tuple(model.input_size)})")
    return model, checkpoint, data, device


def _evaluate(args: argparse.Namespace) -> int:
    from capsnets.engine.evaluate import evaluate
    from capsnets.plots import plot_confusion_matrix

    model, checkpoint, data, device = _load(args)
    results = evaluate(model, data, args.batch_size, device)
    out = Path(args.out) if args.out else checkpoint.path.parent
    out.mkdir(parents=True, exist_ok=True)
    stem = f"evaluation_{data.name or 'test'}".replace("[", "_").replace(":", "").replace("]", "")
    classes = list(data.classes) or [str(k) for k in range(data.num_classes)]
    report = {"checkpoint": str(checkpoint.path), "dataset": data.name, "count": results["count"],
              "accuracy": results["accuracy"],
              "per_class_accuracy": dict(zip(classes, results["per_class_accuracy"].tolist())),
              "confusion_matrix": results["confusion_matrix"].tolist()}
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    png = plot_confusion_matrix(results["confusion_matrix"], classes, out / f"{stem}_confusion.png")
    print(format_report(results, classes))
    print(f"wrote {out / f'{stem}.json'} and {png}")
    return 0


def format_report(results: dict[str, Any], classes: list[str]) -> str:
    """Accuracy, per-class accuracy and the confusion matrix as a plain-text table."""
    width = max(6, *(len(c) for c in classes))
    lines = [f"accuracy {_pct(results['accuracy'])} on {results['count']} images", "",
             f"{'class':>{width}}  accuracy"]
    lines += [f"{c:>{width}}  {_pct(a)}" for c, a in zip(classes, results["per_class_accuracy"].tolist())]
    lines += ["", "confusion matrix (rows: true class, columns: predicted)",
              " " * width + " ".join(f"{c:>{width}}" for c in classes)]
    for name, row in zip(classes, results["confusion_matrix"].tolist()):
        lines.append(f"{name:>{width}}" + " ".join(f"{v:>{width}}" for v in row))
    return "\n".join(lines)


def _reconstruct(args: argparse.Namespace) -> int:
    import torch

    from capsnets.plots import plot_reconstructions

    if args.n < 1:
        raise ValueError(f"--n must be at least 1, got {args.n}")
    model, checkpoint, data, _ = _load(args)
    images, labels = data.images[:args.n], data.labels[:args.n]
    with torch.no_grad():
        output = model(images)
    if output.reconstruction is None:
        raise ValueError(f"model {checkpoint.meta['model']!r} has no decoder, so it cannot reconstruct; "
                         "use a capsule model with a reconstruction decoder")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = plot_reconstructions(images.cpu(), output.reconstruction.float().cpu(), out / "reconstructions.png",
                               labels=labels.cpu(), predictions=output.scores.argmax(-1).cpu(), n=len(images))
    print(f"wrote {png}")
    return 0


def _list_models(args: argparse.Namespace) -> int:
    import torch

    from capsnets.models import count_parameters, create_model, list_models, model_task

    names = list_models()
    width = max(len(n) for n in names)
    for name in names:
        try:
            with torch.device("meta"):  # count parameters without allocating them
                count = count_parameters(create_model(name))
        except (RuntimeError, NotImplementedError):  # a builder that needs real tensors
            count = count_parameters(create_model(name))
        print(f"{name:<{width}}  {count:>12,}  {model_task(name)}")
    return 0


def _pct(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{100 * value:.2f}%"
