"""``capsnets experiment synthesis``: the smoke run end to end, and its settings check."""
import pytest

from capsnets.experiments import run_experiment
from capsnets.testing import assert_contrasts_resolve


def test_smoke_run_writes_the_report(shared_data_root, tmp_path):
    options = dict(smoke=True, device="cpu", data_dir=str(shared_data_root), checkpoint_dir=str(tmp_path / "ckpt"),
                   train_images=32, test_images=16, epochs=2, train_minutes=1e-9)
    result = run_experiment("synthesis", tmp_path, **options)
    text = result.report.read_text()
    assert text.count("1 of 2 (time limit) x 32 images") == 2
    # the discriminators are not saved, so a generator cut short is loaded as it is, and the report says so
    again = run_experiment("synthesis", tmp_path / "again", **options).report.read_text()
    assert again.count("| loaded (1 of 2 (time limit) x 32 images) |") == 2
    assert "| CapsPix2pix (capspix2pix_small) |" in text and "| pix2pix (pix2pix_small) |" in text
    assert {p.name for p in tmp_path.glob("*.png")} == {"examples.png", "capsule_dimensions.png"}
    assert 0 <= result.metrics["CapsPix2pix_l1"] <= 1 and result.metrics["pix2pix_psnr"] > 0
    assert_contrasts_resolve("synthesis", result.metrics, 2)


def test_rejects_unknown_options(tmp_path):
    with pytest.raises(ValueError, match="does not take epoch"):
        run_experiment("synthesis", tmp_path, smoke=True, device="cpu", epoch=1)
