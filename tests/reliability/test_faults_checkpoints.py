"""Fault class: checkpoint files handled outside a run, their checksums and the ``.json`` export of their sidecar.

- A checkpoint whose header lacks the checksum of its tensors or of its sidecar (the entries removed by hand, or
  written by another program) is refused as such, by the library and the command line, with the fix named; it is
  never loaded unchecked.
- A checkpoint alone, without its ``.json`` (a downloaded weight, a copied file), loads without a warning: the
  sidecar it carries is the one read. A ``.json`` beside it is never read, whatever it holds; a ``.json`` missing
  from a run being resumed is exported again.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from reliability.faults import copy_run, one_error_line, train_args
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import capsnets
from capsnets.checkpoints import SIDECAR_DIGEST, TENSORS_DIGEST, CheckpointError, checkpoint_epoch, load_checkpoint
from capsnets.cli import main
from capsnets.engine import reporting
from capsnets.models import load_model, pretrained

SHIPPED = pretrained.WEIGHTS_DIR / "matrix_capsnet_small-mnist.safetensors"


def _without(path: Path, *entries: str) -> Path:
    """Rewrite the checkpoint ``path`` with ``entries`` removed from its header (the tensors as they are)."""
    with safe_open(path, framework="pt") as handle:
        metadata = dict(handle.metadata())
    save_file(load_file(path), path, metadata={k: v for k, v in metadata.items() if k not in entries})
    return path


@pytest.mark.parametrize("entries", [(TENSORS_DIGEST,), (SIDECAR_DIGEST,), (TENSORS_DIGEST, SIDECAR_DIGEST)])
def test_a_checkpoint_without_its_checksums_is_refused_naming_them(tmp_path, entries):
    path = _without(Path(shutil.copy(SHIPPED, tmp_path / "w.safetensors")), *entries)
    message = f"records no checksum \\({', '.join(entries)} missing from its header\\).*write_checkpoint"
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="records no checksum"):
        load_model(path)
    with pytest.raises(CheckpointError, match="records no checksum"):
        capsnets.create_model("matrix_capsnet_small", pretrained=str(path))
    assert checkpoint_epoch(path) is None  # the header alone is not trusted either


def test_the_cli_refuses_a_checkpoint_without_checksums_in_one_line(tmp_path, capsys):
    path = _without(Path(shutil.copy(SHIPPED, tmp_path / "w.safetensors")), TENSORS_DIGEST)
    out = tmp_path / "model.onnx"
    assert main(["export", "--checkpoint", str(path), "--out", str(out)]) == 1
    assert "records no checksum (tensors_sha256 missing" in one_error_line(capsys.readouterr().err, "export")
    assert not out.exists()


def test_a_checkpoint_without_its_json_loads_quietly(tmp_path, caplog):
    """A copied weight (its card left behind) and a checkpoint whose .json was deleted: no warning anywhere."""
    copied = Path(shutil.copy(SHIPPED, tmp_path / "copied.safetensors"))
    with caplog.at_level(logging.WARNING):
        assert load_checkpoint(copied).meta["model"] == "matrix_capsnet_small"
        load_model(copied)
        capsnets.create_model("matrix_capsnet_small", pretrained=str(copied))
    assert caplog.records == [], caplog.text
    assert not copied.with_suffix(".json").exists()  # loading writes nothing


@pytest.mark.parametrize("beside", ["another", "garbled"])
def test_a_json_beside_is_never_read(tmp_path, caplog, beside):
    path = Path(shutil.copy(SHIPPED, tmp_path / "w.safetensors"))
    other = {"checkpoint_id": "0" * 32, "model": "capsnet_small"}
    path.with_suffix(".json").write_text(json.dumps(other) if beside == "another" else "{not json")
    with caplog.at_level(logging.WARNING):
        assert load_checkpoint(path).meta["model"] == "matrix_capsnet_small"
        load_model(path)
    assert caplog.records == [], caplog.text


def test_a_json_missing_from_a_resumed_run_is_exported_again(clean_runs, tmp_path, monkeypatch):
    monkeypatch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
    run = copy_run(clean_runs[1], tmp_path / "run")
    (run / "best.json").unlink()
    assert main([*train_args(2), "--out", str(run), "--resume"]) == 0
    assert json.loads((run / "best.json").read_text()) == load_checkpoint(run / "best.safetensors").meta
