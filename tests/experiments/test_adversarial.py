"""The ``adversarial`` experiment end to end, at a tiny size."""

import pytest

from capsnets.experiments import list_experiments, run_experiment

from helpers import assert_contrasts_resolve


def test_adversarial_is_registered():
    assert "adversarial" in list_experiments()


def test_adversarial_smoke_run(tmp_path, shared_data_root):
    result = run_experiment(
        "adversarial",
        tmp_path,
        smoke=True,
        device="cpu",
        data_dir=str(shared_data_root),
        train_size=128,
        val_size=32,
        test_size=32,
        max_epochs=1,
        eps=(0.3,),
        bim_steps=2,
    )
    text = (tmp_path / "report.md").read_text()
    assert "CNN -> capsules (transfer)" in text and "| BIM | targeted | 0.3 |" in text
    assert {p.name for p in tmp_path.glob("*.png")} >= {
        "success_rates_cross_entropy.png",
        "success_rates_own.png",
        "examples.png",
    }
    assert "crafted with the cross-entropy of the scores" in text and "## Gradient masking" in text
    assert_contrasts_resolve("adversarial", result.metrics, 1 + 2 * 2 * 2)  # clean + losses x attacks x kinds
    rates = [v for k, v in result.metrics.items() if k.startswith(("cross_entropy_", "own_"))]
    assert len(rates) == 2 * (2 * 2 * 4) and all(0 <= r <= 1 for r in rates if r == r)  # 2 losses
    flat = [v for k, v in result.metrics.items() if k.startswith("zero_gradient_")]
    assert len(flat) == 2 * 2 and all(0 <= f <= 1 for f in flat)


def test_adversarial_rejects_unknown_options(tmp_path):
    with pytest.raises(ValueError, match="adversarial does not take epsilon"):
        run_experiment("adversarial", tmp_path, smoke=True, device="cpu", epsilon=0.1)


def test_adversarial_rejects_unknown_attack_losses(tmp_path):
    with pytest.raises(ValueError, match="attack_losses"):
        run_experiment("adversarial", tmp_path, smoke=True, device="cpu", attack_losses=["hinge"])


def test_matching_note_says_whether_the_models_reached_the_target():
    from capsnets.experiments.report import matching_note

    both = matching_note({"CNN": {"val_accuracy": 0.991}, "CapsNet": {"val_accuracy": 0.993}}, 0.99)
    assert both.startswith("Every model reached the 99.00% validation target") and "CNN 99.10%" in both
    one = matching_note({"CNN": {"val_accuracy": 0.96}, "CapsNet": {"val_accuracy": 0.993}}, 0.99)
    assert one.startswith("**Not at equal accuracy**: CNN did not reach") and "after each epoch" not in one
    curves = matching_note(
        {
            "CNN": {"val_accuracy": 0.96, "history": [{"val_accuracy": 0.9}, {"val_accuracy": 0.96}]},
            "CapsNet": {"val_accuracy": 0.993, "history": [{"val_accuracy": 0.993}]},
        },
        0.99,
    )
    assert curves.endswith("Validation accuracy after each epoch: CNN 90.00%, 96.00%; CapsNet 99.30%.")


def test_a_second_run_reloads_the_models_with_their_training_record(tmp_path, shared_data_root):
    options = dict(
        smoke=True,
        device="cpu",
        data_dir=str(shared_data_root),
        checkpoint_dir=str(tmp_path / "ckpt"),
        train_size=64,
        val_size=32,
        test_size=16,
        max_epochs=1,
        eps=(0.3,),
        bim_steps=1,
        attack_losses="cross_entropy",
    )
    first = run_experiment("adversarial", tmp_path / "a", **options)
    second = run_experiment("adversarial", tmp_path / "b", **options)
    assert "| 1 (loaded) |" in second.report.read_text() and "| 1 (loaded) |" not in first.report.read_text()
    curve = [line for line in first.report.read_text().splitlines() if line.startswith("Validation accuracy after")]
    assert len(curve) == 1 and curve[0] in second.report.read_text()  # the history comes back from the sidecar
    assert second.metrics == first.metrics  # same weights, same attacks


def test_train_to_accuracy_numbers_its_epochs_and_stops_at_the_target():
    import torch

    from capsnets.experiments.training import train_to_accuracy
    from capsnets.models import create_model

    torch.manual_seed(0)
    images, labels = torch.rand(40, 1, 28, 28), torch.arange(40) % 10
    model = create_model("cnn_baseline_narrow")
    record = train_to_accuracy(model, images, labels, images, labels, target=1.1, max_epochs=3, batch_size=20)
    assert record["epochs"] == 3 and [h["epoch"] for h in record["history"]] == [1, 2, 3]
    rates = [1e-3 * 0.96**e for e in range(3)]  # the rate each epoch trained with
    assert [h["lr"] for h in record["history"]] == pytest.approx(rates)
    assert record["val_accuracy"] == record["history"][-1]["val_accuracy"]
    stopped = train_to_accuracy(model, images, labels, images, labels, target=0.0, max_epochs=3, batch_size=20)
    assert stopped["epochs"] == 1 and len(stopped["history"]) == 1


def test_train_to_accuracy_is_one_uninterrupted_run():
    """Scoring after each epoch must not change the training: same weights as one train_classifier run
    (so Adam's moments and the learning-rate schedule carry over between epochs)."""
    import torch

    from capsnets.experiments.training import train_classifier, train_to_accuracy
    from capsnets.models import create_model

    images, labels = torch.rand(40, 1, 28, 28), torch.arange(40) % 10
    torch.manual_seed(0)
    scored = create_model("cnn_baseline_narrow")
    torch.manual_seed(0)
    plain = create_model("cnn_baseline_narrow")
    torch.manual_seed(1)
    train_to_accuracy(scored, images, labels, images, labels, target=1.1, max_epochs=3, batch_size=20, seed=4)
    torch.manual_seed(1)
    train_classifier(plain, images, labels, epochs=3, batch_size=20, seed=4, progress=False)
    for name, value in scored.state_dict().items():
        torch.testing.assert_close(value, plain.state_dict()[name], rtol=0, atol=0, msg=name)
