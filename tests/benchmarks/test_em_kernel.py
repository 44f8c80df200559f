"""benchmarks/em_kernel.py: ``--profile``'s record of where a kernel training step's time goes, ``--inference``'s
timings, and the CNNs' own number of timed steps."""

import json

import pytest
import torch

from capsnets.functional.em import kernel as em_kernel


def test_profile_times_each_kernel_call_and_restores_the_kernel(load_benchmark, monkeypatch):
    if em_kernel.load() is None:
        pytest.fail(f"the fused EM kernel did not build or load: {em_kernel.load_error()}")
    bench = load_benchmark("em_kernel")
    monkeypatch.setenv(em_kernel.ENV_VAR, "auto")  # profile() sets "cpp"; monkeypatch restores it
    model, optimizer = bench.build("matrix_capsnet_small", detach=False)
    gen = torch.Generator().manual_seed(0)
    images, labels = torch.rand(2, 1, 32, 32, generator=gen), torch.randint(0, 5, (2,), generator=gen)
    loaded = em_kernel._state["module"]
    record = bench.profile(model, optimizer, images, labels, steps=1)
    assert em_kernel._state["module"] is loaded  # the timed stand-in is gone
    # one training step: the gathers, the forward and the hand-written backward (in one pass: no child groups)
    # ran in the kernel
    assert {"gather_rows", "votes_stats", "route", "backward_fused", "scatter_rows"} <= set(record["kernel_ms"])
    assert 0 < record["kernel_total_ms"] < record["step_ms"]
    assert record["outside_kernel_ms"] == pytest.approx(record["step_ms"] - record["kernel_total_ms"])
    assert record["top_ops_self_ms"] and all(name.startswith("aten::") for name in record["top_ops_self_ms"])


def test_inference_times_the_slices_against_the_whole_batch_and_restores_the_size(load_benchmark, monkeypatch):
    from capsnets.models import matrix_capsnet

    bench = load_benchmark("em_kernel")
    monkeypatch.setenv(em_kernel.ENV_VAR, "auto")  # inference() sets "cpp"; monkeypatch restores it
    monkeypatch.setattr(matrix_capsnet, "CPU_IMAGES_AT_A_TIME", 2)
    model, _ = bench.build("matrix_capsnet_small", detach=False)
    sizes = []
    whole = model._conv_capsules
    monkeypatch.setattr(model, "_conv_capsules", lambda x: sizes.append(len(x)) or whole(x))
    record = bench.inference(model, torch.rand(3, 1, 32, 32), steps=1, repeats=2)
    assert matrix_capsnet.CPU_IMAGES_AT_A_TIME == 2 and model.training
    assert sizes == [2, 1] + [2, 1, 3] + [3, 2, 1]  # warm-up; then slices first, whole first
    assert record["batch"] == 3 and record["images_at_a_time"] == 2 and record["speedup"] > 0
    assert all(len(runs) == 2 and min(runs) > 0 for runs in record["per_repeat"].values())


def test_a_cnn_is_timed_over_its_own_steps(load_benchmark, monkeypatch, tmp_path):
    bench = load_benchmark("em_kernel")
    monkeypatch.setenv(em_kernel.ENV_VAR, "auto")  # main() switches the path; monkeypatch restores it
    steps, real = [], bench.train
    monkeypatch.setattr(bench, "train", lambda *args: steps.append(args[-1]) or real(*args))
    argv = ["--batch", "2", "--steps", "1", "--repeats", "1", "--skip-large", "--skip-memory"]
    assert bench.main([*argv, "--out", str(tmp_path / "tax.json")]) == 0
    row = json.loads((tmp_path / "tax.json").read_text())["rows"][0]
    assert row["steps"] == {"capsules": 1, "cnn": 16}  # the CNN's default: 16 times the capsules'
    assert steps == [1, 1, 1] + [1, 1, 16]  # a warm-up step each (torch path, kernel path, CNN); then the timings
    assert row["capsule_tax"]["cpp"] > 0
