import json
import statistics

import pytest
import torch


def test_compare_compile_times_a_compiled_copy_beside_the_eager_paths(tmp_path, monkeypatch, load_benchmark):
    compiled = []

    def fake_compile(model):  # the plumbing is under test here, not inductor (which takes minutes on a CPU)
        compiled.append(model)
        return model

    throughput = load_benchmark("throughput")
    monkeypatch.setattr(torch, "compile", fake_compile)
    out = tmp_path / "t.json"
    throughput.main(
        [
            "--models",
            "capsnet_digits",
            "--batch-sizes",
            "4",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--repeats",
            "2",
            "--device",
            "cpu",
            "--compare-compile",
            "--out",
            str(out),
        ]
    )
    rows = {row["path"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["production", "naive", "compiled"]
    assert len(compiled) == 1  # the compiled path only
    for kind in ("train", "infer"):
        ratios = [
            c / p
            for c, p in zip(
                rows["compiled"][f"{kind}_images_per_s_runs"], rows["production"][f"{kind}_images_per_s_runs"]
            )
        ]
        assert rows["compiled"][f"{kind}_speedup_vs_eager"] == pytest.approx(statistics.median(ratios))
        assert f"{kind}_speedup_vs_naive" in rows["production"] and f"{kind}_speedup_vs_naive" not in rows["compiled"]
    assert rows["compiled"]["routing"] == rows["production"]["routing"]
    assert rows["compiled"]["parameters"] == rows["production"]["parameters"]


def test_the_compiled_path_starts_from_the_production_weights(monkeypatch, load_benchmark):
    throughput = load_benchmark("throughput")
    monkeypatch.setattr(torch, "compile", lambda model: model)
    args = throughput.parse_args(["--models", "capsnet_digits", "--compare-compile", "--skip-naive"])
    paths = throughput.build_paths("capsnet_digits", args, torch.device("cpu"))
    assert list(paths) == ["production", "compiled"]
    production, compiled = (paths[name]["model"].state_dict() for name in ("production", "compiled"))
    assert production.keys() == compiled.keys()
    assert all(torch.equal(production[key], compiled[key]) for key in production)
    assert paths["compiled"]["model"] is not paths["production"]["model"]


def test_compare_compile_and_compile_are_refused_together(capsys, load_benchmark):
    throughput = load_benchmark("throughput")
    with pytest.raises(SystemExit):
        throughput.parse_args(["--compile", "--compare-compile"])
    assert "leave out --compile" in capsys.readouterr().err


def test_a_model_without_routing_is_compared_with_its_default_path(tmp_path, monkeypatch, load_benchmark):
    throughput = load_benchmark("throughput")
    monkeypatch.setattr(torch, "compile", lambda model: model)
    out = tmp_path / "t.json"
    throughput.main(
        [
            "--models",
            "cnn_baseline_narrow",
            "--batch-sizes",
            "2",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--repeats",
            "1",
            "--device",
            "cpu",
            "--compare-compile",
            "--out",
            str(out),
        ]
    )
    rows = {row["path"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["default", "compiled"]
    assert rows["compiled"]["train_speedup_vs_eager"] > 0 and "train_speedup_vs_naive" not in rows["default"]
