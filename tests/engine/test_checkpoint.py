"""Checkpoints: round trip, corruption detection, atomic replacement."""

import json

import pytest
import torch
from torch import nn

from capsnets import checkpoints as capsnets_checkpoints
from capsnets.checkpoints import CheckpointError, load_checkpoint
from capsnets.engine.checkpoint import restore_training, save_checkpoint
from capsnets.models.hub import restore_model


def _trained(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    for _ in range(3):
        model(torch.randn(5, 4)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return model, optimizer, scheduler


def _save(path, seed=0, **meta):
    model, optimizer, scheduler = _trained(seed)
    save_checkpoint(
        path,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        meta={"model": "toy", "model_args": {}, "epoch": 3, **meta},
    )
    return model, optimizer, scheduler


def test_round_trip(tmp_path):
    path = tmp_path / "last.safetensors"
    model, optimizer, scheduler = _save(path, metrics={"test_accuracy": 0.5})
    fresh, fresh_opt, fresh_sched = _trained(seed=1)
    loaded = load_checkpoint(tmp_path)  # a run directory resolves to last when there is no best
    restore_model(fresh, loaded)
    restore_training(loaded, fresh_opt, fresh_sched)
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    for index, state in optimizer.state_dict()["state"].items():
        for name, value in state.items():
            assert torch.equal(value, fresh_opt.state_dict()["state"][index][name])
    assert fresh_opt.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    assert fresh_opt.param_groups[0]["betas"] == optimizer.param_groups[0]["betas"]
    assert fresh_sched.state_dict() == scheduler.state_dict()
    meta = json.loads((tmp_path / "last.json").read_text())
    assert meta["epoch"] == 3 and meta["metrics"] == {"test_accuracy": 0.5}
    assert set(meta["versions"]) == {"capsnets", "torch", "python"}
    assert "rng.torch" in loaded.tensors and "optim.state.0.exp_avg" in loaded.tensors


def test_truncated_file_names_the_file(tmp_path):
    path = tmp_path / "last.safetensors"
    _save(path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="last.safetensors.*corrupt"):
        load_checkpoint(path)


@pytest.mark.parametrize("where", ["tensors", "sidecar"])
def test_flipped_bytes_are_found_by_the_checksums(tmp_path, where):
    """safetensors checks the layout, not the numbers: a byte flipped in the data (or a digit in the embedded
    sidecar) would load as other weights; the recorded SHA-256s refuse it, naming the file."""
    path = tmp_path / "last.safetensors"
    _save(path)
    data = bytearray(path.read_bytes())
    header_end = 8 + int.from_bytes(data[:8], "little")
    index = len(data) - 3 if where == "tensors" else data.index(b'\\"epoch\\": 3') + len(b'\\"epoch\\": ')
    data[index] ^= 0x01 if where == "tensors" else ord("3") ^ ord("4")  # "epoch": 3 -> 4: still valid JSON
    assert (index >= header_end) == (where == "tensors")
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"last.safetensors' is damaged: the checksum of its {where}"):
        load_checkpoint(path)


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.safetensors")
    with pytest.raises(CheckpointError, match="no best.safetensors or last.safetensors"):
        load_checkpoint(tmp_path)


def _rewrite_header(path, **changes):
    """Rewrite ``path``'s safetensors header with ``changes`` to its metadata (None deletes an entry)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(path, framework="pt") as handle:
        metadata = dict(handle.metadata())
    metadata.update(changes)
    save_file(load_file(path), path, metadata={k: v for k, v in metadata.items() if v is not None})


@pytest.mark.parametrize("version", ["2", "0", None])
def test_a_file_of_another_format_version_is_refused_with_a_clear_error(tmp_path, version):
    path = tmp_path / "last.safetensors"
    _save(path)
    _rewrite_header(path, format_version=version)
    written = f"format version {version}" if version is not None else "no format version"
    with pytest.raises(CheckpointError, match=f"'{path}' has {written}; this capsnets .* reads format version 1 only"):
        load_checkpoint(path)
    assert capsnets_checkpoints.checkpoint_epoch(path) is None  # the header alone: another format is not read either


def test_every_sidecar_records_the_format_version(tmp_path):
    from capsnets.checkpoints import FORMAT_VERSION

    path = tmp_path / "last.safetensors"
    _save(path)
    assert load_checkpoint(path).meta["format_version"] == FORMAT_VERSION
    assert json.loads(path.with_suffix(".json").read_text())["format_version"] == FORMAT_VERSION


def test_a_safetensors_file_that_is_no_checkpoint_is_refused(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, tmp_path / "w.safetensors")
    with pytest.raises(CheckpointError, match="not a capsnets checkpoint"):
        load_checkpoint(tmp_path / "w.safetensors")


def test_one_commit_point_a_crash_after_it_leaves_the_new_checkpoint(tmp_path, monkeypatch):
    """A crash between the commit (the safetensors rename) and the sidecar's export: the new checkpoint loads with
    the sidecar in its header, the stale export is not read, and recover_directory exports the sidecar again."""
    path = tmp_path / "last.safetensors"
    _save(path, metrics={"run": "old"})

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(capsnets_checkpoints, "atomic_write", crash)
    with pytest.raises(KeyboardInterrupt):
        _save(path, seed=5, metrics={"run": "new"})
    monkeypatch.undo()
    assert json.loads((tmp_path / "last.json").read_text())["metrics"] == {"run": "old"}  # a save behind
    loaded = load_checkpoint(path)
    assert loaded.meta["metrics"] == {"run": "new"}
    fresh, fresh_opt, fresh_sched = _trained(seed=1)
    restore_training(loaded, fresh_opt, fresh_sched)  # the optimizer state is there: the run resumes
    assert capsnets_checkpoints.recover_directory(tmp_path) == []
    assert json.loads((tmp_path / "last.json").read_text()) == loaded.meta


@pytest.mark.parametrize("export", ["missing", "garbled", "another save"])
def test_the_json_export_is_never_read_and_is_exported_again_on_recovery(tmp_path, export):
    path = tmp_path / "last.safetensors"
    _save(path)
    if export == "missing":
        (tmp_path / "last.json").unlink()
    else:
        (tmp_path / "last.json").write_text("{not json" if export == "garbled" else json.dumps({"epoch": 9}))
    assert load_checkpoint(path).meta["epoch"] == 3
    capsnets_checkpoints.recover_directory(tmp_path)
    assert json.loads((tmp_path / "last.json").read_text()) == load_checkpoint(path).meta


def test_leftover_of_a_save_cut_before_its_commit_point_is_removed(tmp_path):
    _save(tmp_path / "last.safetensors", metrics={"run": "old"})
    leftover = tmp_path / ".last.safetensors.abc123.tmp"
    leftover.write_bytes(b"half a checkpoint")
    messages = capsnets_checkpoints.recover_directory(tmp_path)
    assert not leftover.exists() and "removed" in messages[0]
    assert load_checkpoint(tmp_path / "last.safetensors").meta["metrics"] == {"run": "old"}


@pytest.mark.parametrize(
    "entry, value",
    [("epoch", "three"), ("epoch", -1), ("model_args", [1, 2]), ("optimizer", {"param_groups": "x"}), ("training", 5)],
)
def test_sidecar_of_wrong_types_is_refused_with_the_entry_named(tmp_path, entry, value):
    model, optimizer, _ = _trained()
    meta = {"model": "toy", "epoch": 3, entry: value}
    save_checkpoint(
        tmp_path / "m.safetensors", model=model, meta=meta, optimizer=None if entry == "optimizer" else optimizer
    )
    with pytest.raises(CheckpointError, match=f"damaged: '{entry.split('.')[0]}"):
        load_checkpoint(tmp_path / "m.safetensors")


def test_absurd_model_sizes_in_a_sidecar_allocate_nothing(tmp_path):
    """A sidecar whose model arguments ask for a huge model is refused after building it on the meta device."""
    from capsnets.models import create_model, load_model

    model = create_model("capsnet_digits")
    save_checkpoint(
        tmp_path / "m.safetensors",
        model=model,
        meta={"model": "capsnet_digits", "model_args": {"num_classes": 10, "decoder_hidden": [2**40, 8]}},
    )
    with pytest.raises(CheckpointError, match="does not fit the model|do not build it"):
        load_model(tmp_path / "m.safetensors")


def test_key_mismatch(tmp_path):
    _save(tmp_path / "last.safetensors")
    with pytest.raises(CheckpointError, match="does not fit the model"):
        restore_model(nn.Linear(4, 3), load_checkpoint(tmp_path / "last.safetensors"))


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), "safetensors"])
def test_failed_write_keeps_previous_checkpoint(tmp_path, monkeypatch, error):
    from safetensors import SafetensorError

    path = tmp_path / "last.safetensors"
    model, _, _ = _save(path)
    before = path.read_bytes(), (tmp_path / "last.json").read_text()

    def broken_save_file(tensors, filename, metadata=None):
        with open(filename, "wb") as handle:
            handle.write(b"partial")
        raise (
            SafetensorError("Error while serializing: IoError(No space left on device)")
            if error == "safetensors"
            else error
        )

    monkeypatch.setattr(capsnets_checkpoints, "save_file", broken_save_file)
    with pytest.raises(
        capsnets_checkpoints.CheckpointWriteError, match="could not write checkpoint .*space.*is intact"
    ):
        _save(path, seed=5)
    assert (path.read_bytes(), (tmp_path / "last.json").read_text()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.json", "last.safetensors"]  # no temp files
    restore_model(model, load_checkpoint(path))


def test_failed_sidecar_write_keeps_previous_checkpoint(tmp_path):
    path = tmp_path / "last.safetensors"
    _save(path)
    before = path.read_bytes()
    with pytest.raises(TypeError, match="cannot store"):
        _save(path, seed=5, bad=object())
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.json", "last.safetensors"]


def test_extra_tensors_are_kept_beside_the_model(tmp_path):
    model, _, _ = _trained(seed=0)
    kept = {"last.weight": torch.arange(6.0).reshape(2, 3)}
    save_checkpoint(tmp_path / "m.safetensors", model=model, meta={"model": "toy"}, extra_tensors=kept)
    loaded = load_checkpoint(tmp_path / "m.safetensors")
    assert torch.equal(loaded.tensors["extra.last.weight"], kept["last.weight"])
    assert set(loaded.model_state()) == set(model.state_dict())  # the extra tensors are not the model's
