"""benchmarks/large_inputs.py: SegCaps keeps less for its backward pass than U-Net at the same input size, and
the benchmark's measurements run."""

import pytest
import torch


@pytest.fixture
def bench(load_benchmark):
    return load_benchmark("large_inputs")


def test_segcaps_saves_less_for_backward_than_unet_at_the_same_size(bench):
    # LaLonde & Bagci's point: SegCaps is smaller than U-Net in memory as well as in parameters. The bytes autograd
    # keeps for the backward pass grow with the pixels for both (their ratio is the same at every size).
    saved = {}
    for name in ("segcaps", "unet"):
        model, _, make, objective = bench.build(name, 64)
        saved[name] = bench.saved_activation_bytes(model, objective, *make(1))
    assert 0 < saved["segcaps"] <= saved["unet"], saved


def test_saved_bytes_count_each_storage_once_and_leave_the_parameters_out(bench):
    weight = torch.nn.Parameter(torch.randn(8, 8))
    model = torch.nn.Linear(8, 8, bias=False)
    model.weight = weight

    def objective(images, _):
        hidden = model(images)  # saves images (and the weight, a parameter)
        return (hidden * hidden).sum()  # saves hidden (twice, one storage)

    images = torch.randn(4, 8)
    assert bench.saved_activation_bytes(model, objective, images, None) == 2 * images.numel() * 4


def test_the_children_measure_both_models(bench):
    timing = bench.timing_child(["segcaps_small", "unet_small"], 32, 1, 2)
    assert set(timing) == {"segcaps_small", "unet_small"}
    assert all(len(rec["steps_s"]) == 2 and rec["step_s"] > 0 for rec in timing.values())
    memory = bench.memory_child("matrix_capsnet_small", 32, 2)
    assert memory["peak_rss_bytes"] >= memory["peak_rss_increase_bytes"] >= 0
    assert memory["saved_activation_bytes"] > 0 and memory["parameters"] == 67_154
