"""Ensembles of trained models (Sabour, Frosst & Hinton 2017, Sec. 7: CIFAR-10 with 7 models): the mean of the
members' class capsule lengths, and checkpoints refused when they were not trained on the same data."""

import json
from types import SimpleNamespace

import pytest
import torch

import capsnets
from capsnets.engine.checkpoint import save_checkpoint
from capsnets.engine.evaluate import Ensemble, evaluate, load_ensemble

DIGITS = [str(k) for k in range(10)]


def _models(count: int, name: str = "capsnet_digits", **args):
    models = []
    for seed in range(count):
        torch.manual_seed(seed)
        models.append(capsnets.create_model(name, **args).eval())
    return models


def test_scores_are_the_mean_of_the_members_lengths():
    members = _models(3)
    images = torch.rand(5, 1, 8, 8)
    with torch.no_grad():
        lengths = torch.stack([member(images).scores for member in members])  # (3, B, K)
        out = Ensemble(members)(images)
    assert out.score_kind == "length" and out.capsules is None and out.reconstruction is None
    torch.testing.assert_close(out.scores, lengths.mean(dim=0), rtol=0, atol=0)


def test_evaluation_counts_the_argmax_of_the_mean():
    members = _models(2)
    images, labels = torch.rand(12, 1, 8, 8), torch.arange(12) % 10
    data = SimpleNamespace(images=images, labels=labels, num_classes=10)
    results = evaluate(Ensemble(members), data, batch_size=5, device="cpu")
    with torch.no_grad():
        predicted = sum(member(images).scores for member in members).argmax(dim=1)
    assert results["accuracy"] == (predicted == labels).float().mean().item() and results["count"] == 12


def test_members_must_agree():
    with pytest.raises(ValueError, match="at least one"):
        Ensemble([])
    with pytest.raises(ValueError, match=r"must agree on num_classes; got \[10, 5\]"):
        Ensemble([*_models(1), *_models(1, num_classes=5)])
    with pytest.raises(ValueError, match=r"must agree on input_size"):
        Ensemble([*_models(1), *_models(1, input_size=(1, 9, 9))])
    mixed = Ensemble([*_models(1, "capsnet_small"), *_models(1, "cnn_baseline_narrow")])
    with pytest.raises(ValueError, match=r"score in different units \(length, logits\)"):
        mixed(torch.rand(2, 1, 28, 28))


def _checkpoint(tmp_path, name: str, model, **meta) -> str:
    record = {
        "model": "capsnet_digits",
        "model_args": json.loads(json.dumps(model.model_args)),
        "dataset": "digits",
        "classes": DIGITS,
        **meta,
    }
    return str(save_checkpoint(tmp_path / name / "best.safetensors", model=model, meta=record))


def test_load_ensemble_rebuilds_the_members(tmp_path):
    members = _models(2)
    letters = [*"abcdefghij"]
    paths = [_checkpoint(tmp_path, f"run{k}", model, classes=letters) for k, model in enumerate(members)]
    ensemble, checkpoints = load_ensemble([str(tmp_path / "run0"), paths[1]])
    assert [str(c.path) for c in checkpoints] == paths and not ensemble.training
    assert ensemble.class_names == letters  # the names the runs recorded
    images = torch.rand(3, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(ensemble(images).scores, Ensemble(members)(images).scores)


@pytest.mark.parametrize(
    "meta, args, message",
    [
        ({"dataset": "mnist"}, {}, r"has data set 'digits' and '.*run1.*' has 'mnist'"),
        ({"classes": [*"abcdefghij"]}, {}, r"has classes \['0', .*\] and .* has \['a', "),
        ({}, {"num_classes": 5}, r"has number of classes 10 and .* has 5"),
        ({}, {"input_size": (1, 9, 9)}, r"has input size \(1, 8, 8\) and .* has \(1, 9, 9\)"),
        ({"dataset": None}, {}, r"does not record the data set it was trained on"),
    ],
    ids=["data set", "class names", "number of classes", "input size", "no data set"],
)
def test_load_ensemble_refuses_models_of_other_data(tmp_path, meta, args, message):
    first = _checkpoint(tmp_path, "run0", *_models(1))
    other = _checkpoint(tmp_path, "run1", *_models(1, **args), **meta)
    with pytest.raises(ValueError, match=message):
        load_ensemble([first, other])


def test_load_ensemble_refuses_a_checkpoint_twice_and_reads_a_data_sets_other_spellings(tmp_path):
    first = _checkpoint(tmp_path, "run0", *_models(1), dataset="fashion-mnist")
    with pytest.raises(ValueError, match=r"is given twice \(.*run0' and .*best.safetensors'\)"):
        load_ensemble([str(tmp_path / "run0"), first])
    other = _checkpoint(tmp_path, "run1", *_models(1), dataset="fashion_mnist")
    assert len(load_ensemble([first, other])[0].members) == 2
