"""No output option replaces a file capsnets did not write: ``predict --json`` and its masks, ``export --out``,
``evaluate``, ``reconstruct``, ``experiment --out`` and ``train --out`` refuse an existing file unless capsnets
wrote it for the same purpose (its mark, :mod:`capsnets.outputs`) or ``--overwrite`` is given. Each refusal is one
line that names the file and how to go on, before any work, and the file keeps its bytes."""

from __future__ import annotations

import json

import pytest
from PIL import Image
from reliability.faults import one_error_line, train_args

from capsnets.cli import main
from capsnets.engine import reporting
from capsnets.outputs import json_header, written_for


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("kept") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
        assert main([*train_args(1), "--out", str(out)]) == 0
    return out


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
    assert set(Image.open(masks / "scan_mask.png").getdata()) == {7} and not (masks / "scan_overlay.png").exists()
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
