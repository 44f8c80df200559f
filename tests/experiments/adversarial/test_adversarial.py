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


def _training(*accuracies):
    from capsnets.experiments.runs import Training

    history = [{"epoch": e + 1, "val_accuracy": a} for e, a in enumerate(accuracies)]
    best = max(range(len(accuracies)), key=lambda i: accuracies[i]) + 1
    return Training(history, {"best_epoch": best}, loaded=False, cut_short=False, planned=len(accuracies))


def test_matching_note_says_whether_the_models_reached_the_target():
    from capsnets.experiments.report import matching_note

    both = matching_note({"CNN": _training(0.991), "CapsNet": _training(0.993)}, 0.99)
    assert both.startswith("Every model reached the 99.00% validation target") and "CNN 99.10%" in both
    one = matching_note({"CNN": _training(0.9, 0.96), "CapsNet": _training(0.993)}, 0.99)
    assert one.startswith("**Not at equal accuracy**: CNN did not reach")
    assert one.endswith("Validation accuracy after each epoch: CNN 90.00%, 96.00%; CapsNet 99.30%.")


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
