"""Models from files (:mod:`capsnets.models.hub`): built, saved and loaded without the training engine."""

import subprocess
import sys
import textwrap

import torch

import capsnets


def test_a_model_is_built_saved_and_loaded_without_importing_the_engine(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        import torch
        import capsnets

        model = capsnets.create_model("capsnet_digits")
        path = capsnets.save_model({str(tmp_path / "m.safetensors")!r}, model, meta={{"dataset": "digits"}})
        loaded, checkpoint = capsnets.load_model(path)
        images = torch.rand(2, 1, 8, 8)
        assert torch.equal(loaded(images).scores, model.eval()(images).scores)
        assert checkpoint.meta["dataset"] == "digits"
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
    loaded, checkpoint = capsnets.load_model(path.with_suffix(".json"))  # the sidecar names the checkpoint too
    assert checkpoint.meta["model"] == "capsnet_digits" and checkpoint.meta["model_args"] == {"num_classes": 5}
    assert loaded.num_classes == 5 and not loaded.training
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
