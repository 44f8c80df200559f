"""Fuzzing the command line: argument lists for every sub-command, built from the real parser
(:func:`capsnets.cli.build_parser`), mixing valid values with garbage strings, huge, negative, NaN and infinite
numbers, unknown keys in ``--model-arg`` / ``--loss-arg`` / ``--set``, damaged config files and bad paths.
``main(argv)`` must return 0 or 1 (or argparse's ``SystemExit`` 0/2), stderr must hold no traceback and, on
status 1, exactly one error line.

Values are right four times in five (so that most examples get past argparse and the checks, into the code that
works), else wrong. Every training is kept tiny: ``--limit-train 8 --limit-test 8 --epochs 1 --device cpu
--no-progress`` and an ``--out`` in a temporary folder are appended unless the example sets them (to small values:
no value of ``--epochs`` / ``--limit-*`` above 3). Not fuzzed, for time: ``--compile`` (torch.compile takes
minutes on a CPU), the ``viewpoints`` data set (rendered on first use, ~30 s) and models too large to train in a
second (``cnn_baseline``, ``pix2pix``, ``unet``). Figures are replaced by nothing, experiments by a stub that only
writes a report (their settings are still checked), and downloads fail as offline. Output options are drawn among
new files and the user's own (an image, a folder of files named as capsnets names its outputs); without
``--overwrite``, no file that was there before may change. The short version runs 50 examples, derandomized;
``-m faults_long`` runs 600, random.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from reliability.faults import copy_run, one_error_line

from capsnets.cli import build_parser, main

MODELS = [
    "capsnet_digits",
    "capsnet",
    "capsnet_small",
    "matrix_capsnet_small",
    "cnn_smallnorb_narrow",
    "cnn_baseline_narrow",
    "segcaps_small",
    "transforming_autoencoder",
    "capsnet_dgits",
]
DATASETS = ["digits", "mnist", "fashion-mnist", "smallnorb", "DIGITS", "cifar"]
DEVICES = ["cpu", "auto", "cuda", "cuda:0", "cuda:7", "mps", "cpu:1", "cuda:x", "CPU", "xpu", "meta"]
LOSSES = ["margin", "spread", "cross_entropy", "transforming", "hinge", "segcaps", "binary_segmentation"]
NOT_HUGE = ("iterations", "routing.iterations")  # (iteration counts: far too slow)
LOSS_KEYS = [
    "reconstruction_weight",
    "m_pos",
    "m_neg",
    "down_weight",
    "margin_start",
    "margin_end",
    "ramp",
    "label_smoothing",
    "m_plus",
    "bogus",
]
#: YAML values for --model-arg / --loss-arg / --set, valid and invalid.
VALUES = [
    "1",
    "2",
    "0",
    "-1",
    "1.5",
    "1e-3",
    ".nan",
    ".inf",
    "-.inf",
    "nan",
    "null",
    "true",
    "false",
    "x",
    "'2'",
    "[1, 8, 8]",
    "[1, 28, 28]",
    "[]",
    "[1, -8, 8]",
    "{}",
    "{type: dynamic, iterations: 2}",
    "{type: bogus}",
    "{type: em}",
    "[[1]]",
    "1e400",
]
HUGE = ["1000000000000000", "[1, 1000000000000000, 8]", "[1000000000000000, 8]"]  # sizes: refused or out of memory

GARBAGE = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "-",
            "x",
            "None",
            "null",
            "[1, 2]",
            "{a: 1}",
            "{",
            "é",
            "1e309",
            "0x10",
            "3.0",
            "=",
            "a=b=c",
            "~",
            "/",
            "..",
        ]
    ),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8),
)
BAD_INTEGERS = st.sampled_from([0, -1, -3, 2**31, 2**63, 2**64, 10**30, -(10**30)]).map(str)
BAD_FLOATS = st.one_of(
    st.sampled_from([0.0, -0.0, -1.0, 1e300, -1e300, 1e39, float("nan"), float("inf"), float("-inf")]), st.floats()
).map(repr)
#: What each option takes (a value, a drawn value or a path), and what is wrong for it; ints and floats not named
#: take VALID_INT / VALID_FLOAT.
VALID = {
    "epochs": st.integers(1, 3),
    "limit_train": st.integers(1, 3),
    "limit_test": st.integers(1, 3),
    "n": st.integers(1, 4),
    "batch_size": st.integers(1, 16),
    "lr": st.floats(1e-5, 0.1),
    "lr_decay": st.floats(0.5, 1.0),
    "weight_decay": st.sampled_from([0.0, 1e-4]),
    "seed": st.integers(0, 2**32),
    "max_shift": st.integers(0, 3),
    "time_limit_minutes": st.floats(1e-6, 10.0),
    "seeds": st.integers(0, 9),
    "model": st.sampled_from(MODELS[:-1]),
    "dataset": st.sampled_from(DATASETS[:3]),
    "device": st.sampled_from(["cpu", "auto"]),
    "loss": st.sampled_from(LOSSES[:3]),
    "amp": st.sampled_from(["auto", "bf16", "off"]),
}
INVALID = {
    "epochs": st.integers(-3, 0),
    "limit_train": st.integers(-3, 0),
    "limit_test": st.integers(-3, 0),
    "n": st.integers(-3, 0),
    "model": st.sampled_from([MODELS[-1], "unet", "capspix2pix_small", ""]),
    "dataset": st.sampled_from(DATASETS[3:]),
    "device": st.sampled_from(DEVICES[2:]),
    "loss": st.sampled_from(LOSSES[3:]),
    "amp": st.just("fp16"),
}
VALID_INT, VALID_FLOAT = st.integers(1, 3), st.floats(1e-3, 1.0)


def _one_in_five_wrong(valid, invalid):
    """A valid value four times in five, else an invalid one or garbage (more would end most examples in
    argparse or validation, before the code that works)."""
    kind = st.sampled_from(["valid"] * 8 + ["invalid", "garbage"])
    return kind.flatmap(lambda k: {"valid": valid, "invalid": invalid, "garbage": GARBAGE}[k])


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


#: Items that are right (for the default model, the margin loss, every experiment).
VALID_ITEMS = {
    "model_arg": [
        "routing.iterations=1",
        "routing.iterations=2",
        "reconstruction=false",
        "routing.detach_routing=false",
    ],
    "loss_arg": ["reconstruction_weight=0.001", "reconstruction_weight=0"],
    "set": ["train_minutes=1", "batch_size=8"],
}


def _key_value(keys: list[str], valid: list[str]):
    """``KEY=VALUE`` items: known and unknown keys, valid and invalid values, huge ones (not for :data:`NOT_HUGE`)."""

    def item(key, value):
        return f"{key}={value}"

    plain = st.builds(item, st.sampled_from(keys), st.sampled_from(VALUES))
    huge = st.builds(item, st.sampled_from([k for k in keys if k not in NOT_HUGE]), st.sampled_from(HUGE))
    return _one_in_five_wrong(st.sampled_from(valid), st.one_of(plain, plain, huge))


def _model_keys() -> list[str]:
    from capsnets.models import model_schema

    keys = set()
    for name in MODELS[:-1]:
        keys.update(model_schema(name))
    return sorted(keys - {"device", "dtype"}) + ["bogus", "iterations", "routing.iterations", "routing.bogus"]


def _setting_keys() -> list[str]:
    from capsnets.experiments import list_experiments
    from capsnets.experiments.common import get_experiment

    keys = {f.name for n in list_experiments() for f in dataclasses.fields(get_experiment(n).settings)}
    return sorted(keys) + ["bogus"]


class _Paths:
    """The paths an example may name: a trained run, files, folders and nothing."""

    def __init__(self, root: Path, run: Path) -> None:
        self.root, self.run = root, run
        self.file = root / "file.txt"
        self.file.write_text("not a run\n")
        self.empty = root / "empty"
        self.empty.mkdir()
        self.missing = root / "missing" / "deeper"
        self.mine = root / "mine"  # a user's folder, holding files named as capsnets names its outputs
        self.mine.mkdir()
        for name in ("report.md", "predictions.json", "dark_mask.png", "model.onnx", "reconstructions_run_best.png"):
            (self.mine / name).write_bytes(b"mine")

    def images(self):
        """Image files and folders for ``predict``: readable ones (of any size and mode), text, nothing."""
        from PIL import Image

        folder = self.root / "images"
        if not folder.is_dir():
            folder.mkdir()
            Image.new("L", (8, 8), 0).save(folder / "dark.png")
            Image.new("RGB", (30, 20), "white").save(folder / "paper.jpg")
            Image.new("RGBA", (5, 90), (0, 0, 0, 0)).save(self.root / "clear.png")
        return st.sampled_from(
            [
                folder,
                folder / "dark.png",
                folder / "paper.jpg",
                self.root / "clear.png",
                self.file,
                self.empty,
                self.missing,
            ]
        ).map(str)

    def checkpoints(self):
        run = self.run
        return st.sampled_from(
            [
                run,
                run / "best.safetensors",
                run / "last.json",
                run / "config.yaml",
                self.file,
                self.empty,
                self.missing,
                run / "nope.safetensors",
            ]
        ).map(str)

    def data_dirs(self):
        shared = os.environ.get("CAPSNETS_DATA") or str(self.empty)
        return st.sampled_from([shared, self.empty, self.missing, self.file]).map(str)

    def outs(self):
        return st.sampled_from(
            [self.root / "out", self.root / "out" / "sub", self.file, self.mine, self.mine / "model.onnx"]
        ).map(str)

    def jsons(self):
        """``predict --json`` files: new, the user's, an image read as input or not, nothing (print)."""
        names = [self.root / "p.json", self.mine / "predictions.json", self.root / "images" / "dark.png", self.file]
        return st.sampled_from([*names, self.root / "clear.png", "-"]).map(str)

    def configs(self, data):
        """A config file: TrainConfig keys with fuzzed values, garbage, or a path that is no file."""
        from capsnets.engine.config import field_names

        kind = data.draw(st.sampled_from(["keys", "keys", "text", "path"]), label="config kind")
        path = self.root / "config.yaml"
        if kind == "path":
            return data.draw(st.sampled_from([self.missing, self.empty, self.run / "best.safetensors"]).map(str))
        if kind == "text":
            path.write_text(data.draw(st.sampled_from(["", "[1, 2]", "epochs: [", "\x7fELF", "7", "model:\n- a"])))
            return str(path)
        keys = [k for k in field_names() if k not in ("epochs", "limit_train", "limit_test", "compile")] + ["bogus"]
        values = {
            "model": st.sampled_from(MODELS),
            "dataset": st.sampled_from(DATASETS[:3]),
            "data_dir": self.data_dirs(),
        }
        entries = data.draw(st.dictionaries(st.sampled_from(keys), st.sampled_from(VALUES), max_size=3))
        lines = [f"{k}: {data.draw(values[k]) if k in values else v}" for k, v in entries.items()]
        path.write_text("\n".join(lines) + "\n")
        return str(path)


def _value(data, command: str, action: argparse.Action, paths: _Paths) -> str:
    dest = action.dest
    if dest == "config":
        return paths.configs(data)
    paths_of = {
        "data_dir": paths.data_dirs,
        "out": paths.outs,
        "checkpoint": paths.checkpoints,
        "checkpoint_dir": paths.outs,
        "json": paths.jsons,
    }
    if dest in paths_of:
        return data.draw(_one_in_five_wrong(paths_of[dest](), GARBAGE), label=dest)
    number = {int: (VALID_INT, BAD_INTEGERS), float: (VALID_FLOAT, BAD_FLOATS)}.get(action.type, (GARBAGE, GARBAGE))
    valid, invalid = VALID.get(dest, number[0]), INVALID.get(dest, number[1])
    return str(data.draw(_one_in_five_wrong(valid, invalid), label=dest))


def _argv(data, paths: _Paths) -> list[str]:
    """One command line: a sub-command, some of its options in any order, each with a drawn value."""
    parsers = _subcommands()
    weights = {
        "train": 5,
        "evaluate": 2,
        "reconstruct": 1,
        "predict": 2,
        "export": 1,
        "experiment": 1,
        "list-models": 1,
        "demo": 1,
    }
    assert set(weights) == set(parsers), "a new sub-command: give it a weight"
    command = data.draw(st.sampled_from([c for c, n in weights.items() for _ in range(n)]), label="command")
    argv = [command]
    actions = [a for a in parsers[command]._actions if a.option_strings and a.dest != "help" and a.dest != "compile"]
    positional = [a for a in parsers[command]._actions if not a.option_strings]
    if command == "predict":
        argv += data.draw(st.lists(paths.images(), min_size=1, max_size=3), label="images")
    elif positional:
        names = _positional_names(command)
        if data.draw(st.booleans(), label="positional"):
            argv.append(data.draw(_one_in_five_wrong(st.sampled_from(names), st.just("bogus")), label="name"))
    chosen = (
        data.draw(st.lists(st.sampled_from(actions), max_size=6, unique_by=lambda a: a.dest), label="options")
        if actions
        else []
    )
    if command in ("evaluate", "reconstruct", "predict", "export") and data.draw(
        st.sampled_from([True] * 9 + [False]), label="ckpt"
    ):
        chosen = [a for a in actions if a.dest == "checkpoint"] + [a for a in chosen if a.dest != "checkpoint"]
    for action in chosen:
        option = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(option)
        elif isinstance(action, argparse._AppendAction):
            keys = {"model_arg": _model_keys(), "loss_arg": LOSS_KEYS, "set": _setting_keys()}[action.dest]
            items = _key_value(keys, VALID_ITEMS[action.dest])
            for item in data.draw(st.lists(items, min_size=1, max_size=3), label=action.dest):
                argv += [option, item]
        elif action.nargs == "+" and action.dest == "checkpoint":  # evaluate: one checkpoint or an ensemble
            checkpoints = _one_in_five_wrong(paths.checkpoints(), GARBAGE)
            argv += [option, *data.draw(st.lists(checkpoints, min_size=1, max_size=3), label=action.dest)]
        elif action.nargs == "+":
            seeds = _one_in_five_wrong(VALID["seeds"], BAD_INTEGERS)
            argv += [option, *map(str, data.draw(st.lists(seeds, min_size=1, max_size=3), label=action.dest))]
        else:
            argv += [option, _value(data, command, action, paths)]
    if data.draw(st.sampled_from([False] * 19 + [True]), label="help"):  # (integers(0, 19) favours 0)
        argv.insert(data.draw(st.integers(1, len(argv))), "--help")
    return _tiny(command, argv, paths)


def _positional_names(command: str) -> list[str]:
    from capsnets.experiments import list_experiments
    from capsnets.models import list_models

    return list_models() if command == "list-models" else [*list_experiments(), "bogus"]


def _tiny(command: str, argv: list[str], paths: _Paths) -> list[str]:
    """Append what keeps a command small and inside the example's folder, unless the example set it."""
    given = set(argv)
    extra = []
    if command == "train":
        extra = [
            ("--limit-train", "8"),
            ("--limit-test", "8"),
            ("--epochs", "1"),
            ("--device", "cpu"),
            ("--out", str(paths.root / "run")),
        ]
        if "--no-progress" not in given:
            argv.append("--no-progress")
    elif command in ("evaluate", "reconstruct"):
        extra = [("--device", "cpu")]
    elif command == "predict":
        extra = [("--device", "cpu"), ("--out", str(paths.root / "masks"))]
    elif command == "experiment":
        extra = [("--device", "cpu"), ("--out", str(paths.root / "experiment"))]
    return argv + [x for option, value in extra if option not in given for x in (option, value)]


@pytest.fixture(scope="module")
def trained(clean_runs, tmp_path_factory) -> Path:
    """A run to evaluate and reconstruct (a copy: examples write their outputs beside it)."""
    return copy_run(clean_runs[1], tmp_path_factory.mktemp("fuzz") / "run")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """A data root of links to the real MNIST and Fashion-MNIST folders (if any): what an example creates there
    (a smallnorb/ folder for --download) stays out of the shared data."""
    root = tmp_path_factory.mktemp("fuzz-data")
    shared = os.environ.get("CAPSNETS_DATA")
    for name in ("mnist", "fashion-mnist"):
        if shared and (Path(shared) / name).is_dir():
            (root / name).symlink_to(Path(shared) / name)
    return root


@pytest.fixture
def offline_and_quick(monkeypatch, tmp_path, data_root):
    """No network, no figures, experiments, the exporters' tracing (tests/test_export.py runs them) and the demo's web
    server stubbed (tests/demo/ runs it), the data root a folder of links, and the working directory a temporary
    folder."""
    from capsnets import export, plots
    from capsnets.engine import reporting
    from capsnets.experiments import common
    from capsnets.experiments.report import write_report

    def offline(*args, **kwargs):
        raise urllib.error.URLError("offline (fuzz test)")

    def stub_figure(*args, **kwargs):
        out = Path(next(a for a in (*args, *kwargs.values()) if isinstance(a, (str, Path)) and str(a).endswith(".png")))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"png")
        return out

    def stub_experiment(out, settings, **kwargs):
        return write_report(out, "stub", [("Settings", str(settings))], metrics={"accuracy": 0.5})

    def stub_export(model, path, format="onnx", **kwargs):  # what export_model checks and writes, without tracing
        export.ExportableModel(model)
        Path(path).write_bytes(b"exported")
        return export.ExportReport(str(path), format, ["scores"], 0.0, [1, 5], 0.0, 8)

    monkeypatch.setenv("CAPSNETS_DATA", str(data_root))
    try:  # demo: the server returns at once (the socket is still bound), and its model trains in a second
        from capsnets.demo import app as demo_app
        from capsnets.demo import source as demo_source

        monkeypatch.setattr(demo_app, "run_server", lambda app, sock: None)
        monkeypatch.setattr(
            demo_source,
            "DEMO_TRAINING",
            {**demo_source.DEMO_TRAINING, "epochs": 1, "limit_train": 8, "limit_test": 8, "progress": False},
        )
    except ImportError:  # no demo extra: the command says so in one line
        pass
    monkeypatch.setattr(export, "export_model", stub_export)
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
    monkeypatch.setattr(plots, "plot_confusion_matrix", stub_figure)
    monkeypatch.setattr(plots, "plot_reconstructions", stub_figure)
    for name, experiment in list(common._EXPERIMENTS.items()):
        monkeypatch.setitem(common._EXPERIMENTS, name, dataclasses.replace(experiment, run=stub_experiment))
    monkeypatch.chdir(tmp_path)


class _TooSlow(BaseException):
    pass


def _alarm(signum, frame):
    raise _TooSlow("an example ran for more than 120 s")


def _check(argv: list[str], capsys, caplog, root: Path | None = None) -> None:
    """Run ``argv``: it ends in status 0, 1 or 2 with no traceback, one error line on status 1, and, without
    ``--overwrite``, every file that was under ``root`` before (the user's) still holds its bytes."""
    files = [path for path in root.rglob("*") if path.is_file()] if root is not None else []
    before = {path: path.read_bytes() for path in files}
    caplog.clear()
    capsys.readouterr()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(120)
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse: --help (0) or a bad argument (2)
        status = exit_.code
        assert status in (0, 2), f"{argv}: SystemExit({status!r})"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in caplog.text, f"{argv}:\n{err}{caplog.text}"
    assert status in (0, 1, 2), f"{argv}: status {status}"
    if status == 1:
        one_error_line(err, argv[0])
    if "--overwrite" not in argv:
        changed = [str(path) for path, content in before.items() if not path.is_file() or path.read_bytes() != content]
        assert not changed, f"{argv}: replaced {changed}"
    trained = " (trained)" if "run directory:" in out else ""
    event(f"{argv[0]}: status {status}{trained}")  # pytest --hypothesis-show-statistics


FUZZ_SETTINGS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))


@settings(max_examples=50, derandomize=True, **FUZZ_SETTINGS)
@given(data=st.data())
def test_fuzzed_command_lines(trained, offline_and_quick, capsys, caplog, data):
    with tempfile.TemporaryDirectory() as root:
        argv = _argv(data, _Paths(Path(root), trained))
        _check(argv, capsys, caplog, Path(root))


@pytest.mark.faults_long
@settings(max_examples=600, **FUZZ_SETTINGS)
@given(data=st.data())
def test_many_fuzzed_command_lines(trained, offline_and_quick, capsys, caplog, data):
    with tempfile.TemporaryDirectory() as root:
        argv = _argv(data, _Paths(Path(root), trained))
        _check(argv, capsys, caplog, Path(root))


TRAIN_TINY = ["train", "--limit-train", "8", "--limit-test", "8", "--epochs", "1", "--device", "cpu", "--no-progress"]


@pytest.mark.parametrize(
    "argv, named",
    [
        ([*TRAIN_TINY, "--lr", "1e39"], "lr=1e+39"),  # was: RuntimeError from Adam's step (float32 overflow)
        ([*TRAIN_TINY, "--weight-decay", "1e300"], "weight_decay=1e+300"),  # the same
        ([*TRAIN_TINY, "--max-shift", str(10**21)], "max_shift="),  # was: "Overflow when unpacking long long"
        ([*TRAIN_TINY, "--seed", str(2**64)], "seed=18446744073709551616"),  # the same
        (["experiment", "multimnist", "--smoke", "--device", "cpu", "--seed", str(2**64)], "seed must be"),  # the same
        (["experiment", "multimnist", "--smoke", "--device", "cpu", "--seeds", "1", str(2**32)], "seed must be"),
    ],
)
def test_values_of_the_fuzz_tried_one_by_one(argv, named, offline_and_quick, tmp_path, capsys):
    """Values of the fuzz's strategies that, tried one by one, ended in a traceback or in a message naming
    nothing (the fuzz meets them too rarely): now one line naming the value."""
    argv = [*argv, "--out", str(tmp_path / "out")]
    assert main(argv) == 1
    assert named in one_error_line(capsys.readouterr().err, argv[0])
