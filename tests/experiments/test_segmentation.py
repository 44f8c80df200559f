"""``capsnets experiment segmentation``: the smoke run end to end, and its settings checks."""

import pytest

from capsnets.experiments import list_experiments, run_experiment

from helpers import assert_contrasts_resolve


def test_smoke_run_writes_the_report(shared_data_root, tmp_path):
    assert "segmentation" in list_experiments()
    result = run_experiment(
        "segmentation",
        tmp_path,
        smoke=True,
        device="cpu",
        data_dir=str(shared_data_root),
        images_per_epoch=64,
        test_images=16,
        clutter=2,
        patch=6,
        epochs=2,
        train_minutes=1e-9,
        unet_args={"batch_norm": True},
    )
    text = result.report.read_text()
    assert text.count("1 of 2 (time limit) x 64 images") == 3 and "batch_norm" in text
    assert "| SegCaps (segcaps_small) |" in text and "| U-Net (unet_small) |" in text and "98.48%" in text
    assert "| Capsule U-Net (capsule_unet_small) | 95,305 |" in text
    assert "image > 0.5 (no model)" in text and (tmp_path / "examples.png").stat().st_size > 0
    dices = ("SegCaps_dice", "Capsule U-Net_dice", "U-Net_dice", "threshold_dice")
    assert all(0 <= result.metrics[k] <= 1 for k in dices)
    assert result.metrics["SegCaps_parameters"] == 357_049
    assert_contrasts_resolve("segmentation", result.metrics, 2)
    # the training table: one row per epoch trained, each model's loss and validation Dice (16 images here), which
    # chooses the best epoch
    assert "Dice (object and background) on 16 validation images" in text
    row = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 7 and all(c.endswith("%") for c in cells[2::2])
    assert not any(line.startswith("| 2 |") for line in text.splitlines())  # the time limit stopped both after 1


def test_training_history_is_kept_with_the_checkpoint(shared_data_root, tmp_path):
    options = dict(
        smoke=True,
        device="cpu",
        data_dir=str(shared_data_root),
        checkpoint_dir=str(tmp_path / "ckpt"),
        images_per_epoch=32,
        test_images=8,
        clutter=1,
        patch=4,
        epochs=2,
        train_minutes=1e-9,
    )
    first = run_experiment("segmentation", tmp_path / "a", **options).report.read_text()  # epoch 1 of 2
    second = run_experiment("segmentation", tmp_path / "b", **options).report.read_text()  # continues: epoch 2
    table = [line for line in first.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert len(table) == 1 and first.count("| 1 of 2 (time limit) x 32 images |") == 3
    assert second.count("| 2 x 32 images |") == 3
    assert [line for line in second.splitlines() if line.startswith(("| 1 |", "| 2 |"))][:1] == table


def test_checkpoints_are_reused(shared_data_root, tmp_path):
    options = dict(
        smoke=True,
        device="cpu",
        data_dir=str(shared_data_root),
        checkpoint_dir=str(tmp_path / "ckpt"),
        images_per_epoch=32,
        test_images=8,
        clutter=1,
        patch=4,
    )
    first = run_experiment("segmentation", tmp_path / "a", **options)
    second = run_experiment("segmentation", tmp_path / "b", **options)
    assert second.report.read_text().count("| 1 (loaded) x 32 images |") == 3 and first.metrics == second.metrics
    # another U-Net (other builder arguments) gets its own checkpoint beside them; the capsule models are reused
    third = run_experiment("segmentation", tmp_path / "c", **options, unet_args={"batch_norm": True}).report.read_text()
    assert third.count("| 1 (loaded) x 32 images |") == 2 and "| SegCaps (segcaps_small) | 357,049 |" in third
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())  # run directories
    assert [name.rsplit("_", 1)[0] for name in names].count("segmentation_unet_small") == 1
    assert len(names) == 4 and sum(name.startswith("segmentation_segcaps_small_") for name in names) == 1


def test_rejects_unknown_options_and_sizes(tmp_path):
    with pytest.raises(ValueError, match="does not take epoch"):
        run_experiment("segmentation", tmp_path, smoke=True, device="cpu", epoch=1)
    with pytest.raises(ValueError, match="unet_args='batch_norm' is not dict \\(a mapping, e.g. --set 'unet_args="):
        run_experiment("segmentation", tmp_path, smoke=True, device="cpu", unet_args="batch_norm")
    for size in (40, 16):
        with pytest.raises(ValueError, match="divisible by 16.*28x28 digit"):
            run_experiment("segmentation", tmp_path, smoke=True, device="cpu", size=size)


def _train_unet_small(shared_data_root, *, seed: int, head_bias: float | None = None) -> tuple[float, float]:
    """unet_small trained with its default loss for 150 Adam steps (batch 16, lr 3e-3) on the experiment's kind of
    data at its smoke size (32x32, 4 clutter pieces); the mean test Dice and the share of pixels predicted
    foreground on 64 test images."""
    import torch

    from capsnets.data import load_dataset
    from capsnets.data.segmentation import make_digit_segmentation
    from capsnets.engine.evaluate import dice_score
    from capsnets.losses import create_loss
    from capsnets.models import create_model

    torch.manual_seed(seed)
    shape = {"size": 32, "clutter": 4, "patch": 8}
    digits = load_dataset("mnist", root=shared_data_root, train=True).images[:5000]
    train = make_digit_segmentation(digits, 150 * 16, seed=seed, **shape)
    test_digits = load_dataset("mnist", root=shared_data_root, train=False).images[:1000]
    test = make_digit_segmentation(test_digits, 64, seed=10_000 + seed, **shape)
    model = create_model("unet_small", input_size=(1, 32, 32))
    if head_bias is not None:
        torch.nn.init.constant_(model.head.bias, head_bias)
    criterion, optimizer = create_loss(model.default_loss), torch.optim.Adam(model.parameters(), lr=3e-3)
    for start in range(0, len(train), 16):
        images, masks = train.images[start : start + 16], train.masks[start : start + 16]
        loss, _ = criterion(model(images), images, masks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        probabilities = model.eval()(test.images).probabilities
    return dice_score(probabilities, test.masks).mean().item(), (probabilities > 0.5).float().mean().item()


@pytest.mark.learning
def test_unet_leaves_the_all_background_answer(shared_data_root):
    # 2-10% of these pixels are object, so predicting background everywhere is the first thing U-Net learns. Measured
    # after 150 steps (seeds 0-4): Dice 0.761, 0.712, 0.739, 0.837, 0.742; foreground 8.3-10.7% of the pixels.
    dice, foreground = _train_unet_small(shared_data_root, seed=0)
    assert foreground > 0.01 and dice >= 0.35, (dice, foreground)


@pytest.mark.learning
def test_unet_recovers_from_logits_below_the_probability_clamp(shared_data_root):
    # Every logit starts at -15, where sigmoid < 1e-6: a cross-entropy of clamped probabilities has no gradient
    # there and the model stays all background (Dice 0); the one taken from the logits pulls the object pixels back.
    # Measured after 150 steps (seeds 0-2): Dice 0.629, 0.562, 0.275.
    dice, foreground = _train_unet_small(shared_data_root, seed=0, head_bias=-15.0)
    assert foreground > 0.01 and dice >= 0.1, (dice, foreground)
