import json

import pytest

pytest.importorskip("onnxruntime")


def test_records_both_runtimes_alternately_per_batch(tmp_path, load_benchmark):
    bench = load_benchmark("export_inference")
    out = tmp_path / "e.json"
    bench.main(
        [
            "--models",
            "capsnet_digits",
            "--batch-sizes",
            "1",
            "3",
            "--threads",
            "1",
            "--min-seconds",
            "0.01",
            "--warmup",
            "1",
            "--repeats",
            "2",
            "--out",
            str(out),
        ]
    )
    record = json.loads(out.read_text())
    assert record["meta"]["onnxruntime"] and record["meta"]["threads"] == 1
    assert [(row["model"], row["batch"]) for row in record["rows"]] == [("capsnet_digits", 1), ("capsnet_digits", 3)]
    for row in record["rows"]:
        assert len(row["pytorch_images_per_s_runs"]) == len(row["onnxruntime_images_per_s_runs"]) == 2
        ratios = sorted(o / p for o, p in zip(row["onnxruntime_images_per_s_runs"], row["pytorch_images_per_s_runs"]))
        assert row["onnxruntime_over_pytorch"] == pytest.approx(sum(ratios) / 2)  # the median of two
        assert row["max_abs_difference"] <= 1e-4 and row["outputs"] == ["scores", "capsules", "reconstruction"]
