"""Trainer: run directory contents, exact resume, non-finite loss handling."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from capsnets import checkpoints as capsnets_checkpoints
from capsnets.engine import NonFiniteLossError, reporting
from capsnets.engine import trainer as trainer_module
from capsnets.engine.trainer import Trainer
from capsnets.models.output import ModelOutput


class DropoutNet(nn.Module):
    """A tiny stand-in model whose training uses torch's global RNG (dropout), for the resume test."""

    num_classes, input_size, default_loss = 10, (1, 8, 8), "cross_entropy"

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 10))

    def forward(self, images, labels=None):
        return ModelOutput(scores=self.net(images))


@pytest.fixture
def dropout_net(monkeypatch):
    monkeypatch.setattr(trainer_module, "build_model", lambda name, args=None, pretrained=None: DropoutNet())


def test_run_directory(tiny_config):
    config = tiny_config(figures=True)
    summary = Trainer(config).fit()
    run = Path(config.out)
    lines = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [line["epoch"] for line in lines] == [1, 2]
    assert {
        "train_loss",
        "train_accuracy",
        "test_loss",
        "test_accuracy",
        "lr",
        "epoch_time_s",
        "images_per_s",
        "train_time_s",
    } <= set(lines[0])
    assert lines[1]["lr"] == pytest.approx(config.lr * config.lr_decay)
    on_disk = json.loads((run / "summary.json").read_text())
    for key in (
        "test_accuracy",
        "best_test_accuracy",
        "best_epoch",
        "epochs",
        "train_time_s",
        "time_to_accuracy",
        "parameters",
        "model",
        "dataset",
        "device",
        "torch",
    ):
        assert key in on_disk and key in summary, key
    assert summary["test_accuracy"] == lines[-1]["test_accuracy"]
    assert on_disk["figures_checkpoint"].startswith(f"best.safetensors (epoch {summary['best_epoch']}, ")
    figures = {Path(p).name for p in on_disk["figures"]}
    assert figures == {"training_curves.png", "confusion_matrix.png", "reconstructions.png"}
    for name in ("config.yaml", "last.safetensors", "last.json", "best.safetensors", "best.json", *figures):
        assert (run / name).is_file(), name


@pytest.mark.parametrize("stand_in", [False, True], ids=["capsnet_digits", "dropout_stand_in"])
def test_resume_is_bit_identical(tiny_config, tmp_path, request, monkeypatch, stand_in):
    """2 epochs == 1 epoch + resume for 1 more: weights, losses and learning rates, bit for bit."""
    if stand_in:
        request.getfixturevalue("dropout_net")
    monkeypatch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])  # figures are slow, not tested here
    small = dict(batch_size=16, limit_train=32, limit_test=16)
    full = Trainer(tiny_config(out=str(tmp_path / "a"), epochs=2, **small))
    full.fit()
    Trainer(tiny_config(out=str(tmp_path / "b"), epochs=1, **small)).fit()
    resumed = Trainer(tiny_config(out=str(tmp_path / "b"), epochs=2, **small), resume=True)
    resumed.fit()
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    metrics = [[json.loads(line) for line in open(tmp_path / run / "metrics.jsonl")] for run in "ab"]
    assert [m["train_loss"] for m in metrics[0]] == [m["train_loss"] for m in metrics[1]]
    assert [m["lr"] for m in metrics[0]] == [m["lr"] for m in metrics[1]]


def test_time_limit_stops_checkpoints_and_resumes_exactly(tiny_config, tmp_path, monkeypatch):
    """A run stopped by the time limit is evaluated, checkpointed and summarised after its first epoch (whatever
    eval_every / checkpoint_every say); --resume then finishes it bit for bit like an uninterrupted run, its cosine
    schedule over the 3 planned epochs included."""
    monkeypatch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
    small = dict(batch_size=16, limit_train=32, limit_test=16, epochs=3, eval_every=5, checkpoint_every=5)
    small["lr_schedule"] = "cosine"
    full = Trainer(tiny_config(out=str(tmp_path / "a"), **small))
    full.fit()
    cut = tiny_config(out=str(tmp_path / "b"), time_limit_minutes=1e-9, **small)
    summary = Trainer(cut).fit()
    assert summary["time_limited"] and summary["epochs"] == 1 and summary["planned_epochs"] == 3
    assert summary["test_accuracy"] is not None  # evaluated although eval_every is 5
    last = capsnets_checkpoints.load_checkpoint(
        tmp_path / "b" / "last.safetensors"
    )  # checkpointed although checkpoint_every is 5
    assert last.meta["training"]["epoch"] == 1
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["time_limited"] is True
    resumed = Trainer(cut.replace(time_limit_minutes=None), resume=True)
    summary = resumed.fit()
    assert not summary["time_limited"] and summary["epochs"] == 3
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    metrics = [[json.loads(line) for line in open(tmp_path / run / "metrics.jsonl")] for run in "ab"]
    assert [m["train_loss"] for m in metrics[0]] == [m["train_loss"] for m in metrics[1]]
    assert [m["lr"] for m in metrics[0]] == [m["lr"] for m in metrics[1]]
    # a limit that does not bind changes nothing; the last epoch is never cut
    free = Trainer(tiny_config(out=str(tmp_path / "c"), time_limit_minutes=60, **small)).fit()
    assert not free["time_limited"] and free["epochs"] == 3
    assert not Trainer(tiny_config(out=str(tmp_path / "d"), epochs=1, time_limit_minutes=1e-9)).fit()["time_limited"]


def test_best_is_chosen_on_validation_and_the_figures_show_it(tiny_config, monkeypatch):
    from capsnets.engine.tasks import classification as tasks  # the trainer evaluates through its task

    real, evaluated, shown, validations = tasks.evaluate, [], {}, []

    def scripted(model, data, *args, **kwargs):  # on validation epoch 1 scores best, epoch 2 worse; test: 2 > 1
        result = real(model, data, *args, **kwargs)
        evaluated.append({k.removeprefix("model."): v.clone() for k, v in model.state_dict().items()})
        if len(data) == 6:  # the validation split: 10% of the 64 training digits
            validations.append(len(evaluated))
            result["accuracy"] = {1: 0.9, 2: 0.5}[len(validations)]
        elif len(validations) == 2 and len(evaluated) == 3:  # epoch 2's test
            result["accuracy"] = 0.95
        return result

    monkeypatch.setattr(tasks, "evaluate", scripted)
    monkeypatch.setattr(reporting, "save_figures", lambda run_dir, **kwargs: shown.update(kwargs) or [])
    config = tiny_config(epochs=2, figures=True, test_each_epoch=False)  # epoch 1, the best, is not test-scored
    summary = Trainer(config).fit()
    assert summary["best_chosen_on"] == "validation" and summary["best_chosen_by"] == "val_accuracy"
    assert (summary["best_epoch"], summary["best_val_accuracy"], summary["test_accuracy"]) == (1, 0.9, 0.95)
    assert summary["validation_examples"] == 6 and summary["best_test_accuracy"] < 0.95
    assert shown["checkpoint"] == summary["figures_checkpoint"] and shown["checkpoint"].startswith(
        "best.safetensors (epoch 1, "
    )
    best = capsnets_checkpoints.load_checkpoint(Path(config.out) / "best.safetensors").model_state()
    # epoch 1: val; epoch 2: val, test; the best checkpoint on test; its figures
    assert len(evaluated) == 5 and all(torch.equal(evaluated[-1][k], v) for k, v in best.items())
    assert all(torch.equal(evaluated[-2][k], v) for k, v in best.items())


def test_a_best_epoch_scored_on_test_is_not_scored_again(tiny_config, monkeypatch):
    # Its record's test scores are those of the weights the best checkpoint holds.
    from capsnets.engine.tasks import classification as tasks

    real, sizes = tasks.evaluate, []
    monkeypatch.setattr(
        tasks, "evaluate", lambda model, data, *a, **k: sizes.append(len(data)) or real(model, data, *a, **k)
    )
    summary = Trainer(tiny_config(epochs=2, test_each_epoch=True)).fit()
    history = [json.loads(line) for line in open(Path(summary["run_dir"]) / "metrics.jsonl")]
    best = history[summary["best_epoch"] - 1]
    assert sizes == [6, 32] * 2  # each epoch: validation, test; nothing after
    assert summary["best_test_accuracy"] == best["test_accuracy"]


def test_without_a_validation_split_no_best_is_chosen(tiny_config):
    config = tiny_config(epochs=2, val_fraction=0, figures=True)
    summary = Trainer(config).fit()
    assert summary["best_chosen_on"] is None and summary["best_epoch"] is None
    assert summary["best_test_accuracy"] is None and summary["test_accuracy"] is not None
    assert not (Path(config.out) / "best.safetensors").exists()
    assert summary["figures_checkpoint"].startswith("last.safetensors (epoch 2, ")
    lines = [json.loads(line) for line in open(Path(config.out) / "metrics.jsonl")]
    assert all("val_accuracy" not in line for line in lines)


def test_the_test_split_can_be_scored_at_the_end_only(tiny_config):
    config = tiny_config(epochs=2, test_each_epoch=False)
    summary = Trainer(config).fit()
    lines = [json.loads(line) for line in open(Path(config.out) / "metrics.jsonl")]
    assert "test_accuracy" not in lines[0] and "val_accuracy" in lines[0]
    assert lines[1]["test_accuracy"] == summary["test_accuracy"] and summary["best_test_accuracy"] is not None


def test_figures_false_draws_none_and_a_resume_may_draw_them(tiny_config):
    config = tiny_config(epochs=1, figures=False)
    summary = Trainer(config).fit()
    run = Path(config.out)
    assert summary["figures"] == [] and not list(run.glob("*.png"))
    assert json.loads((run / "summary.json").read_text())["figures"] == []
    summary = Trainer(config.replace(epochs=2, figures=True), resume=True).fit()
    assert {Path(p).name for p in summary["figures"]} == {p.name for p in run.glob("*.png")} != set()


def test_a_run_prints_nothing_when_not_in_a_terminal(tiny_config, capsys):
    from capsnets.engine import train

    train(tiny_config(epochs=1, progress=True))
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "5"])
def test_time_limit_must_be_a_positive_number(tiny_config, bad):
    with pytest.raises(ValueError, match="time_limit_minutes"):
        tiny_config(time_limit_minutes=bad)


def test_resume_without_checkpoint(tiny_config):
    with pytest.raises(ValueError, match="cannot resume"):
        Trainer(tiny_config(), resume=True).fit()


def test_nan_loss_stops_and_keeps_last_checkpoint(tiny_config, dropout_net, monkeypatch):
    Trainer(tiny_config(epochs=1)).fit()
    last = Path(tiny_config().out) / "last.safetensors"
    before = last.read_bytes()
    calls = {"n": 0}

    def nan_on_second_step(output, images, labels):
        calls["n"] += 1
        loss = nn.functional.cross_entropy(output.scores, labels)
        return (loss * float("nan") if calls["n"] == 2 else loss), {}

    monkeypatch.setattr(Trainer, "_build_loss", lambda self, model: nan_on_second_step)
    with pytest.raises(NonFiniteLossError, match=r"epoch 2, step 2.*--lr"):
        Trainer(tiny_config(epochs=2), resume=True).fit()
    assert last.read_bytes() == before


def test_model_data_mismatch_is_explained(tiny_config):
    with pytest.raises(ValueError, match=r"expects 10 classes of \(1, 28, 28\).*--model-arg"):
        Trainer(tiny_config(model="capsnet_small", model_args={"input_size": [1, 28, 28]})).fit()


def test_num_classes_and_input_size_default_to_the_dataset(tiny_config):
    config = tiny_config(model="cnn_baseline", model_args={}, epochs=1)
    trainer = Trainer(config)
    trainer.fit()
    assert trainer.model.input_size == (1, 8, 8) and config.model_args["num_classes"] == 10


def test_loss_schedule_gets_training_progress(tiny_config, monkeypatch):
    from capsnets.losses import MarginLoss

    seen = []

    class Scheduled(MarginLoss):
        def set_progress(self, fraction, epochs):
            seen.append((fraction, epochs))

    monkeypatch.setattr(Trainer, "_build_loss", lambda self, model: Scheduled())
    Trainer(tiny_config(epochs=2, batch_size=32, limit_train=64)).fit()
    assert seen == [(0.0, 2), (0.25, 2), (0.5, 2), (0.75, 2)]  # 2 epochs x 2 steps


def _larger_digits(monkeypatch, augment=None):
    """The trainer's data: the digits resized to 16x16 (the digit augmentation needs at least 10 px)."""
    import dataclasses

    from capsnets.data import resize

    load = Trainer._load_data

    def larger(self, device):
        return [
            dataclasses.replace(d, images=resize(d.images, 16), augment=augment if i == 0 else None)
            for i, d in enumerate(load(self, device))
        ]

    monkeypatch.setattr(Trainer, "_load_data", larger)


def test_augment_applies_the_digit_augmentation_to_every_training_batch(tiny_config, monkeypatch):
    from capsnets.data import DigitAugment

    _larger_digits(monkeypatch)
    calls = []
    original = DigitAugment.__call__
    monkeypatch.setattr(
        DigitAugment,
        "__call__",
        lambda self, images, generator=None: calls.append(len(images)) or original(self, images, generator),
    )
    config = tiny_config(model="cnn_baseline_narrow", model_args={}, epochs=1, augment="digits")
    Trainer(config).fit()
    assert calls == [32, 26]  # 64 training digits less the 6 held out for validation, in batches of 32
    assert "augment: digits" in (Path(config.out) / "config.yaml").read_text()


def test_augment_is_refused_for_data_with_its_own_augmentation(tiny_config, monkeypatch):
    _larger_digits(monkeypatch, augment=lambda images, generator: images)
    with pytest.raises(ValueError, match="has its own training augmentation; drop --augment"):
        Trainer(tiny_config(model="cnn_baseline", model_args={}, epochs=1, augment="digits")).fit()


def test_augment_on_images_too_small_says_so(tiny_config):
    with pytest.raises(ValueError, match="at least 10 pixels a side, got 8x8"):
        Trainer(tiny_config(augment="digits", epochs=1)).fit()


def test_augment_must_be_a_known_name(tiny_config):
    with pytest.raises(ValueError, match=r"augment='rotate' is invalid: expected None or one of \['digits'\]"):
        tiny_config(augment="rotate")


def test_a_run_saved_before_the_validation_split_resumes_without_one(tiny_config, tmp_path, monkeypatch):
    """A checkpoint whose config has no ``val_fraction`` (capsnets 0.2) trained on all its training examples: it
    resumes so, bit for bit, whatever ``val_fraction`` the resuming config has."""
    from capsnets.checkpoints import load_checkpoint

    from helpers import rewrite_sidecar

    monkeypatch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
    small = dict(batch_size=16, limit_train=32, limit_test=16, val_fraction=0.0)
    full = Trainer(tiny_config(out=str(tmp_path / "a"), epochs=2, **small))
    full.fit()
    Trainer(tiny_config(out=str(tmp_path / "b"), epochs=1, **small)).fit()
    last = tmp_path / "b" / "last.safetensors"
    meta = load_checkpoint(last).meta
    del meta["config"]["val_fraction"]
    rewrite_sidecar(last, {k: v for k, v in meta.items() if k not in ("format_version", "checkpoint_id")})
    resumed = Trainer(tiny_config(out=str(tmp_path / "b"), epochs=2, **{**small, "val_fraction": 0.1}), resume=True)
    resumed.fit()
    assert resumed.config.val_fraction == 0.0
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_kernel_compile_is_timed_apart_from_the_first_epoch(tiny_config, monkeypatch):
    from capsnets.engine import trainer as trainer_module

    events, real_fit = [], trainer_module.fit
    monkeypatch.setattr(trainer_module, "compile_em_kernel", lambda model, device: events.append("compile") or 3.5)
    monkeypatch.setattr(trainer_module, "fit", lambda *a, **k: events.append("fit") or real_fit(*a, **k))
    summary = Trainer(tiny_config(epochs=1)).fit()
    assert events == ["compile", "fit"] and summary["kernel_compile_s"] == 3.5


def test_a_run_starts_from_a_weight_trains_only_the_classifier_first_and_resumes_without_it(
    tiny_config, shared_data_root, monkeypatch
):
    import capsnets
    from capsnets.models import hub

    shipped = capsnets.create_model("capsnet_small", pretrained="mnist").state_dict()
    config = tiny_config(
        model="capsnet_small",
        dataset="fashion_mnist",
        data_dir=str(shared_data_root),
        model_args={},
        epochs=1,
        pretrained="capsnet_small-mnist",
        classifier_only_epochs=1,
        val_fraction=0,
    )
    Trainer(config).fit()
    run = Path(config.out)
    assert yaml.safe_load((run / "config.yaml").read_text())["pretrained"] == "capsnet_small-mnist"
    state = capsnets_checkpoints.load_checkpoint(run / "last.safetensors").model_state()
    head = {k for k in state if k.startswith(("class_capsules.", "decoder."))}
    assert head and all(torch.equal(state[k], shipped[k]) for k in state if k not in head)  # frozen for epoch 1
    assert all(not torch.equal(state[k], shipped[k]) for k in head)
    monkeypatch.setattr(hub, "load_pretrained", lambda *a, **k: pytest.fail("a resumed run reloaded the weight"))
    Trainer(config.replace(epochs=2), resume=True).fit()
    state = capsnets_checkpoints.load_checkpoint(run / "last.safetensors").model_state()
    assert not torch.equal(state["conv.weight"], shipped["conv.weight"])  # epoch 2 trains everything
