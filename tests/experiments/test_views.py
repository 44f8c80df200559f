"""fit_matched: the matching rule through the engine's trainer, the novel views."""

import torch

from capsnets.data import TensorData
from capsnets.experiments.runs import Runs
from capsnets.experiments.viewpoints import build_model
from capsnets.experiments.views import fit_matched


def _toy_views(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 5
    images = torch.randn(n, 1, 32, 32, generator=g) + labels.view(-1, 1, 1, 1).float()  # separable classes
    data = TensorData(images, labels, 5, classes=list("abcde"), name="toy")
    return {"train": data, "familiar": data, "novel": data.subset(20)}


def _fit(tmp_path, name, **options):
    torch.manual_seed(0)
    settings = {"batch_size": 16, "lr": 1e-3, "device": "cpu", "progress": False}
    with Runs(tmp_path) as runs:
        return fit_matched(runs, name, build_model("cnn_smallnorb_narrow", "cpu"), _toy_views(), **settings, **options)


def test_matching_stops_at_the_target_or_keeps_the_nearest(tmp_path):
    reached = _fit(tmp_path, "reached", epochs=3, target=1.0)
    assert reached["reached"] and reached["epoch"] == 1 and len(reached["history"]) == 1
    never = _fit(tmp_path, "never", epochs=3, target=-1.0)
    errors = [h["familiar_error"] for h in never["history"]]
    assert not never["reached"] and len(errors) == 3 and never["familiar_error"] == min(errors)
    best = _fit(tmp_path, "best", epochs=2, target=None)
    assert best["epoch"] == 1 + [h["familiar_error"] for h in best["history"]].index(best["familiar_error"])


def test_novel_views_are_scored_each_epoch_or_only_at_the_chosen_one(tmp_path):
    every = _fit(tmp_path, "every", epochs=2, target=None)
    assert all(h["novel_error"] is not None for h in every["history"])
    chosen = every["history"][every["epoch"] - 1]
    assert every["novel_error"] == chosen["novel_error"]  # the best checkpoint scored on the novel views
    once = _fit(tmp_path, "once", epochs=2, target=None, novel_each_epoch=False)
    assert [h["novel_error"] is None for h in once["history"]] == [True, False]  # the last epoch is scored too
    assert once["novel_error"] == every["novel_error"] and 0 <= once["novel_error"] <= 1


def test_a_time_limit_is_continued_by_the_next_run(tmp_path):
    cut = _fit(tmp_path, "m", epochs=2, target=-1.0, train_minutes=1e-9)
    assert cut["time_limit"] and len(cut["history"]) == 1
    whole = _fit(tmp_path, "m", epochs=2, target=-1.0)
    assert not whole["time_limit"] and len(whole["history"]) == 2
