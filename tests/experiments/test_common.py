"""Runs: the experiments train through the engine's trainer in run directories that a later run reuses (complete)
or continues (cut short by a time limit), stop at a validation target, and draw a training set every epoch."""

import pytest
import torch
from torch import nn

from capsnets.data import TensorData
from capsnets.experiments.runs import Runs, check_minutes, epochs_trained
from capsnets.models.output import ModelOutput


class NoisyLinear(nn.Module):
    """Dropout on the input, so that training draws from the global RNG (a continued run must restore it)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, images, labels=None):
        return ModelOutput(self.fc(nn.functional.dropout(images.flatten(1), 0.5, self.training)), "logits")


def _data(n=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return TensorData(torch.rand(n, 1, 2, 2, generator=generator), torch.arange(n) % 3, 3, name="tiny")


def _fit(folder, *, epochs=4, rng_seed=0, **options):
    """One process's share of a training: a fresh model, and the global RNG as a new process holds it."""
    torch.manual_seed(0)
    model = NoisyLinear()
    torch.manual_seed(rng_seed)
    with Runs(folder) as runs:
        settings = dict(batch_size=4, lr=0.05, lr_decay=0.5, max_shift=0, device="cpu", progress=False)
        training = runs.fit("m", model, _data(), _data(8, seed=1), epochs=epochs, **settings, **options)
    return model, training, runs


def test_a_complete_run_is_reused_and_other_settings_train_their_own(tmp_path):
    model, first, runs = _fit(tmp_path)
    assert not first.loaded and len(first.history) == 4 and first.epochs == "4" and runs.cut_short == []
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert run.name.startswith("m_") and {"last.safetensors", "best.safetensors", "summary.json"} <= {
        p.name for p in run.iterdir()
    }
    again, second, _ = _fit(tmp_path, rng_seed=5)
    assert second.loaded and second.history == first.history and second.epochs == "4 (loaded)"
    assert torch.equal(again.fc.weight, model.fc.weight)  # the best checkpoint, loaded
    _fit(tmp_path, epochs=2)
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2


def test_the_model_is_left_at_its_best_epoch_chosen_on_validation(tmp_path):
    _, training, _ = _fit(tmp_path)
    best = max(range(4), key=lambda i: (training.history[i]["val_accuracy"], -i))
    assert training.summary["best_epoch"] == best + 1
    assert training.chosen("val_accuracy") == training.history[best]["val_accuracy"]


def _without_timing(history):
    return [{k: v for k, v in r.items() if not k.endswith(("time_s", "per_s", "time_limit"))} for r in history]


@pytest.mark.parametrize("stepwise", [False, True])
def test_a_training_cut_short_is_continued_by_the_next_run_as_if_uninterrupted(tmp_path, stepwise):
    # stepwise: a target never reached, so that every epoch is a trainer call of its own
    target = {"target": 2.0} if stepwise else {}
    reference, whole, _ = _fit(tmp_path / "whole", **target)
    _, cut, runs = _fit(tmp_path / "cut", train_minutes=1e-9, **target)  # epoch 1 of 4, then stops
    assert cut.cut_short and len(cut.history) == 1 and cut.epochs == "1 of 4 (time limit)"
    assert runs.cut_short and runs.cut_short[0].startswith("m_")
    _, cut, _ = _fit(tmp_path / "cut", train_minutes=1e-9, rng_seed=123, **target)  # epoch 2
    assert [r["epoch"] for r in cut.history] == [1, 2] and not cut.loaded
    model, cut, runs = _fit(tmp_path / "cut", rng_seed=7, **target)  # epochs 3 and 4
    assert not cut.cut_short and runs.cut_short == []
    assert _without_timing(cut.history) == _without_timing(whole.history)
    assert torch.equal(model.fc.weight, reference.fc.weight) and torch.equal(model.fc.bias, reference.fc.bias)


def test_a_stepwise_training_trains_what_one_trainer_call_does(tmp_path):
    reference, whole, _ = _fit(tmp_path / "whole")
    model, steps, _ = _fit(tmp_path / "steps", target=2.0)
    assert _without_timing(steps.history) == _without_timing(whole.history)
    assert torch.equal(model.fc.weight, reference.fc.weight)


def test_a_target_stops_the_training_at_the_first_epoch_that_reaches_it(tmp_path):
    _, training, _ = _fit(tmp_path, target=0.0)
    assert len(training.history) == 1 and training.epochs == "1"
    _, again, _ = _fit(tmp_path, target=0.0)
    assert again.loaded and len(again.history) == 1


def test_epoch_data_draws_a_training_set_every_epoch(tmp_path):
    drawn = []

    def epoch_data(epoch):
        drawn.append(epoch)
        return _data(seed=10 + epoch)

    _, training, _ = _fit(tmp_path, epochs=3, epoch_data=epoch_data)
    assert drawn == [1, 2, 3] and len(training.history) == 3


@pytest.mark.parametrize("bad", [0, -1.0, "5", True, float("nan")])
def test_bad_time_limits_are_refused(bad, tmp_path):
    with pytest.raises(ValueError, match="train_minutes must be a positive number"):
        check_minutes(bad)
    with pytest.raises(ValueError, match="train_minutes must be a positive number"):
        _fit(tmp_path, train_minutes=bad)


def test_epochs_trained_states_a_trainings_length():
    assert epochs_trained(12, 50) == "12"
    assert epochs_trained(7, 50, cut_short=True) == "7 of 50 (time limit)"
    assert epochs_trained(12, 50, loaded=True) == "12 (loaded)"
