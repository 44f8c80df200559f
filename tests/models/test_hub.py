"""Models from files (:mod:`capsnets.models.hub`): built, saved and loaded without the training engine."""

import subprocess
import sys
import textwrap

import pytest
import torch

import capsnets
from capsnets.checkpoints import CheckpointError, load_checkpoint, write_checkpoint
from capsnets.models import model_from_checkpoint
from capsnets.models.hub import model_tensors


def test_a_model_is_built_saved_and_loaded_without_importing_the_engine(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        import torch
        import capsnets

        model = capsnets.create_model("capsnet_digits")
        path = capsnets.save_model({str(tmp_path / "m.safetensors")!r}, model, meta={{"dataset": "digits"}})
        loaded = capsnets.load_model(path)
        images = torch.rand(2, 1, 8, 8)
        assert torch.equal(loaded(images).scores, model.eval()(images).scores)
        assert loaded.checkpoint_meta["dataset"] == "digits"
        shipped = capsnets.create_model("capsnet_small", pretrained="mnist")
        engine = sorted(name for name in sys.modules if name.startswith(("capsnets.engine", "capsnets.experiments",
                                                                         "capsnets.demo")))
        print(",".join(engine) or "none")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none"


def test_save_model_records_what_rebuilds_it(tmp_path):
    torch.manual_seed(0)
    model = capsnets.create_model("capsnet_digits", num_classes=5)
    path = capsnets.save_model(tmp_path / "m.safetensors", model)
    loaded = capsnets.load_model(path.with_suffix(".json"))  # the sidecar names the checkpoint too
    meta = loaded.checkpoint_meta
    assert meta["model"] == "capsnet_digits" and meta["model_args"] == {"num_classes": 5}
    assert loaded.num_classes == 5 and not loaded.training
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


def test_load_model_takes_a_run_directory_or_a_file_and_returns_the_model(tmp_path):
    torch.manual_seed(0)
    model = capsnets.create_model("capsnet_digits", num_classes=3)
    names = ["cat", "dog", "bird"]
    run = tmp_path / "run"
    capsnets.save_model(run / "best.safetensors", model, meta={"classes": names, "dataset": "folder:pets"})
    images = torch.rand(2, 1, 8, 8)
    for source in (run, run / "best.safetensors"):
        loaded = capsnets.load_model(source)
        assert isinstance(loaded, torch.nn.Module) and not loaded.training
        assert loaded.class_names == names and loaded.checkpoint_meta["dataset"] == "folder:pets"
        assert not any(isinstance(v, torch.Tensor) for v in loaded.checkpoint_meta.values())
        assert torch.equal(loaded(images).scores, model.eval()(images).scores)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no best.safetensors or last.safetensors in run directory"):
        capsnets.load_model(tmp_path / "empty")


def test_model_from_checkpoint_serves_code_that_needs_the_checkpoint(tmp_path):
    path = capsnets.save_model(tmp_path / "m.safetensors", capsnets.create_model("capsnet_digits"))
    checkpoint = load_checkpoint(path)
    model = model_from_checkpoint(checkpoint)
    assert model.checkpoint_meta["checkpoint_id"] == checkpoint.meta["checkpoint_id"]
    assert model.class_names == [str(k) for k in range(10)]  # no recorded names: "0", "1", ...


def test_a_checkpoint_with_the_old_classifier_name_says_how_to_rename_it(tmp_path):
    model = capsnets.create_model("capsnet_digits")
    tensors = {k.replace("model.class_capsules.", "model.classes."): v for k, v in model_tensors(model).items()}
    old = write_checkpoint(tmp_path / "old.safetensors", tensors, {"model": "capsnet_digits", "model_args": {}})
    with pytest.raises(
        CheckpointError, match="classifier layer was named 'classes'; it is now 'class_capsules'"
    ) as err:
        capsnets.load_model(old)
    command = str(err.value).split('python -c "')[1].split('" (or retrain)')[0]
    done = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    renamed = capsnets.load_model(tmp_path / "old-renamed.safetensors")  # the command the error gives works
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), renamed.state_dict().values()))
