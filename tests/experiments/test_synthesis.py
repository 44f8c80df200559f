"""``capsnets experiment synthesis``: the smoke run end to end, and its settings check."""

import pytest
import torch

from capsnets.experiments import run_experiment

from helpers import assert_contrasts_resolve


def test_smoke_run_writes_the_report(shared_data_root, tmp_path):
    options = dict(
        smoke=True,
        device="cpu",
        data_dir=str(shared_data_root),
        checkpoint_dir=str(tmp_path / "ckpt"),
        train_images=32,
        test_images=16,
        epochs=2,
        train_minutes=1e-9,
    )
    result = run_experiment("synthesis", tmp_path, **options)
    text = result.report.read_text()
    assert text.count("1 of 2 (time limit) x 32 images") == 2
    # the next run continues both trainings (epoch 2 of 2), the one after that loads the finished generators
    again = run_experiment("synthesis", tmp_path / "again", **options).report.read_text()
    assert again.count("| 2 x 32 images |") == 2
    third = run_experiment("synthesis", tmp_path / "third", **options).report.read_text()
    assert third.count("| 2 (loaded) x 32 images |") == 2
    assert "| CapsPix2pix (capspix2pix_small) |" in text and "| pix2pix (pix2pix_small) |" in text
    assert {p.name for p in tmp_path.glob("*.png")} == {"examples.png", "capsule_dimensions.png"}
    assert 0 <= result.metrics["CapsPix2pix_l1"] <= 1 and result.metrics["pix2pix_psnr"] > 0
    assert_contrasts_resolve("synthesis", result.metrics, 2)


def test_rejects_unknown_options(tmp_path):
    with pytest.raises(ValueError, match="does not take epoch"):
        run_experiment("synthesis", tmp_path, smoke=True, device="cpu", epoch=1)


def _pix2pix_in_run(out, *, time_limit_s, rng_seed=0):
    """One process's share of a pix2pix training kept in a run directory (fit_in_run)."""
    from capsnets.experiments.synthesis.pix2pix import fit_in_run
    from capsnets.models import PatchDiscriminator, create_model

    torch.manual_seed(0)
    maps, images = (torch.rand(16, 3, 32, 32) > 0.5).float(), torch.rand(16, 1, 32, 32)
    generator = create_model("pix2pix_small", input_size=(3, 32, 32))
    discriminator = PatchDiscriminator(4, width=8)
    torch.manual_seed(rng_seed)  # what a new process holds; a continued run must not depend on it
    training = fit_in_run(
        out, generator, discriminator, maps, images, epochs=3, batch_size=8, progress=False, time_limit_s=time_limit_s
    )
    return generator, discriminator, training


def test_a_pix2pix_training_cut_short_is_continued_as_if_uninterrupted(tmp_path):
    generator, discriminator, whole = _pix2pix_in_run(tmp_path / "whole", time_limit_s=None)
    for run in range(3):  # one epoch per run
        g, d, training = _pix2pix_in_run(tmp_path / "cut", time_limit_s=1e-9, rng_seed=run + 1)
        assert not training.loaded and len(training.history) == run + 1
    assert [r["generator"] for r in training.history] == [r["generator"] for r in whole.history]
    assert all(torch.equal(a, b) for a, b in zip(g.state_dict().values(), generator.state_dict().values()))
    g, _, again = _pix2pix_in_run(tmp_path / "cut", time_limit_s=None)
    assert again.loaded and again.epochs == "3 (loaded)" and (tmp_path / "cut" / "last.safetensors").is_file()
