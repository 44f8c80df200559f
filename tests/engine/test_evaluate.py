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
