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
from capsnets.validation import ArgumentError


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


# ---- fine-tuning: a pretrained weight into another class count and channel count ------------------------------


def test_a_shipped_weight_starts_a_model_of_other_classes_and_channels(caplog):
    from capsnets.models.hub import adapt_input_conv

    shipped = capsnets.create_model("capsnet_small", pretrained="mnist")
    with caplog.at_level("INFO", logger="capsnets.models.hub"):
        model = capsnets.create_model("capsnet_small", pretrained="mnist", num_classes=5, in_chans=3)
    assert (model.num_classes, model.input_size, model.class_names) == (5, (3, 28, 28), ["0", "1", "2", "3", "4"])
    transfer, trained, state = model.transfer, shipped.state_dict(), model.state_dict()
    assert transfer.adapted == ["conv.weight"] and torch.equal(
        state["conv.weight"], adapt_input_conv(trained["conv.weight"], 3)
    )
    # the class capsules and the decoder's layers that see the class count or the image's channels start afresh
    assert transfer.reinitialised == [
        "class_capsules.weight",
        "decoder.mlp.0.weight",
        "decoder.mlp.4.weight",
        "decoder.mlp.4.bias",
    ]
    assert set(transfer.loaded) == set(state) - set(transfer.adapted) - set(transfer.reinitialised)
    assert all(torch.equal(state[k], trained[k]) for k in transfer.loaded)
    assert not torch.equal(state["decoder.mlp.0.weight"][:, :80], trained["decoder.mlp.0.weight"][:, :80])
    assert model.checkpoint_meta["pretrained_from"] == "capsnet_small-mnist" and not model.training
    assert caplog.messages == [f"capsnet_small from capsnet_small-mnist: {transfer}"]
    assert str(transfer).startswith("loaded 6 of 11; adapted conv.weight") and "\n" not in str(transfer)
    with torch.no_grad():
        assert model(torch.rand(2, 3, 28, 28)).scores.shape == (2, 5)


@pytest.mark.parametrize(("trained", "new"), [(1, 3), (3, 1), (2, 6), (3, 3), (1, 1)])
def test_an_adapted_input_convolution_answers_a_grey_image_as_before(trained, new):
    """timm's rule: a grey image (every channel equal) gets the trained response where the new count is one or a
    multiple of the trained one."""
    from capsnets.models.hub import adapt_input_conv

    gen = torch.Generator().manual_seed(trained * 10 + new)
    weight, grey = (
        torch.randn(6, trained, 3, 3, generator=gen, dtype=torch.float64),
        torch.rand(2, 1, 9, 9, generator=gen, dtype=torch.float64),
    )
    expected = torch.nn.functional.conv2d(grey.expand(-1, trained, -1, -1), weight)
    got = torch.nn.functional.conv2d(grey.expand(-1, new, -1, -1), adapt_input_conv(weight, new))
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_a_run_directory_starts_a_fine_tuning_and_in_chans_builds_untrained_models(tmp_path):
    trained = capsnets.create_model("capsnet_digits")
    capsnets.save_model(tmp_path / "run" / "last.safetensors", trained, meta={"dataset": "digits"})
    model = capsnets.create_model("capsnet_digits", pretrained=str(tmp_path / "run"), num_classes=3)
    assert model.checkpoint_meta["pretrained_from"] == str(tmp_path / "run") and model.num_classes == 3
    assert capsnets.create_model("capsnet_small", in_chans=3).input_size == (3, 28, 28)
    for bad in (0, 1.5, True, "3"):
        with pytest.raises(ArgumentError, match="in_chans must be a positive int"):
            capsnets.create_model("capsnet_small", in_chans=bad)
    with pytest.raises(ArgumentError, match="need a"):
        capsnets.models.hub.adapt_input_conv(torch.ones(3, 3), 1)


def test_timms_model_dot_tag_names_a_weight():
    model = capsnets.create_model("capsnet_small.fashion_mnist", pretrained=True)
    assert model.model_name == "capsnet_small" and model.class_names[0] == "T-shirt/top"
    untrained = capsnets.create_model("capsnet_small.fashion_mnist")
    assert untrained.model_name == "capsnet_small" and not hasattr(untrained, "checkpoint_meta")
    with pytest.raises(ArgumentError, match="unknown model 'capsnet_smal.mnist'"):
        capsnets.create_model("capsnet_smal.mnist", pretrained=True)
