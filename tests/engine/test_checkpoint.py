"""Checkpoints: round trip, corruption detection, atomic replacement."""
import json

import pytest
import torch
from torch import nn

from capsnets.engine import checkpoint as ckpt
from capsnets.engine.checkpoint import CheckpointError, load_checkpoint, restore_model, restore_training, \
    save_checkpoint


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
    save_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler,
                    meta={"model": "toy", "model_args": {}, "epoch": 3, **meta})
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


def test_missing_file_and_sidecar(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.safetensors")
    with pytest.raises(CheckpointError, match="no best.safetensors or last.safetensors"):
        load_checkpoint(tmp_path)
    _save(tmp_path / "last.safetensors")
    (tmp_path / "last.json").unlink()
    with pytest.raises(CheckpointError, match="no sidecar"):
        load_checkpoint(tmp_path / "last.safetensors")


def test_sidecar_from_another_save_is_detected(tmp_path):
    _save(tmp_path / "a.safetensors")
    _save(tmp_path / "b.safetensors")
    (tmp_path / "a.json").write_text((tmp_path / "b.json").read_text())
    with pytest.raises(CheckpointError, match="does not belong"):
        load_checkpoint(tmp_path / "a.safetensors")


def test_key_mismatch(tmp_path):
    _save(tmp_path / "last.safetensors")
    with pytest.raises(CheckpointError, match="does not fit the model"):
        restore_model(nn.Linear(4, 3), load_checkpoint(tmp_path / "last.safetensors"))


def test_failed_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.safetensors"
    model, _, _ = _save(path)
    before = path.read_bytes(), (tmp_path / "last.json").read_text()

    def broken_save_file(tensors, filename, metadata=None):
        with open(filename, "wb") as handle:
            handle.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "save_file", broken_save_file)
    with pytest.raises(OSError, match="disk full"):
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
