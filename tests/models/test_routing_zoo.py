"""The router zoo (Hahn, Pyeon & Kim 2019's comparison): one backbone, every head, parameter counts against the
authors' code (coder3000/SR-CapsNet), shapes, gradients, losses and errors."""

import pytest
import torch

import capsnets
from capsnets.cli import main
from capsnets.functional import DynamicRouting
from capsnets.losses import create_loss
from capsnets.models.routing_zoo import HEAD_LOSSES, HEADS, RoutingZoo
from capsnets.validation import ArgumentError, describe

from helpers import assert_finite

# The paper gives parameter counts only for its ResNet-20 models. These are the counts of the code's smallNORB
# network (models/convnet.py, ConvNet with planes=16, num_caps=32, caps_size=16, depth=1; 1 channel, 5 classes),
# by hand from its layers: the backbone (lines 21-40) 142,992 convolution weights + 672 batch norm = 143,664;
# DR adds conv_pose + bn_pose (lines 63-64) 590,848 and W (line 65) 512 * 80 * 16 = 655,360; EM conv_a + bn_a
# 36,928, conv_pose + bn_pose 590,848, W 512 * 5 * 16 = 40,960 and beta_u, beta_a 10 (modules.py lines 92-96);
# AVG/MAX a 128 -> 5 linear layer; FC conv_ + bn_ 590,848 and a 8192 -> 5 linear layer.
CODE_COUNTS = {
    "dynamic": 1_389_872,
    "em": 812_410,
    "avg_pool": 144_309,
    "max_pool": 144_309,
    "fully_connected": 775_477,
}
# The heads the code does not have, or has otherwise: self-attention adds its log priors (512 x 5), inverted
# attention its LayerNorm's affine part (2 x 16) and the shared 16 -> 1 classifier, self-routing conv_a + bn_a
# and the routing network (512 x 5 x 16 + 512 x 5), and poses for its class capsules (512 x 5 x 16 x 16).
# Heinsen's routing has the EM head's conv_a + bn_a and primary poses, W and B of 512 x 5 x 4 x 4 each and
# beta_use, beta_ign of 512 x 5 each; homogeneous vector capsules the primary poses, 5 x 512 x 16 weights and
# the normalisation's 16 offsets.
OTHER_COUNTS = {
    "heinsen": 143_664 + 590_848 + 36_928 + 2 * 40_960 + 2 * 2_560,
    "hvc": 143_664 + 590_848 + 40_960 + 16,
    "uniform": 1_389_872,
    "self_attention": 1_389_872 + 2_560,
    "inverted_attention": 1_389_872 + 32 + 17,
    "self_routing": 1_389_872 + 36_928 + 40_960 + 2_560,
}


def test_every_head_is_counted():
    assert set(CODE_COUNTS) | set(OTHER_COUNTS) == set(HEADS)


@pytest.mark.parametrize("head", HEADS)
def test_parameter_counts(head):
    model = capsnets.create_model("routing_zoo", head=head, device="meta")
    assert capsnets.count_parameters(model) == {**CODE_COUNTS, **OTHER_COUNTS}[head]


SCORES = {
    "dynamic": "length",
    "self_attention": "length",
    "uniform": "length",
    "em": "activation",
    "inverted_attention": "logits",
    "self_routing": "logits",
    "heinsen": "logits",
    "hvc": "logits",
    "avg_pool": "logits",
    "max_pool": "logits",
    "fully_connected": "logits",
}


@pytest.mark.parametrize("head", HEADS)
def test_every_head_trains_a_step_with_its_loss(head):
    torch.manual_seed(0)
    model = capsnets.create_model("routing_zoo", head=head, input_size=(1, 28, 28), num_classes=10)
    assert model.default_loss == HEAD_LOSSES[head]
    for batch in (2, 1):  # a batch of one in training mode too
        model.zero_grad(set_to_none=True)
        images, labels = torch.rand(batch, 1, 28, 28), torch.arange(batch) + 3
        out = model(images, labels)
        assert out.scores.shape == (batch, 10) and out.score_kind == SCORES[head]
        assert (out.capsules is None) == (head in ("avg_pool", "max_pool", "fully_connected"))
        if out.capsules is not None:
            assert out.capsules.shape == (batch, 10, 16)
        create_loss(model.default_loss)(out, images, labels)[0].backward()
        for name, p in model.named_parameters():
            assert p.grad is not None, f"{head}: {name} got no gradient"
            assert_finite(p.grad, f"{head}: {name}")
    model.eval()
    with torch.no_grad():
        assert model(torch.rand(1, 1, 28, 28)).scores.shape == (1, 10)


def test_scores_are_what_each_loss_reads():
    torch.manual_seed(0)
    images = torch.rand(3, 1, 32, 32)
    with torch.no_grad():
        lengths = capsnets.create_model("routing_zoo", head="dynamic")(images).scores
        activations = capsnets.create_model("routing_zoo", head="em")(images).scores
        log_activations = capsnets.create_model("routing_zoo", head="self_routing")(images).scores
        hvc = capsnets.create_model("routing_zoo", head="hvc")(images)
    assert ((lengths >= 0) & (lengths < 1)).all() and ((activations > 0) & (activations < 1)).all()
    # homogeneous vector capsules: each logit is the length of its (rectified) class capsule
    torch.testing.assert_close(hvc.scores, hvc.capsules.norm(dim=-1))
    assert (hvc.capsules >= 0).all()
    # self-routing's class activations sum to 1 over the classes: its scores are log-probabilities (the paper's NLL)
    torch.testing.assert_close(log_activations.exp().sum(1), torch.ones(3))


def test_every_head_has_the_same_backbone():
    states = []
    for head in HEADS:
        torch.manual_seed(0)
        states.append(capsnets.create_model("routing_zoo", head=head).backbone.state_dict())
    for state in states[1:]:
        assert state.keys() == states[0].keys()
        assert all(torch.equal(state[key], states[0][key]) for key in state)


def test_routing_settings_reach_the_heads():
    dynamic = capsnets.create_model("routing_zoo", head="dynamic", routing={"iterations": 2}, device="meta")
    em = capsnets.create_model("routing_zoo", head="em", routing={"iterations": 2}, device="meta")
    inverted = capsnets.create_model("routing_zoo", head="inverted_attention", routing={"iterations": 4}, device="meta")
    assert dynamic.head.class_capsules.routing.iterations == em.head.class_capsules.routing.iterations == 2
    assert inverted.head.class_capsules.routing.spec.iterations == 4
    assert dynamic.model_args == {"head": "dynamic", "routing": DynamicRouting(2).to_config()}
    with pytest.raises(ValueError, match="routing type 'uniform' does not take iterations; it takes: mean, squash"):
        capsnets.create_model("routing_zoo", head="uniform", routing={"iterations": 2})
    with pytest.raises(ValueError, match="head 'avg_pool' has no routing"):
        capsnets.create_model("routing_zoo", head="avg_pool", routing={"iterations": 2})
    with pytest.raises(ValueError, match="head 'hvc' has no routing"):
        capsnets.create_model("routing_zoo", head="hvc", routing={"iterations": 2})
    heinsen = capsnets.create_model("routing_zoo", head="heinsen", routing={"iterations": 2}, device="meta")
    assert heinsen.head.class_capsules.routing.spec.iterations == 2
    with pytest.raises(ValueError, match="its type is 'em'"):
        capsnets.create_model("routing_zoo", head="dynamic", routing={"type": "em"})


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(ArgumentError, match="head must be one of 'dynamic', 'em', .*'fully_connected', got 'capsule'"):
        capsnets.create_model("routing_zoo", head="capsule")
    with pytest.raises(ValueError, match="head must be one of"):
        RoutingZoo(head="max")
    with pytest.raises(ValueError, match="square capsule_dim"):
        capsnets.create_model("routing_zoo", head="em", capsule_dim=8)
    with pytest.raises(ValueError, match="head 'heinsen' needs a square capsule_dim"):
        capsnets.create_model("routing_zoo", head="heinsen", capsule_dim=8)
    with pytest.raises(ValueError, match="square map; got capsule_dim=16 and a 4x6 map"):
        capsnets.create_model("routing_zoo", head="em", input_size=(1, 32, 48))
    with pytest.raises(ArgumentError, match="width must be a positive integer"):
        capsnets.create_model("routing_zoo", width=0)
    with pytest.raises(ArgumentError, match=r"expects images of shape \(B, 1, 32, 32\)"):
        capsnets.create_model("routing_zoo")(torch.rand(2, 1, 28, 28))


def test_list_models_shows_the_heads(capsys):
    assert main(["list-models", "routing_zoo"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "head=dynamic  # one of " + ", ".join(map(repr, HEADS)) in lines
    assert "routing=null  # " + describe("Routing | None") in lines
    assert "routing.iterations=3  # a setting of the default routing" in lines
