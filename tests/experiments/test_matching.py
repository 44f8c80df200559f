"""train_matched: the matching rule, scoring within epochs, novel views, the time limit, continuing."""

import pytest
import torch

from capsnets.data import TensorData
from capsnets.experiments import matching
from capsnets.experiments.matching import train_matched
from capsnets.experiments.viewpoints import build_model


def _toy_views(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 5
    images = torch.randn(n, 1, 32, 32, generator=g) + labels.view(-1, 1, 1, 1).float()  # separable classes
    data = TensorData(images, labels, 5, name="toy")
    return {"train": data, "familiar": data, "novel": data}


def test_matching_stops_at_the_target_or_keeps_the_nearest():
    torch.manual_seed(0)
    views = _toy_views()
    settings = {"batch_size": 16, "lr": 1e-3}
    reached = train_matched(build_model("cnn_smallnorb_narrow", "cpu"), views, epochs=3, target=1.0, **settings)
    assert reached["reached"] and reached["epoch"] == 1 and len(reached["history"]) == 1
    never = train_matched(build_model("cnn_smallnorb_narrow", "cpu"), views, epochs=3, target=-1.0, **settings)
    errors = [h["familiar_error"] for h in never["history"]]
    assert not never["reached"] and len(errors) == 3 and never["familiar_error"] == min(errors)
    best = train_matched(build_model("cnn_smallnorb_narrow", "cpu"), views, epochs=2, target=None, **settings)
    assert best["epoch"] == 1 + [h["familiar_error"] for h in best["history"]].index(best["familiar_error"])


def test_scores_within_epochs_and_stops_mid_epoch():
    torch.manual_seed(0)
    views = _toy_views()  # 40 images, batch 8: 5 steps per epoch
    every = train_matched(
        build_model("cnn_smallnorb_narrow", "cpu"),
        views,
        epochs=2,
        target=-1.0,
        batch_size=8,
        lr=1e-3,
        evals_per_epoch=5,
    )
    assert [h["epoch"] for h in every["history"]] == [0.2, 0.4, 0.6, 0.8, 1, 1.2, 1.4, 1.6, 1.8, 2]
    assert [h["step"] for h in every["history"]] == list(range(1, 11))
    first = train_matched(
        build_model("cnn_smallnorb_narrow", "cpu"),
        views,
        epochs=2,
        target=1.0,
        batch_size=8,
        lr=1e-3,
        evals_per_epoch=5,
    )
    assert first["reached"] and first["epoch"] == 0.2 and len(first["history"]) == 1
    with pytest.raises(ValueError, match="evals_per_epoch"):
        train_matched(
            build_model("cnn_smallnorb_narrow", "cpu"),
            views,
            epochs=1,
            target=None,
            batch_size=8,
            lr=1e-3,
            evals_per_epoch=0,
        )


def test_novel_views_are_scored_every_nth_evaluation_and_at_the_chosen_one(monkeypatch):
    torch.manual_seed(0)
    views = _toy_views()  # 5 steps per epoch at batch 8
    views["novel"] = TensorData(views["novel"].images, views["novel"].labels, 5, name="novel")  # its own object
    novel_calls = []
    real_error = matching.error_rate

    def counting(model, data):
        if data is views["novel"]:
            novel_calls.append(1)
        return real_error(model, data)

    monkeypatch.setattr(matching, "error_rate", counting)
    rec = train_matched(
        build_model("cnn_smallnorb_narrow", "cpu"),
        views,
        epochs=2,
        target=-1.0,
        batch_size=8,
        lr=1e-3,
        evals_per_epoch=5,
        novel_every=4,
    )
    scored = [h["novel_error"] is not None for h in rec["history"]]
    chosen = next(i for i, h in enumerate(rec["history"]) if h["epoch"] == rec["epoch"])
    expected = [(i + 1) % 4 == 0 or i == chosen for i in range(10)]
    assert scored == expected and len(novel_calls) == sum(expected)
    # the chosen evaluation's novel error is that of the restored state (toy views: novel == familiar)
    assert rec["novel_error"] == rec["familiar_error"] == rec["history"][chosen]["novel_error"]
    novel_calls.clear()
    none = train_matched(
        build_model("cnn_smallnorb_narrow", "cpu"), views, epochs=1, target=None, batch_size=8, lr=1e-3, novel_every=0
    )
    assert len(novel_calls) == 1 and none["novel_error"] is not None
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="novel_every"):
            train_matched(
                build_model("cnn_smallnorb_narrow", "cpu"),
                views,
                epochs=1,
                target=None,
                batch_size=8,
                lr=1e-3,
                novel_every=bad,
            )


def test_time_limit_stops_at_the_first_evaluation_past_it():
    torch.manual_seed(0)
    views = _toy_views()  # 5 steps per epoch at batch 8
    cut = train_matched(
        build_model("cnn_smallnorb_narrow", "cpu"),
        views,
        epochs=3,
        target=-1.0,
        batch_size=8,
        lr=1e-3,
        evals_per_epoch=5,
        time_limit_s=1e-9,
    )
    assert cut["time_limit"] and not cut["reached"] and [h["epoch"] for h in cut["history"]] == [0.2]
    free = train_matched(
        build_model("cnn_smallnorb_narrow", "cpu"),
        views,
        epochs=2,
        target=-1.0,
        batch_size=8,
        lr=1e-3,
        time_limit_s=3600,
    )
    assert not free["time_limit"] and len(free["history"]) == 2
    with pytest.raises(ValueError, match="positive number"):
        train_matched(
            build_model("cnn_smallnorb_narrow", "cpu"),
            views,
            epochs=1,
            target=None,
            batch_size=8,
            lr=1e-3,
            time_limit_s=-5,
        )


def test_compile_trains_through_the_compiled_model_and_scores_the_eager_one(monkeypatch):
    views = _toy_views()  # 5 steps per epoch at batch 8
    compiled, calls = [], []

    def fake_compile(model):  # stands in for torch.compile: the plumbing is under test (tests/models compiles)
        def forward(*args):
            calls.append(len(args[0]))
            return model(*args)

        compiled.append(model)
        return forward

    monkeypatch.setattr(torch, "compile", fake_compile)
    runs = {}
    for flag in (False, True):
        torch.manual_seed(0)
        model = build_model("cnn_smallnorb_narrow", "cpu")
        runs[flag] = train_matched(model, views, epochs=2, target=-1.0, batch_size=8, lr=1e-3, compile=flag)
        assert compiled == ([model] if flag else [])
    assert calls == [8] * 10  # every training step (2 epochs x 5), and no evaluation, went through it
    untimed = {
        flag: [{k: v for k, v in h.items() if k != "time_s"} for h in run["history"]] for flag, run in runs.items()
    }
    assert untimed[True] == untimed[False]


def _matched_in_run(checkpoint_dir, *, time_limit_s, rng_seed=0):
    """One process's share of a matched training: load_or_train + train_matched with a TrainState."""
    from capsnets.engine import TrainState
    from capsnets.experiments.checkpoints import load_or_train

    torch.manual_seed(0)
    views, model = _toy_views(), build_model("cnn_smallnorb_narrow", "cpu")
    torch.manual_seed(rng_seed)  # what a new process holds; a continued run must not depend on it
    record, state = {}, TrainState()

    def train():  # 5 steps per epoch at batch 8, scored after steps 2 and 5
        record.update(
            train_matched(
                model,
                views,
                epochs=2,
                target=-1.0,
                batch_size=8,
                lr=1e-2,
                lr_decay=0.5,
                evals_per_epoch=2,
                time_limit_s=time_limit_s,
                state=state,
            )
        )

    loaded = load_or_train(model, "m", train, checkpoint_dir=checkpoint_dir, meta=record, state=state)
    return model, record, loaded


def test_a_matched_training_cut_short_is_continued_as_if_uninterrupted(tmp_path):
    reference, whole, _ = _matched_in_run(tmp_path / "whole", time_limit_s=None)
    assert [h["epoch"] for h in whole["history"]] == [0.4, 1, 1.4, 2]
    stops = []
    for run in range(4):  # stops within epoch 1, at its end, within epoch 2, then the planned end
        model, record, loaded = _matched_in_run(tmp_path / "cut", time_limit_s=1e-9, rng_seed=run)
        stops.append((record["history"][-1]["epoch"], record["time_limit"]))
        assert not loaded
    assert stops == [(0.4, True), (1, True), (1.4, True), (2, False)]  # the last evaluation is not cut short
    keys = ("epoch", "step", "loss", "familiar_error", "novel_error")
    assert [[h[k] for k in keys] for h in record["history"]] == [[h[k] for k in keys] for h in whole["history"]]
    assert (record["epoch"], record["familiar_error"]) == (whole["epoch"], whole["familiar_error"])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    model, record, loaded = _matched_in_run(tmp_path / "cut", time_limit_s=1e-9)
    assert loaded and all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))
