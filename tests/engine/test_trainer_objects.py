"""Trainer.fit on your own objects: a capsule network built from capsnets.layers (``helpers.TinyCapsNet``, not
registered), trained on a TensorDataset, a Dataset of pairs or a DataLoader; interrupted (SIGTERM, time limit) and
resumed bit for bit (in two gloo processes: tests/engine/test_distributed.py); the best checkpoint chosen on validation; a resume with another model and bad inputs
refused with errors that say what to do."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from capsnets.engine import Trainer, TrainingInterrupted, reporting
from capsnets.engine.run_dir import RunDirectoryError
from capsnets.losses import margin_loss
from capsnets.validation import ArgumentError

from helpers import TinyCapsNet


class StopAt:
    """Margin loss ``(output, images, targets)`` that sends this process SIGTERM at its ``stop``-th training call."""

    def __init__(self, stop: int | None = None) -> None:
        self.stop, self.calls = stop, 0

    def __call__(self, output, images, targets):
        if torch.is_grad_enabled():  # not the evaluations
            self.calls += 1
            if self.calls == self.stop:
                os.kill(os.getpid(), signal.SIGTERM)
        return margin_loss(output.scores, targets)


class Pairs(Dataset):
    """A map-style Dataset of ``(image, int label)`` items."""

    def __init__(self, images, labels) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index], int(self.labels[index])


SAVE_FIGURES = reporting.save_figures  # the real one, for the test of the figures


@pytest.fixture(autouse=True)
def no_figures(monkeypatch):
    monkeypatch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])  # slow, and not what is tested here


@pytest.fixture
def data():
    generator = torch.Generator().manual_seed(0)
    images, labels = torch.rand(256, 1, 8, 8, generator=generator), torch.randint(0, 10, (256,), generator=generator)
    return TensorDataset(images, labels)


def model(**kwargs) -> TinyCapsNet:
    torch.manual_seed(0)  # the same initial weights in every run
    return TinyCapsNet(**kwargs)


def trainer(tmp_path, name: str, **settings) -> Trainer:
    values = dict(out=str(tmp_path / name), epochs=2, batch_size=32, device="cpu", progress=False)
    return Trainer(**{**values, **settings})


def weights(trained: Trainer) -> dict[str, torch.Tensor]:
    return trained.model.state_dict()


def test_an_interrupted_run_resumes_bit_for_bit(tmp_path, data):
    full = trainer(tmp_path, "full")
    summary = full.fit(model(), data, loss=StopAt())
    assert summary["model"] == "TinyCapsNet" and summary["epochs"] == 2 and summary["best_chosen_on"] == "validation"
    cut = trainer(tmp_path, "cut")
    with pytest.raises(TrainingInterrupted) as stop:
        cut.fit(model(), data, loss=StopAt(stop=11))  # 8 steps an epoch: in the middle of the second
    assert (stop.value.epoch, stop.value.step) == (1, 3)
    resumed = trainer(tmp_path, "cut", resume=True)
    assert resumed.fit(TinyCapsNet(), data, loss=StopAt())["epochs"] == 2  # its weights come from the checkpoint
    for name, value in weights(full).items():
        assert torch.equal(value, weights(resumed)[name]), name
    records = [[json.loads(line) for line in open(tmp_path / run / "metrics.jsonl")] for run in ("full", "cut")]
    assert [r["train_loss"] for r in records[0]] == [r["train_loss"] for r in records[1]]
    assert json.loads((tmp_path / "cut" / "best.json").read_text())["model_class"].endswith(".TinyCapsNet")


def test_a_run_cut_by_the_time_limit_resumes_bit_for_bit(tmp_path, data):
    full = trainer(tmp_path, "full", epochs=3)
    full.fit(model(), data)
    cut = trainer(tmp_path, "cut", epochs=3, time_limit_minutes=1e-9).fit(model(), data)
    assert cut["time_limited"] and cut["epochs"] == 1
    resumed = trainer(tmp_path, "cut", epochs=3, resume=True)
    assert not resumed.fit(model(), data)["time_limited"]
    for name, value in weights(full).items():
        assert torch.equal(value, weights(resumed)[name]), name


def test_a_dataset_of_pairs_and_a_dataloader_train_as_a_tensordataset(tmp_path, data):
    images, labels = data.tensors
    runs = {"tensors": data, "pairs": Pairs(images, labels), "loader": DataLoader(data, batch_size=64, shuffle=True)}
    trained = {}
    for name, train_data in runs.items():
        size = {} if name == "loader" else {"batch_size": 64}  # a DataLoader's batch size is the run's
        fitted = Trainer(out=str(tmp_path / name), epochs=1, device="cpu", progress=False, **size)
        assert fitted.fit(model(), train_data)["batch_size"] == 64
        trained[name] = weights(fitted)
    for name, value in trained["tensors"].items():
        assert torch.equal(value, trained["pairs"][name]) and torch.equal(value, trained["loader"][name]), name


def test_the_best_checkpoint_is_chosen_on_a_split_held_out_of_the_training_data(tmp_path, data):
    fitted = trainer(tmp_path, "run", epochs=3)
    summary = fitted.fit(model(), data, test_data=data)
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert summary["validation_examples"] == 26  # 10% of 256, drawn from the seed
    assert records[0]["step"] == 8  # the 230 others in batches of 32
    best = max(range(3), key=lambda i: (records[i]["val_accuracy"], -i))
    assert (summary["best_chosen_on"], summary["best_chosen_by"]) == ("validation", "val_accuracy")
    assert summary["best_epoch"] == best + 1 and summary["best_val_accuracy"] == records[best]["val_accuracy"]
    assert summary["best_test_accuracy"] == records[best]["test_accuracy"]  # its test score, reported once
    assert json.loads((tmp_path / "run" / "best.json").read_text())["epoch"] == best + 1


def test_val_data_given_is_the_validation_split(tmp_path, data):
    images, labels = data.tensors
    summary = trainer(tmp_path, "run", epochs=1).fit(model(), data, TensorDataset(images[:40], labels[:40]))
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert summary["validation_examples"] == 40 and record["step"] == 8  # all 256 trained on
    assert summary["best_epoch"] == 1 and "val_accuracy" in record and "test_accuracy" not in record


def test_no_validation_split_chooses_no_best(tmp_path, data):
    summary = trainer(tmp_path, "run", epochs=1, val_fraction=0).fit(model(), data, test_data=data)
    assert summary["best_chosen_on"] is None and summary["best_epoch"] is None and summary["test_accuracy"] is not None
    assert not (tmp_path / "run" / "best.safetensors").exists()


def test_plain_scores_and_a_loss_of_scores_and_targets(tmp_path, data):
    torch.manual_seed(0)
    network = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    summary = trainer(tmp_path, "run", epochs=1).fit(network, data, loss=nn.CrossEntropyLoss())
    assert summary["model"] == "Sequential" and summary["train_time_s"] > 0


def test_a_resume_with_another_model_is_refused(tmp_path, data):
    trainer(tmp_path, "run", epochs=1).fit(model(), data)
    with pytest.raises(RunDirectoryError, match=r"not the model the run trained.*conv\.weight"):
        trainer(tmp_path, "run", resume=True).fit(model(channels=4), data)

    class Other(TinyCapsNet):
        pass

    with pytest.raises(RunDirectoryError, match='model "TinyCapsNet" -> "Other"'):
        trainer(tmp_path, "run", resume=True).fit(Other(), data)


@pytest.mark.parametrize(
    ("train_data", "message"),
    [
        ([(torch.rand(8, 8).numpy(), 1)] * 4, r"train_data\[0\]'s image is ndarray; it must be a tensor"),
        ([(torch.rand(1, 8, 8), 1, 2)] * 4, r"train_data\[0\] is a tuple of 3; it must be a pair"),
        ([(torch.zeros(1, 8, 8, dtype=torch.uint8), 1)] * 4, "floating-point pixel values"),
        ([(torch.rand(1, 8, 8), "cat")] * 4, "target is str; it must be a class index"),
        ([(torch.rand(1, 8, 8), 12)] * 4, "holds class 12, and the model scores 10 classes"),
        ([(torch.rand(1, 9, 9), 1)] * 4, r"the model failed on a batch of training images of shape \(2, 1, 9, 9\)"),
        (42, "train_data must be a torch Dataset"),
    ],
)
def test_bad_inputs_are_refused_before_anything_is_written(tmp_path, train_data, message):
    with pytest.raises(ArgumentError, match=message):
        trainer(tmp_path, "run").fit(model(), train_data)
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_arguments_of_another_kind_are_refused(tmp_path, data):
    with pytest.raises(ArgumentError, match="model must be an nn.Module"):
        trainer(tmp_path, "run").fit(lambda x: x, data)
    with pytest.raises(ArgumentError, match="batches of 64 and batch_size is 32"):
        trainer(tmp_path, "run").fit(model(), DataLoader(data, batch_size=64))
    with pytest.raises(ArgumentError, match="unknown|epoch"):
        Trainer(out=str(tmp_path / "run"), epoch=3)


def test_a_validation_split_of_cropped_training_data_is_seen_as_the_test_split_is():
    """Data whose training augmentation crops (smallNORB, the rendered views) is held out as it is scored: the centre
    window of the model's input size, without augmentation; splits of one data set stored at two sizes are taken."""
    from capsnets.data import TensorData
    from capsnets.data.transforms import NorbAugment
    from capsnets.engine.inputs import check_splits, hold_out

    images = torch.arange(10 * 6 * 6, dtype=torch.float32).view(10, 1, 6, 6)
    data = TensorData(images, torch.arange(10) % 2, 2, augment=NorbAugment(crop=4))
    train, val = hold_out(data, 0.2, seed=0)
    assert train.image_shape == (1, 6, 6) and train.augment is data.augment
    assert val.image_shape == (1, 4, 4) and val.augment is None
    held = [i for i in range(10) if not any(torch.equal(images[i], t) for t in train.images)]
    torch.testing.assert_close(val.images, images[held][..., 1:5, 1:5], rtol=0, atol=0)
    check_splits(train, val, TensorData(images[:2, :, 1:5, 1:5], torch.tensor([0, 1]), 2), width=2)
    with pytest.raises(ArgumentError, match=r"test_data holds .* \(1, 5, 5\) images"):
        check_splits(train, None, TensorData(images[:2, :, :5, :5], torch.tensor([0, 1]), 2), width=2)


def test_figures_of_test_data_without_class_names(tmp_path, data, monkeypatch):
    """A ``TensorData`` that names no classes gets a confusion matrix with the class indices as names."""
    from capsnets.data import TensorData

    monkeypatch.setattr(reporting, "save_figures", SAVE_FIGURES)
    images, labels = data.tensors
    summary = trainer(tmp_path, "run", epochs=1).fit(model(), data, test_data=TensorData(images[:32], labels[:32], 10))
    assert (tmp_path / "run" / "confusion_matrix.png").is_file(), summary.get("figures")


def test_a_stream_that_never_ends_is_refused_at_the_limit(tmp_path, monkeypatch):
    from torch.utils.data import DataLoader, IterableDataset

    from capsnets.engine import inputs

    class Endless(IterableDataset):
        def __iter__(self):
            while True:
                yield torch.rand(4, 1, 8, 8), torch.randint(0, 10, (4,))

    monkeypatch.setattr(inputs, "MAX_STREAMED_EXAMPLES", 40)
    with pytest.raises(ArgumentError, match=r"streams more than 40 examples .* must end"):
        trainer(tmp_path, "run").fit(model(), DataLoader(Endless(), batch_size=None))
    assert not (tmp_path / "run").exists()
