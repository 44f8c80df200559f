"""train_classifier: mixed precision follows the trainer's rule (bf16 autocast on CUDA, or when asked)."""

import pytest
import torch
from torch import nn

from capsnets.experiments.training import epochs_trained, minutes_to_seconds, train_classifier
from capsnets.models.output import ModelOutput

from helpers import rewrite_sidecar


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, images, labels=None):
        return ModelOutput(scores=self.fc(images.flatten(1)))


@pytest.mark.parametrize("amp, dtype", [("auto", torch.float32), ("off", torch.float32), ("bf16", torch.bfloat16)])
def test_forward_and_loss_run_under_the_requested_autocast(amp, dtype):
    seen = []

    def loss_fn(model, images, labels):
        scores = model(images).scores
        seen.append(scores.dtype)
        return nn.functional.cross_entropy(scores.float(), labels)

    images, labels = torch.rand(8, 1, 2, 2), torch.arange(8) % 3
    history = train_classifier(
        Linear(), images, labels, loss_fn=loss_fn, epochs=1, batch_size=4, amp=amp, progress=False
    )
    assert seen == [dtype, dtype] and len(history) == 1  # "auto" is full precision on the CPU


def _tiny_run(**kwargs):
    images, labels = torch.rand(8, 1, 2, 2), torch.arange(8) % 3
    return train_classifier(Linear(), images, labels, batch_size=4, progress=False, **kwargs)


def test_time_limit_stops_after_the_epoch_that_passes_it():
    stopped = _tiny_run(epochs=5, time_limit_s=1e-9)
    assert len(stopped) == 1 and stopped[-1]["time_limit"] is True
    assert epochs_trained(stopped, 5) == "1 of 5 (time limit)"
    unlimited = _tiny_run(epochs=3, time_limit_s=3600)
    assert len(unlimited) == 3 and not any("time_limit" in r for r in unlimited)
    assert epochs_trained(unlimited, 3) == "3"
    last = _tiny_run(epochs=1, time_limit_s=1e-9)  # the planned run ended anyway: not cut short
    assert len(last) == 1 and "time_limit" not in last[-1]


@pytest.mark.parametrize("bad", [0, -1.0, "5", True, float("nan")])
def test_bad_time_limits_are_refused(bad):
    with pytest.raises(ValueError, match="positive number"):
        _tiny_run(epochs=1, time_limit_s=bad)
    with pytest.raises(ValueError, match="train_minutes must be a positive number"):
        minutes_to_seconds(bad)


def test_train_minutes_converts_to_seconds():
    assert minutes_to_seconds(None) is None and minutes_to_seconds(2.5) == 150.0


def test_training_cell_says_how_a_loaded_model_was_trained():
    from capsnets.experiments.report import training_cell

    cell = "7 of 50 (time limit) x 60,000 pairs"
    assert training_cell(cell, [{}], loaded=False) == cell
    assert training_cell(cell, [{}], loaded=True) == f"loaded ({cell})"
    assert training_cell("0 x 60,000 pairs", [], loaded=True) == "loaded"  # a checkpoint written without history


def test_load_or_train_fills_meta_from_the_checkpoint(tmp_path):
    import torch
    from torch import nn

    from capsnets.experiments.checkpoints import load_or_train

    history: list = []
    trained = nn.Linear(2, 1)
    assert not load_or_train(
        trained,
        "m",
        lambda: history.extend([{"epoch": 1, "loss": 0.5}]),
        checkpoint_dir=tmp_path,
        meta={"history": history, "note": "x"},
    )
    again: list = ["stale"]
    loaded = nn.Linear(2, 1)
    assert load_or_train(
        loaded,
        "m",
        lambda: pytest.fail("must not train"),
        checkpoint_dir=tmp_path,
        meta=(meta := {"history": again, "note": "y"}),
    )
    assert again == [{"epoch": 1, "loss": 0.5}]  # the same list object, filled from the sidecar
    # the caller's own entries stay; what the caller does not have comes from the sidecar
    assert load_or_train(
        loaded, "m", lambda: pytest.fail("must not train"), checkpoint_dir=tmp_path, meta=(fresh := {"history": []})
    )
    assert meta["note"] == "y" and fresh["note"] == "x" and fresh["history"] == [{"epoch": 1, "loss": 0.5}]
    assert "model_args" not in fresh and "training" not in fresh
    assert torch.equal(loaded.weight, trained.weight)


def test_load_or_train_refuses_a_checkpoint_trained_with_another_recipe(tmp_path):
    from torch import nn

    from capsnets.experiments.checkpoints import load_or_train

    recipe = {"epochs": 2, "sizes": (3, 4)}
    assert not load_or_train(nn.Linear(2, 1), "m", lambda: None, checkpoint_dir=tmp_path, recipe=recipe)
    never = lambda: pytest.fail("must not train")  # noqa: E731
    assert load_or_train(nn.Linear(2, 1), "m", never, checkpoint_dir=tmp_path, recipe=dict(recipe))  # tuple as list
    assert load_or_train(nn.Linear(2, 1), "m", never, checkpoint_dir=tmp_path)  # no recipe asked for: not checked
    with pytest.raises(
        ValueError,
        match=r"m.safetensors holds a model trained with epochs=2, lr=\(unset\), but "
        r"this run trains it with epochs=3, lr=0.1; pass another --checkpoint-dir",
    ):
        load_or_train(nn.Linear(2, 1), "m", never, checkpoint_dir=tmp_path, recipe={**recipe, "epochs": 3, "lr": 0.1})
    # checkpoints written without a recipe (before recipes were recorded) are loaded as they are
    assert not load_or_train(nn.Linear(2, 1), "old", lambda: None, checkpoint_dir=tmp_path)
    assert load_or_train(nn.Linear(2, 1), "old", never, checkpoint_dir=tmp_path, recipe=recipe)


class NoisyLinear(Linear):
    """Dropout on the input, so that training draws from the global RNG (a continued run must restore it)."""

    def forward(self, images, labels=None):
        return super().forward(nn.functional.dropout(images, 0.5, self.training))


def _train_in_run(checkpoint_dir, *, time_limit_s, rng_seed=0, epochs=4):
    """One process's share of a training: load_or_train + train_classifier with a TrainState."""
    from capsnets.engine import TrainState
    from capsnets.experiments.checkpoints import load_or_train

    torch.manual_seed(0)
    model, history, state = NoisyLinear(), [], TrainState()
    torch.manual_seed(rng_seed)  # what a new process holds; a continued run must not depend on it
    images, labels = torch.linspace(-1, 1, 64).reshape(16, 1, 2, 2), torch.arange(16) % 3

    def fit():
        history.extend(
            train_classifier(
                model,
                images,
                labels,
                epochs=epochs,
                batch_size=4,
                lr=0.05,
                lr_decay=0.5,
                progress=False,
                time_limit_s=time_limit_s,
                state=state,
            )
        )

    loaded = load_or_train(model, "m", fit, checkpoint_dir=checkpoint_dir, meta={"history": history}, state=state)
    return model, history, loaded


def _without_timing(history):
    return [{k: v for k, v in record.items() if k not in ("time_s", "time_limit")} for record in history]


def test_a_checkpoint_cut_short_by_an_earlier_version_is_refused_with_what_to_do(tmp_path):
    import json

    from capsnets.engine import TrainState
    from capsnets.experiments.checkpoints import load_or_train

    _train_in_run(tmp_path, time_limit_s=1e-9)
    sidecar = tmp_path / "m.json"
    meta = json.loads(sidecar.read_text())
    meta["training"] = {"epoch": 1, "finished": False, "step": 3, "done": 8, "best": 0}  # train_matched's old record
    rewrite_sidecar(tmp_path / "m.safetensors", meta)
    with pytest.raises(ValueError, match=r"m.safetensors: .*does not read \(done\); delete the checkpoint"):
        load_or_train(NoisyLinear(), "m", lambda: None, checkpoint_dir=tmp_path, state=TrainState())


def test_a_training_cut_short_is_continued_by_the_next_run_as_if_uninterrupted(tmp_path):
    import json

    from safetensors import safe_open

    reference, reference_history, _ = _train_in_run(tmp_path / "whole", time_limit_s=None)
    model, history, loaded = _train_in_run(tmp_path / "cut", time_limit_s=1e-9)  # epoch 1 of 4, then stops
    assert not loaded and len(history) == 1 and history[-1]["time_limit"]
    training = json.loads((tmp_path / "cut" / "m.json").read_text())["training"]
    assert (training["epoch"], training["finished"], len(training["history"])) == (1, False, 1)
    model, history, loaded = _train_in_run(tmp_path / "cut", time_limit_s=1e-9, rng_seed=123)  # epoch 2
    assert not loaded and [r["epoch"] for r in history] == [1, 2]
    model, history, loaded = _train_in_run(tmp_path / "cut", time_limit_s=None, rng_seed=7)  # epochs 3 and 4
    assert not loaded and _without_timing(history) == _without_timing(reference_history)
    assert torch.equal(model.fc.weight, reference.fc.weight) and torch.equal(model.fc.bias, reference.fc.bias)
    assert epochs_trained(history, 4) == "4 (3 runs)"
    assert epochs_trained(history[:2], 4) == "2 of 4 (time limit; 2 runs)"
    sidecar = json.loads((tmp_path / "cut" / "m.json").read_text())
    assert (sidecar["training"]["epoch"], sidecar["training"]["finished"]) == (4, True) and "optimizer" not in sidecar
    with safe_open(str(tmp_path / "cut" / "m.safetensors"), framework="pt") as handle:
        assert not [k for k in handle.keys() if k.startswith("optim.")]  # a finished model keeps no Adam state
    model, history, loaded = _train_in_run(tmp_path / "cut", time_limit_s=None)
    assert loaded and len(history) == 4 and torch.equal(model.fc.weight, reference.fc.weight)


def test_an_unfinished_checkpoint_is_taken_as_it_is_without_a_training_state(tmp_path):
    from capsnets.experiments.checkpoints import load_or_train

    _train_in_run(tmp_path, time_limit_s=1e-9)
    history: list = []
    assert load_or_train(
        NoisyLinear(), "m", lambda: pytest.fail("must not train"), checkpoint_dir=tmp_path, meta={"history": history}
    )
    assert len(history) == 1 and history[-1]["time_limit"]
