"""benchmarks/large_inputs.py: SegCaps takes less memory than U-Net at the same input size (what it keeps for the
backward pass, and the peak of a forward and backward pass), and the benchmark's measurements run."""

import pytest
import torch


@pytest.fixture
def bench(load_benchmark):
    return load_benchmark("large_inputs")


def test_segcaps_takes_less_memory_than_unet_at_the_same_size(bench):
    # LaLonde & Bagci's point: SegCaps is smaller than U-Net in memory as well as in parameters.
    # - saved: the bytes autograd keeps for the backward pass grow with the pixels for both (their ratio is the
    #   same at every size);
    # - peak: the most the tensors of a forward and backward pass hold at once (activations, what backward keeps,
    #   temporaries) beyond the weights and their gradients. SegCaps' peak is where the backward pass of its
    #   full-resolution reconstruction decoder starts. A change that adds full-resolution temporaries to its step
    #   takes it above U-Net's.
    saved, peak = {}, {}
    for name in ("segcaps", "unet"):
        model, _, make, objective = bench.build(name, 128)
        saved[name] = bench.saved_activation_bytes(model, objective, *make(1))
        peak[name] = bench.peak_tensor_bytes(model, objective, *make(1))
    assert 0 < saved["segcaps"] <= saved["unet"], saved
    assert 0 < peak["segcaps"] <= peak["unet"], peak


def test_peak_tensor_bytes_counts_what_the_pass_makes_while_it_lives(bench):
    model = torch.nn.Linear(8, 8, bias=False)

    def objective(images, _):
        hidden = model(images)  # (4, 8), kept for backward
        return (hidden * hidden).sum()  # the product (4, 8) lives until the sum, which is a scalar

    images = torch.randn(4, 8)
    peak = bench.peak_tensor_bytes(model, objective, images, torch.zeros(()))
    hidden = product = 4 * 8 * 4
    # forward: hidden + product + the sum's scalar; backward adds the scalar's gradient and the gradients of hidden
    # (8 floats' worth per factor) before the weight's, which accumulates into the gradient made beforehand
    assert hidden + product <= peak <= hidden + product + 3 * hidden + 64, peak
    assert model.weight.grad is None


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
