"""Hostile and careless inputs that must get a clear error, and never destroy a run's files: an output flag
aimed at a checkpoint, an empty path, a routing asked to iterate without end (from an argument or a checkpoint's
sidecar), an integer tensor given to ``squash``."""

from __future__ import annotations

import json

import pytest
import torch
from reliability.faults import train_args

from capsnets.checkpoints import CheckpointError, load_checkpoint, write_checkpoint
from capsnets.cli import main
from capsnets.engine import reporting
from capsnets.functional import DynamicRouting, InvertedAttentionRouting, dynamic_routing, squash
from capsnets.functional.em.routing import EMRouting
from capsnets.models import create_model, load_model
from capsnets.models.hub import model_tensors
from capsnets.validation import MAX_ROUTING_ITERATIONS, ArgumentError


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
        assert main([*train_args(1), "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("target", ["last.safetensors", "last.json", "best.json", "summary.json", "config.yaml"])
def test_predict_json_never_replaces_a_file_of_the_run(run, target, tmp_path, capsys):
    image = tmp_path / "x.png"
    from PIL import Image

    Image.new("L", (8, 8), 255).save(image)
    before = (run / target).read_bytes()
    assert main(["predict", "--checkpoint", str(run), "--json", str(run / target), str(image)]) == 1
    err = capsys.readouterr().err
    assert f"--json '{run / target}' would replace a file of a training run" in err and "Traceback" not in err
    assert (run / target).read_bytes() == before
    assert main(["train", "--resume", "--out", str(run), "--epochs", "2", "--no-progress"]) == 0  # still resumable


def test_predict_json_writes_elsewhere_in_the_run_directory(run, tmp_path, capsys):
    image = tmp_path / "x.png"
    from PIL import Image

    Image.new("L", (8, 8), 255).save(image)
    assert main(["predict", "--checkpoint", str(run), "--json", str(tmp_path / "p.json"), str(image)]) == 0
    assert json.loads((tmp_path / "p.json").read_text())["predictions"][0]["path"] == str(image)


@pytest.mark.parametrize(
    "argv",
    [
        [*train_args(1), "--out", ""],
        ["evaluate", "--checkpoint", "x", "--out", " "],
        ["predict", "--checkpoint", "x", "--json", "", "a.png"],
        ["experiment", "dimensions", "--out", ""],
    ],
)
def test_an_empty_path_is_refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "an empty path; name a file or directory" in capsys.readouterr().err


def test_routing_iterations_are_bounded():
    too_many = MAX_ROUTING_ITERATIONS + 1
    for build in (
        lambda: DynamicRouting(too_many),
        lambda: DynamicRouting(10**9),
        lambda: EMRouting.official(too_many),
        lambda: InvertedAttentionRouting(iterations=too_many),
        lambda: dynamic_routing(torch.zeros(1, 2, 2, 2), iterations=10**9),
    ):
        with pytest.raises(ArgumentError, match=f"iterations must be an integer from 1 to {MAX_ROUTING_ITERATIONS}"):
            build()
    assert DynamicRouting(MAX_ROUTING_ITERATIONS).iterations == MAX_ROUTING_ITERATIONS
    assert DynamicRouting(2.0).iterations == 2  # an integral float, as YAML may give


def test_a_sidecar_asking_for_endless_routing_is_refused(tmp_path):
    model = create_model("capsnet_digits", routing={"iterations": 2})  # model_args records the routing spec
    args = {**model.model_args, "routing": {**model.model_args["routing"], "iterations": 10**9}}
    path = write_checkpoint(
        tmp_path / "m.safetensors", model_tensors(model), {"model": "capsnet_digits", "model_args": args}
    )
    assert load_checkpoint(path).meta["model_args"]["routing"]["iterations"] == 10**9  # the digests are valid
    with pytest.raises(CheckpointError, match="iterations must be an integer from 1 to 100"):
        load_model(path)


def test_squash_refuses_integer_tensors():
    with pytest.raises(ArgumentError, match=r"squash takes a floating-point tensor, got torch.int64; .*s.float\(\)"):
        squash(torch.ones(2, 3, dtype=torch.long))


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.complex64])
def test_a_checkpoint_of_other_kinds_of_numbers_is_refused(tmp_path, dtype):
    model = create_model("capsnet_digits")
    tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in model_tensors(model).items()}
    path = write_checkpoint(tmp_path / "m.safetensors", tensors, {"model": "capsnet_digits", "model_args": {}})
    with pytest.raises(CheckpointError, match=f"holds tensors of another kind than the model's .*{dtype}"):
        load_model(path)


def test_a_checkpoint_of_nan_weights_is_refused(tmp_path):
    model = create_model("capsnet_digits")
    tensors = {
        k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in model_tensors(model).items()
    }
    path = write_checkpoint(tmp_path / "m.safetensors", tensors, {"model": "capsnet_digits", "model_args": {}})
    with pytest.raises(CheckpointError, match="holds NaN or infinite weights"):
        load_model(path)
    half = {k: v.half() if v.is_floating_point() else v for k, v in model_tensors(model).items()}
    path = write_checkpoint(tmp_path / "h.safetensors", half, {"model": "capsnet_digits", "model_args": {}})
    assert load_model(path).class_names  # float16 weights, as the shipped ones, still load


@pytest.mark.parametrize(
    ("error", "expected"),
    [(MemoryError(), "out of memory; use a smaller --batch-size"), (RecursionError("deep"), "nested too deeply")],
)
def test_memory_and_recursion_errors_reach_the_user_as_one_line(error, expected, monkeypatch, capsys):
    def fail(args):
        raise error

    monkeypatch.setattr("capsnets.cli._list_models", fail)
    monkeypatch.delenv("CAPSNETS_DEBUG", raising=False)
    assert main(["list-models"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err
