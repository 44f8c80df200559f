import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "em_learning.py"


def test_em_learning_records_a_curve_per_variant(tmp_path):
    out = tmp_path / "curves.json"
    command = [sys.executable, str(SCRIPT), "--model", "capsnet_digits", "--dataset", "digits", "--train-size", "48",
               "--test-size", "20", "--steps", "3", "--eval-every", "2", "--batch-size", "16", "--device", "cpu",
               "--variant", "three", '{"routing_iterations": 3}', "--variant", "one", '{"routing_iterations": 1}',
               "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())
    assert result["meta"]["device"] == "cpu" and result["batch_size"] == 16
    assert list(result["variants"]) == ["three", "one"]
    for variant in result["variants"].values():
        assert [point["step"] for point in variant["curve"]] == [2, 3]
        assert [point["images"] for point in variant["curve"]] == [32, 48]
        assert 0 <= variant["final_test_accuracy"] <= 1 and variant["train_images_per_s"] > 0
    assert result["variants"]["one"]["model_args"] == {"routing_iterations": 1}


def test_em_learning_rejects_a_variant_that_is_not_an_object(tmp_path):
    command = [sys.executable, str(SCRIPT), "--variant", "bad", "[1, 2]", "--out", str(tmp_path / "x.json")]
    run = subprocess.run(command, capture_output=True, text=True)
    assert run.returncode == 2 and "must be an object" in run.stderr
