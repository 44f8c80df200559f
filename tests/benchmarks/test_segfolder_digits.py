"""benchmarks/segfolder_digits.py: its dry run trains each model on a folder of real digits and records per-class
Dice."""

import json


def test_dry_run_records_each_runs_per_class_dice(load_benchmark, shared_data_root, tmp_path):
    bench = load_benchmark("segfolder_digits")
    out = tmp_path / "digits.json"
    bench.main(["--dry-run", "--data-dir", str(shared_data_root), "--pos-weights", "1", "5", "--out", str(out)])
    runs = json.loads(out.read_text())["runs"]
    assert [(r["model"], r["pos_weight"]) for r in runs] == [
        ("unet_small", None),
        ("segcaps_small", 1.0),
        ("segcaps_small", 5.0),
    ]
    for run in runs:
        assert list(run["test_dice"]) == ["background", "digit 0", "digit 1", "digit 2"]
        assert (
            0 <= run["mean_dice"] <= 1
            and run["mean_dice_by_epoch"] == [run["mean_dice"]]
            and run["worst_digit_dice"] == min(list(run["test_dice"].values())[1:])
        )
