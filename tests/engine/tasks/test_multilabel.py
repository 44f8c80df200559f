"""Multi-label evaluation: average precision, F1 thresholds and the metrics against literal float64 references, the
evaluator's multi-hot branch, and the binary cross-entropy loss."""

import math

import pytest
import torch
from torch import nn

from capsnets.engine.evaluate import (
    DEFAULT_THRESHOLD,
    average_precision,
    evaluate,
    f1_thresholds,
    multilabel_metrics,
)
from capsnets.engine.tasks import MultilabelTask
from capsnets.losses import create_loss
from capsnets.models.output import ModelOutput, independent_probabilities
from capsnets.validation import ArgumentError


def literal_average_precision(scores: list[float], truth: list[bool]) -> float:
    """The definition, threshold by threshold: sum over the distinct scores, highest first, of the recall gained
    times the precision of predicting every example scored at least that (NaN without a positive)."""
    positives = sum(truth)
    if positives == 0:
        return math.nan
    total, recall_before = 0.0, 0.0
    for threshold in sorted(set(scores), reverse=True):
        kept = [t for s, t in zip(scores, truth) if s >= threshold]
        precision, recall = sum(kept) / len(kept), sum(kept) / positives
        total += (recall - recall_before) * precision
        recall_before = recall
    return total


def literal_f1(predicted: list[bool], truth: list[bool]) -> float:
    tp = sum(p and t for p, t in zip(predicted, truth))
    wrong = sum(p != t for p, t in zip(predicted, truth))
    return math.nan if 2 * tp + wrong == 0 else 2 * tp / (2 * tp + wrong)


def random_case(seed: int, n: int = 40, k: int = 5, levels: int = 6):
    """Scores on a coarse grid (many ties) and targets; class 4 has no positive."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, levels, (n, k), generator=g).double() / (levels - 1)
    targets = (torch.rand(n, k, generator=g) < 0.4).double()
    targets[:, 4] = 0
    return scores, targets


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_average_precision_matches_the_definition_with_ties(seed):
    scores, targets = random_case(seed)
    got = average_precision(scores, targets)
    for k in range(scores.shape[1]):
        want = literal_average_precision(scores[:, k].tolist(), (targets[:, k] > 0).tolist())
        assert (math.isnan(want) and got[k].isnan()) or math.isclose(got[k].item(), want, rel_tol=1e-12), k


def test_average_precision_by_hand():
    # Scores 0.9 (pos), 0.8 (neg), 0.8 (pos), 0.1 (pos): cuts at 0.9 -> P 1, R 1/3; at 0.8 -> P 2/3, R 2/3;
    # at 0.1 -> P 3/4, R 1. AP = 1/3 * 1 + 1/3 * 2/3 + 1/3 * 3/4.
    scores = torch.tensor([[0.9], [0.8], [0.8], [0.1]])
    targets = torch.tensor([[1.0], [0.0], [1.0], [1.0]])
    assert math.isclose(average_precision(scores, targets).item(), (1 + 2 / 3 + 3 / 4) / 3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_thresholds_maximise_each_class_f1(seed):
    scores, targets = random_case(seed)
    chosen = f1_thresholds(scores, targets)
    for k in range(4):
        column, truth = scores[:, k].tolist(), (targets[:, k] > 0).tolist()
        best = max(literal_f1([s >= t for s in column], truth) for t in set(column))
        assert math.isclose(literal_f1([s >= chosen[k].item() for s in column], truth), best), k
        # halfway between the lowest score kept and the next lower one
        kept = min(s for s in column if s >= chosen[k].item())
        lower = [s for s in column if s < kept]
        assert math.isclose(chosen[k].item(), (kept + max(lower)) / 2 if lower else kept, rel_tol=1e-6)
    assert chosen[4].item() == DEFAULT_THRESHOLD  # no positive to choose from


@pytest.mark.parametrize("seed", [0, 1])
def test_metrics_match_literal_references(seed):
    scores, targets = random_case(seed)
    thresholds = torch.tensor([0.3, 0.5, 0.7, 0.1, 0.9])
    results = multilabel_metrics(scores.float(), targets, thresholds)
    predicted = (scores >= thresholds.double()).tolist()
    truth = (targets > 0).tolist()
    per_class = [literal_f1([row[k] for row in predicted], [row[k] for row in truth]) for k in range(5)]
    for got, want in zip(results["per_class_f1"].tolist(), per_class):
        assert (math.isnan(want) and math.isnan(got)) or math.isclose(got, want)
    defined = [f for f in per_class if not math.isnan(f)]
    assert math.isclose(results["macro_f1"], sum(defined) / len(defined))
    tp = sum(p and t for prow, trow in zip(predicted, truth) for p, t in zip(prow, trow))
    wrong = sum(p != t for prow, trow in zip(predicted, truth) for p, t in zip(prow, trow))
    assert math.isclose(results["micro_f1"], 2 * tp / (2 * tp + wrong))
    assert math.isclose(results["exact_match"], sum(p == t for p, t in zip(predicted, truth)) / len(truth))
    aps = [literal_average_precision(scores[:, k].tolist(), [row[k] for row in truth]) for k in range(4)]
    assert math.isclose(results["mAP"], sum(aps) / 4, rel_tol=1e-6)  # class 4 (no positive) left out
    assert results["accuracy"] == results["exact_match"] and results["count"] == 40


def test_metrics_refuse_bad_thresholds_and_shapes():
    scores, targets = random_case(0)
    with pytest.raises(ValueError, match="5 numbers in"):
        multilabel_metrics(scores, targets, [0.5] * 4)
    with pytest.raises(ValueError, match=r"both be \(N, K\)"):
        average_precision(scores, targets[:, :3])


class StoredScores(nn.Module):
    """Returns the scores stored in each image's pixels (``score_kind`` as given)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, images, labels=None):
        return ModelOutput(scores=images.flatten(1), score_kind=self.kind)


def test_evaluator_scores_multi_hot_targets_in_batches():
    scores, targets = random_case(3)
    images = scores.float().view(40, 1, 1, 5)
    logits = torch.logit(scores.float().clamp(0.01, 0.99)).view(40, 1, 1, 5)
    thresholds = torch.full((5,), 0.5)
    want = multilabel_metrics(scores.float(), targets, thresholds)
    got = evaluate(StoredScores("length"), (images, targets.float()), batch_size=7, device="cpu")
    assert got["mAP"] == want["mAP"] and got["exact_match"] == want["exact_match"]
    as_logits = evaluate(StoredScores("logits"), (logits, targets.float()), batch_size=7, device="cpu")
    assert math.isclose(as_logits["mAP"], want["mAP"])  # the sigmoid keeps the order
    with_loss = evaluate(
        StoredScores("length"), (images, targets.float()), 16, "cpu", criterion=create_loss("binary_cross_entropy")
    )
    assert with_loss["loss"] > 0


def test_binary_cross_entropy_on_logits_and_lengths():
    targets = torch.tensor([[1.0, 0.0, 1.0]])
    logits = torch.tensor([[2.0, -1.0, 0.5]], requires_grad=True)
    loss, parts = create_loss("binary_cross_entropy")(ModelOutput(logits, "logits"), None, targets)
    p = torch.sigmoid(logits.detach())
    want = -(torch.log(p[0, 0]) + torch.log(1 - p[0, 1]) + torch.log(p[0, 2]))
    assert torch.isclose(loss, want) and "binary_cross_entropy" in parts
    loss.backward()
    assert logits.grad is not None
    lengths = torch.tensor([[0.9, 0.2, 0.6]])
    got, _ = create_loss("binary_cross_entropy")(ModelOutput(lengths, "length"), None, targets)
    assert torch.isclose(got, -(math.log(0.9) + math.log(0.8) + math.log(0.6)) * torch.ones(()))
    assert torch.equal(
        independent_probabilities(ModelOutput(torch.tensor([[1.2, -0.1]]), "length")), torch.tensor([[1.0, 0.0]])
    )


def test_multilabel_loss_choice():
    task = MultilabelTask()
    assert task.loss_name("margin", "margin", given=False) == "margin"
    assert task.loss_name("cross_entropy", "cross_entropy", given=False) == "binary_cross_entropy"
    assert task.loss_name("spread", "spread", given=False) == "binary_cross_entropy"
    with pytest.raises(
        ArgumentError, match="'cross_entropy' takes one class per image.*binary_cross_entropy or margin"
    ):
        task.loss_name("cross_entropy", "margin", given=True)
    with pytest.raises(ValueError, match="loss 'segcaps' is for segmentation models, and this is a multilabel run"):
        task.loss_name("segcaps", "margin", given=True)
