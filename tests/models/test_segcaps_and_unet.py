"""Segmentation models (SegCaps and its U-Net baseline), their loss, the Dice score and the data generator."""

import pytest
import torch
import torch.nn.functional as F

import capsnets
from capsnets.data.segmentation import make_digit_segmentation
from capsnets.engine import dice_score
from capsnets.losses import binary_segmentation_loss, create_loss
from capsnets.models import SegmentationOutput

from helpers import assert_finite

SEGMENTATION = capsnets.list_models(task="segmentation")


def test_the_registry_keeps_tasks_apart():
    assert SEGMENTATION == ["capsule_unet", "capsule_unet_small", "segcaps", "segcaps_small", "unet", "unet_small"]
    assert not set(SEGMENTATION) & set(capsnets.list_models(task="classification"))
    by_task = [capsnets.list_models(task=task) for task in capsnets.models.registry.MODEL_TASKS]
    assert sorted(capsnets.list_models()) == sorted(name for names in by_task for name in names)
    assert capsnets.models.model_task("segcaps") == "segmentation"
    with pytest.raises(ValueError, match="task must be one of"):
        capsnets.list_models(task="detection")


@pytest.mark.parametrize("name, count", [("segcaps", 1_425_649), ("unet", 31_030_593)])
def test_paper_parameter_counts(name, count):
    # SegCaps R3: 1.4M (1,416,112 without the reconstruction decoder); U-Net: 31M.
    assert capsnets.count_parameters(capsnets.create_model(name)) == count
    if name == "segcaps":
        assert capsnets.count_parameters(capsnets.create_model(name, reconstruction=False)) == 1_416_112


@pytest.mark.parametrize("name", ["unet", "unet_small"])
def test_unet_batch_norm_is_a_builder_option(name):
    plain = capsnets.create_model(name, input_size=(1, 16, 16))
    normed = capsnets.create_model(name, input_size=(1, 16, 16), batch_norm=True)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in plain.modules())
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in normed.modules()) == 18  # two per double conv
    assert normed.model_args["batch_norm"] is True


@pytest.mark.parametrize("name", SEGMENTATION)
@pytest.mark.parametrize("batch", [1, 3])
def test_forward_backward_every_parameter_gets_gradient(name, batch):
    torch.manual_seed(0)
    model = capsnets.create_model(name, input_size=(1, 16, 16))
    images = torch.rand(batch, 1, 16, 16)
    masks = (images > 0.6).float()
    out = model(images, masks)
    assert out.probabilities.shape == (batch, 1, 16, 16)
    assert ((out.probabilities >= 0) & (out.probabilities <= 1)).all()
    loss, parts = create_loss(model.default_loss)(out, images, masks)
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{name}.{pname} got no gradient"
        assert_finite(p.grad, f"{name}.{pname}.grad")
    if out.reconstruction is not None:
        assert out.reconstruction.shape == images.shape and set(parts) == {"bce", "reconstruction"}


def test_segcaps_routes_once_in_its_first_capsule_layer_then_as_configured():
    model = capsnets.create_model("segcaps_small", routing={"iterations": 2})
    assert model.primary.routing.iterations == 1
    routed = [m.routing.iterations for name, m in model.named_modules() if hasattr(m, "routing") and name != "primary"]
    assert len(routed) == 11 and set(routed) == {2}  # 12 capsule layers in all


def test_segcaps_reconstructs_only_what_the_mask_keeps():
    torch.manual_seed(0)
    model = capsnets.create_model("segcaps_small", input_size=(1, 16, 16)).eval()
    a, b = torch.rand(1, 1, 16, 16), torch.rand(1, 1, 16, 16)
    empty = torch.zeros(1, 1, 16, 16)
    torch.testing.assert_close(model(a, empty).reconstruction, model(b, empty).reconstruction)
    full = torch.ones_like(empty)
    assert not torch.allclose(model(a, full).reconstruction, model(b, full).reconstruction)


def test_bad_inputs_are_explained():
    model = capsnets.create_model("segcaps_small")
    with pytest.raises(ValueError, match=r"divisible by 8, got \(2, 1, 20, 20\)"):
        model(torch.rand(2, 1, 20, 20))
    with pytest.raises(ValueError, match=r"\(B, 1, H, W\)"):
        model(torch.rand(2, 3, 16, 16))
    with pytest.raises(ValueError, match="masks must have shape"):
        model(torch.rand(2, 1, 16, 16), torch.ones(2, 16, 16))
    with pytest.raises(ValueError, match="divisible by 8"):
        capsnets.create_model("segcaps", input_size=(1, 100, 100))
    with pytest.raises(ValueError, match="divisible by 16"):
        capsnets.create_model("unet_small")(torch.rand(1, 1, 24, 24))


def test_the_trainer_refuses_a_segmentation_model_on_classification_data(tmp_path):
    from capsnets.engine import TrainConfig, train

    with pytest.raises(ValueError, match="segmentation model, and dataset 'digits' is classification data"):
        train(
            TrainConfig(
                model="segcaps_small", dataset="digits", epochs=1, device="cpu", progress=False, out=str(tmp_path)
            )
        )


def test_binary_segmentation_loss_is_weighted_cross_entropy():
    torch.manual_seed(0)
    p = torch.rand(2, 1, 4, 4, dtype=torch.float64) * 0.98 + 0.01
    m = (torch.rand(2, 1, 4, 4) > 0.5).double()
    torch.testing.assert_close(binary_segmentation_loss(p, m), F.binary_cross_entropy(p, m))
    weighted = -(3.0 * m * p.log() + (1 - m) * (1 - p).log()).mean()
    torch.testing.assert_close(binary_segmentation_loss(p, m, pos_weight=3.0), weighted)
    assert torch.isfinite(binary_segmentation_loss(torch.zeros(1, 1, 2, 2), torch.ones(1, 1, 2, 2)))
    with pytest.raises(ValueError, match="pos_weight"):
        create_loss("segcaps", pos_weight=0)


def test_the_unet_loss_is_the_same_cross_entropy_from_logits_and_keeps_its_gradient():
    from capsnets.losses import binary_segmentation_loss_from_logits
    from capsnets.models import SegmentationOutput

    torch.manual_seed(0)
    z = torch.randn(2, 1, 4, 4, dtype=torch.float64) * 3
    m = (torch.rand(2, 1, 4, 4) > 0.5).double()
    for weight in (1.0, 3.0):
        torch.testing.assert_close(
            binary_segmentation_loss_from_logits(z, m, pos_weight=weight),
            binary_segmentation_loss(torch.sigmoid(z), m, pos_weight=weight),
        )
    # An object pixel scored far below the clamp (p < 1e-6): the probability form has no gradient there,
    # so a network that pushed it there could never recover; the logit form pulls it back.
    deep = torch.full((1, 1, 1, 1), -20.0, dtype=torch.float64, requires_grad=True)
    ones = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    binary_segmentation_loss(torch.sigmoid(deep), ones).backward()
    assert deep.grad.item() == 0.0
    deep.grad = None
    criterion = create_loss("binary_segmentation")
    criterion(SegmentationOutput(torch.sigmoid(deep), logits=deep), ones, ones)[0].backward()
    assert deep.grad.item() == pytest.approx(-1.0, abs=1e-6)
    unet = capsnets.create_model("unet_small", input_size=(1, 16, 16))
    out = unet(torch.rand(1, 1, 16, 16))
    torch.testing.assert_close(out.probabilities, torch.sigmoid(out.logits))
    with pytest.raises(ValueError, match="differ in shape"):
        binary_segmentation_loss_from_logits(z, m[:1])


def test_segcaps_loss_reconstructs_the_image_inside_the_mask():
    from capsnets.models import SegmentationOutput

    images = torch.rand(2, 1, 4, 4)
    masks = (images > 0.5).float()
    out = SegmentationOutput(masks * 0.5 + 0.25, None, images * masks)  # perfect reconstruction
    loss, parts = create_loss("segcaps", reconstruction_weight=10.0)(out, images, masks)
    assert parts["reconstruction"] == 0 and loss == parts["bce"]
    _, parts = create_loss("segcaps", reconstruction_weight=10.0)(
        SegmentationOutput(out.probabilities, None, images), images, masks
    )
    torch.testing.assert_close(parts["reconstruction"], 10.0 * (images * (1 - masks)).pow(2).mean())


def test_dice_score():
    masks = torch.zeros(3, 1, 2, 2)
    masks[0, 0, 0] = 1  # two pixels
    masks[1, 0, 0, 0] = 1
    probabilities = torch.zeros(3, 1, 2, 2)
    probabilities[0, 0, 0, 0] = 0.9  # one of the two: 2 * 1 / (1 + 2)
    probabilities[1] = 0.8  # four predicted, one true: 2 * 1 / (4 + 1)
    torch.testing.assert_close(dice_score(probabilities, masks), torch.tensor([2 / 3, 2 / 5, 1.0], dtype=torch.float64))


def test_digit_segmentation_is_deterministic_and_marks_the_object(shared_data_root):
    from capsnets.data import load_dataset

    digits = load_dataset("mnist", root=shared_data_root, train=False).subset(200).images
    a = make_digit_segmentation(digits, 64, seed=3, size=32, clutter=4)
    b = make_digit_segmentation(digits, 64, seed=3, size=32, clutter=4)
    assert torch.equal(a.images, b.images) and torch.equal(a.masks, b.masks)
    assert a.images.shape == a.masks.shape == (64, 1, 32, 32) and set(a.masks.unique().tolist()) == {0.0, 1.0}
    assert (a.images[a.masks.bool()] > 0.5).all()  # the object is visible where the mask says
    assert ((a.images > 0.5) & ~a.masks.bool()).any()  # ... and clutter lies outside it
    clean = make_digit_segmentation(digits, 64, seed=3, size=32, clutter=0)
    assert torch.equal(clean.masks, (clean.images > 0.5).float())  # no clutter: the mask is the bright pixels
    # the whole digit is on the canvas: its mask has as many pixels as the source digit has above 0.5
    counts = (digits > 0.5).flatten(1).sum(1)
    assert sorted(clean.masks.flatten(1).sum(1).tolist()) == sorted(counts[_picks(digits, 64, 3)].tolist())
    with pytest.raises(ValueError, match="patch"):
        make_digit_segmentation(digits, 4, seed=0, patch=40)


def _picks(digits, count, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, len(digits), (count,), generator=generator)


@pytest.mark.parametrize("name", ["segcaps_small", "unet_small"])
def test_several_classes_give_one_map_per_class(name):
    torch.manual_seed(0)
    model = capsnets.create_model(name, input_size=(1, 16, 16), num_classes=4)
    images, masks = torch.rand(2, 1, 16, 16), torch.randint(0, 4, (2, 1, 16, 16))
    out = model(images, masks)
    assert out.probabilities.shape == (2, 4, 16, 16) and model.num_classes == 4
    assert out.predicted_classes().shape == (2, 1, 16, 16) and out.predicted_classes().max() < 4
    if out.capsules is not None:
        assert out.capsules.shape[:2] == (2, 4) and out.capsules.shape[-2:] == (16, 16)
    else:  # U-Net: a softmax over the classes
        torch.testing.assert_close(out.probabilities.sum(dim=1), torch.ones(2, 16, 16))
    loss, _ = create_loss(model.default_loss)(out, images, masks)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name", ["segcaps", "unet"])
def test_the_binary_model_keeps_its_weights_layout(name):
    binary, several = capsnets.create_model(name), capsnets.create_model(name, num_classes=3)
    assert capsnets.create_model(name, num_classes=1).state_dict().keys() == binary.state_dict().keys()
    assert several.state_dict().keys() == binary.state_dict().keys()
    assert capsnets.count_parameters(capsnets.create_model(name, num_classes=1)) == capsnets.count_parameters(binary)


def test_segcaps_reconstructs_each_object_pixel_from_its_true_class():
    torch.manual_seed(0)
    model = capsnets.create_model("segcaps_small", input_size=(1, 16, 16), num_classes=3).eval()
    image = torch.rand(1, 1, 16, 16)
    background = torch.zeros(1, 1, 16, 16, dtype=torch.long)
    capsules = model(image).capsules
    torch.testing.assert_close(model(image, background).reconstruction, model.decoder(torch.zeros_like(capsules[:, 0])))
    second = torch.full_like(background, 2)
    torch.testing.assert_close(model(image, second).reconstruction, model.decoder(capsules[:, 2]))


def test_multi_class_losses():
    probabilities = torch.tensor([0.2, 0.9, 0.1]).view(1, 3, 1, 1)
    masks = torch.ones(1, 1, 1, 1, dtype=torch.long)  # the pixel is of class 1
    expected = -(torch.log(torch.tensor(0.8)) + 3.0 * torch.log(torch.tensor(0.9)) + torch.log(torch.tensor(0.9))) / 3
    loss, _ = create_loss("binary_segmentation", pos_weight=3.0)(SegmentationOutput(probabilities), None, masks)
    torch.testing.assert_close(loss, expected)  # per-class cross-entropy of lengths, object classes weighted
    logits = torch.tensor([0.5, 2.0, -1.0]).view(1, 3, 1, 1)
    output = SegmentationOutput(logits.softmax(dim=1), logits=logits)
    loss, _ = create_loss("binary_segmentation")(output, None, masks)
    torch.testing.assert_close(loss, -logits.log_softmax(dim=1)[0, 1, 0, 0])  # softmax cross-entropy of logits
    with pytest.raises(ValueError, match=r"mask classes must lie in \[0, 3\)"):
        create_loss("binary_segmentation")(output, None, torch.full((1, 1, 1, 1), 3))


# the capsule U-Net ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("classes", [1, 2, 3, 4])
def test_the_capsule_unet_gives_logits_per_pixel_and_class_capsules_on_an_eighth_of_the_grid(classes):
    model = capsnets.create_model("capsule_unet_small", num_classes=classes, input_size=(1, 24, 40))
    output = model(torch.rand(2, 1, 24, 40))
    assert output.probabilities.shape == output.logits.shape == (2, classes, 24, 40)
    assert output.capsules.shape == (2, max(classes, 2), 32, 3, 5)  # a binary model: background and object
    expected = torch.sigmoid(output.logits) if classes == 1 else output.logits.softmax(dim=1)
    torch.testing.assert_close(output.probabilities, expected)
    assert (output.capsules.norm(dim=2) < 1).all()  # squashed
    # under a quarter of unet_small's parameters, for up to four classes
    unet = capsnets.create_model("unet_small", num_classes=classes)
    assert 4 * capsnets.count_parameters(model) < capsnets.count_parameters(unet)


def test_the_capsule_unet_refuses_sizes_its_three_strides_cannot_halve():
    with pytest.raises(ValueError, match=r"H and W divisible by 8 .* got input_size \(1, 20, 16\)"):
        capsnets.create_model("capsule_unet_small", input_size=(1, 20, 16))
    with pytest.raises(ValueError, match="multiple of 8|divisible by 8"):
        capsnets.create_model("capsule_unet_small")(torch.rand(1, 1, 20, 16))
    with pytest.raises(ValueError, match=r"types must be 5 positive integers, got \(2, 2\)"):
        capsnets.models.CapsuleUNet(types=(2, 2))


def test_the_capsule_unet_loss_adds_the_margin_loss_of_each_cells_class_shares():
    """Literal float64 reference: the cross-entropy of the logits, plus 0.1 x the margin loss of the capsules'
    lengths against the fraction of each class in each 2x2 cell, summed over classes, averaged over cells."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 4, 4, generator=generator, dtype=torch.float64)
    capsules = 0.4 * torch.randn(2, 3, 5, 2, 2, generator=generator, dtype=torch.float64)
    masks = torch.randint(0, 3, (2, 1, 4, 4), generator=generator)
    output = SegmentationOutput(logits.softmax(dim=1), capsules=capsules, logits=logits)
    loss, parts = create_loss("capsule_unet")(output, torch.rand(2, 1, 4, 4), masks)
    margin, cells = 0.0, 0
    for b in range(2):
        for y in range(2):
            for x in range(2):
                cell = masks[b, 0, 2 * y : 2 * y + 2, 2 * x : 2 * x + 2].flatten().tolist()
                for k in range(3):
                    share = cell.count(k) / 4
                    length = float(capsules[b, k, :, y, x].norm())
                    margin += share * max(0.0, 0.9 - length) ** 2 + 0.5 * (1 - share) * max(0.0, length - 0.1) ** 2
                cells += 1
    cross_entropy = F.cross_entropy(logits, masks[:, 0].long())
    assert parts["margin"].item() == pytest.approx(margin / cells, rel=1e-6)
    assert loss.item() == pytest.approx(cross_entropy.item() + 0.1 * margin / cells, rel=1e-6)
    off, off_parts = create_loss("capsule_unet", margin_weight=0)(output, torch.rand(2, 1, 4, 4), masks)
    assert off.item() == pytest.approx(cross_entropy.item(), rel=1e-6) and "margin" not in off_parts
    coarse = SegmentationOutput(
        output.probabilities, capsules=capsules[..., :1, :1].expand(-1, -1, -1, 3, 3), logits=logits
    )
    with pytest.raises(ValueError, match=r"a grid that the capsules' \(3, 3\) divides, got \(2, 1, 4, 4\)"):
        create_loss("capsule_unet")(coarse, torch.rand(2, 1, 4, 4), masks)
