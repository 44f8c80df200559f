"""Registry-driven model tests (timm style): every registered model, forward and backward on CPU."""

import pytest
import torch

import capsnets
from capsnets.functional import DynamicRouting, EMRouting, LayerwiseEMRouting
from capsnets.losses import create_loss
from capsnets.models import MatrixCapsNet
from capsnets.validation import ArgumentError

from helpers import assert_finite, live_tensors, only_new_objects

EXPECTED_PARAMETERS = {
    "capsnet": 8_215_568,  # Sabour, Frosst & Hinton (2017), Sec. 5: 8.2M
    "cnn_baseline": 35_445_522,  # 35.4M
    "cnn_smallnorb": 4_252_549,  # the EM paper's smallNORB CNN, 4.2M
    "matrix_capsnet": 316_394,  # ~310K (5 classes; 315,850 with the official formulation, without primary biases)
    "matrix_capsnet_small": 67_154,  # ~68K
}


@pytest.mark.parametrize("name", capsnets.list_models(task="classification"))
@pytest.mark.parametrize("batch", [1, 3])
def test_forward_backward_every_parameter_gets_gradient(name, batch):
    torch.manual_seed(0)
    model = capsnets.create_model(name)
    images = torch.rand(batch, *model.input_size)
    labels = torch.randint(0, model.num_classes, (batch,))
    out = model(images, labels)
    assert out.scores.shape == (batch, model.num_classes)
    assert_finite(out.scores, f"{name} scores")
    loss, _ = create_loss(model.default_loss)(out, images, labels)
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{name}.{pname} got no gradient"
        assert_finite(p.grad, f"{name}.{pname}.grad")
    model.eval()
    with torch.no_grad():
        eval_out = model(images)
    if eval_out.reconstruction is not None:
        assert eval_out.reconstruction.shape == images.shape


@pytest.mark.parametrize("name, count", EXPECTED_PARAMETERS.items())
def test_paper_parameter_counts(name, count):
    assert capsnets.count_parameters(capsnets.create_model(name)) == count


def test_num_classes_and_input_size_overrides():
    model = capsnets.create_model("capsnet_small", num_classes=5, input_size=(3, 32, 32))
    out = model(torch.rand(2, 3, 32, 32))
    assert out.scores.shape == (2, 5) and out.reconstruction.shape == (2, 3, 32, 32)
    matrix = capsnets.create_model("matrix_capsnet_small", num_classes=10, input_size=(1, 28, 28))
    assert matrix(torch.rand(2, 1, 28, 28)).scores.shape == (2, 10)
    with pytest.raises(ValueError, match="too small"):
        capsnets.create_model("matrix_capsnet_small", input_size=(1, 12, 12))
    cnn = capsnets.create_model("cnn_baseline", input_size=(1, 8, 8), num_classes=4)
    assert cnn(torch.rand(2, 1, 8, 8)).scores.shape == (2, 4)


def test_registry_errors_are_clear():
    with pytest.raises(ValueError, match="Did you mean 'capsnet'"):
        capsnets.create_model("capsnett")
    with pytest.raises(ValueError, match="does not take"):
        capsnets.create_model("capsnet", widht=3)
    model = capsnets.create_model("capsnet_digits")
    with pytest.raises(ValueError, match=r"\(B, 1, 8, 8\)"):
        model(torch.rand(2, 1, 28, 28))


def test_routing_is_passed_in(load_benchmark):
    NaiveDynamicRouting = load_benchmark("baselines").NaiveDynamicRouting

    torch.manual_seed(0)
    fast = capsnets.create_model("capsnet_digits", dtype=torch.float64)
    naive = capsnets.create_model("capsnet_digits", routing=NaiveDynamicRouting(3), dtype=torch.float64)
    naive.load_state_dict(fast.state_dict())
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(fast(x).scores, naive(x).scores, rtol=0, atol=1e-6)
    assert capsnets.create_model("capsnet_digits", routing={"iterations": 1}).class_capsules.routing.iterations == 1
    assert capsnets.create_model("capsnet_digits", routing="dynamic").class_capsules.routing == DynamicRouting()


def test_matrix_models_configure_their_em_routing():
    settings = {"iterations": 2, "cost_normalization": "mass", "inverse_temperature": 1.5, "detach_routing": True}
    model = capsnets.create_model("matrix_capsnet_small", routing=settings)
    for layer in (model.conv_caps1, model.conv_caps2, model.class_capsules):
        routing = layer.routing
        assert (routing.iterations, routing.cost_normalization, routing.detach_routing) == (2, "mass", True)
        assert routing.inverse_temperatures == [1.5, 1.5]
    assert model.model_args["routing"]["cost_normalization"] == "mass"
    assert model.model_args["routing"]["inverse_temperature"] == [1.5, 1.5]
    with pytest.raises(ValueError, match="cost_normalization"):
        capsnets.create_model("matrix_capsnet_small", routing={"cost_normalization": "layer"})


def test_matrix_models_take_the_assignment_scope_of_their_convolutional_capsule_layers():
    torch.manual_seed(0)
    model = capsnets.create_model(
        "matrix_capsnet_small",
        input_size=(1, 28, 28),
        num_classes=10,
        assignment_scope="all_parents",
        routing={"detach_routing": True},
    )
    assert model.conv_caps1.assignment_scope == model.conv_caps2.assignment_scope == "all_parents"
    assert model.model_args["assignment_scope"] == "all_parents"
    images, labels = torch.rand(3, 1, 28, 28), torch.tensor([0, 4, 9])
    loss = create_loss(model.default_loss)(model(images, labels), images, labels)[0]
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    with pytest.raises(ValueError, match="checkpoint_chunks must be 0"):
        capsnets.create_model("matrix_capsnet_small", assignment_scope="all_parents", checkpoint_chunks=4)


def test_models_record_the_arguments_that_rebuild_them():
    model = capsnets.create_model("capsnet_small", input_size=(1, 36, 36), num_classes=10, device="cpu")
    assert model.model_args == {"input_size": [1, 36, 36], "num_classes": 10}
    routing = capsnets.functional.DynamicRouting(2)  # recorded as its spec (tests/models/test_routing_checkpoints.py)
    assert capsnets.create_model("capsnet_small", routing=routing).model_args == {"routing": routing.to_config()}


def _experiment_run(folder, model):
    from capsnets.data import TensorData
    from capsnets.experiments.runs import Runs

    (c, h, w), k = model.input_size, model.num_classes
    data = TensorData(torch.rand(8, c, h, w), torch.arange(8) % k, k, classes=[str(i) for i in range(k)], name="random")
    with Runs(folder) as runs:
        runs.fit("m", model, data, data, epochs=1, batch_size=4, max_shift=0, device="cpu", progress=False)
    (run,) = [p for p in folder.iterdir() if p.is_dir()]
    return run


def test_experiment_runs_rebuild_through_load_model(tmp_path):
    from capsnets.models import load_model

    model = capsnets.create_model("capsnet_small", input_size=(1, 36, 36))
    rebuilt = load_model(_experiment_run(tmp_path, model))
    assert rebuilt.input_size == (1, 36, 36) and rebuilt.checkpoint_meta["model"] == "capsnet_small"
    for (name, a), (_, b) in zip(model.state_dict().items(), rebuilt.state_dict().items()):
        assert torch.equal(a, b), name


def test_experiment_runs_of_differently_built_models_are_kept_apart(tmp_path):
    first = _experiment_run(tmp_path, capsnets.create_model("capsnet_small"))
    assert _experiment_run(tmp_path, capsnets.create_model("capsnet_small")) == first  # reused
    _experiment_run(tmp_path / "other", capsnets.create_model("capsnet_small", routing={"iterations": 1}))
    (other,) = [p for p in (tmp_path / "other").iterdir()]
    assert other.name != first.name


SMALL = [
    name
    for name in capsnets.list_models(task="classification") + capsnets.list_models(task="segmentation")
    if name.endswith(("_small", "_narrow", "_digits"))
]


@pytest.mark.parametrize("name", SMALL)
def test_training_steps_leave_no_tensors_behind(name):
    # A reference cycle through the autograd graph once kept every step of matrix_capsnet alive (it ran
    # out of a GPU's 80 GB within a few steps); every model's training step must free its graph.
    torch.manual_seed(0)
    model = capsnets.create_model(name)
    criterion = create_loss(model.default_loss)
    optimizer = torch.optim.Adam(model.parameters())
    images = torch.rand(2, *model.input_size)
    targets = (
        (images > 0.5).float()
        if capsnets.models.model_task(name) == "segmentation"
        else torch.arange(2) % model.num_classes
    )

    def step():
        loss = criterion(model(images, targets), images, targets)[0]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    with only_new_objects():
        step()  # the first step creates the optimiser's state
        before = live_tensors()
        for _ in range(2):
            step()
        assert live_tensors() == before  # a leak adds tensors at every step


def test_matrix_models_give_the_class_layer_a_routing_of_its_own():
    conv = EMRouting(3, detach_routing=True)
    classes = EMRouting(3, 1.0, cost_normalization="mean_std", detach_routing=True)
    model = MatrixCapsNet(
        input_size=(1, 28, 28),
        num_classes=10,
        conv_channels=64,
        primary_types=8,
        conv_caps1_types=16,
        conv_caps2_types=16,
        routing=LayerwiseEMRouting(conv, classes),
    )
    assert model.conv_caps1.routing is conv and model.conv_caps2.routing is conv
    assert model.class_capsules.routing == classes
    images, labels = torch.rand(2, 1, 28, 28), torch.tensor([1, 7])
    assert model(images, labels).scores.shape == (2, 10)
    spec = {**conv.to_config(), "class_layer": {"inverse_temperature": 1.0, "cost_normalization": "mean_std"}}
    assert MatrixCapsNet(routing=spec, device="meta").class_capsules.routing == classes
    with pytest.raises(ValueError, match="routing=.*its type is 'dynamic'"):
        MatrixCapsNet(routing="dynamic", device="meta")


def test_list_models_takes_fnmatch_patterns_a_task_and_pretrained():
    every = capsnets.list_models()
    assert capsnets.list_models("capsnet_s*") == [name for name in every if name.startswith("capsnet_s")] != []
    assert capsnets.list_models(["unet*", "segcaps"]) == ["segcaps", "unet", "unet_small"]
    assert capsnets.list_models("*_small", task="segmentation") == ["capsule_unet_small", "segcaps_small", "unet_small"]
    assert capsnets.list_models("nothing*") == []
    assert capsnets.list_models(pretrained=True) == ["capsnet_small", "efficient_capsnet", "matrix_capsnet_small"]
    assert capsnets.list_models("efficient*", pretrained=True) == ["efficient_capsnet"]
    with pytest.raises(ArgumentError, match="'segmentation' is a task: pass task='segmentation'"):
        capsnets.list_models("segmentation")
    with pytest.raises(ArgumentError, match="pattern must be a string or a list of strings"):
        capsnets.list_models(3)


def test_list_models_include_tags_lists_weights_as_timm_names_them():
    tagged = capsnets.list_models(pretrained=True, include_tags=True)
    assert tagged == [
        "capsnet_small.mnist",  # each model's default weight first
        "capsnet_small.fashion_mnist",
        "efficient_capsnet.mnist",
        "matrix_capsnet_small.mnist",
    ]
    assert capsnets.list_models(pretrained=True) == ["capsnet_small", "efficient_capsnet", "matrix_capsnet_small"]
    assert capsnets.list_models("capsnet_small", include_tags=True) == tagged[:2]  # a model's name: all its weights
    assert capsnets.list_models("*.mnist", pretrained=True, include_tags=True) == [tagged[0], *tagged[2:]]
    assert capsnets.list_models(["efficient*", "*.fashion_mnist"], include_tags=True) == [
        "capsnet_small.fashion_mnist",
        "efficient_capsnet.mnist",
        "efficient_capsnet_smallnorb",  # no shipped weight: its name
    ]
    every = capsnets.list_models(include_tags=True)
    assert len(every) == len(capsnets.list_models()) + 1 and set(tagged) <= set(every)
    assert capsnets.list_models(task="segmentation", include_tags=True) == capsnets.list_models(task="segmentation")


def test_list_models_learns_the_tags_from_the_pretrained_source(monkeypatch):
    from capsnets.models import registry

    monkeypatch.setattr(registry, "_PRETRAINED_SOURCE", lambda: {"unet": ["a", "b"], "capsnet": ["mnist"]})
    assert capsnets.list_models(pretrained=True) == ["capsnet", "unet"]
    assert capsnets.list_models(pretrained=True, include_tags=True) == ["capsnet.mnist", "unet.a", "unet.b"]
    assert capsnets.list_models("unet*", include_tags=True) == ["unet.a", "unet.b", "unet_small"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"include_tags": "yes"}, "include_tags must be true or false, got 'yes'"),
        ({"pretrained": 1}, "pretrained must be true or false, got 1"),
    ],
)
def test_list_models_refuses_flags_that_are_not_bools(kwargs, message):
    with pytest.raises(ArgumentError, match=message):
        capsnets.list_models(**kwargs)


@pytest.mark.parametrize(
    "name, layer",
    [
        ("capsnet_digits", "LinearCapsules"),
        ("efficient_capsnet", "LinearCapsules"),
        ("matrix_capsnet_small", "ClassMatrixCapsules"),
    ],
)
def test_the_class_capsule_layer_and_the_class_names_are_apart(name, layer):
    model = capsnets.create_model(name)
    assert type(model.class_capsules).__name__ == layer and not hasattr(model, "classes")
    assert model.class_names == [str(k) for k in range(model.num_classes)]
    assert capsnets.create_model("capsnet_digits", num_classes=3).class_names == ["0", "1", "2"]
    assert any(key.startswith("class_capsules.") for key in model.state_dict())
