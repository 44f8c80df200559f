"""Efficient-CapsNet (Mazzia, Salvetti & Chiaberge 2021): parameter counts against the paper and the authors' code
(EscVM/Efficient-CapsNet), the layers as that code computes them (float64 oracles), shapes, gradients, errors."""

import math

import pytest
import torch

import capsnets
from capsnets.functional import SelfAttentionRouting
from capsnets.losses import create_loss
from capsnets.models.efficient_capsnet import ConvCapsuleDecoder, DepthwisePrimaryCapsules, EfficientCapsNet
from capsnets.validation import ArgumentError

from helpers import assert_finite

# Paper, Table 2 (MNIST): 161K parameters, and Table 4 (smallNORB, 48x48 stereo pairs): 151K, both counted without
# the decoder that regularises training. Keras's count of the authors' graphs (models/efficient_capsnet_graph_mnist.py
# lines 32-42, models/efficient_capsnet_graph_smallnorb.py lines 33-64; utils/layers.py FCCaps.build) is 161,824
# and 151,664 trainable parameters; the decoders (generator_graph) add 1,411,344 and 229,570.
PAPER_COUNTS = [
    ("efficient_capsnet", {"reconstruction": False}, 161_824),
    ("efficient_capsnet", {}, 161_824 + 1_411_344),
    ("efficient_capsnet_smallnorb", {"input_size": (2, 48, 48), "reconstruction": False}, 151_664),
    ("efficient_capsnet_smallnorb", {"input_size": (2, 48, 48)}, 151_664 + 229_570),
    # the library's 32x32 grey crops: a 1-channel 7x7 stem, a 4x4 primary kernel, a 6x6 decoder seed
    ("efficient_capsnet_smallnorb", {"reconstruction": False}, 143_952),
    ("efficient_capsnet_smallnorb", {}, 143_952 + 226_149),
]


@pytest.mark.parametrize("name, overrides, count", PAPER_COUNTS)
def test_parameter_counts_are_the_papers(name, overrides, count):
    assert capsnets.count_parameters(capsnets.create_model(name, **overrides, device="meta")) == count


def test_the_layers_are_the_authors():
    mnist = capsnets.create_model("efficient_capsnet", device="meta")
    assert [conv.kernel_size + conv.stride for conv in mnist.stem if isinstance(conv, torch.nn.Conv2d)] == [
        (5, 5, 1, 1),
        (3, 3, 1, 1),
        (3, 3, 1, 1),
        (3, 3, 2, 2),
    ]
    assert mnist.primary.conv.kernel_size == (9, 9) and mnist.primary.conv.groups == 128
    assert (mnist.class_capsules.in_capsules, mnist.class_capsules.in_dim, mnist.class_capsules.out_dim) == (16, 8, 16)
    assert mnist.class_capsules.routing.spec == SelfAttentionRouting(bias=True, squash="efficient")
    assert mnist.stem[2].eps == 1e-3  # Keras's batch norm
    norb = capsnets.create_model("efficient_capsnet_smallnorb", input_size=(2, 48, 48), device="meta")
    assert norb.primary.conv.kernel_size == (8, 8) and norb.decoder.seed == (8, 8)
    assert isinstance(norb.stem[2], torch.nn.InstanceNorm2d) and norb.stem[1].negative_slope == 0.3


def test_initialisation_is_keras():
    torch.manual_seed(0)
    model = capsnets.create_model("efficient_capsnet_smallnorb", input_size=(2, 48, 48))
    # he_normal of FCCaps's (K, N, D_p, D) weight: Keras's fan-in is N * K * D_p = 16 * 5 * 8
    assert model.class_capsules.weight.std().item() == pytest.approx(math.sqrt(2 / 640), rel=0.05)
    first = model.stem[0].weight
    assert first.std().item() == pytest.approx(math.sqrt(2 / first[0].numel()), rel=0.1)
    norms = [m for m in model.stem if isinstance(m, torch.nn.InstanceNorm2d)]
    assert all(p.abs().max() <= 0.05 for m in norms for p in (m.weight, m.bias))
    assert all(not m.bias.any() for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    decoder = [m for m in capsnets.create_model("efficient_capsnet").decoder.mlp if isinstance(m, torch.nn.Linear)]
    assert decoder[0].weight.std().item() == pytest.approx(math.sqrt(2 / 160), rel=0.05)  # he_normal
    assert decoder[-1].weight.std().item() == pytest.approx(math.sqrt(2 / (1024 + 784)), rel=0.05)  # glorot_normal


def test_class_capsules_route_as_the_authors_fccaps():
    # utils/layers.py, FCCaps.call, literally: u = W u_in, c = softmax_parents(u . sum_k u_k / sqrt(D)) + b,
    # v = Squash(sum_i c u) with Squash(s) = (1 - 1/exp|s|) s/|s|
    torch.manual_seed(0)
    model = EfficientCapsNet(dtype=torch.float64, decoder=None)
    with torch.no_grad():
        model.class_capsules.routing.bias.normal_(0, 0.1)
    u_in = torch.randn(2, 16, 8, dtype=torch.float64)
    u = torch.einsum("bid,ijed->bjie", u_in, model.class_capsules.weight)  # (B, K, N, D)
    c = (
        torch.softmax(torch.einsum("bjie,bjke->bji", u, u) / math.sqrt(16), dim=1)
        + model.class_capsules.routing.bias.t()
    )
    s = (u * c.unsqueeze(-1)).sum(dim=2)
    n = s.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(model.class_capsules(u_in), (1 - 1 / torch.exp(n)) * s / n, rtol=0, atol=1e-12)


def test_primary_capsules_are_the_depthwise_channels_squashed():
    torch.manual_seed(0)
    layer = DepthwisePrimaryCapsules(16, 4, (3, 3), dtype=torch.float64)
    x = torch.randn(2, 16, 3, 3, dtype=torch.float64)
    s = torch.stack([(x[:, c] * layer.conv.weight[c, 0]).sum((-2, -1)) for c in range(16)], 1) + layer.conv.bias
    s = s.view(2, 4, 4)  # PrimaryCaps.call: Reshape((N, D)) of the 1x1x16 map
    n = s.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(layer(x), (1 - 1 / torch.exp(n)) * s / n, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "name, input_size", [("efficient_capsnet", (1, 28, 28)), ("efficient_capsnet_smallnorb", (2, 48, 48))]
)
@pytest.mark.parametrize("batch", [1, 3])
def test_shapes_and_every_parameter_gets_a_gradient(name, input_size, batch):
    torch.manual_seed(0)
    model = capsnets.create_model(name, input_size=input_size)
    images = torch.rand(batch, *input_size)
    labels = torch.arange(batch) % model.num_classes
    out = model(images, labels)
    assert out.scores.shape == (batch, model.num_classes) and out.score_kind == "length"
    assert out.capsules.shape == (batch, model.num_classes, 16) and out.reconstruction.shape == images.shape
    assert (out.scores < 1).all() and (out.reconstruction >= 0).all() and (out.reconstruction <= 1).all()
    loss, parts = create_loss(model.default_loss)(out, images, labels)
    assert set(parts) == {"margin", "reconstruction"}
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert_finite(p.grad, pname)


def test_the_decoder_draws_the_labelled_capsule_in_training_and_the_longest_otherwise():
    torch.manual_seed(0)
    model = capsnets.create_model("efficient_capsnet_smallnorb").eval()
    images, labels = torch.rand(3, 1, 32, 32), torch.tensor([4, 0, 2])
    with torch.no_grad():
        out, chosen = model(images), model(images, labels)
        torch.testing.assert_close(out.reconstruction, model.decoder(out.capsules, out.scores.argmax(1)))
        torch.testing.assert_close(chosen.reconstruction, model.decoder(out.capsules, labels))


def test_uint8_and_float64_images_give_the_float32_outputs():
    torch.manual_seed(0)
    model = capsnets.create_model("efficient_capsnet").eval()
    pixels = torch.randint(0, 256, (2, 1, 28, 28), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(model(pixels).scores, model((pixels.float() / 255).double()).scores, rtol=0, atol=0)


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(ValueError, match=r"input_size \(1, 12, 12\) is too small for the convolutions"):
        capsnets.create_model("efficient_capsnet_smallnorb", input_size=(1, 12, 12))
    with pytest.raises(ValueError, match="multiples of 8.*reconstruction=False"):
        capsnets.create_model("efficient_capsnet_smallnorb", input_size=(1, 36, 36))
    assert (
        capsnets.create_model(
            "efficient_capsnet_smallnorb", input_size=(1, 36, 36), reconstruction=False, device="meta"
        ).decoder
        is None
    )
    with pytest.raises(ArgumentError, match="routing=.*its type is 'em', and these capsule layers route with"):
        capsnets.create_model("efficient_capsnet", routing={"type": "em"})
    with pytest.raises(ValueError, match="norm must be one of 'batch', 'instance', got 'layer'"):
        EfficientCapsNet(norm="layer")
    with pytest.raises(ValueError, match="decoder must be one of"):
        EfficientCapsNet(decoder="mlp")
    with pytest.raises(ValueError, match=r"channels \(128\) must be a multiple of capsule_dim \(6\)"):
        EfficientCapsNet(primary_dim=6)
    with pytest.raises(ValueError, match="multiples of 8"):
        ConvCapsuleDecoder(5, 16, (1, 30, 32))


def test_another_routing_can_be_passed_in():
    model = capsnets.create_model(
        "efficient_capsnet", routing={"type": "dynamic", "iterations": 2}, reconstruction=False
    )
    assert model.model_args["routing"] == {
        "type": "dynamic",
        "iterations": 2,
        "detach_routing": True,
        "none_of_the_above": False,
    }
    assert model(torch.rand(2, 1, 28, 28)).scores.shape == (2, 10)
