"""benchmarks/gradient_scale.py: both paths are timed and the wrapper is put back."""

import importlib
import json


def test_times_both_paths_and_restores_the_wrapper(tmp_path, load_benchmark):
    # the module, not the function of the same name that capsnets.functional exports
    dynamic = importlib.import_module("capsnets.functional.dynamic_routing")

    before = dynamic.dynamic_routing
    bench = load_benchmark("gradient_scale")
    out = tmp_path / "g.json"
    bench.main(["--models", "capsnet_digits", "--batch-size", "4", "--repeats", "2", "--steps", "1", "--out", str(out)])
    (row,) = json.loads(out.read_text())["results"]
    assert row["images_per_s_wrapped"] > 0 and row["images_per_s_unwrapped"] > 0
    assert dynamic.dynamic_routing is before and hasattr(before, "__wrapped__")
