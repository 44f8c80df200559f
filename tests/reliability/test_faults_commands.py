"""Fault class "predict/evaluate/export": bad inputs and bad output paths given to the commands that read a
trained run. Each is refused with status 1 and one line that names the path and what to do, without a traceback,
before any work, and leaves every file as it was: the run's, the inputs', and nothing created.

Inputs: missing, empty, garbage and truncated image files, a text file, a pipe, a folder without images, a folder
where a checkpoint is expected. Outputs (``predict --json``, ``export --out``, ``evaluate``/``reconstruct``
``--out``): a folder where a file is expected, a file where a folder is expected, a folder that does not exist or
is a file, a device or pipe, the input itself, a file of another kind (``export --out x.png``), a read-only folder
(simulated as in ``test_faults_run_dirs.py``).

Everything runs in-process through :func:`capsnets.cli.main`.
"""

from __future__ import annotations

import os
import stat

import pytest
from PIL import Image
from reliability.faults import copy_run, one_error_line
from reliability.read_only import ReadOnly, chmod_protects

import capsnets
from capsnets.cli import main
from capsnets.engine import save_checkpoint
from capsnets.files import FileWriteError, atomic_write


@pytest.fixture
def place(clean_runs, tmp_path):
    """A copy of a trained run and a folder of inputs: ``ok.png`` (8x8), broken images, a text file, a pipe, an
    empty folder, a plain file ``afile``."""
    run = copy_run(clean_runs[1], tmp_path / "run")
    inputs = tmp_path / "in"
    inputs.mkdir()
    Image.new("L", (8, 8), 200).save(inputs / "ok.png")
    (inputs / "empty.png").write_bytes(b"")
    (inputs / "garbage.png").write_bytes(b"not an image " * 10)
    (inputs / "truncated.png").write_bytes((inputs / "ok.png").read_bytes()[:40])
    (inputs / "notes.txt").write_text("hello")
    (inputs / "empty").mkdir()
    (inputs / "afile").write_text("x")
    if hasattr(os, "mkfifo"):
        os.mkfifo(inputs / "pipe.json")
    return run, inputs


def _tree(root):
    """Every path under ``root``: bytes for regular files, the kind for anything else."""
    tree = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        tree[key] = path.read_bytes() if path.is_file() else "dir" if path.is_dir() else oct(path.lstat().st_mode)
    return tree


def _refused(argv, tmp_path, capsys, *expected: str) -> str:
    """``argv`` fails with one line holding each of ``expected``; nothing under ``tmp_path`` changed."""
    before = _tree(tmp_path)
    status = main(argv)
    line = one_error_line(capsys.readouterr().err, argv[0])
    assert status == 1, line
    for text in expected:
        assert text in line, line
    assert _tree(tmp_path) == before, "a refused command changed files"
    return line


@pytest.mark.parametrize(
    "name, expected",
    [
        ("missing.png", "is neither an image file nor a folder"),
        ("empty.png", "is not an image that can be read"),
        ("garbage.png", "is not an image that can be read"),
        ("truncated.png", "is not an image that can be read"),
        ("notes.txt", "is not an image that can be read"),
        ("empty", "holds no image file"),
        pytest.param(
            "pipe.json",
            "is neither an image file nor a folder",
            marks=pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes"),
        ),
    ],
)
def test_predict_refuses_inputs_that_are_no_images(place, tmp_path, capsys, name, expected):
    run, inputs = place
    _refused(["predict", "--checkpoint", str(run), "--device", "cpu", str(inputs / name)], tmp_path, capsys, expected)


@pytest.mark.parametrize("name", ["empty", "afile", "ok.png"])
def test_a_checkpoint_that_is_no_checkpoint_is_refused(place, tmp_path, capsys, name):
    run, inputs = place
    _refused(
        ["predict", "--checkpoint", str(inputs / name), "--device", "cpu", str(inputs / "ok.png")],
        tmp_path,
        capsys,
        str(inputs / name),
    )


#: (--json or --out value, under the inputs folder, and what the message says) for predict --json and export --out
FILE_OUTPUTS = [
    ("empty", "is a folder; name"),
    ("missing/x", "the folder '{inputs}/missing' does not exist; create it, or name a file in an existing folder"),
    ("afile/x", "'{inputs}/afile' is a file, not a folder"),
    pytest.param(
        "pipe.json",
        "is not a regular file",
        marks=pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes"),
    ),
]


@pytest.mark.parametrize("target, expected", FILE_OUTPUTS)
def test_predict_json_is_checked_before_predicting(place, tmp_path, capsys, target, expected):
    run, inputs = place
    out = inputs / (target + ".json" if "/" in target else target)
    _refused(
        ["predict", "--checkpoint", str(run), "--device", "cpu", "--json", str(out), str(inputs / "ok.png")],
        tmp_path,
        capsys,
        f"--json '{out}'",
        expected.format(inputs=inputs),
    )


@pytest.mark.parametrize("target, expected", FILE_OUTPUTS)
def test_export_out_is_checked_before_exporting(place, tmp_path, capsys, target, expected):
    run, inputs = place
    out = inputs / (target + ".onnx" if "/" in target else target)
    _refused(
        ["export", "--checkpoint", str(run), "--out", str(out)],
        tmp_path,
        capsys,
        f"--out '{out}'",
        expected.format(inputs=inputs),
    )


def test_a_missing_folder_is_refused_alike_by_predict_and_export(place, tmp_path, capsys):
    """Neither creates the folders of a mistyped path: both say the same."""
    run, inputs = place
    missing = tmp_path / "nonexistent" / "dir"
    lines = [
        _refused(
            ["predict", "--checkpoint", str(run), "--json", str(missing / "p.json"), str(inputs / "ok.png")],
            tmp_path,
            capsys,
        ),
        _refused(["export", "--checkpoint", str(run), "--out", str(missing / "x.onnx")], tmp_path, capsys),
    ]
    said = f"the folder '{missing}' does not exist; create it, or name a file in an existing folder"
    assert all(said in line for line in lines), lines
    assert not (tmp_path / "nonexistent").exists()


@pytest.mark.parametrize("aimed", ["same", "dotted", "in-folder"])
def test_predict_json_never_replaces_an_input(place, tmp_path, capsys, aimed):
    run, inputs = place
    image = inputs / "ok.png"
    given, target = {
        "same": (image, image),
        "dotted": (image, inputs / "empty" / ".." / "ok.png"),
        "in-folder": (inputs, image),  # a folder of inputs holding the file
    }[aimed]
    _refused(
        ["predict", "--checkpoint", str(run), "--device", "cpu", "--json", str(target), str(given)],
        tmp_path,
        capsys,
        "is one of the files read as input",
    )


@pytest.mark.parametrize("name", ["picture.png", "p.json", "model.pt2"])
def test_export_out_must_end_as_its_format(place, tmp_path, capsys, name):
    """An --out that names another kind of file (an image, a JSON) would be replaced by an ONNX file: refused,
    whether the file exists or not."""
    run, inputs = place
    if name == "picture.png":
        Image.new("L", (8, 8)).save(inputs / name)
    _refused(
        ["export", "--checkpoint", str(run), "--out", str(inputs / name)], tmp_path, capsys, "does not end in .onnx"
    )


@pytest.mark.parametrize("command", ["evaluate", "reconstruct"])
@pytest.mark.parametrize(
    "out, expected", [("afile", "is a file, not a folder"), ("afile/sub", "is a file, not a folder")]
)
def test_evaluate_and_reconstruct_out_must_be_a_folder(place, tmp_path, capsys, command, out, expected):
    run, inputs = place
    _refused(
        [command, "--checkpoint", str(run), "--device", "cpu", "--out", str(inputs / out)],
        tmp_path,
        capsys,
        f"--out '{inputs / out}'",
        expected,
    )


@pytest.mark.parametrize(
    "command, visible", [("predict", True), ("export", True), ("predict", False)], ids=["predict", "export", "late"]
)
def test_an_output_file_in_a_read_only_folder(place, tmp_path, capsys, command, visible):
    """Found before the work where ``os.access`` sees it; else when the file is written (``late``)."""
    run, inputs = place
    shared = tmp_path / "shared"
    shared.mkdir()
    argv = {
        "predict": ["predict", "--checkpoint", str(run), "--json", str(shared / "p.json"), str(inputs / "ok.png")],
        "export": ["export", "--checkpoint", str(run), "--out", str(shared / "m.onnx")],
    }[command]
    with pytest.MonkeyPatch.context() as patch:
        ReadOnly(shared, visible=visible).install(patch)
        if visible:
            _refused(
                argv,
                tmp_path,
                capsys,
                f"cannot write in '{shared}' (Read-only file system)",
                "nothing in it was changed",
                "make",
            )
        else:  # found when the file is written, after the work: one line naming the file
            _refused(argv, tmp_path, capsys, "could not write '", "(Read-only file system)")


def test_atomic_write_leaves_a_folder_a_device_or_a_pipe_alone(tmp_path):
    """The last guard: whatever the caller checked, an atomic write never replaces what is not a regular file."""
    folder = tmp_path / "folder"
    folder.mkdir()
    targets = [folder]
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe")
        targets.append(tmp_path / "pipe")
    for target in targets:
        kind = target.lstat().st_mode
        with pytest.raises(FileWriteError, match="it is left as it is"):
            atomic_write(target, lambda tmp: open(tmp, "w").write("x"))
        assert target.lstat().st_mode == kind
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(t.name for t in targets)


@pytest.fixture
def segmentation_run(tmp_path):
    """A (untrained) segmentation checkpoint and two folders of scans."""
    model = capsnets.create_model("segcaps_small")
    save_checkpoint(
        tmp_path / "seg" / "best.safetensors",
        model=model,
        meta={"model": "segcaps_small", "model_args": model.model_args, "dataset": "segmentation"},
    )
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        Image.new("L", (32, 32), 90).save(tmp_path / folder / "scan.png")
    return tmp_path / "seg"


def test_segment_masks_never_replace_each_other_or_an_input(segmentation_run, tmp_path, capsys):
    predict = ["predict", "--checkpoint", str(segmentation_run), "--device", "cpu"]
    a, b = tmp_path / "a", tmp_path / "b"
    _refused(
        [*predict, str(a / "scan.png"), str(b / "scan.png"), "--out", str(tmp_path / "masks")],
        tmp_path,
        capsys,
        "would both write their mask to",
    )
    Image.new("L", (32, 32), 10).save(a / "scan_mask.png")  # an image named as a mask, in the --out folder
    _refused([*predict, str(a), "--out", str(a)], tmp_path, capsys, "would replace the input image", "--out")
    assert main([*predict, str(a), "--out", str(tmp_path / "masks")]) == 0  # elsewhere, both are segmented
    written = sorted(p.name for p in (tmp_path / "masks").iterdir())
    assert written == ["scan_mask.png", "scan_mask_mask.png", "scan_mask_overlay.png", "scan_overlay.png"]


@pytest.mark.skipif(not chmod_protects(), reason="chmod does not stop this process (root); simulated above")
@pytest.mark.parametrize("command", ["predict", "export", "evaluate"])
def test_outputs_into_a_folder_made_read_only_with_chmod(place, tmp_path, capsys, command):
    run, inputs = place
    shared = tmp_path / "shared"
    shared.mkdir()
    argv = {
        "predict": ["predict", "--checkpoint", str(run), "--json", str(shared / "p.json"), str(inputs / "ok.png")],
        "export": ["export", "--checkpoint", str(run), "--out", str(shared / "m.onnx")],
        "evaluate": ["evaluate", "--checkpoint", str(run), "--device", "cpu", "--out", str(shared / "reports")],
    }[command]
    os.chmod(shared, stat.S_IRUSR | stat.S_IXUSR)
    try:
        _refused(argv, tmp_path, capsys, f"cannot write in '{shared}' (Permission denied)", "nothing in it was changed")
    finally:
        os.chmod(shared, stat.S_IRWXU)


def test_export_beside_a_checkpoint_in_a_read_only_run(place, tmp_path, capsys):
    """Without --out the file goes beside the checkpoint: a read-only run is named, and --out suggested."""
    run, _ = place
    with pytest.MonkeyPatch.context() as patch:
        ReadOnly(run).install(patch)
        _refused(
            ["export", "--checkpoint", str(run)],
            tmp_path,
            capsys,
            f"the default --out '{run / 'best.onnx'}': cannot write in '{run}' (Read-only file system)",
            "give --out a file in a writable folder",
        )
