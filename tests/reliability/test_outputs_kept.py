"""No output option replaces a file capsnets did not write: ``predict --json`` and its masks, ``export --out``,
``evaluate``, ``reconstruct``, ``experiment --out`` and ``train --out`` refuse an existing file unless capsnets
wrote it for the same purpose (its mark, :mod:`capsnets.outputs`) or ``--overwrite`` is given. Each refusal is one
line that names the file and how to go on, before any work, and the file keeps its bytes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image
from reliability.faults import copy_run, one_error_line, train_args

from capsnets.cli import main
from capsnets.engine import reporting
from capsnets.outputs import json_header, written_for


@pytest.fixture(scope="module")
def run(clean_runs, tmp_path_factory):
    """A copy of the session's one-epoch run (the commands write beside it)."""
    return copy_run(clean_runs[1], tmp_path_factory.mktemp("kept") / "run")


@pytest.fixture
def images(tmp_path, monkeypatch):
    """The first-day folder: a digit, a photo and a blank page, in the current directory."""
    monkeypatch.chdir(tmp_path)
    Image.new("L", (8, 8), 0).save("digit0.png")
    Image.new("RGB", (32, 24), "white").save("photo.jpg")
    Image.new("L", (8, 8), 255).save("blank.png")
    return tmp_path


def _refused(argv, capsys, *expected) -> str:
    assert main(argv) == 1
    line = one_error_line(capsys.readouterr().err, argv[0])
    assert all(text in line for text in expected), line
    return line


def test_the_first_day_command_keeps_the_image(run, images, capsys):
    """``--json`` takes a file name, so it took ``digit0.png``: refused, the image kept, and the message says how
    to print the JSON instead."""
    before = (images / "digit0.png").read_bytes()
    argv = ["predict", "--checkpoint", str(run), "--json", "digit0.png", "photo.jpg", "blank.png"]
    _refused(argv, capsys, "--json 'digit0.png' is an image's name", "put --json after the images", "--json -")
    assert (images / "digit0.png").read_bytes() == before
    assert main(["predict", "--checkpoint", str(run), "digit0.png", "photo.jpg", "blank.png", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)  # --json with no file prints the JSON
    assert printed["capsnets"]["content"] == "predictions" and len(printed["predictions"]) == 3
    assert main(["predict", "--checkpoint", str(run), "--json", "-", "photo.jpg"]) == 0
    assert len(json.loads(capsys.readouterr().out)["predictions"]) == 1


def test_predict_json_replaces_only_its_own_file(run, images, capsys):
    (images / "notes.json").write_text('{"mine": true}')
    argv = ["predict", "--checkpoint", str(run), "photo.jpg", "--json", "notes.json"]
    _refused(argv, capsys, "--json 'notes.json' already exists and is a file capsnets did not write", "--overwrite")
    assert (images / "notes.json").read_text() == '{"mine": true}'
    assert main([*argv, "--overwrite"]) == 0
    assert written_for(images / "notes.json") == "predictions"
    assert main(["predict", "--checkpoint", str(run), "blank.png", "--json", "notes.json"]) == 0  # its own: replaced
    assert json.loads((images / "notes.json").read_text())["predictions"][0]["path"] == "blank.png"
    (images / "e.json").write_text(json.dumps({**json_header("evaluation")}))
    _refused(["predict", "--checkpoint", str(run), "blank.png", "--json", "e.json"], capsys, "capsnets evaluation")


@pytest.mark.parametrize("format, suffix", [("onnx", ".onnx"), ("torch_export", ".pt2")])
def test_export_out_keeps_a_users_file(run, tmp_path, capsys, format, suffix):
    mine = tmp_path / f"user{suffix}"
    mine.write_bytes(b"mine")
    argv = ["export", "--checkpoint", str(run), "--format", format, "--out", str(mine)]
    _refused(argv, capsys, f"--out '{mine}' already exists and is a file capsnets did not write", "--overwrite")
    assert mine.read_bytes() == b"mine"


def test_export_replaces_its_own_export(run, tmp_path, capsys):
    out = tmp_path / "model.pt2"
    argv = ["export", "--checkpoint", str(run), "--format", "torch_export", "--out", str(out)]
    assert main(argv) == 0 and written_for(out) == "torch_export"
    assert main(argv) == 0


def test_evaluate_and_reconstruct_keep_a_users_file_in_the_folder(run, tmp_path, capsys):
    out = tmp_path / "results"
    out.mkdir()
    users = {"evaluate": out / "evaluation_run_best_digits.json", "reconstruct": out / "reconstructions_run_best.png"}
    users["evaluate"].write_text("{}")
    Image.new("L", (8, 8)).save(users["reconstruct"])
    for command, path in users.items():
        before = path.read_bytes()
        argv = [command, "--checkpoint", str(run), "--device", "cpu", "--out", str(out)]
        _refused(argv, capsys, f"'{path}' already exists and is a file capsnets did not write", "pass another --out")
        assert path.read_bytes() == before
        assert main([*argv, "--overwrite"]) == 0  # asked for
        assert main(argv) == 0  # now its own file: replaced
    assert written_for(users["evaluate"]) == "evaluation" and written_for(users["reconstruct"]) == "figure"
    assert written_for(out / "evaluation_run_best_digits_confusion.png") == "figure"


def test_predicted_masks_keep_a_users_file(tmp_path, capsys):
    import capsnets
    from capsnets.engine.checkpoint import save_checkpoint

    model = capsnets.create_model("segcaps_small")
    meta = {"model": "segcaps_small", "model_args": model.model_args, "dataset": "segmentation"}
    save_checkpoint(tmp_path / "seg" / "best.safetensors", model=model, meta=meta)
    Image.new("L", (32, 32), 30).save(tmp_path / "scan.png")
    masks = tmp_path / "masks"
    masks.mkdir()
    Image.new("L", (32, 32), 7).save(masks / "scan_mask.png")  # the user's own mask, by the same name
    argv = ["predict", "--checkpoint", str(tmp_path / "seg"), str(tmp_path / "scan.png"), "--out", str(masks)]
    _refused(argv, capsys, f"the mask of '{tmp_path / 'scan.png'}', '{masks / 'scan_mask.png'}' already exists")
    mask = Image.open(masks / "scan_mask.png")
    assert mask.getextrema() == (7, 7) and not (masks / "scan_overlay.png").exists()
    assert main([*argv, "--overwrite"]) == 0 and main(argv) == 0  # then its own masks are replaced
    assert written_for(masks / "scan_mask.png") == "mask" and written_for(masks / "scan_overlay.png") == "overlay"


def test_experiment_out_holding_other_files_is_refused_before_any_work(tmp_path, capsys):
    from matplotlib.figure import Figure

    from capsnets.experiments import write_report
    from capsnets.plots import save_figure

    out = tmp_path / "out"
    write_report(out / "seed-0", "T", [("A", "a")])  # what an earlier experiment wrote there
    save_figure(Figure(figsize=(1, 1)), out / "contrasts.png")
    (out / "seeds.json").write_text(json.dumps({**json_header("seeds")}))
    argv = ["experiment", "dimensions", "--smoke", "--out", str(out), "--set", "nonsense=1"]
    _refused(argv, capsys, "does not take nonsense")  # the folder passed; the setting is what stops it
    (out / "seed-0" / "holiday.jpg").write_bytes(b"mine")
    _refused(argv, capsys, f"--out '{out}' holds files capsnets did not write ('{out / 'seed-0' / 'holiday.jpg'}')")
    _refused([*argv, "--overwrite"], capsys, "does not take nonsense")
    assert (out / "seed-0" / "holiday.jpg").read_bytes() == b"mine"


def test_train_overwrite_replaces_only_a_run(tmp_path, capsys):
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    Image.new("L", (8, 8)).save(pictures / "cat.png")
    for extra in ([], ["--overwrite"]):
        _refused([*train_args(1), "--out", str(pictures), *extra], capsys, "holds files that are not a training run")
    assert sorted(p.name for p in pictures.iterdir()) == ["cat.png"]


#: For each command, the command line (RUN: the trained run, MINE: the user's folder, FILE: a user's file in it)
#: and the user's file it aims at, named as that command names its output.
_AIMED = {
    "predict --json": (["predict", "--checkpoint", "RUN", "IMAGE", "--json", "FILE"], "predictions.json"),
    "predict --json image": (["predict", "--checkpoint", "RUN", "--json", "FILE", "IMAGE"], "photo.png"),
    "export": (["export", "--checkpoint", "RUN", "--format", "torch_export", "--out", "FILE"], "model.pt2"),
    "export onnx": (["export", "--checkpoint", "RUN", "--out", "FILE"], "model.onnx"),
    "evaluate": (["evaluate", "--checkpoint", "RUN", "--out", "MINE"], "evaluation_run_best_digits.json"),
    "evaluate figure": (
        ["evaluate", "--checkpoint", "RUN", "--out", "MINE"],
        "evaluation_run_best_digits_confusion.png",
    ),
    "reconstruct": (["reconstruct", "--checkpoint", "RUN", "--out", "MINE"], "reconstructions_run_best.png"),
    "experiment": (["experiment", "dimensions", "--smoke", "--out", "MINE"], "report.md"),
    "train": ([*train_args(1), "--out", "MINE"], "config.yaml"),
}
#: What a user's file may hold: an image, JSON (of capsnets' shape, without its mark), text, nothing, bytes.
_CONTENTS = st.sampled_from(["png", '{"predictions": []}', '{"capsnets": 1}', "# my notes\n", "", "\x00\xff"])


@pytest.fixture(scope="module")
def quick(run):
    """Stand-ins for what is slow and beside the point: the exporters' tracing, the figures' drawing and the
    experiments (their outputs are written where the real ones are)."""
    import dataclasses

    from capsnets import cli, plots
    from capsnets.experiments import common
    from capsnets.experiments.report import write_report

    def stub_export(model, path, format="onnx", **kwargs):
        Path(path).write_bytes(b"exported")
        return SimpleNamespace(
            path=str(path),
            bytes=8,
            format=format,
            output_names=["scores"],
            seconds=0.0,
            checked_batches=[1, 5],
            max_abs_difference=0.0,
        )

    def stub_figure(*args, **kwargs):
        out = Path(next(a for a in (*args, *kwargs.values()) if isinstance(a, (str, Path)) and str(a).endswith(".png")))
        out.write_bytes(b"figure")
        return out

    def stub_experiment(out, settings, **kwargs):
        return write_report(out, "stub", [("Settings", str(settings))])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "export_model", stub_export)
        patch.setattr(plots, "plot_confusion_matrix", stub_figure)
        patch.setattr(plots, "plot_reconstructions", stub_figure)
        patch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
        for name, experiment in list(common._EXPERIMENTS.items()):
            patch.setitem(common._EXPERIMENTS, name, dataclasses.replace(experiment, run=stub_experiment))
        yield run


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(aimed=st.sampled_from(sorted(_AIMED)), content=_CONTENTS, overwrite=st.booleans())
@example(aimed="train", content="png", overwrite=False)  # found: a folder holding only a config.yaml was "empty"
@example(aimed="train", content="png", overwrite=True)  # found: --overwrite took a user's config.yaml for a run
@example(aimed="predict --json image", content="png", overwrite=True)
def test_no_output_option_replaces_a_users_file(quick, tmp_path_factory, capsys, aimed, content, overwrite):
    """Whatever the command and whatever the user's file holds, it keeps its bytes unless --overwrite is given
    (``train`` keeps a folder that holds no run even then), and a refusal is one line that names it."""
    root = tmp_path_factory.mktemp("aimed")
    mine = root / "mine"
    mine.mkdir()
    argv, name = _AIMED[aimed]
    user = mine / name
    if content == "png":
        Image.new("L", (8, 8), 3).save(user, format="PNG")
    else:
        user.write_bytes(content.encode("latin-1"))
    Image.new("L", (8, 8), 0).save(root / "digit.png")
    names = {"RUN": str(quick), "MINE": str(mine), "FILE": str(user), "IMAGE": str(root / "digit.png")}
    argv = [names.get(a, a) for a in argv] + (["--overwrite"] if overwrite else [])
    before = user.read_bytes()
    status = main(argv)
    err = capsys.readouterr().err
    kept = not overwrite or aimed in ("train", "predict --json image")
    if kept:
        assert status == 1 and user.read_bytes() == before, argv
        assert str(user.name) in one_error_line(err, argv[0]) or str(mine) in err, err
    else:
        assert status == 0, err
