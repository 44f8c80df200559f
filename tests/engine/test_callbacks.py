"""The callbacks of fit: a target stops the training, checkpoints are named and saved as the trainer and the
experiments both expect, and a saved state is resumed exactly."""

import pytest
import torch
from torch import nn

from capsnets.checkpoints import load_checkpoint
from capsnets.data import DeviceLoader
from capsnets.engine import TrainState, fit, training_step
from capsnets.engine.callbacks import (
    Hook,
    ModelCheckpoint,
    Target,
    TimeLimit,
    checkpoint_name,
    checkpoint_path,
    resume_state,
)
from capsnets.engine.fit import adam_with_decay


def _problem(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Dropout(0.2), nn.Linear(4, 3))
    optimizer, scheduler = adam_with_decay(model.parameters(), lr=0.05, lr_decay=0.5)
    loader = DeviceLoader((torch.linspace(-1, 1, 80).reshape(20, 1, 2, 2), torch.arange(20) % 3), 4, seed=1)

    def compute(batch):
        x, y = batch
        return {"loss": nn.functional.cross_entropy(model(x.flatten(1)), y)}

    return model, training_step(compute, optimizer, device=torch.device("cpu"), model=model), loader, scheduler


def test_a_target_scores_every_point_and_stops_once_reached():
    scores = iter([0.2, 0.6, 0.9, 1.0])
    _, step, loader, _ = _problem()
    state = fit(step, loader, epochs=4, progress=False, callbacks=[Target(lambda: next(scores), 0.5, key="acc")])
    assert [r["acc"] for r in state.history] == [0.2, 0.6] and state.finished and state.epoch == 2
    _, step, loader, _ = _problem()
    scored = fit(step, loader, epochs=2, progress=False, callbacks=[Target(lambda: 0.0, None)])
    assert [r["val_accuracy"] for r in scored.history] == [0.0, 0.0]


def test_a_target_reached_at_the_time_limit_is_not_cut_short():
    _, step, loader, _ = _problem()
    state = fit(step, loader, epochs=3, progress=False, callbacks=[TimeLimit(1e-9), Target(lambda: 1.0, 0.5)])
    assert state.finished and "time_limit" not in state.history[-1] and len(state.history) == 1


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True, "5"])
def test_a_time_limit_is_a_positive_number_of_seconds(bad):
    with pytest.raises(ValueError, match="positive number of seconds"):
        TimeLimit(bad)
    assert not TimeLimit(None).time_up(TrainState())


def test_checkpoint_names_record_the_builder_arguments(tmp_path):
    assert checkpoint_name("seg_unet", {}) == checkpoint_name("seg_unet", None) == "seg_unet"
    a = checkpoint_name("seg_unet", {"batch_norm": True, "width": 8})
    assert a == checkpoint_name("seg_unet", {"width": 8, "batch_norm": True})  # key order does not matter
    assert a.startswith("seg_unet_") and len(a) == len("seg_unet_") + 8
    assert a != checkpoint_name("seg_unet", {"batch_norm": False, "width": 8})
    path = checkpoint_path(tmp_path, "seg_unet", {"width": 8})
    assert path == tmp_path / f"{checkpoint_name('seg_unet', {'width': 8})}.safetensors"


def test_model_checkpoints_save_when_due_and_resume_exactly(tmp_path):
    model, step, loader, scheduler = _problem()
    whole = fit(step, loader, epochs=3, schedulers=[scheduler], progress=False)
    reference = [p.detach().clone() for p in model.parameters()]

    model, step, loader, scheduler = _problem()
    state, saved = TrainState(), []
    state.attach(scheduler.optimizer, scheduler)
    last = ModelCheckpoint(
        tmp_path / "last.safetensors",
        model,
        lambda s, r: {"epoch": s.epoch},
        every=2,
        on_save=lambda: saved.append(state.epoch),
    )
    best = ModelCheckpoint(tmp_path / "best.safetensors", model, lambda s, r: {}, best_only=True)
    choose = Hook(lambda record, final: setattr(state, "best", 0) if len(state.history) == 1 else None)
    fit(
        step,
        loader,
        epochs=3,
        state=state,
        schedulers=[scheduler],
        progress=False,
        callbacks=[TimeLimit(None), choose, last, best],
    )
    assert saved == [2, 3]  # every second epoch, and the last
    assert load_checkpoint(tmp_path / "best.safetensors").meta["training"]["epoch"] == 1  # the chosen evaluation

    # a training cut after its first epoch continues from its checkpoint to the uninterrupted run's weights
    model, step, loader, scheduler = _problem()
    cut = TrainState()
    cut.attach(scheduler.optimizer, scheduler)
    fit(
        step,
        loader,
        epochs=3,
        state=cut,
        schedulers=[scheduler],
        progress=False,
        callbacks=[TimeLimit(1e-9), ModelCheckpoint(tmp_path / "cut.safetensors", model, lambda s, r: {})],
    )
    model, step, loader, scheduler = _problem(seed=5)
    torch.manual_seed(123)  # what a new process holds
    resumed = resume_state(tmp_path / "cut.safetensors", model)
    assert (resumed.epoch, resumed.finished) == (1, False)
    resumed.attach(scheduler.optimizer, scheduler)
    fit(step, loader, epochs=3, state=resumed, schedulers=[scheduler], progress=False)
    assert [r["loss"] for r in resumed.history] == [r["loss"] for r in whole.history]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference))
