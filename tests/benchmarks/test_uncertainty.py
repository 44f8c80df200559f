import json

import pytest


def test_records_the_flagged_fractions_of_the_score_rule_of_predict_and_of_the_grid(
    tmp_path, load_benchmark, shared_data_root
):
    bench = load_benchmark("uncertainty")
    out = tmp_path / "u.json"
    argv = ["--models", "capsnet_small-mnist", "--data-dir", str(shared_data_root), "--limit", "40", "--noise", "10"]
    bench.main([*argv, "--min-scores", "0.5", "0.7", "--min-margins", "0.3", "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["meta"]["defaults"] == {"min_score": 0.7, "min_margin": 0.3} and record["meta"]["prepare"] is False
    (row,) = record["rows"]
    counts = row["counts"]
    assert counts["right"] + counts["wrong"] == counts["other_fashion_mnist"] == 40
    assert counts["uniform_noise"] == counts["blurred_noise"] == counts["inverted"] == 10 and counts["blank"] == 10
    assert [(g["min_score"], g["min_margin"]) for g in row["grid"]] == [(0.5, 0.3), (0.7, 0.3)]
    for key, value in row["score_rule"].items():  # the score rule alone is the grid's row of predict's defaults
        assert row["grid"][1]["flagged"][key] == pytest.approx(value)
    # predict adds the reconstruction to the score rule: it flags everything the rule flags, and every blank image
    assert row["unsure_rule"] == "score and reconstruction" and row["reconstruction_limits"]["images"] == 60000
    assert all(row["flagged"][key] >= row["score_rule"][key] for key in counts if row["flagged"][key] is not None)
    assert row["score_rule"]["blank"] == 0 and row["flagged"]["blank"] == 1
    # uniform noise is flagged far more often than not (100% of 2,000 images measured); a floor, not the exact
    # share, so that other floating point cannot break it
    assert row["flagged"]["uniform_noise"] >= 0.8


def test_prepare_hands_each_image_to_predict_as_a_file_would_be(tmp_path, load_benchmark, shared_data_root):
    bench = load_benchmark("uncertainty")
    out = tmp_path / "u.json"
    argv = ["--models", "matrix_capsnet_small-mnist", "--data-dir", str(shared_data_root), "--limit", "8"]
    bench.main([*argv, "--noise", "4", "--prepare", "--min-scores", "0.7", "--min-margins", "0.3", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["unsure_rule"] == "score" and row["reconstruction_limits"] is None  # no decoder: the score rule
    assert row["flagged"] == row["score_rule"]
    assert row["counts"]["inverted"] == 4
