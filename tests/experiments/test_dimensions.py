"""The ``dimensions`` experiment: perturbation grids and the routing picture."""

import pytest
import torch

from capsnets.experiments import run_experiment
from capsnets.experiments.dimensions import routing_map
from capsnets.models import create_model
from capsnets.plots import PERTURBATIONS, perturbation_grid


def test_perturbation_grid_moves_one_dimension_of_the_winner():
    torch.manual_seed(0)
    model = create_model("capsnet_small").eval()
    image = torch.rand(1, 28, 28)
    grid, winner = perturbation_grid(model, image)
    assert grid.shape == (16, 11, 1, 28, 28)
    assert len(PERTURBATIONS) == 11 and torch.allclose(PERTURBATIONS.diff(), torch.tensor(0.05))
    assert PERTURBATIONS[0].item() == pytest.approx(-0.25) and PERTURBATIONS[5].item() == 0
    with torch.no_grad():
        capsules = model.encode(image[None])
        plain = model.decoder(capsules, torch.tensor([winner]))[0]
    assert torch.allclose(grid[:, 5], plain.expand(16, -1, -1, -1), atol=1e-6)  # step 0 = no change
    assert not torch.allclose(grid[0, 0], grid[0, -1])


def test_routing_map_is_on_the_primary_grid():
    model = create_model("capsnet_small").eval()
    heat, winner = routing_map(model, torch.rand(1, 28, 28))
    assert heat.shape == (6, 6) and 0 <= winner < 10
    assert (heat >= 0).all() and heat.sum() <= 8 * 36 + 1e-4  # couplings sum to <= 1 per capsule, 8 types


def test_dimensions_smoke_end_to_end_and_reload(shared_data_root, tmp_path):
    options = {"train_images": 200, "test_images": 100, "digits": 1, "epochs": 2, "train_minutes": 1e-9}
    ckpt = tmp_path / "ckpt"
    result = run_experiment(
        "dimensions",
        tmp_path / "a",
        smoke=True,
        device="cpu",
        data_dir=shared_data_root,
        checkpoint_dir=ckpt,
        **options,
    )
    assert result.report.is_file() and "dimensions_digit0.png" in result.report.read_text()
    assert "| 1 of 2 (time limit) x 200 images |" in result.report.read_text()
    (run,) = result.cut_short
    assert run.startswith("dimensions_capsnet_") and (ckpt / run / "last.safetensors").is_file()
    assert (tmp_path / "a" / "routing.png").is_file()
    # the next run with the same checkpoint folder continues the training the time limit cut short ...
    again = run_experiment(
        "dimensions",
        tmp_path / "b",
        smoke=True,
        device="cpu",
        data_dir=shared_data_root,
        checkpoint_dir=ckpt,
        **options,
    )
    assert "| 2 x 200 images |" in again.report.read_text() and again.cut_short == []
    # ... and the one after that loads the finished model
    third = run_experiment(
        "dimensions",
        tmp_path / "c",
        smoke=True,
        device="cpu",
        data_dir=shared_data_root,
        checkpoint_dir=ckpt,
        **options,
    )
    assert "| 2 (loaded) x 200 images |" in third.report.read_text()
    assert third.metrics["test_accuracy"] == again.metrics["test_accuracy"]
    # a time limit is not part of what was trained; more epochs or another seed is, and is refused
    untimed = {k: v for k, v in options.items() if k != "train_minutes"}
    assert (
        run_experiment(
            "dimensions",
            tmp_path / "d",
            smoke=True,
            device="cpu",
            data_dir=shared_data_root,
            checkpoint_dir=ckpt,
            **untimed,
        ).metrics["test_accuracy"]
        == again.metrics["test_accuracy"]
    )
    # more epochs or another seed is another training: a run directory of its own beside the first
    run_experiment(
        "dimensions",
        tmp_path / "e",
        smoke=True,
        device="cpu",
        seed=1,
        data_dir=shared_data_root,
        checkpoint_dir=ckpt,
        **untimed,
    )
    assert len([p for p in ckpt.iterdir() if p.name.startswith("dimensions_capsnet_")]) == 2


def test_routing_map_is_couplings_times_lengths():
    from capsnets.functional import capsule_length

    torch.manual_seed(0)
    model = create_model("capsnet_small").eval()
    image = torch.rand(1, 28, 28)
    heat, winner, couplings = routing_map(model, image, return_couplings=True)
    with torch.no_grad():
        lengths = capsule_length(model.primary(torch.relu(model.conv(image[None]))))[0]  # (288,)
    assert couplings.shape == (288,) and ((couplings > 0) & (couplings < 1)).all()
    assert torch.allclose(heat, (couplings * lengths).view(8, 6, 6).sum(0), atol=1e-6)


def test_the_cli_says_which_trainings_were_cut_short_and_how_to_continue(shared_data_root, tmp_path, capsys):
    from capsnets.cli import main

    args = [
        "experiment",
        "dimensions",
        "--smoke",
        "--device",
        "cpu",
        "--data-dir",
        str(shared_data_root),
        "--set",
        "train_images=64",
        "--set",
        "test_images=32",
        "--set",
        "digits=1",
        "--set",
        "epochs=2",
        "--set",
        "train_minutes=1e-9",
    ]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "cut 1 training(s) short (dimensions_capsnet_" in out and "with --checkpoint-dir DIR" in out
    assert main([*args, "--out", str(tmp_path / "b"), "--checkpoint-dir", str(tmp_path / "ckpt")]) == 0
    assert "run the same command again to continue them" in capsys.readouterr().out
    assert main([*args, "--out", str(tmp_path / "c"), "--checkpoint-dir", str(tmp_path / "ckpt")]) == 0
    assert "cut" not in capsys.readouterr().out.split("wrote")[-1]  # epoch 2 of 2: finished
