"""The mark capsnets puts in the files it writes (capsnets.outputs): read back from every format, never found in a
file capsnets did not write, and the rule that an existing file is replaced only when it carries the same purpose."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image

from capsnets.outputs import (
    OutputExistsError,
    check_output,
    json_header,
    markdown_mark,
    png_text,
    written_for,
)
from capsnets.validation import ArgumentError


def _files(tmp_path):
    """One file of each marked kind, as the writers make them, by its purpose."""
    from matplotlib.figure import Figure

    from capsnets.experiments.report import write_report
    from capsnets.plots import save_figure

    (tmp_path / "p.json").write_text(json.dumps({**json_header("predictions"), "predictions": []}, indent=2))
    save_figure(Figure(figsize=(1, 1)), tmp_path / "figure.png")
    write_report(tmp_path, "T", [("A", "text")])
    return {"predictions": tmp_path / "p.json", "figure": tmp_path / "figure.png", "report": tmp_path / "report.md"}


def test_every_writer_marks_its_file_with_its_purpose(tmp_path):
    for purpose, path in _files(tmp_path).items():
        assert written_for(path) == purpose
    assert (tmp_path / "report.md").read_text().startswith("# T\n")  # the title stays first


def test_a_runs_config_is_marked(tmp_path):
    from capsnets.engine.config import TrainConfig, read_config_file

    TrainConfig().save(tmp_path / "config.yaml")
    assert written_for(tmp_path / "config.yaml") == "config"
    assert read_config_file(tmp_path / "config.yaml") == TrainConfig().to_dict()  # the mark is a comment


def test_the_marks_of_each_format_read_back(tmp_path):
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    for key, value in png_text("mask").items():
        info.add_text(key, value)
    Image.new("P", (4, 4)).save(tmp_path / "m.png", pnginfo=info)
    (tmp_path / "r.md").write_text("# title\n" + "x" * 5000 + f"\n{markdown_mark('report')}\n")
    (tmp_path / "e.json").write_text(json.dumps({**json_header("evaluation"), "rows": list(range(10**5))}))
    assert [written_for(tmp_path / n) for n in ("m.png", "r.md", "e.json")] == ["mask", "report", "evaluation"]


def test_files_capsnets_did_not_write_carry_no_mark(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "photo.png")
    Image.new("RGB", (8, 8)).save(tmp_path / "photo.jpg")
    (tmp_path / "data.json").write_text('{"predictions": [], "capsnets": {"content": "predictions"}}')  # not first
    (tmp_path / "notes.md").write_text("# notes\n<!-- capsnets: report -->\nmore\n")  # not the last line
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07")
    (tmp_path / "empty").write_bytes(b"")
    for name in ("photo.png", "photo.jpg", "data.json", "notes.md", "model.onnx", "empty", "missing"):
        assert written_for(tmp_path / name) is None, name


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(content=st.binary(max_size=2048), suffix=st.sampled_from([".json", ".png", ".md", ".onnx", ".pt2", ""]))
@example(content=b'{"capsnets": 1}', suffix=".json")
@example(content=b'{"capsnets": {"content": ["x"]}}', suffix=".json")
@example(content=b'{"capsnets": {"content": "predictions"', suffix=".json")
@example(content=b"PK\x03\x04garbage", suffix=".pt2")
@example(content=b"\x89PNG\r\n\x1a\ngarbage", suffix=".png")
@example(content=b"\xff" * 2048, suffix=".md")
def test_any_bytes_are_read_without_an_error(tmp_path_factory, content, suffix):
    """Whatever a file holds, reading its mark gives a purpose or None, never an exception."""
    path = tmp_path_factory.mktemp("any") / f"file{suffix}"
    path.write_bytes(content)
    found = written_for(path)
    assert found is None or isinstance(found, str)


def test_a_file_is_replaced_only_for_the_same_purpose_or_with_overwrite(tmp_path):
    files = _files(tmp_path)
    assert check_output(files["predictions"], "predictions") == files["predictions"]
    with pytest.raises(OutputExistsError, match=r"is a capsnets predictions file, not an evaluation.*overwrite=True"):
        check_output(files["predictions"], "evaluation")
    Image.new("L", (8, 8)).save(tmp_path / "mine.png")
    with pytest.raises(ArgumentError, match=r"--out '.*mine.png' already exists and is a file capsnets did not write"):
        check_output(tmp_path / "mine.png", "figure", flag="--out")
    assert check_output(tmp_path / "mine.png", "figure", overwrite=True) == tmp_path / "mine.png"
    assert check_output(tmp_path / "new.png", "figure") == tmp_path / "new.png"
