"""Export (:mod:`capsnets.export`, ``capsnets export``): every model family to ONNX, run by onnxruntime and compared
with eager PyTorch on random and real inputs at several batch sizes; torch.export programs; clear refusals."""

from __future__ import annotations

import json
import re

import pytest
import torch

import capsnets
from capsnets.cli import main
from capsnets.engine.checkpoint import save_checkpoint
from capsnets.export import ExportableModel, export_model, run_onnx

#: One model of each family: vector capsules (dynamic routing: the shipped ``capsnet_small-mnist`` weight, which the
#: tests of predicting with an ONNX file use too), matrix capsules (EM routing), SegCaps, a CNN, Efficient-CapsNet
#: (self-attention routing).
FAMILIES = ["capsnet_small", "matrix_capsnet_small", "segcaps_small", "cnn_baseline_narrow", "efficient_capsnet"]


#: The families whose export takes 10 s or so: started first (tests/conftest.py).
LONG_EXPORTS = {"matrix_capsnet_small", "segcaps_small"}

#: Builder arguments of the exported models: SegCaps with 2 routing iterations instead of 3, which runs the routing's
#: update as 3 do, with a third less graph to trace.
MODEL_ARGS = {"capsnet_small": {"pretrained": "mnist"}, "segcaps_small": {"routing": {"iterations": 2}}}

#: The names of each family's ONNX outputs, by task.
OUTPUTS = {
    "capsnet_small": ["scores", "capsules", "reconstruction"],
    "matrix_capsnet_small": ["scores", "capsules"],
    "segcaps_small": ["probabilities"],
    "cnn_baseline_narrow": ["scores"],
    "efficient_capsnet": ["scores", "capsules", "reconstruction"],
}


class _Exports(dict):
    """Each family's model (seeded) and its ONNX file, exported on first use and kept for the module, so that each
    pytest-xdist worker exports only the families its tests use."""

    def __init__(self, root):
        super().__init__()
        self.root = root

    def __missing__(self, name):
        torch.manual_seed(0)
        model = capsnets.create_model(name, **MODEL_ARGS.get(name, {})).eval()
        self[name] = (model, export_model(model, self.root / f"{name}.onnx"))
        return self[name]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return _Exports(tmp_path_factory.mktemp("export"))


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.long) if n in LONG_EXPORTS else n for n in FAMILIES]
)
def test_onnx_runs_in_onnxruntime_as_pytorch_does(exported, name):
    model, report = exported[name]
    assert report.max_abs_difference <= 1e-4 and report.checked_batches == [1, 5]
    assert report.output_names == OUTPUTS[name]  # named by task
    wrapped = ExportableModel(model)
    gen = torch.Generator().manual_seed(7)
    for batch in (1, 3, 16):  # the batch dimension is dynamic
        images = torch.rand(batch, *model.input_size, generator=gen)
        got = run_onnx(report.path, images)
        with torch.no_grad():
            expected = wrapped(images)
        assert [g.shape for g in got] == [e.shape for e in expected]
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=0, atol=1e-4)


def test_torch_export_programs_load_and_agree(tmp_path):
    torch.manual_seed(0)
    model = capsnets.create_model("capsnet_digits").eval()
    report = export_model(model, tmp_path / "m.pt2", "torch_export")
    assert report.max_abs_difference <= 1e-5
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    images = torch.rand(4, *model.input_size)
    with torch.no_grad():
        torch.testing.assert_close(program(images)[0], model(images).scores, rtol=0, atol=1e-5)


def test_models_that_cannot_be_exported_say_why(tmp_path):
    with pytest.raises(ValueError, match="only classification and segmentation models can be exported"):
        export_model(capsnets.create_model("transforming_autoencoder"), tmp_path / "t.onnx")
    assert not (tmp_path / "t.onnx").exists()
    with pytest.raises(ValueError, match="format must be one of onnx, torch_export"):
        export_model(capsnets.create_model("capsnet_digits"), tmp_path / "t.onnx", "tflite")


def test_the_cli_exports_a_run(tmp_path, capsys):
    torch.manual_seed(0)
    model = capsnets.create_model("capsnet_digits")
    save_checkpoint(
        tmp_path / "run" / "best.safetensors",
        model=model,
        meta={"model": "capsnet_digits", "model_args": model.model_args, "dataset": "digits"},
    )
    assert main(["export", "--checkpoint", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'run' / 'best.onnx'}" in out and "largest difference" in out
    assert "unused nodes" not in out  # the exporters' chatter is kept out
    images = torch.rand(2, *model.input_size)
    with torch.no_grad():
        torch.testing.assert_close(
            run_onnx(tmp_path / "run" / "best.onnx", images)[0], model.eval()(images).scores, rtol=0, atol=1e-4
        )
    for run_file in ("best.json", "best.safetensors"):
        assert main(["export", "--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "run" / run_file)]) == 1
        assert "would replace a file of a training run" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "other.json")]) == 1
    assert "does not end in .onnx; name a .onnx file" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(tmp_path / "nowhere")]) == 1
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("routing", ["dynamic", "none_of_the_above"])
def test_exported_local_routing_agrees_with_eager(tmp_path, routing):
    # The routing alone, on votes of unit scale: a model's outputs at initialisation can hide a routing error
    # below the 1e-4 tolerance, so the graph that export takes for few children (sums of products) is checked
    # here where every iteration changes the result.
    from capsnets.functional import DynamicRouting, local_routing

    class Route(torch.nn.Module):
        def forward(self, u_hat):
            return local_routing(u_hat, DynamicRouting(3, none_of_the_above=routing == "none_of_the_above"))

    u_hat = torch.randn(2, 3, 4, 8, 5, 5, generator=torch.Generator().manual_seed(0))
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(Route(), (u_hat,), dynamic_shapes=({0: batch},), strict=False)
    torch.onnx.export(program, (u_hat,), dynamo=True, optimize=False, verbose=False).save(tmp_path / "route.onnx")
    one_pass = local_routing(u_hat, DynamicRouting(1))
    for votes in (u_hat, torch.randn(3, 3, 4, 8, 5, 5, generator=torch.Generator().manual_seed(1))):
        got = run_onnx(tmp_path / "route.onnx", votes)[0]
        expected = Route()(votes)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert (Route()(u_hat) - one_pass).abs().max() > 1e-2  # the iterations matter on these votes


def test_the_onnx_file_says_what_its_model_takes_and_names_its_batch_axis(exported):
    import onnx

    model, report = exported["capsnet_small"]
    proto = onnx.load(report.path)
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["capsnets_version"] == capsnets.__version__ and meta["model"] == "capsnet_small"
    assert json.loads(meta["class_names"]) == model.class_names and json.loads(meta["input_size"]) == [1, 28, 28]
    assert meta["task"] == "classification" and "values in [0, 1]" in meta["preprocessing"]
    assert meta["score_kind"] == "length"  # what OnnxModel's scores are
    for value in (*proto.graph.input, *proto.graph.output):
        assert value.type.tensor_type.shape.dim[0].dim_param == "batch", value.name
    symbols = {d.dim_param for v in proto.graph.value_info for d in v.type.tensor_type.shape.dim if d.dim_param}
    assert not any(re.fullmatch(r"s\d+", s) for s in symbols), symbols


def test_the_onnx_metadata_names_the_training_data_and_its_framing():
    from capsnets.export import onnx_metadata

    model = capsnets.create_model("capsnet_small", device="meta")
    model.checkpoint_meta = {"dataset": "mnist"}
    assert onnx_metadata(model)["dataset"] == "mnist" and "dark background" in onnx_metadata(model)["preprocessing"]
    model = capsnets.create_model("matrix_capsnet_small", device="meta")
    model.checkpoint_meta = {"dataset": "smallnorb"}
    assert "standardised per image" in onnx_metadata(model)["preprocessing"]
    model.checkpoint_meta = {"multilabel": True, "thresholds": [0.25] * 5}
    meta = onnx_metadata(model, score_kind="activation")
    assert meta["multilabel"] == "true" and json.loads(meta["thresholds"]) == [0.25] * 5
    assert meta["score_kind"] == "activation" and "mask_format" not in meta


@pytest.fixture(scope="module")
def mnist_onnx(exported):
    """The shipped ``capsnet_small-mnist`` weight and its ONNX file (the vector capsules' family export)."""
    model, report = exported["capsnet_small"]
    return model, report.path


def test_predict_runs_an_onnx_file_as_the_model(mnist_onnx, shared_data_root):
    from capsnets.data import load_dataset
    from capsnets.export import OnnxModel

    model, path = mnist_onnx
    onnx_model = OnnxModel(path)
    assert onnx_model.input_size == model.input_size and onnx_model.class_names == model.class_names
    assert onnx_model.checkpoint_meta["dataset"] == "mnist" and onnx_model.score_kind == "length"
    assert onnx_model.checkpoint_meta["reconstruction_limits"] == model.checkpoint_meta["reconstruction_limits"]
    images = load_dataset("mnist", root=shared_data_root, train=False).images[:256]
    images = torch.cat([images, torch.zeros(4, *model.input_size, dtype=images.dtype)])  # blank: unsure by the decoder
    expected = capsnets.predict(model, images, batch_size=100)
    got = capsnets.predict(onnx_model, images, batch_size=100)  # batches of 100, 100, 60: the batch axis is dynamic
    assert [p.label for p in got] == [p.label for p in expected]
    assert len({p.label for p in got}) == 10  # a real test: every class is answered
    assert {p.unsure_rule for p in got} == {"score and reconstruction"} and all(p.uncertain for p in got[-4:])
    assert [p.uncertain for p in got] == [p.uncertain for p in expected]
    for g, e in zip(got, expected):
        assert g.scores.keys() == e.scores.keys() and g.lengths.keys() == e.lengths.keys()
        assert max(abs(g.scores[k] - e.scores[k]) for k in e.scores) <= 1e-4
        assert max(abs(g.lengths[k] - e.lengths[k]) for k in e.lengths) <= 1e-4
        assert max(abs(g.reconstruction_error[k] - e.reconstruction_error[k]) for k in ("pixel", "relative")) <= 1e-4


def test_the_cli_predicts_with_an_onnx_file_as_with_its_checkpoint(mnist_onnx, shared_data_root, tmp_path, capsys):
    from PIL import Image

    from capsnets.data import load_dataset

    _, path = mnist_onnx
    test = load_dataset("mnist", root=shared_data_root, train=False)
    files = []
    for k in range(12):  # prepared by predict as MNIST was: framed, not inverted
        files.append(str(tmp_path / f"digit{k}.png"))
        Image.fromarray((test.images[k, 0] * 255).round().byte().numpy()).save(files[-1])
    answers = {}
    for source in (["--pretrained", "capsnet_small-mnist"], ["--checkpoint", str(path)]):
        assert main(["predict", *files, *source, "--json", "-"]) == 0
        answers[source[0]] = json.loads(capsys.readouterr().out)
    checkpoint, onnx = answers["--pretrained"], answers["--checkpoint"]
    assert onnx["checkpoint"] == str(path) and onnx["model"] == "capsnet_small" and onnx["dataset"] == "mnist"
    assert [p["label"] for p in onnx["predictions"]] == [p["label"] for p in checkpoint["predictions"]]
    assert [p["label"] for p in onnx["predictions"]] == [str(int(label)) for label in test.labels[:12]]
    for got, expected in zip(onnx["predictions"], checkpoint["predictions"]):
        assert max(abs(got["scores"][k] - expected["scores"][k]) for k in expected["scores"]) <= 1e-4
    assert main(["predict", files[0], "--checkpoint", str(path)]) == 0  # the text, as for a checkpoint
    assert capsys.readouterr().out.startswith(f"{files[0]}: {onnx['predictions'][0]['label']} (score ")
    assert main(["predict", files[0], "--checkpoint", str(path), "--device", "cuda"]) == 1
    assert "is run by onnxruntime on the CPU" in capsys.readouterr().err


def test_an_onnx_file_without_the_metadata_is_refused_with_what_to_do(mnist_onnx, tmp_path, monkeypatch, capsys):
    import sys

    import onnx

    from capsnets.export import OnnxModel

    _, path = mnist_onnx
    proto = onnx.load(path)
    exported = [(p.key, p.value) for p in proto.metadata_props]

    def variant(name, drop=(), add=None):
        kept = [(key, value) for key, value in exported if key not in drop]
        del proto.metadata_props[:]
        for key, value in [*kept, *(add or {}).items()]:
            proto.metadata_props.add(key=key, value=value)
        onnx.save(proto, tmp_path / name)
        return tmp_path / name

    older = variant("older.onnx", drop=("score_kind",))  # exported before the metadata said what its scores are
    with pytest.raises(
        ValueError, match=r"does not record score_kind in its metadata.*earlier capsnets.*export the model again"
    ):
        OnnxModel(older)
    other = variant("other.onnx", drop=("capsnets", "capsnets_version", "model", "task", "input_size", "score_kind"))
    with pytest.raises(ValueError, match="model, task, input_size, score_kind .*another tool than capsnets"):
        OnnxModel(other)
    image = tmp_path / "blank.png"
    image.write_bytes(b"")  # never read: the file is refused first
    assert main(["predict", str(image), "--checkpoint", str(older)]) == 1
    assert "does not record score_kind" in capsys.readouterr().err
    # a multi-label model's file answers with the set of classes present
    multilabel = variant("multilabel.onnx", add={"multilabel": "true", "thresholds": json.dumps([0.5] * 10)})
    answer = capsnets.predict(OnnxModel(multilabel), torch.zeros(1, 1, 28, 28))[0]
    assert answer.labels is not None and answer.label is None
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # not installed
    with pytest.raises(ImportError, match=r"Running an ONNX file needs onnxruntime: pip install 'capsnets\[export\]'"):
        OnnxModel(path)


@pytest.mark.long
def test_a_segmentation_models_onnx_file_writes_the_masks_its_checkpoint_writes(tmp_path, capsys):
    from PIL import Image

    torch.manual_seed(0)
    model = capsnets.create_model("unet_small", num_classes=3)
    mask_format = {"mode": "RGB", "values": [[0, 0, 0], [0, 128, 0], [200, 0, 0]]}
    save_checkpoint(
        tmp_path / "run" / "best.safetensors",
        model=model,
        meta={
            "model": "unet_small",
            "model_args": model.model_args,
            "classes": ["a", "b", "c"],
            "mask_format": mask_format,
        },
    )
    assert main(["export", "--checkpoint", str(tmp_path / "run")]) == 0
    assert "outputs: probabilities" in capsys.readouterr().out
    image = tmp_path / "shape.png"
    Image.fromarray(torch.rand(32, 32, generator=torch.Generator().manual_seed(1)).mul(255).byte().numpy()).save(image)
    masks = {}
    for name, source in (("checkpoint", tmp_path / "run"), ("onnx", tmp_path / "run" / "best.onnx")):
        out = tmp_path / name
        assert main(["predict", str(image), "--checkpoint", str(source), "--out", str(out), "--json", "-"]) == 0
        masks[name] = json.loads(capsys.readouterr().out)["predictions"][0]
        masks[name]["pixels"] = Image.open(out / "shape_mask.png").tobytes()
    assert masks["onnx"]["areas"] == masks["checkpoint"]["areas"] and list(masks["onnx"]["areas"]) == ["a", "b", "c"]
    assert masks["onnx"]["pixels"] == masks["checkpoint"]["pixels"]
