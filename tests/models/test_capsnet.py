"""The CapsNets of Sabour, Frosst & Hinton (2017), Sec. 7: CIFAR-10, SVHN and smallNORB, as the paper describes
them. Parameter counts are worked out layer by layer from the paper's sizes (and checked against the paper's
8.2M / 6.8M for MNIST, the only counts it gives); shapes; the CIFAR-10 model's 24x24 patches and its
none-of-the-above parent."""

import json

import pytest
import torch

import capsnets
from capsnets.data import center_crop, random_crop
from capsnets.engine.checkpoint import save_checkpoint
from capsnets.functional import DynamicRouting, SelfAttentionRouting
from capsnets.models import load_model
from capsnets.models.capsnet import CapsNet
from capsnets.testing import reference_dynamic_routing


def capsnet_parameters(
    *,
    channels: int,
    image: int,
    conv: int = 256,
    kernel: int = 9,
    types: int = 32,
    primary_dim: int = 8,
    classes: int = 10,
    class_dim: int = 16,
    decoder: tuple[int, ...] | None = (512, 1024),
    pixels: int | None = None,
) -> int:
    """Sec. 4's layers: a ReLU conv (weights + biases), the primary capsules' 9x9 stride-2 conv (weights + biases)
    on its valid output, one 8-D -> 16-D matrix per (primary capsule, class) without biases, and the decoder's
    fully connected layers (weights + biases) from the masked class capsules to ``pixels`` outputs."""
    grid = ((image - kernel + 1) - kernel) // 2 + 1
    count = conv * channels * kernel**2 + conv
    count += types * primary_dim * conv * kernel**2 + types * primary_dim
    count += grid * grid * types * primary_dim * classes * class_dim
    sizes = [classes * class_dim, *decoder, pixels] if decoder else []
    return count + sum(a * b + b for a, b in zip(sizes, sizes[1:]))


#: id: (model, its arguments, parameters, the paper's layer sizes for :func:`capsnet_parameters`)
PAPER_COUNTS = {
    "mnist": ("capsnet", {}, 8_215_568, dict(channels=1, image=28, pixels=784)),
    "mnist_without_decoder": (
        "capsnet",
        {"reconstruction": False},
        6_804_224,
        dict(channels=1, image=28, decoder=None),
    ),
    "cifar10": ("capsnet_cifar10", {}, 11_990_528, dict(channels=3, image=24, types=64, decoder=None)),
    "svhn": (
        "capsnet_svhn",
        {},
        4_720_480,
        dict(channels=3, image=32, conv=64, types=16, primary_dim=6, class_dim=8, pixels=3 * 32 * 32),
    ),
    "smallnorb": (
        "capsnet",
        {"input_size": (1, 32, 32), "num_classes": 5},
        8_256_768,
        dict(channels=1, image=32, classes=5, pixels=32 * 32),
    ),
}


@pytest.mark.parametrize("case", PAPER_COUNTS)
def test_parameter_counts_follow_the_papers_layer_sizes(case):
    name, args, count, sizes = PAPER_COUNTS[case]
    assert capsnets.count_parameters(capsnets.create_model(name, **args)) == count == capsnet_parameters(**sizes)


def test_the_mnist_counts_are_the_papers():
    # Sec. 5: "CapsNet has 8.2M parameters and 6.8M parameters without the reconstruction subnetwork"
    assert round(PAPER_COUNTS["mnist"][2] / 1e6, 1) == 8.2
    assert round(PAPER_COUNTS["mnist_without_decoder"][2] / 1e6, 1) == 6.8


def test_cifar10_model_shapes_and_routing():
    model = capsnets.create_model("capsnet_cifar10")
    assert model.input_size == (3, 32, 32) and model.crop == 24 and model.decoder is None
    assert model.primary.num_capsules(16, 16) == 4 * 4 * 64 == model.class_capsules.in_capsules
    assert model.class_capsules.routing == DynamicRouting(3, none_of_the_above=True)
    out = model(torch.rand(2, 3, 32, 32))
    assert out.scores.shape == (2, 10) and out.capsules.shape == (2, 10, 16) and out.reconstruction is None


def test_svhn_model_shapes():
    model = capsnets.create_model("capsnet_svhn")
    assert model.conv.out_channels == 64 and model.primary.num_types == 16 and model.primary.capsule_dim == 6
    assert model.class_capsules.in_capsules == 8 * 8 * 16 and model.class_capsules.out_dim == 8
    assert model.class_capsules.routing == DynamicRouting()
    images = torch.rand(3, 3, 32, 32)
    out = model(images, torch.tensor([0, 4, 9]))
    assert out.capsules.shape == (3, 10, 8) and out.reconstruction.shape == images.shape


def test_smallnorb_model_is_the_mnist_model_on_32x32_crops():
    model = capsnets.create_model("capsnet", input_size=(1, 32, 32), num_classes=5)
    assert model.class_capsules.in_capsules == 8 * 8 * 32 and model.conv.out_channels == 256
    out = model(torch.randn(2, 1, 32, 32), torch.tensor([1, 3]))
    assert out.scores.shape == (2, 5) and out.reconstruction.shape == (2, 1, 32, 32)


def _uncropped_twin(model: CapsNet) -> CapsNet:
    """The same weights, taking the 24x24 patches themselves as its images."""
    twin = CapsNet(input_size=(3, 24, 24), primary_types=64, routing=model.class_capsules.routing, decoder_hidden=None)
    twin.load_state_dict(model.state_dict())
    return twin


def test_the_patches_are_random_in_training_and_central_at_test():
    torch.manual_seed(0)
    model = capsnets.create_model("capsnet_cifar10", routing={"iterations": 1})
    twin = _uncropped_twin(model)
    images = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(images).scores, twin(center_crop(images, 24)).scores)
        model.train()
        torch.manual_seed(7)
        trained_on = model(images).scores
        torch.manual_seed(7)  # the model's window is drawn from torch's generator, as random_crop draws it
        torch.testing.assert_close(trained_on, twin(random_crop(images, 24)).scores)
        assert not torch.allclose(model(images).scores, trained_on)  # another draw, other windows


def test_the_none_of_the_above_parent_takes_coupling_but_gives_no_score():
    torch.manual_seed(0)
    model = capsnets.create_model("capsnet_cifar10", dtype=torch.float64).eval()
    images = torch.rand(1, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        primary = model.primary_capsules(images)  # (1, 1024, 8), of the central window
        torch.testing.assert_close(primary, model.primary(torch.relu(model.conv(center_crop(images, 24)))))
        capsules, couplings = model.class_capsules(primary, return_couplings=True)
        _, reference = reference_dynamic_routing(model.class_capsules.predictions(primary), 3, none_of_the_above=True)
        out = model(images)
    assert couplings.shape == (1, 1024, 10) and reference.shape == (1, 1024, 11)
    torch.testing.assert_close(couplings, reference[..., :10], rtol=0, atol=1e-10)
    torch.testing.assert_close(reference.sum(-1), torch.ones(1, 1024, dtype=torch.float64))  # classes + the extra one
    assert (reference[..., 10] > 0).all() and (couplings.sum(-1) < 1).all()
    assert out.scores.shape == (1, 10) and out.capsules.shape == (1, 10, 16)  # no capsule, no score for it
    torch.testing.assert_close(out.capsules, capsules)


def test_none_of_the_above_is_an_option_of_every_capsnet():
    for name in ("capsnet", "capsnet_small", "capsnet_digits", "capsnet_svhn"):
        model = capsnets.create_model(name, routing={"none_of_the_above": True, "iterations": 2}, device="meta")
        assert model.class_capsules.routing == DynamicRouting(2, none_of_the_above=True), name
    # the CIFAR-10 model: on unless turned off; settings alone update it, a spec with a type replaces it
    assert not capsnets.create_model(
        "capsnet_cifar10", routing={"none_of_the_above": False}
    ).class_capsules.routing.none_of_the_above
    assert capsnets.create_model("capsnet_cifar10", routing={"iterations": 2}).class_capsules.routing == DynamicRouting(
        2, none_of_the_above=True
    )
    given = capsnets.create_model("capsnet_cifar10", routing={"type": "dynamic", "iterations": 2})
    assert given.class_capsules.routing == DynamicRouting(2)
    attention = capsnets.create_model("capsnet_cifar10", routing={"type": "self_attention"})
    assert isinstance(attention.class_capsules.routing.spec, SelfAttentionRouting)
    with pytest.raises(ValueError, match="does not take none_of_the_above; it takes: bias, squash"):
        capsnets.create_model("capsnet_cifar10", routing={"type": "self_attention", "none_of_the_above": True})


def test_a_checkpoint_keeps_the_option(tmp_path):
    model = capsnets.create_model("capsnet_small", routing=DynamicRouting(2, none_of_the_above=True))
    assert model.model_args == {
        "routing": {"type": "dynamic", "iterations": 2, "detach_routing": True, "none_of_the_above": True}
    }
    path = save_checkpoint(
        tmp_path / "best.safetensors",
        model=model,
        meta={"model": "capsnet_small", "model_args": json.loads(json.dumps(model.model_args))},
    )
    rebuilt = load_model(path)
    assert rebuilt.class_capsules.routing == DynamicRouting(2, none_of_the_above=True)
    images = torch.rand(2, 1, 28, 28)
    torch.testing.assert_close(rebuilt(images).scores, model.eval()(images).scores)


def test_crop_is_checked():
    with pytest.raises(ValueError, match=r"crop=40 is larger than the 32x32 images"):
        capsnets.create_model("capsnet_cifar10", crop=40)
    with pytest.raises(ValueError, match=r"crop=24 with a decoder: .*reconstruction=false.*crop=null"):
        capsnets.create_model("capsnet_cifar10", reconstruction=True)
    whole = capsnets.create_model("capsnet_cifar10", crop=None, reconstruction=True)  # the whole image, decoded
    images = torch.rand(2, 3, 32, 32)
    assert whole(images, torch.tensor([1, 2])).reconstruction.shape == images.shape
    with pytest.raises(ValueError, match="smaller than conv_kernel=9"):
        capsnets.create_model("capsnet_cifar10", crop=8)


def test_routing_maps_of_a_cropping_model_are_on_its_primary_grid():
    # the dimensions experiment and the demo read the couplings on the grid of the (cropped) primary capsules
    from capsnets.experiments.dimensions import routing_map

    torch.manual_seed(0)
    model = capsnets.create_model("capsnet_cifar10", num_classes=3).eval()
    assert model.primary_grid() == (4, 4)  # 24x24 patch -> 9x9 conv -> 16x16 -> 9x9/2 primary capsules -> 4x4
    heat, winner = routing_map(model, torch.rand(3, 32, 32))
    assert heat.shape == (4, 4) and 0 <= winner < 3
    assert capsnets.create_model("capsnet", device="meta").primary_grid() == (
        6,
        6,
    )  # 28 -> 20 -> 6: Sabour et al.'s 6x6
