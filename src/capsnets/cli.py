"""The ``capsnets`` command: ``train``, ``evaluate``, ``reconstruct``, ``predict``, ``export``, ``list-models``,
``experiment`` and ``demo``.

Quick start (offline, 8x8 scikit-learn digits; ``--model capsnet_digits --dataset digits`` are the
defaults)::

    capsnets train --epochs 5                             # run directory runs/capsnet_digits
    capsnets evaluate --checkpoint runs/capsnet_digits    # evaluation_best_digits.json + PNG there
    capsnets evaluate --checkpoint runs/a runs/b          # their ensemble: runs/evaluation_ensemble_a_best+b_best_...
    capsnets list-models capsnet                          # the --model-arg keys of capsnet, with defaults
    capsnets train --model capsnet --dataset mnist --download --epochs 50 --model-arg routing.iterations=1
    capsnets experiment multimnist --smoke --out runs/multimnist_smoke   # report.md + PNGs
    capsnets predict --pretrained capsnet_small-mnist seven.png   # a shipped weight
    capsnets export --checkpoint runs/capsnet_digits      # runs/capsnet_digits/best.onnx
    capsnets predict --checkpoint runs/capsnet_digits/best.onnx digit.png   # the exported file, by onnxruntime
    capsnets demo                                         # http://127.0.0.1:8000/

``capsnets COMMAND --help`` gives every option with its default. ``train`` writes its run directory to
``--out``, by default ``runs/<model>``; its flags override the values of
``--config FILE`` (YAML or JSON with :class:`~capsnets.engine.config.TrainConfig` keys), which override
the defaults. ``evaluate`` and ``reconstruct`` name their files after the checkpoint(s) they read
(:func:`output_label`, :func:`ensemble_label`), so they never replace a training run's files or each other's.
Errors are reported as one line on stderr with a non-zero exit status (set ``CAPSNETS_DEBUG=1`` for the
traceback). The command changes no process-wide setting unless asked: ``--retain-freed-memory`` (or
``CAPSNETS_RETAIN_FREED_MEMORY=1``) keeps freed CPU memory in the process
(:func:`~capsnets.engine.runtime.retain_freed_memory`). The commands that run models compute with ``--threads N``
threads, else ``OMP_NUM_THREADS``, else torch's count, lowered with a one-line note to the cores that the load
average leaves free (:func:`~capsnets.engine.runtime.choose_threads`); ``train`` records the count in its
``config.yaml``, and ``--resume`` uses it.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import ipaddress
import json
import logging
import os
import re
import shlex
import signal
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from capsnets._version import __version__
from capsnets.checkpoints import checkpoint_epoch, load_checkpoint, peek_sidecar
from capsnets.data import DatasetError, list_datasets, load_dataset
from capsnets.data.errors import DOWNLOAD_HINT
from capsnets.data.image_folder import FOLDER_PREFIX
from capsnets.data.seg_folder import SEGFOLDER_PREFIX
from capsnets.demo.source import DEMO_PRETRAINED, DEMO_RUN_DIR, DEMO_TRAINING, load_demo_model
from capsnets.engine.config import DEFAULTS, TrainConfig, build_config, default_run_dir, read_config_file
from capsnets.engine.evaluate import EVAL_BATCH_SIZE, load_ensemble
from capsnets.engine.fit import LR_SCHEDULES, TrainingInterrupted
from capsnets.engine.run_dir import run_files
from capsnets.engine.runtime import (
    AMP_MODES,
    MAX_THREADS,
    choose_threads,
    machine_load,
    resolve_device,
    retain_freed_memory,
)
from capsnets.engine.tasks import checkpoint_task, task_for, task_named
from capsnets.engine.tasks.report import percent
from capsnets.engine.trainer import train
from capsnets.export import EXPORT_FORMATS, OnnxModel, export_model
from capsnets.files import FileWriteError, atomic_write_text, folder_write_problem
from capsnets.images import IMAGE_FORMATS_TEXT, IMAGE_SUFFIXES
from capsnets.inference import collect_image_files
from capsnets.models import (
    count_parameters,
    create_model,
    list_models,
    model_schema,
    model_task,
    routing_keys,
    training_recipe,
)
from capsnets.models.hub import model_from_checkpoint
from capsnets.models.pretrained import (
    PretrainedError,
    default_weights,
    get_model_weights,
    get_weights,
    resolve_pretrained,
)
from capsnets.outputs import OutputExistsError, check_output, json_header, written_for
from capsnets.parsing import load_yaml
from capsnets.validation import ArgumentError, shown

#: The environment variable that turns on ``--retain-freed-memory`` (``1``).
RETAIN_FREED_MEMORY_ENV = "CAPSNETS_RETAIN_FREED_MEMORY"
#: What ``experiment``, which downloads nothing, says instead of "rerun with --download".
_EXPERIMENT_DOWNLOAD = "call the data set with download=True in Python once"
#: ``train`` flags that map one-to-one onto TrainConfig fields (argparse dest == field name).
_CONFIG_FLAGS = (
    "model",
    "pretrained",
    "classifier_only_epochs",
    "dataset",
    "epochs",
    "out",
    "batch_size",
    "lr",
    "lr_schedule",
    "lr_decay",
    "weight_decay",
    "seed",
    "device",
    "threads",
    "amp",
    "compile",
    "data_dir",
    "download",
    "limit_train",
    "limit_test",
    "val_fraction",
    "test_each_epoch",
    "max_shift",
    "augment",
    "loss",
    "eval_every",
    "checkpoint_every",
    "progress",
    "figures",
    "time_limit_minutes",
    "image_size",
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.argv = argv  # the command line as given, for the command that starts a failed training again
    if args.retain_freed_memory or os.environ.get(RETAIN_FREED_MEMORY_ENV) == "1":
        retain_freed_memory()  # asked for: freed CPU tensors stay in the process (engine.runtime)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.command in _THREADED:
        _set_threads(args.threads)
    try:
        return args.handler(args) or 0
    except KeyboardInterrupt:
        print("capsnets: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, FloatingPointError, MemoryError, RecursionError) as err:  # CheckpointError...
        if os.environ.get("CAPSNETS_DEBUG"):
            raise
        print(f"capsnets {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 1


def _one_line(err: BaseException) -> str:
    """The first line of ``err``'s message, or what it means when it has none worth showing."""
    if isinstance(err, MemoryError):
        return "out of memory; use a smaller --batch-size (or smaller images), or a machine with more memory"
    if isinstance(err, RecursionError):
        return "an input is nested too deeply to be read (Python's recursion limit)"
    return str(err).splitlines()[0] if str(err) else type(err).__name__


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's formatter that appends ``(default: ...)`` to each option's help, except where the help says
    ``(default`` itself (options whose default is worked out at run time); a flag's default reads on/off."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or action.default is None or action.default is argparse.SUPPRESS:
            return text
        if action.nargs == 0:  # a flag
            return f"{text} (default: {'on' if action.default else 'off'})"
        if action.default == []:  # a repeatable option given no times
            return f"{text} (default: none)"
        return super()._get_help_string(action)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line ``argv`` (default: ``sys.argv[1:]``) with :func:`build_parser`.

    An unknown command or option is an error (exit status 2, as argparse's) that suggests the closest known one
    (``capsnets trian``: did you mean ``train``?), printed with the usage of the command it was given to.
    """
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = command_parsers(parser)
    position = next((i for i, token in enumerate(argv) if not token.startswith("-")), None)
    if position is not None:
        name = argv[position]
        if name not in commands:
            parser.error(
                f"unknown command {name!r}{_did_you_mean(name, commands)}; the commands are: {', '.join(commands)}"
            )
        _reject_unknown_options(commands[name], argv[position + 1 :])
    return parser.parse_args(argv)


def command_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-command parsers of the ``capsnets`` parser, by command name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _reject_unknown_options(parser: argparse.ArgumentParser, tokens: Sequence[str]) -> None:
    """Exit through ``parser.error`` (its usage, status 2) at the first ``--option`` among ``tokens`` that
    ``parser`` lacks; a prefix of an option is not taken for it (``--epoch`` is not ``--epochs``)."""
    known = [option for option in parser._option_string_actions if option.startswith("--")]
    for token in tokens:
        if token == "--":
            return
        if not token.startswith("--"):
            continue
        option = token.split("=", 1)[0]
        if option in known:
            continue
        close = difflib.get_close_matches(option, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else f"; `{parser.prog} --help` lists the options"
        parser.error(f"unrecognized argument: {option}{hint}")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with its sub-commands."""
    parser = argparse.ArgumentParser(
        prog="capsnets", description="Capsule networks: train, evaluate, inspect.", allow_abbrev=False
    )
    parser.add_argument("--version", action="version", version=f"capsnets {__version__} (torch {torch.__version__})")
    parser.add_argument(
        "--retain-freed-memory",
        action="store_true",
        help="keep the memory of freed CPU tensors in the process for reuse (glibc's mallopt; "
        "faster CPU training of EM routing, at the price of a resident size near the peak; "
        f"also {RETAIN_FREED_MEMORY_ENV}=1) (default: off)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name, help=summary, description=summary, formatter_class=_HelpFormatter, allow_abbrev=False
        )

    _add_train(command("train", "train a model and write a run directory"))
    _add_evaluate(
        command(
            "evaluate",
            "accuracy, per-class accuracy and confusion matrix of a checkpoint, or of an ensemble of checkpoints",
        )
    )
    _add_reconstruct(command("reconstruct", "inputs against their reconstructions by a checkpoint"))
    _add_export(
        command("export", "write a checkpoint's model as ONNX (or a torch.export program), checked against PyTorch")
    )
    _add_predict(
        command(
            "predict",
            f"classify image files ({IMAGE_FORMATS_TEXT}) with a checkpoint or an exported .onnx file, or segment them",
        )
    )
    _add_list_models(
        command("list-models", "registered models and their parameter counts, or the --model-arg keys of one model")
    )
    _add_experiment(command("experiment", "run a paper experiment, write DIR/report.md + PNGs"))
    for name in _THREADED:
        _add_threads_arg(commands.choices[name])
    _add_demo(
        command(
            "demo",
            "a local web page to see what capsules encode: draw a digit, see its class capsules, "
            "move their dimensions, see the routing (needs pip install -e '.[demo]')",
        )
    )
    return parser


#: The commands besides ``train`` that compute with torch's threads and take ``--threads``.
_THREADED = ("evaluate", "reconstruct", "predict", "experiment")


def _add_threads_arg(parser: argparse.ArgumentParser, recorded: bool = False) -> None:
    parser.add_argument(
        "--threads",
        type=_thread_count,
        metavar="N",
        help="threads torch computes with (default: OMP_NUM_THREADS if set, else torch's count, lowered to the "
        "cores that other running work leaves free, with a note"
        + ("; the count used is recorded in config.yaml and --resume uses it" if recorded else "")
        + ")",
    )


def _path(text: str) -> str:
    """A file or directory argument: an empty one is refused (it would silently mean the default or ``.``)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; name a file or directory (or leave the option out)")
    return text


def _thread_count(text: str) -> int:
    count = _positive_int(text)
    if count > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"{count} threads is more than {MAX_THREADS}, the most torch is given")
    return count


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


def _set_threads(requested: int | None) -> int | None:
    """Set the threads torch computes with (:func:`~capsnets.engine.runtime.choose_threads`), printing the one line
    that says why when it lowers them; returns the count set, or None where torch's count stays."""
    cores, load = machine_load()
    threads, note = choose_threads(
        requested, torch_threads=torch.get_num_threads(), cpu_count=cores, load=load, env=os.environ
    )
    if note:
        print(note, file=sys.stderr)
    if threads is not None:
        torch.set_num_threads(threads)
    return threads


def _datasets() -> str:
    """The registered data sets, for help texts."""
    return (
        ", ".join(list_datasets())
        + ", or folder:PATH (your own images: one subfolder per class; segfolder:PATH: images/ and their masks/)"
    )


def _add_experiment(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("name", nargs="?", help="experiment name (see --list)")
    add(
        "--list",
        action="store_true",
        help="list the experiments, one line each (with NAME: its settings, their defaults and smoke values) and exit",
    )
    add("--smoke", action="store_true", help="tiny CPU-sized version (minutes)")
    add("--out", type=_path, help="directory for report.md and the figures")
    _add_overwrite_arg(parser, "files in --out")
    add("--device", default="auto", help="auto (default), cpu, cuda, cuda:1 ...")
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=0)
    seeds.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        metavar="SEED",
        help="run once per seed into DIR/seed-N and summarise the spread in DIR/report.md",
    )
    add("--data-dir", help="folder holding the data sets (default: $CAPSNETS_DATA or the library's default)")
    add(
        "--checkpoint-dir",
        help="load trained models from here if present, else save them here (with --seeds: from its seed-N folders)",
    )
    add(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one of the experiment's settings (see NAME --list)",
    )
    parser.set_defaults(handler=_experiment)


def _experiment(args: argparse.Namespace) -> int:
    # slow (matplotlib and every experiment's module); only this command needs it
    from capsnets.experiments import describe_experiments, list_experiments, run_experiment, run_experiment_seeds  # noqa: PLC0415

    if args.list:
        print(describe_experiments(args.name))
        return 0
    if not args.name:
        raise ArgumentError(f"name an experiment (one of: {', '.join(list_experiments())}) or pass --list")
    if not args.out:
        raise ArgumentError("--out DIR is required: the directory for report.md and the figures")
    _check_experiment_folder(Path(args.out), args.overwrite)
    common = dict(
        smoke=args.smoke,
        device=args.device,
        data_dir=args.data_dir,
        checkpoint_dir=args.checkpoint_dir,
        **parse_key_values(args.set, "--set"),
    )
    try:
        if args.seeds is not None:
            result = run_experiment_seeds(args.name, args.out, args.seeds, **common)
        else:
            result = run_experiment(args.name, args.out, seed=args.seed, **common)
    except DatasetError as err:  # the experiments read data sets but do not download them
        raise DatasetError(str(err).replace(DOWNLOAD_HINT, _EXPERIMENT_DOWNLOAD)) from err
    print(f"wrote {result.report} and {len(result.figures)} figure(s)")
    for key, value in result.metrics.items():
        print(f"  {key}: {value:.4g}" if isinstance(value, float) else f"  {key}: {value}")
    if result.cut_short:
        how = (
            "run the same command again to continue them from --checkpoint-dir"
            if args.checkpoint_dir
            else "with --checkpoint-dir DIR they are kept, and running the same command again continues them"
        )
        print(f"train_minutes cut {len(result.cut_short)} training(s) short ({', '.join(result.cut_short)}); {how}")
    return 0


#: How many entries of an experiment's ``--out`` folder are looked at before it is refused as too full to check.
_MAX_FOLDER_ENTRIES = 10_000


def _check_experiment_folder(out: Path, overwrite: bool) -> None:
    """Before any work: the experiment's ``--out`` folder holds only files capsnets wrote (reports, figures,
    summaries, checkpoints), which a rerun may replace; else, unless ``--overwrite``, an :class:`ArgumentError`
    naming the first few others. The experiment's file names are not known before it runs, so any other file
    refuses the folder."""
    if overwrite or not out.is_dir():
        return
    foreign, seen = [], 0
    for folder, _, names in os.walk(out):
        for name in names:
            seen += 1
            if seen > _MAX_FOLDER_ENTRIES:
                raise ArgumentError(
                    f"--out '{out}' holds more than {_MAX_FOLDER_ENTRIES:,} files; pass an empty or new folder, or "
                    "--overwrite to write there anyway"
                )
            path = Path(folder) / name
            checkpoint = path.with_suffix(".safetensors")
            if not (written_for(path) or peek_sidecar(checkpoint) is not None):  # a checkpoint and its sidecar
                foreign.append(path)
    if foreign:
        listed = ", ".join(f"'{path}'" for path in foreign[:3]) + (
            f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        )
        raise ArgumentError(
            f"--out '{out}' holds files capsnets did not write ({listed}), so nothing was written there; the "
            "experiment writes report.md and figures under --out: pass a new folder, or --overwrite to write there "
            "anyway (files of the same names are replaced)"
        )


def _add_train(parser: argparse.ArgumentParser) -> None:
    default = TrainConfig()  # the values a flag left out (and absent from --config) takes
    add = parser.add_argument
    add("--config", metavar="FILE", help="YAML/JSON file of TrainConfig keys; flags override it (default: none)")
    add("--model", help=f"registered model name, see `capsnets list-models` (default: {default.model})")
    add("--dataset", help=f"data set: {_datasets()} (default: {default.dataset})")
    add("--epochs", type=int, help=f"passes over the training split (default: {default.epochs})")
    add(
        "--pretrained",
        metavar="WEIGHT",
        help="start from a weight (fine-tuning): a shipped weight's name (`capsnets list-models --pretrained`), a "
        "checkpoint file or a run directory; the tensors that fit the model are loaded, the class layer starts "
        "afresh for another class count, and config.yaml records it (default: untrained)",
    )
    add(
        "--classifier-only-epochs",
        type=int,
        metavar="N",
        help="train only the classifier (and the decoder) for the first N epochs, the other weights frozen "
        f"(default: {default.classifier_only_epochs})",
    )
    add(
        "--out",
        type=_path,
        metavar="DIR",
        help="run directory for config, metrics, checkpoints and figures "
        f"(default: {default_run_dir('<model>')}, e.g. {default_run_dir(default.model)})",
    )
    add("--batch-size", type=int, help=f"global batch size, split across processes (default: {default.batch_size})")
    recipe = "the model's training recipe (capsnets.models.training_recipe), else"
    add("--lr", type=float, help=f"Adam learning rate (default: {recipe} {DEFAULTS['lr']:g})")
    add(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        help="exponential: decayed by --lr-decay every epoch; cosine: annealed to 0 along a half cosine over the "
        f"run's steps (default: exponential with --lr-decay, else {recipe} {DEFAULTS['lr_schedule']})",
    )
    add(
        "--lr-decay",
        type=float,
        help="per-epoch decay of the learning rate of the exponential schedule "
        f"(default: {recipe} {DEFAULTS['lr_decay']})",
    )
    add("--weight-decay", type=float, help=f"Adam weight decay (default: {recipe} {DEFAULTS['weight_decay']:g})")
    add("--loss", help="loss name from capsnets.losses (default: the model's training recipe, else its default loss)")
    add("--seed", type=int, help=f"seed of initialisation, shuffling and augmentation (default: {default.seed})")
    add("--device", help=f"auto (CUDA if available, else CPU), cpu, cuda, cuda:1 ... (default: {default.device})")
    _add_threads_arg(parser, recorded=True)
    add(
        "--amp",
        choices=AMP_MODES,
        help=f"mixed precision: auto is bf16 autocast on CUDA, off on CPU (default: {default.amp})",
    )
    add("--compile", action="store_true", default=None, help="wrap the model in torch.compile (default: off)")
    add(
        "--resume",
        action="store_true",
        default=False,
        help="continue the run in --out from its last checkpoint, with its config.yaml; flags may change what can "
        "change mid-run (--epochs, --lr, --lr-decay, --device, --time-limit...), not the model or data "
        "(default: off)",
    )
    add(
        "--overwrite",
        action="store_true",
        default=False,
        help="replace the run already in --out: it is moved aside and deleted once the new run has saved its "
        "first checkpoint (default: off; without it a fresh run into a run directory is refused)",
    )
    add(
        "--data-dir",
        metavar="DIR",
        help="folder holding the data set files (default: $CAPSNETS_DATA, else ~/.cache/capsnets/data)",
    )
    add("--download", action="store_true", default=None, help="download missing data set files (default: off)")
    add("--limit-train", type=int, metavar="N", help="use only the first N training images (default: all)")
    add("--limit-test", type=int, metavar="N", help="use only the first N test images (default: all)")
    add(
        "--val-fraction",
        type=float,
        metavar="F",
        help="share of the training images held out, drawn from --seed, to choose the best checkpoint (the test "
        f"split never chooses it); 0: none held out, the last epoch is the result (default: {default.val_fraction})",
    )
    add(
        "--no-test-each-epoch",
        dest="test_each_epoch",
        action="store_false",
        default=None,
        help="score the test split only at the end, the best checkpoint too (default: at every evaluation)",
    )
    add(
        "--image-size",
        type=int,
        metavar="PIXELS",
        help="folder:PATH and segfolder:PATH data sets: resize every image to PIXELS x PIXELS (default: the first "
        "training image's size)",
    )
    add(
        "--max-shift",
        type=int,
        metavar="PIXELS",
        help="random shift of training images (default: the model's training recipe, else 2; 0 for images of 16 px "
        "or less and for data sets with their own training augmentation)",
    )
    add(
        "--augment",
        metavar="NAME",
        help="training augmentation after the shifts: digits, the random rotation, squeeze and erased patch of "
        "Efficient-CapsNet's code (default: shifts only)",
    )
    add(
        "--eval-every",
        type=int,
        metavar="N",
        help=f"evaluate on the validation (and test) split every N epochs and after the last (default: "
        f"{default.eval_every})",
    )
    add(
        "--checkpoint-every",
        type=int,
        metavar="N",
        help=f"save <out>/last.safetensors every N epochs and after the last (default: {default.checkpoint_every})",
    )
    add(
        "--model-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="argument of the model's builder, repeatable; `capsnets list-models MODEL` lists the keys and their "
        "defaults; routing.KEY=VALUE sets one setting of the model's routing (e.g. routing.iterations=2)",
    )
    add("--loss-arg", action="append", default=[], metavar="KEY=VALUE", help="argument of the loss, repeatable")
    add(
        "--no-progress",
        dest="progress",
        action="store_false",
        default=None,
        help="no progress bar (default: a bar on a terminal)",
    )
    add(
        "--no-figures",
        dest="figures",
        action="store_false",
        default=None,
        help="draw no figures when the training ends (default: the training curves and the task's figures)",
    )
    add(
        "--time-limit",
        dest="time_limit_minutes",
        type=float,
        metavar="MINUTES",
        help="stop after the first epoch that ends past MINUTES of wall-clock time (evaluated, checkpointed "
        "and summarised as usual); --resume continues the run (default: no limit)",
    )
    parser.set_defaults(handler=_train)


def _add_evaluate(parser: argparse.ArgumentParser) -> None:
    _add_checkpoint_args(parser, several=True)
    _add_data_args(parser)
    parser.add_argument(
        "--out",
        type=_path,
        metavar="DIR",
        help="directory for evaluation_<checkpoint>_<dataset>.json (several "
        "checkpoints: evaluation_ensemble_<checkpoints>_<dataset>.json) "
        "and its confusion-matrix PNG (default: the checkpoint's "
        "directory; several: the folder that holds them all; "
        "--pretrained: the current directory)",
    )
    parser.add_argument("--batch-size", type=int, default=EVAL_BATCH_SIZE, help="images per forward pass")
    _add_overwrite_arg(parser, "the evaluation's JSON and PNG")
    parser.set_defaults(handler=_evaluate)


def _add_reconstruct(parser: argparse.ArgumentParser) -> None:
    _add_checkpoint_args(parser)
    _add_data_args(parser)
    parser.add_argument("--n", type=int, default=16, help="number of test images")
    parser.add_argument(
        "--out",
        type=_path,
        metavar="DIR",
        help="directory for reconstructions_<checkpoint>.png (default: the checkpoint's directory; --pretrained: "
        "the current directory)",
    )
    _add_overwrite_arg(parser, "the PNG")
    parser.set_defaults(handler=_reconstruct)


def _add_predict(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="IMAGE_OR_FOLDER",
        help=f"image files ({IMAGE_FORMATS_TEXT}), or folders searched for them",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="run directory (its best, else last, checkpoint), .safetensors file, or .onnx file written by "
        "capsnets export (run by onnxruntime on the CPU, with the same predictions; needs pip install "
        "'capsnets[export]') (this or --pretrained is required, no default)",
    )
    _add_pretrained_arg(source, parser)
    parser.add_argument(
        "--json",
        type=_path,
        nargs="?",
        const="-",
        metavar="FILE",
        help="also write the predictions as JSON to FILE; with no FILE, or '-', print the JSON instead of the text "
        "(default: text only)",
    )
    parser.add_argument(
        "--invert",
        choices=["auto", "yes", "no"],
        default="auto",
        help="invert images (light background) for models trained on light strokes on black, "
        "such as MNIST; auto: when an image's border is lighter than mid-grey",
    )
    parser.add_argument(
        "--out",
        type=_path,
        metavar="DIR",
        help="segmentation models: directory for the <image>_mask.png and <image>_overlay.png files (default: ./masks)",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="images per forward pass")
    parser.add_argument(
        "--device", default="auto", help="auto (CUDA if available, else CPU), cpu, cuda, cuda:1 ...; an .onnx file: cpu"
    )
    _add_overwrite_arg(parser, "the --json file, masks and overlays")
    parser.set_defaults(handler=_predict)


def _add_export(parser: argparse.ArgumentParser) -> None:
    _add_checkpoint_args(parser)
    parser.add_argument(
        "--format",
        choices=["onnx", "torch_export"],
        default="onnx",
        help="onnx (run by onnxruntime; needs pip install 'capsnets[export]') or torch_export "
        "(a .pt2 torch.export program)",
    )
    parser.add_argument(
        "--out",
        type=_path,
        metavar="FILE",
        help="the file to write (default: beside the checkpoint, <checkpoint>.onnx or .pt2; --pretrained: "
        "<name>.onnx or .pt2 in the current directory)",
    )
    _add_overwrite_arg(parser, "the exported file")
    parser.set_defaults(handler=_export)


def _add_list_models(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name",
        nargs="?",
        metavar="MODEL",
        help="list this model's --model-arg keys with their defaults and what they take, one per line, instead; "
        "a pattern such as 'capsnet*' lists the models it matches (default: list every model)",
    )
    parser.add_argument(
        "--pretrained",
        action="store_true",
        help="list the pretrained weights shipped with the package (the names --pretrained takes) "
        "with their test accuracy, instead (those of MODEL, or of the models a pattern matches, when given)",
    )
    parser.set_defaults(handler=_list_models)


def _add_demo(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--pretrained",
        metavar="NAME",
        help=f"a pretrained weight: shipped (capsnets list-models --pretrained), a .safetensors file or an "
        f"https:// URL with --sha256 (default: {DEMO_PRETRAINED}, unless --checkpoint or --out is given)",
    )
    parser.add_argument(
        "--sha256",
        metavar="HEX",
        help="the expected SHA-256 of the --pretrained file: required for an https:// URL (default: none)",
    )
    source.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="run directory (its best, else last, checkpoint) or .safetensors file of the capsule "
        "model to show (default: none)",
    )
    source.add_argument(
        "--out",
        type=_path,
        metavar="DIR",
        help=f"run directory of a demo model trained on the first start ({DEMO_TRAINING['model']} "
        f"on {DEMO_TRAINING['dataset']}, {DEMO_TRAINING['epochs']} epochs on one CPU thread, under a minute) "
        f"and loaded on later starts, instead of the pretrained weight, e.g. {DEMO_RUN_DIR} "
        f"(default: none)",
    )
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help="folder holding the data set of the test images offered on the page (default: the folder the "
        "training recorded, else $CAPSNETS_DATA or the library's default)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on; 0.0.0.0 opens the demo to every machine that can reach this one; the demo "
        "answers only requests for localhost, an IP address, this machine's names and this name (403 otherwise)",
    )
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (0: a free port)")
    parser.set_defaults(handler=_demo)


def _add_overwrite_arg(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace existing files where {what} go, whatever they hold (default: off; without it only files "
        "capsnets wrote for the same purpose are replaced, and any other file is refused before any work)",
    )


def _add_pretrained_arg(source, parser: argparse.ArgumentParser) -> None:
    """``--pretrained`` (into ``source``, the group that makes it exclusive of ``--checkpoint``) and ``--sha256``."""
    source.add_argument(
        "--pretrained",
        metavar="NAME",
        help="a pretrained weight shipped with the package, <model>-<dataset> (e.g. "
        "capsnet_small-mnist; `capsnets list-models --pretrained` lists them), a .safetensors file or an "
        "https:// URL (with --sha256), instead of --checkpoint (default: none)",
    )
    parser.add_argument(
        "--sha256",
        metavar="HEX",
        help="the expected SHA-256 of the --pretrained file: required for an https:// URL, checked for a file "
        "(default: none; a shipped weight is checked against its model card)",
    )


def _add_checkpoint_args(parser: argparse.ArgumentParser, several: bool = False) -> None:
    """``--checkpoint`` (``several``: one or more, an ensemble) or ``--pretrained`` (with ``--sha256``), one of
    them required, and ``--device``."""
    source = parser.add_mutually_exclusive_group(required=True)
    if several:  # evaluate: one checkpoint, or an ensemble of them
        source.add_argument(
            "--checkpoint",
            nargs="+",
            metavar="PATH",
            help="run directory (its best, else last, checkpoint) or .safetensors file; several: "
            "their ensemble, scored by the mean of their class capsule lengths (or other "
            "scores), trained on the same data set (this or --pretrained is required, no default)",
        )
    else:
        source.add_argument(
            "--checkpoint",
            metavar="PATH",
            help="run directory (its best, else last, checkpoint) or .safetensors file (this or --pretrained is "
            "required, no default)",
        )
    _add_pretrained_arg(source, parser)
    parser.add_argument("--device", default="auto", help="auto (CUDA if available, else CPU), cpu, cuda, cuda:1 ...")


def _add_data_args(parser: argparse.ArgumentParser) -> None:
    """The test data of ``evaluate`` and ``reconstruct``: ``--dataset``, ``--data-dir``, ``--download``."""
    parser.add_argument("--dataset", help=f"test split of: {_datasets()} (default: the one the model was trained on)")
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help="folder holding the data set files (default: the one recorded by the training run, else $CAPSNETS_DATA)",
    )
    parser.add_argument("--download", action="store_true", help="download missing data set files")


def parse_key_values(items: Sequence[str], flag: str) -> dict[str, Any]:
    """``["a=1", "b=[1, 8, 8]"]`` -> ``{"a": 1, "b": [1, 8, 8]}`` (values parsed as YAML scalars/lists;
    ``1e-3`` is a float)."""
    values = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ArgumentError(f"{flag} {shown(item)} must look like KEY=VALUE")
        values[key.strip()] = load_yaml(text, f"the value of {flag} {shown(key.strip())}")
    return values


def nest_dotted(values: dict[str, Any]) -> dict[str, Any]:
    """``{"routing.iterations": 2, "num_classes": 5}`` -> ``{"routing": {"iterations": 2}, "num_classes": 5}``:
    a dotted key sets one entry of the mapping its first part names."""
    nested: dict[str, Any] = {}
    for key, value in values.items():
        head, dot, rest = key.partition(".")
        if not dot:
            nested[key] = value
            continue
        if head in nested and not isinstance(nested[head], dict):
            raise ArgumentError(
                f"{key}={shown(value)} sets an entry of {head}, which is also given as {shown(nested[head])}"
            )
        nested.setdefault(head, {})[rest] = value
    return nested


def config_from_args(args: argparse.Namespace):
    """The :class:`TrainConfig` described by parsed ``train`` arguments.

    The run directory is ``--out``, else the config file's ``out``, else ``runs/<model>``
    (:func:`~capsnets.engine.config.default_run_dir`); ``--resume`` without ``--config`` reads the run directory's ``config.yaml``.
    """
    config_file = args.config
    from_file = read_config_file(config_file) if config_file is not None else {}
    out = (
        args.out or from_file.get("out") or default_run_dir(args.model or from_file.get("model") or TrainConfig().model)
    )
    if config_file is None and args.resume:
        config_file = _run_config(Path(out))
    if args.lr_schedule == "cosine" and args.lr_decay is not None:
        raise ArgumentError(
            "--lr-decay sets the exponential schedule's per-epoch factor; the cosine schedule anneals to 0 by "
            "itself: leave out --lr-decay, or pass --lr-schedule exponential"
        )
    overrides = {name: getattr(args, name) for name in _CONFIG_FLAGS}
    overrides["out"] = out
    if args.threads is None and os.environ.get("OMP_NUM_THREADS"):  # obeyed, as torch read it at start
        overrides["threads"] = torch.get_num_threads()
    overrides["model_args"] = nest_dotted(parse_key_values(args.model_arg, "--model-arg")) or None
    overrides["loss_args"] = parse_key_values(args.loss_arg, "--loss-arg") or None
    return build_config(config_file, **overrides)


def _run_config(run_dir: Path) -> Path | dict[str, Any] | None:
    """The configuration ``--resume`` continues the run in ``run_dir`` with: its ``config.yaml``, or, where that is
    missing or damaged (not a mapping, unreadable, empty), the one recorded in its last checkpoint, with a warning
    (the trainer writes config.yaml again)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        problem = "is missing"
    else:
        try:
            if read_config_file(path):
                return path  # its values are checked where they are used, and a wrong one named
            problem = "is empty"
        except ValueError as err:
            problem = f"is damaged ({str(err).splitlines()[0]})"
    checkpoint = run_dir / "last.safetensors"
    recorded = (peek_sidecar(checkpoint) or {}).get("config")
    if not isinstance(recorded, dict):
        return path if path.is_file() else None
    logging.getLogger(__name__).warning(
        "'%s' %s; resuming with the configuration recorded in '%s' (config.yaml is written again)",
        path,
        problem,
        checkpoint,
    )
    return {key: value for key, value in recorded.items() if key != "out"}


def _recipe_note(config: TrainConfig) -> str | None:
    """One line naming the settings a training takes from its model's recipe (those the user left unset), or
    None for a model without one."""
    recipe = training_recipe(config.model)
    taken = [key for key, value in recipe.items() if key != "loss_args" and getattr(config, key) == value]
    if "loss_args" in recipe and config.loss == recipe.get("loss"):
        taken.append("loss_args")
    if not taken:
        return None
    shown_values = ", ".join(f"{key}={getattr(config, key)}" for key in taken)
    return f"{config.model} trains with its recipe: {shown_values} (a flag or --config changes any of them)"


def _train(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    note = None if args.resume else _recipe_note(config)
    if note:
        print(note)
    if config.threads is None:  # neither asked for nor recorded by the run it resumes: chosen now, and recorded
        config.threads = _set_threads(None) or torch.get_num_threads()
    replaced = _checkpoint_id(config.out) if args.overwrite else None  # the run --overwrite replaces, if any
    try:
        summary = train(config, resume=args.resume, overwrite=args.overwrite)
    except TrainingInterrupted as stop:  # Ctrl-C or SIGTERM: a checkpoint of the step it stopped at is saved
        hint = _resume_hint(config.out, args.argv, replaced, stop=stop)
        print(f"capsnets train: stopped by {signal.Signals(stop.signum).name}; {hint}", file=sys.stderr)
        return 128 + stop.signum  # the shell's status for a process ended by that signal: 130, 143
    except KeyboardInterrupt:
        print(f"capsnets train: interrupted; {_resume_hint(config.out, args.argv, replaced)}", file=sys.stderr)
        return 130
    except FileWriteError as err:  # a full disk...: what was saved before is kept
        if os.environ.get("CAPSNETS_DEBUG"):
            raise
        hint = _resume_hint(config.out, args.argv, replaced, err.remedy)
        print(f"capsnets train: error: {str(err).splitlines()[0]}; {hint}", file=sys.stderr)
        return 1
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    print(
        f"model {summary['model']} ({summary['parameters']:,} parameters) on {summary['dataset']}, "
        f"{summary['epochs']} epoch{'' if summary['epochs'] == 1 else 's'}, {summary['train_time_s']:.1f} s of training on {summary['device']}"
    )
    for line in task_named(summary.get("task", "classification")).summary_lines(summary):
        print(line)
    if summary.get("time_limited"):
        print(
            f"stopped by the time limit after epoch {summary['epochs']} of {summary['planned_epochs']}; "
            f"continue with: capsnets train --out {summary['run_dir']} --resume"
        )
    print(
        f"run directory: {summary['run_dir']} (figures: "
        f"{', '.join(Path(p).name for p in summary.get('figures', [])) or 'none'})"
    )
    return 0


def _resume_hint(
    out: str,
    argv: Sequence[str],
    replaced: str | None = None,
    remedy: str = "",
    stop: TrainingInterrupted | None = None,
) -> str:
    """What a stopped or failed training left in run directory ``out``, and the command that goes on from there:
    ``--resume`` from its last checkpoint (named by epoch, and step where it is mid-epoch), or, where it has none
    (or it is still the one of the run ``--overwrite`` was replacing, ``replaced``: its ``checkpoint_id``), the
    command line ``argv`` again (with ``--overwrite`` where the files left would be refused). ``remedy`` comes
    first where something must be fixed before (``"free disk space"``); ``stop``: the checkpoint was saved at
    that stop."""
    then = f"{remedy}, then " if remedy else ""
    last = Path(out) / "last.safetensors"
    saved = _checkpoint_position(last)
    resume = f"continue with: capsnets train --out {shlex.quote(str(out))} --resume"
    again = list(argv)
    if replaced is not None and _checkpoint_id(out) == replaced:
        return (
            f"the run that --overwrite was to replace is back in place, unchanged; {then}start the new one again "
            f"with: capsnets {shlex.join(again)}"
        )
    if saved is not None and stop is not None and checkpoint_epoch(last) == stop.epoch:
        return f"a checkpoint ({saved}) is saved; {resume}"
    if saved is not None:
        return f"the last checkpoint ({saved}) is kept; {then}{resume}"
    if run_files(out) and "--overwrite" not in again:
        again.append("--overwrite")
    return f"no checkpoint of the run was saved yet; {then}start it again with: capsnets {shlex.join(again)}"


def _checkpoint_id(out: str | os.PathLike) -> str | None:
    """The ``checkpoint_id`` of the last checkpoint in run directory ``out``, or None."""
    return (peek_sidecar(Path(out) / "last.safetensors") or {}).get("checkpoint_id")


def _checkpoint_position(path: str | os.PathLike) -> str | None:
    """Where the training checkpoint ``path`` stands: ``"epoch 2"`` (after its second epoch), ``"epoch 3, step 5"``
    (saved mid-epoch, 5 steps into the third), or None where there is no readable checkpoint."""
    sidecar = peek_sidecar(path) or {}
    epoch, step = sidecar.get("epoch"), (sidecar.get("training") or {}).get("step")
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        return None
    return f"epoch {epoch + 1}, step {step}" if isinstance(step, int) and step > 0 else f"epoch {epoch}"


def _load(args: argparse.Namespace, path: str):
    """Model, checkpoint, test data, its task and device for ``evaluate`` / ``reconstruct`` of the checkpoint
    ``path``."""
    device = resolve_device(args.device)
    checkpoint = load_checkpoint(path)
    model = model_from_checkpoint(checkpoint, device)
    return model, checkpoint, *_test_data(args, checkpoint, model, device), device


def _test_data(args: argparse.Namespace, checkpoint, model, device):
    """The test split ``model`` is evaluated on (``--dataset``, else the one ``checkpoint`` was trained on), and the
    task of the model on it (:func:`~capsnets.engine.tasks.task_for`)."""
    dataset = args.dataset or checkpoint.meta.get("dataset")
    if dataset is None:
        raise ArgumentError(f"checkpoint '{checkpoint.path}' does not record its data set; pass --dataset")
    recorded = checkpoint.meta.get("config") or {}
    data_dir = args.data_dir or recorded.get("data_dir")
    folder = str(dataset).startswith((FOLDER_PREFIX, SEGFOLDER_PREFIX))
    image_size = recorded.get("image_size") if folder else None
    data = load_dataset(dataset, root=data_dir, train=False, download=args.download, image_size=image_size).to(device)
    name = checkpoint.meta["model"]
    task = task_for(name, model_task(name), data, dataset, training=False)
    if not task.fits(model, data):
        raise ArgumentError(
            f"data set {dataset!r} ({data.num_classes} classes of {tuple(data.images.shape[1:])}) "
            f"does not fit the model ({model.num_classes} classes of {tuple(model.input_size)})"
        )
    return data, task


def output_label(checkpoint_path: str | os.PathLike, out: str | os.PathLike) -> str:
    """The name ``evaluate`` and ``reconstruct`` give the checkpoint in their file names: its file name without
    the suffix (``best``, ``last``), after its run directory's name when the files go to another directory
    (``run_best``), so that outputs from different checkpoints never replace each other or a run's own files."""
    path = Path(checkpoint_path)
    label = path.stem if Path(out).resolve() == path.parent.resolve() else f"{path.parent.name}_{path.stem}"
    return _file_safe(label)


def _data_label(name: str | None) -> str:
    """A data set in a file name: its name; a ``folder:PATH`` data set by the folder's own name."""
    if name and name.startswith(FOLDER_PREFIX):
        return _file_safe(f"folder_{Path(name[len(FOLDER_PREFIX) :]).name}")
    if name and name.startswith(SEGFOLDER_PREFIX):
        return _file_safe(f"segfolder_{Path(name[len(SEGFOLDER_PREFIX) :]).name}")
    return _file_safe(name or "test")


def _file_safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "checkpoint"


def _describe(checkpoint) -> str:
    """``PATH (epoch N)``: which checkpoint a figure or report shows."""
    epoch = checkpoint.meta.get("epoch")
    return f"{checkpoint.path}" + (f" (epoch {epoch})" if epoch is not None else "")


def _evaluate(args: argparse.Namespace) -> int:
    if args.pretrained is None and len(args.checkpoint) > 1:
        return _evaluate_ensemble(args)
    model, checkpoint, data, task, device = _load(args, _checkpoint_source(args, args.checkpoint))
    out = _output_folder(Path(args.out) if args.out else Path(".") if args.pretrained else checkpoint.path.parent, args)
    stem = f"evaluation_{output_label(checkpoint.path, out)}_{_data_label(data.name)}"
    _check_evaluation_files(task.report_files(out, stem), args)
    results = task.score(model, data, batch_size=args.batch_size, device=device, meta=checkpoint.meta)
    record = {"checkpoint": str(checkpoint.path), "epoch": checkpoint.meta.get("epoch")}
    _print_report(task.report(results, data, out, stem, record, title=_describe(checkpoint)))
    return 0


def _evaluate_ensemble(args: argparse.Namespace) -> int:
    """``evaluate`` of several checkpoints: each alone, then their ensemble (the mean of their scores)."""
    device = resolve_device(args.device)
    ensemble, checkpoints = load_ensemble([_checkpoint_path(path) for path in args.checkpoint], device)
    data, task = _test_data(args, checkpoints[0], ensemble, device)
    task.check_ensemble()
    paths = [checkpoint.path for checkpoint in checkpoints]
    out = Path(args.out) if args.out else Path(os.path.commonpath([path.parent.resolve() for path in paths]))
    out = _output_folder(out, args)
    stem = f"evaluation_ensemble_{ensemble_label(paths, out)}_{_data_label(data.name)}"
    _check_evaluation_files(task.report_files(out, stem), args)
    members = [
        task.score(model, data, batch_size=args.batch_size, device=device, meta=checkpoint.meta)["accuracy"]
        for model, checkpoint in zip(ensemble.members, checkpoints)
    ]
    results = task.score(ensemble, data, batch_size=args.batch_size, device=device, meta={})
    record = {
        "checkpoints": [str(path) for path in paths],
        "epochs": [checkpoint.meta.get("epoch") for checkpoint in checkpoints],
        "members": [{"checkpoint": str(path), "accuracy": accuracy} for path, accuracy in zip(paths, members)],
    }
    for path, accuracy in zip(paths, members):
        print(f"{percent(accuracy)}  {path} alone")
    _print_report(task.report(results, data, out, stem, record, title=f"ensemble of {len(paths)} checkpoints"))
    return 0


def _check_evaluation_files(files: Sequence[tuple[Path, str]], args: argparse.Namespace) -> None:
    """Before any work: the files of the evaluation's report (``(path, purpose)`` each) replace no file capsnets did
    not write as such, unless ``--overwrite`` (:func:`~capsnets.outputs.check_output`)."""
    for path, purpose in files:
        check_output(path, purpose, overwrite=args.overwrite, flag="evaluate's output", how="pass another --out")


def _print_report(report: tuple[str, Sequence[Path]]) -> None:
    """Print a task's report (:meth:`~capsnets.engine.tasks.Task.report`): its text, then the files written."""
    text, files = report
    print(text)
    print(f"wrote {' and '.join(str(path) for path in files)}")


def ensemble_label(paths: Sequence[str | os.PathLike], out: str | os.PathLike) -> str:
    """The name ``evaluate`` gives an ensemble in its file names: its checkpoints' :func:`output_label` joined by
    ``+``; for a long list the first one's, the number of the others and a digest of all their paths."""
    labels = [output_label(path, out) for path in paths]
    if len("+".join(labels)) <= 120:
        return "+".join(labels)
    digest = hashlib.sha1("\n".join(str(Path(path).resolve()) for path in paths).encode()).hexdigest()[:8]
    return f"{labels[0]}+{len(labels) - 1}_more_{digest}"


def _reconstruct(args: argparse.Namespace) -> int:
    # matplotlib is slow to import; only figures need it
    from capsnets.plots import plot_reconstructions  # noqa: PLC0415

    if args.n < 1:
        raise ArgumentError(f"--n must be at least 1, got {args.n}")
    model, checkpoint, data, task, device = _load(args, _checkpoint_source(args, [args.checkpoint]))
    out = _output_folder(Path(args.out) if args.out else Path(".") if args.pretrained else checkpoint.path.parent, args)
    png = out / f"reconstructions_{output_label(checkpoint.path, out)}.png"
    check_output(png, "figure", overwrite=args.overwrite, flag="reconstruct's output", how="pass another --out")
    samples = task.reconstructions(model, data, args.n, device)
    if samples is None:
        raise ArgumentError(
            f"model {checkpoint.meta['model']!r} has no decoder, so it cannot reconstruct; "
            "use a capsule model with a reconstruction decoder"
        )
    out.mkdir(parents=True, exist_ok=True)
    png = plot_reconstructions(
        samples["images"],
        samples["reconstructions"],
        png,
        labels=samples["labels"],
        predictions=samples["predictions"],
        class_names=[str(name) for name in data.classes] or None,
        n=len(samples["images"]),
        title=f"{_describe(checkpoint)}, {data.name or 'test'} test images",
    )
    print(f"wrote {png}")
    return 0


def _export(args: argparse.Namespace) -> int:
    checkpoint = load_checkpoint(_checkpoint_source(args, [args.checkpoint]))
    model = model_from_checkpoint(checkpoint, "cpu")
    suffix = EXPORT_FORMATS[args.format]
    out = Path(args.out) if args.out else Path(checkpoint.path.stem + suffix) if args.pretrained else None
    flag = "--out" if args.out else "the default --out"
    out = _output_file(out or checkpoint.path.with_suffix(suffix), flag, f"a {suffix}")
    if out.suffix.lower() != suffix:
        raise ArgumentError(
            f"--out '{out}' does not end in {suffix}; name a {suffix} file for --format {args.format} "
            "(so that no other file, an image or a JSON, is replaced by it)"
        )
    check_output(out, args.format, overwrite=args.overwrite, flag=flag)
    report = export_model(model, out, args.format, overwrite=args.overwrite)
    print(
        f"wrote {report.path} ({report.bytes / 1e6:.1f} MB, {report.format}, outputs: "
        f"{', '.join(report.output_names)}; batch dimension dynamic) in {report.seconds:.0f} s"
    )
    print(
        f"checked against PyTorch on batches of {' and '.join(map(str, report.checked_batches))}: largest "
        f"difference {report.max_abs_difference:.2g}"
    )
    return 0


def _predict(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise ArgumentError(f"--batch-size must be at least 1, got {args.batch_size}")
    files = collect_image_files(args.inputs)
    json_out = _json_file(Path(args.json), files, args.overwrite) if args.json not in (None, "-") else None
    if args.pretrained is None and Path(args.checkpoint).suffix.lower() == ".onnx":
        source, model = Path(args.checkpoint), _onnx_model(args)
    else:
        checkpoint = load_checkpoint(_checkpoint_source(args, [args.checkpoint]))
        source, model = checkpoint.path, model_from_checkpoint(checkpoint, resolve_device(args.device))
    meta = model.checkpoint_meta
    task = checkpoint_task(meta)
    out = _prediction_folder(task, Path(args.out or "masks"), files, args)
    results = task.predict(
        model,
        files,
        meta=meta,
        out=out,
        batch_size=args.batch_size,
        invert=args.invert,
        overwrite=args.overwrite,
    )
    records = [result.to_dict() for result in results]
    header = {
        **json_header("predictions"),
        "checkpoint": str(source),
        "model": meta["model"],
        "dataset": meta.get("dataset"),
        **task.prediction_header(meta, model),
    }
    text = json.dumps({**header, "predictions": records}, indent=2) + "\n"
    if args.json == "-":
        print(text, end="")
        return 0
    for result in results:
        print(task.format_prediction(result))
    if json_out is not None:
        atomic_write_text(json_out, text)
        print(f"wrote {json_out}")
    return 0


def _onnx_model(args: argparse.Namespace) -> OnnxModel:
    """``predict --checkpoint FILE.onnx``: the exported file, run by onnxruntime on the CPU (``--device`` auto or
    cpu); a missing onnxruntime is reported in one line, with how to install it."""
    if args.device not in ("auto", "cpu"):
        raise ArgumentError(
            f"--device {args.device}: an .onnx file is run by onnxruntime on the CPU; leave --device out, or predict "
            "with the checkpoint it was exported from"
        )
    try:
        return OnnxModel(args.checkpoint)
    except ImportError as err:
        raise ArgumentError(str(err)) from None


def _json_file(path: Path, files: Sequence[Path], overwrite: bool) -> Path:
    """``predict --json FILE``, checked before any work (:func:`_output_file`). An image's name is refused, and so is
    an existing file capsnets did not write, with how to print the JSON instead: ``--json`` takes a file name, so
    ``--json digit0.png photo.png`` names ``digit0.png`` as the JSON file, not as an image."""
    hint = (
        "--json takes the file to write the JSON to; to print the JSON, put --json after the images or write --json -"
    )
    path = _output_file(path, "--json", "a new .json", inputs=files)
    if path.suffix.lower() in IMAGE_SUFFIXES:
        raise ArgumentError(
            f"--json '{path}' is an image's name, so it was not read as an image and nothing was written; {hint}; "
            "to save it, name a .json file: --json predictions.json"
        )
    try:
        return check_output(path, "predictions", overwrite=overwrite, flag="--json")
    except OutputExistsError as err:
        raise OutputExistsError(f"{err} ({hint})") from err


#: Files a run directory holds that an output flag must never replace (a ``.json`` is one when it is a
#: checkpoint's sidecar or a run's summary).
RUN_FILE_SUFFIXES = (".safetensors", ".yaml", ".jsonl")


def _not_a_run_file(path: Path, flag: str, what: str) -> Path:
    """``path``, unless writing it would replace a file of a training run (a checkpoint, its sidecar, the config,
    the metrics or the summary): then an :class:`ArgumentError` naming ``flag``."""
    sidecar = path.suffix.lower() == ".json" and (
        path.with_suffix(".safetensors").exists()
        or (path.name == "summary.json" and path.with_name("config.yaml").exists())
    )
    if path.suffix.lower() in RUN_FILE_SUFFIXES or sidecar:
        raise ArgumentError(f"{flag} '{path}' would replace a file of a training run; name {what} file elsewhere")
    return path


def _output_file(path: Path, flag: str, what: str, inputs: Sequence[Path] = ()) -> Path:
    """``path``, checked before any work as the file an output flag writes: not a file of a training run
    (:func:`_not_a_run_file`), not one of the ``inputs`` read, not a folder or a device, in a folder that exists
    and can be written; else an :class:`ArgumentError` naming ``flag`` and what to do instead. Folders are not
    created for it: a mistyped folder is reported, not made. The caller then checks, with
    :func:`~capsnets.outputs.check_output`, that an existing file is one capsnets wrote for the same purpose."""
    _not_a_run_file(path, flag, what)
    if path.is_dir():
        raise ArgumentError(f"{flag} '{path}' is a folder; name {what} file (in it, or elsewhere)")
    if path.exists() and not path.is_file():
        raise ArgumentError(f"{flag} '{path}' is not a regular file (a device, a pipe...); name {what} file")
    if path.exists() and any(path.samefile(item) for item in inputs if item.exists()):
        raise ArgumentError(f"{flag} '{path}' is one of the files read as input; name another file for the output")
    folder = path.parent
    if not folder.exists():
        raise ArgumentError(
            f"{flag} '{path}': the folder '{folder}' does not exist; create it, or name a file in an existing folder"
        )
    problem = folder_write_problem(folder)
    if problem is not None and not Path(problem.filename).is_dir():
        raise ArgumentError(f"{flag} '{path}': '{problem.filename}' is a file, not a folder; name another file")
    if problem is not None:
        raise ArgumentError(
            f"{flag} '{path}': cannot write in '{problem.filename}' ({problem.strerror}); nothing in it was "
            f"changed; give {flag.split()[-1]} a file in a writable folder, or make '{problem.filename}' writable"
        )
    return path


def _output_folder(path: Path, args: argparse.Namespace) -> Path:
    """``path``, checked before any work as the folder a command writes its files to (``--out``, else its default,
    created where missing): not a file, and writable; else an :class:`ArgumentError` that says which folder,
    that nothing in it was changed, and how to go on."""
    given = f"--out '{path}'" if getattr(args, "out", None) else f"'{path}' (where the files go without --out)"
    if path.exists() and not path.is_dir():
        raise ArgumentError(f"{given} is a file, not a folder; pass --out with a folder")
    problem = folder_write_problem(path)
    if problem is not None and not Path(problem.filename).is_dir():
        raise ArgumentError(f"{given}: '{problem.filename}' is a file, not a folder; pass --out with another folder")
    if problem is not None:
        raise ArgumentError(
            f"cannot write in '{problem.filename}' ({problem.strerror}); nothing in it was changed; pass --out "
            f"DIR to write the files elsewhere, or make '{problem.filename}' writable"
        )
    return path


def _prediction_folder(task, out: Path, files: Sequence[Path], args: argparse.Namespace) -> Path:
    """``out``, checked before any work where ``task`` writes files there for the images ``files``
    (:meth:`~capsnets.engine.tasks.Task.prediction_files`: a segmentation's masks and overlays): the folder
    (:func:`_output_folder`), then that no file replaces one of the images read, and that none replaces a file
    capsnets did not write as such (:func:`~capsnets.outputs.check_output`, unless ``--overwrite``)."""
    outputs = task.prediction_files(files, out)
    if outputs:
        _output_folder(out, args)
    for path, what, source in outputs:
        if path.exists() and any(path.samefile(item) for item in files):
            raise ArgumentError(f"the {what} of '{source}' would replace the input image '{path}'; pass another --out")
        check_output(path, what, overwrite=args.overwrite, flag=f"the {what} of '{source}',")
    return out


def _checkpoint_source(args: argparse.Namespace, checkpoints: list[str] | None) -> str | Path:
    """The checkpoint a command reads: the weight ``--pretrained`` names (a shipped one, a file or a URL, checked
    against ``--sha256`` or its model card), else the one ``--checkpoint``."""
    if args.pretrained is None:
        return _checkpoint_path(checkpoints[0])
    return resolve_pretrained(args.pretrained, sha256=_pretrained_digest(args))


def _pretrained_digest(args: argparse.Namespace) -> str | None:
    """``--sha256``, checked: 64 hex digits, and given wherever ``--pretrained`` is a URL."""
    digest = args.sha256
    if digest is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
        raise ArgumentError(f"--sha256 {digest!r} is not a SHA-256: give its 64 hex digits")
    if urllib.parse.urlparse(str(args.pretrained)).scheme.lower() in ("http", "https") and digest is None:
        raise ArgumentError(
            f"--pretrained {args.pretrained}: a weight from a URL needs its expected digest; add --sha256 HEX "
            "(the model card or the publisher gives it)"
        )
    return digest


def _checkpoint_path(path: str) -> str:
    """``--checkpoint PATH``; the name of a shipped weight given there instead of a file is refused, naming
    ``--pretrained``."""
    if Path(path).exists():
        return path
    try:
        get_weights(path)
    except PretrainedError:
        return path
    raise ArgumentError(
        f"--checkpoint {path}: no such file; {path} is a pretrained weight shipped with the package, "
        f"so use --pretrained {path}"
    )


def _demo(args: argparse.Namespace) -> int:
    try:
        # optional dependencies: FastAPI and uvicorn (the demo extra)
        from capsnets.demo import app as server  # noqa: PLC0415
    except ImportError as err:
        raise ArgumentError(
            f"the demo needs FastAPI and uvicorn ({err.name or err} is missing): pip install -e '.[demo]'"
        ) from None

    with server.listen(args.host, args.port) as sock:  # a busy port is refused before the model is trained
        pretrained = args.pretrained or (DEMO_PRETRAINED if args.checkpoint is None and args.out is None else None)
        demo = load_demo_model(
            args.checkpoint,
            out=args.out or DEMO_RUN_DIR,
            pretrained=pretrained,
            sha256=_pretrained_digest(args) if args.pretrained else None,
            data_dir=args.data_dir,
        )
        print(f"model: {demo.name} ({demo.kind} capsules) on {demo.dataset or 'an unknown data set'}, {demo.source}")
        kernel_note = demo.kernel_note()  # the first prediction compiles the EM kernel: say so now
        if kernel_note is not None:
            print(f"capsnets demo: {kernel_note}")
        try:
            local = args.host == "localhost" or ipaddress.ip_address(args.host).is_loopback
        except ValueError:  # a host name
            local = False
        if not local:
            print(f"warning: listening on {args.host}: whoever can reach this machine can use the demo")
        print(f"capsnets demo: open {server.url(sock)} in a browser (Ctrl+C stops it)", flush=True)
        server.run_server(server.create_app(demo, args.host), sock)
    return 0


def _list_models(args: argparse.Namespace) -> int:
    pattern = args.name is not None and any(c in args.name for c in "*?[")
    if args.pretrained:
        print(format_pretrained(args.name))
        return 0
    if args.name is not None and not pattern:
        print(format_model_arguments(args.name))
        return 0
    names = list_models(args.name)
    if not names:
        raise ArgumentError(f"no model matches {args.name!r}; `capsnets list-models` lists them all")
    width = max(len(n) for n in names)
    for name in names:
        try:
            with torch.device("meta"):  # count parameters without allocating them
                count = count_parameters(create_model(name))
        except (RuntimeError, NotImplementedError):  # a builder that needs real tensors
            count = count_parameters(create_model(name))
        print(f"{name:<{width}}  {count:>12,}  {model_task(name)}")
    return 0


def format_pretrained(pattern: str | None = None) -> str:
    """The shipped pretrained weights (of the models ``pattern`` names or matches), one
    ``NAME  ACCURACY  DTYPE  SIZE  DEFAULT`` line each (from their model cards)."""
    if pattern is not None and not any(c in pattern for c in "*?[") and not get_model_weights(pattern):
        default_weights(pattern)  # an error naming the models with weights
    models = list_models(pattern, pretrained=True)
    weights = {name: w for model in models for name, w in get_model_weights(model).items()}
    if not weights:
        return "no pretrained weights are shipped" + (f" for {pattern!r}" if pattern else "")
    width = max(len(name) for name in weights)
    lines = [f"{'name':<{width}}  test acc.  dtype    size  default"]
    for name, weight in weights.items():
        size = weight.path.stat().st_size / 1e6 if weight.path.is_file() else float("nan")
        accuracy = weight.meta["metrics"][weight.dataset]["accuracy"]
        dtype = weight.meta["card"].get("dtype", "?")
        default = "yes" if weight.default else ""
        lines.append(f"{name:<{width}}  {percent(accuracy):>9}  {dtype:<7}  {size:.1f} MB  {default}".rstrip())
    return "\n".join(lines)


#: Builder arguments that are no --model-arg: the trainer places the model (--device, --amp).
_PLACEMENT_ARGS = ("device", "dtype")


def format_model_arguments(name: str) -> str:
    """The ``--model-arg`` keys of model ``name``, one ``KEY=DEFAULT  # what it takes`` line each, DEFAULT written
    as ``--model-arg`` reads it (YAML, where ``#`` starts a comment); from the builder's signature
    (:func:`capsnets.models.model_schema`), then the settings of its default routing as ``routing.KEY=VALUE``
    (:func:`capsnets.models.routing_keys`)."""
    lines = [
        f"{key}={_yaml_value(argument.default)}  # {argument.expects}"
        for key, argument in model_schema(name).items()
        if key not in _PLACEMENT_ARGS
    ]
    lines += [
        f"routing.{key}={_yaml_value(value)}  # a setting of the default routing"
        for key, value in routing_keys(name).items()
    ]
    return "\n".join(lines)


def _yaml_value(value: Any) -> str:
    """``value`` in one line of YAML flow style (``null``, ``true``, ``[1, 28, 28]``); tuples as lists."""
    plain = list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) else value
    try:
        text = yaml.safe_dump(plain, default_flow_style=True, width=1_000_000).strip()
    except yaml.YAMLError:  # not a YAML value (an object): as Python shows it
        return repr(value)
    return text.removesuffix("...").strip()
