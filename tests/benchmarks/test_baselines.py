"""The naive routings of benchmarks/baselines.py compute what the production routings compute (so that the
throughput benchmark compares like with like)."""

import pytest
import torch

from capsnets.functional import dynamic_routing, em_routing


@pytest.fixture
def baselines(load_benchmark):
    return load_benchmark("baselines")


def test_naive_dynamic_routing_agrees(baselines):
    u_hat = torch.randn(4, 30, 5, 8, dtype=torch.float64)
    v_naive, c_naive = baselines.NaiveDynamicRouting(3)(u_hat, return_couplings=True)
    v, c = dynamic_routing(u_hat, 3, return_couplings=True)
    torch.testing.assert_close(v, v_naive, rtol=0, atol=1e-7)  # naive squash has its own 1e-8 epsilon
    torch.testing.assert_close(c, c_naive, rtol=0, atol=1e-7)
    assert repr(baselines.NaiveDynamicRouting(3)) == "NaiveDynamicRouting(iterations=3)"


def test_naive_em_routing_agrees_on_well_conditioned_inputs(baselines):
    gen = torch.Generator().manual_seed(9)
    # few pose components of unit scale: the densities neither underflow nor hit the naive floor
    votes = torch.randn(3, 12, 4, 4, dtype=torch.float64, generator=gen)
    activations = torch.rand(3, 12, dtype=torch.float64, generator=gen).clamp(min=0.2)
    beta_v, beta_a = torch.randn(2, 4, dtype=torch.float64, generator=gen)
    lambdas = [0.05, 0.1, 0.2]
    naive = baselines.NaiveEMRouting(3, lambdas)
    got = naive(votes, activations, beta_v, beta_a, return_assignments=True)
    want = em_routing(votes, activations, beta_v, beta_a, 3, inverse_temperature=lambdas, return_assignments=True)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-8)
    assert repr(naive) == "NaiveEMRouting(iterations=3)"
    poses, act = baselines.NaiveEMRouting(3)(votes.float(), activations.float(), beta_v.float(), beta_a.float())
    assert poses.shape == (3, 4, 4) and act.shape == (3, 4)


def test_naive_em_routing_takes_the_production_lambda_schedule(baselines):
    from capsnets.functional import em_inverse_temperatures

    assert baselines.NaiveEMRouting(4).inverse_temperatures == em_inverse_temperatures(4)
    assert baselines.NaiveEMRouting(2, 0.5).inverse_temperatures == [0.5, 0.5]
    with pytest.raises(ValueError, match="inverse_temperature"):
        baselines.NaiveEMRouting(3, [0.1, 0.2])
