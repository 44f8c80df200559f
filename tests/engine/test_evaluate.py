"""evaluate(): accuracy, per-class accuracy and confusion matrix from a model's scores."""

import math
from types import SimpleNamespace

import torch
from torch import nn

from capsnets.engine.evaluate import evaluate
from capsnets.models.output import ModelOutput


class FixedScores(nn.Module):
    """Predicts the class stored in pixel (0, 0, 0) of each image."""

    def forward(self, images, labels=None):
        return ModelOutput(scores=nn.functional.one_hot(images[:, 0, 0, 0].long(), 3).float())


def test_confusion_matrix_and_accuracies():
    labels = torch.tensor([0, 0, 1, 1, 1, 0])
    predictions = torch.tensor([0, 1, 1, 1, 0, 0])
    images = predictions.float().view(-1, 1, 1, 1).expand(-1, 1, 2, 2).contiguous()
    data = SimpleNamespace(images=images, labels=labels, num_classes=3)
    results = evaluate(FixedScores(), data, batch_size=4, device="cpu")
    assert results["confusion_matrix"].tolist() == [[2, 1, 0], [1, 2, 0], [0, 0, 0]]
    assert math.isclose(results["accuracy"], 4 / 6)
    per_class = results["per_class_accuracy"]
    assert torch.allclose(per_class[:2], torch.tensor([2 / 3, 2 / 3], dtype=torch.float64))
    assert per_class[2].isnan()
    assert results["count"] == 6 and "loss" not in results


def test_mean_loss_and_mode_restored():
    model = FixedScores().train()
    data = SimpleNamespace(images=torch.zeros(5, 1, 2, 2), labels=torch.zeros(5, dtype=torch.long), num_classes=3)
    results = evaluate(
        model, data, batch_size=2, device="cpu", criterion=lambda out, x, y: (torch.tensor(float(len(y))), {})
    )
    assert math.isclose(results["loss"], (2 * 2 + 2 * 2 + 1 * 1) / 5)
    assert model.training


def test_data_parallel_shards_cover_every_example_once(monkeypatch):
    """Each process counts its own contiguous shard (some may be empty); the sum is the whole set's count."""
    import importlib

    from capsnets.engine.distributed import DistContext

    module = importlib.import_module("capsnets.engine.evaluate")  # the module; the package exports the function

    monkeypatch.setattr(module, "all_reduce_sum", lambda tensor, context: tensor)  # sum over ranks done below
    monkeypatch.setattr(module, "_summarise", lambda confusion, loss_sum, with_loss: confusion)
    labels = torch.tensor([0, 2, 1, 1, 2, 0, 1])
    images = torch.tensor([0, 2, 2, 1, 0, 0, 1]).float().view(-1, 1, 1, 1)
    data = SimpleNamespace(images=images, labels=labels, num_classes=3)
    whole = evaluate(FixedScores(), data, batch_size=2, device="cpu")
    for world_size in (2, 3, 8):
        shards = [
            evaluate(FixedScores(), data, batch_size=2, device="cpu", context=DistContext(rank, world_size))
            for rank in range(world_size)
        ]
        assert torch.equal(sum(shards), whole) and whole.sum() == len(labels)


def test_segmentation_metrics_from_a_hand_counted_confusion_matrix():
    from capsnets.engine.evaluate import segmentation_metrics

    # rows: true background, cat, dog; columns: predicted. Cat: TP 3, FP 1 + 0, FN 2 + 1; dog: TP 2, FP 0 + 1,
    # FN 1 + 0; the mouse is neither present nor predicted.
    confusion = torch.tensor([[10, 1, 1, 0], [2, 3, 1, 0], [1, 0, 2, 0], [0, 0, 0, 0]])
    metrics = segmentation_metrics(confusion)
    cat_dice, dog_dice = 2 * 3 / (2 * 3 + 1 + 3), 2 * 2 / (2 * 2 + 2 + 1)
    torch.testing.assert_close(
        metrics["dice"],
        torch.tensor([20 / (20 + 3 + 2), cat_dice, dog_dice, math.nan], dtype=torch.float64),
        equal_nan=True,
    )
    torch.testing.assert_close(
        metrics["iou"], torch.tensor([10 / 15, 3 / 7, 2 / 5, math.nan], dtype=torch.float64), equal_nan=True
    )
    assert math.isclose(metrics["mean_dice"], (cat_dice + dog_dice) / 2)  # the background and NaN left out
    assert math.isclose(metrics["mean_iou"], (3 / 7 + 2 / 5) / 2)
    assert math.isclose(metrics["pixel_accuracy"], 15 / 21)


class FixedMasks(nn.Module):
    """A segmentation model whose prediction is the image itself, read as class indices."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, images):
        from capsnets.models import SegmentationOutput

        scores = torch.nn.functional.one_hot(images[:, 0].long(), 3).permute(0, 3, 1, 2).float()
        return SegmentationOutput(scores)


def test_evaluate_segmentation_counts_every_pixel_once():
    from capsnets.engine.evaluate import evaluate_segmentation

    predicted = torch.tensor([[[0, 1], [2, 2]], [[1, 1], [0, 0]], [[0, 0], [0, 2]]]).float().unsqueeze(1)
    masks = torch.tensor([[[0, 1], [2, 0]], [[1, 0], [0, 0]], [[0, 0], [0, 2]]], dtype=torch.uint8).unsqueeze(1)
    data = SimpleNamespace(images=predicted, masks=masks, num_classes=3)
    whole = evaluate_segmentation(FixedMasks(), data, batch_size=2, device="cpu")
    expected = torch.tensor([[6, 1, 1], [0, 2, 0], [0, 0, 2]])
    assert torch.equal(whole["confusion_matrix"], expected) and whole["count"] == 3
    assert math.isclose(whole["mean_dice"], (4 / 5 + 4 / 5) / 2)
