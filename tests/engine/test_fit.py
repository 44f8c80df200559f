"""fit and its callbacks: evaluation points, stopping, the time limit, exact continuation mid-epoch, finite checks,
logging."""

import logging

import pytest
import torch
from torch import nn

from capsnets.data import DeviceLoader
from capsnets.engine import NonFiniteLossError, TrainState, fit, training_step
from capsnets.engine.callbacks import Hook, TimeLimit
from capsnets.engine.fit import adam_with_decay, cosine_factor, evaluation_points


def _problem(seed=0):
    """A linear model with dropout (training draws from the global RNG), its optimizer, schedule and batches."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Dropout(0.2), nn.Linear(4, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)
    images = torch.linspace(-1, 1, 80).reshape(20, 1, 2, 2)
    loader = DeviceLoader((images, torch.arange(20) % 3), 4, seed=1)  # 5 batches per epoch

    def compute(batch):
        x, y = batch
        return {"loss": nn.functional.cross_entropy(model(x.flatten(1)), y)}

    step = training_step(compute, optimizer, device=torch.device("cpu"), model=model)
    return model, step, loader, optimizer, scheduler


def test_evaluation_points_are_evenly_spaced_and_end_the_epoch():
    assert evaluation_points(5, 1) == [5]
    assert evaluation_points(5, 2) == [2, 5]  # round(2.5) == 2
    assert evaluation_points(3, 10) == [1, 2, 3]


def test_records_positions_means_and_learning_rates():
    model, step, loader, _, scheduler = _problem()
    finals = []
    state = fit(
        step,
        loader,
        epochs=2,
        schedulers=[scheduler],
        evaluations_per_epoch=2,
        progress=False,
        callbacks=[Hook(lambda record, final: finals.append(final))],
    )
    assert [r["epoch"] for r in state.history] == [0.4, 1, 1.4, 2]
    assert [r["step"] for r in state.history] == [2, 5, 7, 10]
    assert [r["lr"] for r in state.history] == [0.05, 0.05, 0.025, 0.025]
    assert finals == [False, False, False, True] and state.finished
    assert (state.epoch, state.step, state.steps) == (2, 0, 10)


def test_the_cosine_schedule_steps_every_step_from_lr_to_zero():
    model, _, loader, _, _ = _problem()
    optimizer, scheduler = adam_with_decay(model.parameters(), lr=0.08, schedule="cosine", total_steps=10)
    seen = []

    def compute(batch):
        seen.append(optimizer.param_groups[0]["lr"])
        x, y = batch
        return {"loss": nn.functional.cross_entropy(model(x.flatten(1)), y)}

    fit(
        training_step(compute, optimizer, device=torch.device("cpu"), model=model),
        loader,
        epochs=2,
        schedulers=[scheduler],
        progress=False,
    )
    # step t (0-based) of 10 trains at lr (1 + cos(pi t / 10)) / 2, written out
    expected = [
        0.08,
        0.07804226,
        0.07236068,
        0.06351141,
        0.05236068,
        0.04,
        0.02763932,
        0.01648859,
        0.00763932,
        0.00195774,
    ]
    assert seen == pytest.approx(expected, rel=1e-6)
    assert cosine_factor(10, 10) == 0.0 and cosine_factor(12, 10) == 0.0  # past the plan it stays at 0
    with pytest.raises(ValueError, match="total_steps"):
        adam_with_decay(model.parameters(), lr=0.1, schedule="cosine")
    with pytest.raises(ValueError, match="schedule must be one of"):
        adam_with_decay(model.parameters(), lr=0.1, schedule="linear")


def test_the_hook_stops_training_and_the_time_limit_marks_the_point():
    _, step, loader, _, _ = _problem()
    stopped = fit(step, loader, epochs=3, progress=False, callbacks=[Hook(lambda record, final: record["epoch"] == 2)])
    assert len(stopped.history) == 2 and stopped.finished
    _, step, loader, _, _ = _problem()
    seen = []
    cut = fit(
        step,
        loader,
        epochs=3,
        progress=False,
        callbacks=[TimeLimit(1e-9), Hook(lambda record, final: seen.append((dict(record), final)))],
    )
    assert not cut.finished and len(cut.history) == 1 and seen[0][1] is True and seen[0][0]["time_limit"]
    with pytest.raises(ValueError, match="positive number of seconds"):
        TimeLimit(0)


def test_a_training_stopped_mid_epoch_continues_exactly():
    model, step, loader, optimizer, scheduler = _problem()
    whole = fit(step, loader, epochs=2, schedulers=[scheduler], evaluations_per_epoch=2, progress=False)
    reference = [p.detach().clone() for p in model.parameters()]

    model, step, loader, optimizer, scheduler = _problem()
    state = TrainState()
    fit(
        step,
        loader,
        epochs=2,
        state=state,
        schedulers=[scheduler],
        evaluations_per_epoch=2,
        progress=False,
        callbacks=[TimeLimit(1e-9)],
    )
    assert (state.epoch, state.step, state.finished) == (0, 2, False)
    fit(step, loader, epochs=2, state=state, schedulers=[scheduler], evaluations_per_epoch=2, progress=False)
    keys = ("epoch", "step", "loss", "lr")
    assert [[r[k] for k in keys] for r in state.history] == [[r[k] for k in keys] for r in whole.history]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference))


def test_an_interrupted_training_checkpoints_its_step_and_continues_with_the_same_records():
    """``interrupt`` stops fit before a step mid-epoch, after ``on_interrupt`` (the checkpoint) saw the epoch's
    running sums in the state; continued from that state, the records and weights are the uninterrupted ones."""
    from capsnets.engine import TrainingInterrupted
    from capsnets.engine.callbacks import Callback

    model, step, loader, _, scheduler = _problem()
    whole = fit(step, loader, epochs=2, schedulers=[scheduler], progress=False)
    reference = [p.detach().clone() for p in model.parameters()]

    class Saved(Callback):
        def on_interrupt(self, state):
            self.extra = dict(state.extra)

    model, step, loader, _, scheduler = _problem()
    state, saved, calls = TrainState(), Saved(), []
    with pytest.raises(TrainingInterrupted) as stop:
        fit(
            step,
            loader,
            epochs=2,
            state=state,
            schedulers=[scheduler],
            progress=False,
            callbacks=[saved],
            interrupt=lambda: calls.append(1) or (15 if len(calls) == 8 else None),  # before step 3 of epoch 2
        )
    assert (stop.value.signum, stop.value.epoch, stop.value.step) == (15, 1, 2) and isinstance(
        stop.value, KeyboardInterrupt
    )
    assert len(saved.extra["interrupted_epoch"]["sums"]) == 2 and "interrupted_epoch" not in state.extra
    state.extra = saved.extra  # what the checkpoint holds
    fit(step, loader, epochs=2, state=state, schedulers=[scheduler], progress=False)
    keys = ("epoch", "step", "loss", "lr")
    assert [[r[k] for k in keys] for r in state.history] == [[r[k] for k in keys] for r in whole.history]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference)) and state.extra == {}


def test_a_non_finite_loss_names_the_epoch_and_step():
    calls = iter(range(100))

    def step(batch):
        return {"loss": torch.tensor(float("nan") if next(calls) == 6 else 1.0)}

    _, _, loader, _, _ = _problem()
    with pytest.raises(
        NonFiniteLossError,
        match=r"toy: training loss is nan at epoch 2, step 2: lower the learning rate or turn mixed precision off$",
    ):
        fit(step, loader, epochs=3, desc="toy", progress=False)


def test_each_evaluation_point_is_logged_and_nothing_is_printed(caplog, capsys):
    _, step, loader, _, _ = _problem()
    with caplog.at_level(logging.INFO, logger="capsnets.engine.fit"):
        hook = Hook(lambda record, final: record.update(score=0.5, limits={"mse": 0.1}))
        fit(step, loader, epochs=2, desc="toy", callbacks=[hook])
    assert [m for m in caplog.messages if m.startswith("toy epoch")] == [
        m for m in caplog.messages if "score 0.5" in m
    ] and len(caplog.messages) == 2
    assert not any("limits" in m for m in caplog.messages)  # a mapping stays in the records, out of the log line
    assert capsys.readouterr() == ("", "")  # the progress bar stays off when stderr is not a terminal


def test_a_step_leaves_its_frozen_parameters_as_they_are():
    from capsnets.engine.fit import training_step

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, weight_decay=0.1)  # decay too would move them
    frozen = [True]
    step = training_step(
        lambda batch: {"loss": model(batch).square().mean()},
        optimizer,
        device=torch.device("cpu"),
        frozen=lambda: list(model[0].parameters()) if frozen[0] else (),
    )
    before = [p.detach().clone() for p in model.parameters()]
    step(torch.randn(8, 3))
    after = list(model.parameters())
    assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])
    assert not torch.equal(after[2], before[2])
    frozen[0] = False
    step(torch.randn(8, 3))
    assert not torch.equal(model[0].weight, before[0])
