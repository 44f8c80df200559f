import json

import pytest


def test_records_the_flagged_fractions_of_the_default_and_of_the_grid(tmp_path, load_benchmark, shared_data_root):
    bench = load_benchmark("uncertainty")
    out = tmp_path / "u.json"
    argv = ["--models", "capsnet_small-mnist", "--data-dir", str(shared_data_root), "--limit", "40", "--noise", "10"]
    bench.main([*argv, "--min-scores", "0.5", "0.7", "--min-margins", "0.3", "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["meta"]["defaults"] == {"min_score": 0.7, "min_margin": 0.3}
    (row,) = record["rows"]
    counts = row["counts"]
    assert counts["right"] + counts["wrong"] == counts["other_fashion_mnist"] == 40
    assert counts["uniform_noise"] == counts["blurred_noise"] == 10
    assert [(g["min_score"], g["min_margin"]) for g in row["grid"]] == [(0.5, 0.3), (0.7, 0.3)]
    for key, value in row["default"].items():  # predict's own flags are the grid's row of its defaults
        assert row["grid"][1]["flagged"][key] == pytest.approx(value)
    # uniform noise is flagged far more often than not (99.8% of 2,000 images measured); a floor, not the exact
    # share, so that other floating point cannot break it
    assert row["default"]["uniform_noise"] >= 0.8
