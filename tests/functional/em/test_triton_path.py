"""EM routing by the Triton kernels (capsnets.functional.em.triton_path), run on CPU tensors in Triton's
interpreter: forward against the float64 literal references, gradients against the PyTorch path (float64, which
the tests of em_routing gradcheck; and float32 against it in float64), edge cases, and which path runs where.

The interpreter runs every program of a launch in Python, about a millisecond per operation, so the sizes are the
smallest that still cover each case (shared transforms, coordinates, child groups, tails of blocks);
``tests/functional/em/test_triton_votes.py`` checks each kernel on its own."""

import unittest.mock
import warnings

import pytest
import torch

from capsnets.functional import EMRouting, em_routing_poses
from capsnets.functional.em import OFFICIAL_VARIANCE_FLOOR, triton_path, triton_votes
from capsnets.functional.em import kernel as em_kernel
from capsnets.layers import ConvMatrixCapsules, MatrixCapsules
from capsnets.testing import reference_em_routing

from helpers import em_poses, em_votes

pytest.importorskip("triton")


@pytest.fixture
def interpreted(monkeypatch):
    """The Triton path, on CPU tensors: in Triton's interpreter."""
    monkeypatch.setenv(em_kernel.ENV_VAR, "triton")


def _lambdas(formulation):
    return [0.05, 0.1, 0.15] if formulation == "official" else [0.3, 0.6, 1.0]


def test_the_triton_path_runs_where_chosen(interpreted, monkeypatch):
    inputs = em_poses(2, 6, 3, 3, gen=torch.Generator().manual_seed(0), dtype=torch.float32)
    with unittest.mock.patch.object(triton_votes, "moments", wraps=triton_votes.moments) as moments:
        em_routing_poses(*inputs)
        assert moments.call_count == 3  # one per M-step
        monkeypatch.setenv(em_kernel.ENV_VAR, "auto")  # on the CPU: the CPU's paths, never Triton
        em_routing_poses(*inputs)
        monkeypatch.setenv(em_kernel.ENV_VAR, "torch")
        em_routing_poses(*inputs)
        assert moments.call_count == 3
    monkeypatch.setenv(em_kernel.ENV_VAR, "triton")
    assert triton_path.applies(torch.zeros(1, 2, 4, 4), torch.zeros(2, 3, 4, 4), None)
    assert not triton_path.applies(torch.zeros(1, 2, 3, 3), torch.zeros(2, 3, 3, 3), None)  # 4x4 poses only
    learned = torch.zeros(2, 2, requires_grad=True)  # coordinates with a gradient: the PyTorch path
    assert not triton_path.applies(torch.zeros(1, 2, 4, 4), torch.zeros(2, 3, 4, 4), learned)


def test_works_on_tries_the_kernels_once_per_device_and_warns_where_they_fail(monkeypatch):
    monkeypatch.setattr(triton_path, "_works", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert triton_path.works_on(torch.device("cpu"))  # the interpreter: they work

    def fails(*args, **kwargs):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(triton_path, "_works", {})
    monkeypatch.setattr(triton_votes, "_launch", fails)
    with pytest.warns(RuntimeWarning, match="kernels failed on cpu .*no kernel image.*takes the PyTorch path"):
        assert not triton_path.works_on(torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # tried once: no second warning
        assert not triton_path.works_on(torch.device("cpu"))


@pytest.mark.parametrize("formulation", ["paper", "official"])
def test_forward_agrees_with_the_literal_reference(interpreted, formulation):
    gen = torch.Generator().manual_seed(1)
    floor = OFFICIAL_VARIANCE_FLOOR if formulation == "official" else None
    # per-child transforms with coordinates, transforms shared by type, one child
    for children, child_types, coordinates in ((6, 6, True), (6, 3, False), (1, 1, True)):
        poses, weight, acts, beta_v, beta_a = em_poses(2, children, child_types, 3, gen=gen, scale=0.5)
        coords = torch.rand(children, 2, generator=gen, dtype=torch.float64) if coordinates else None
        mu, a, r = em_routing_poses(
            poses,
            weight,
            acts,
            beta_v,
            beta_a,
            3,
            coordinates=coords,
            inverse_temperature=_lambdas(formulation),
            return_assignments=True,
            eps=1e-5,
            formulation=formulation,
        )
        ref = reference_em_routing(
            em_votes(poses, weight, coords), acts, beta_v, beta_a, 3, _lambdas(formulation), 1e-5, variance_floor=floor
        )
        for got, want in zip((mu, a, r), ref):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-8)


@pytest.mark.parametrize(("formulation", "detach"), [("paper", False), ("official", False), ("official", True)])
def test_float64_gradients_equal_the_pytorch_paths(interpreted, monkeypatch, formulation, detach):
    # the PyTorch path's gradients are gradchecked (and its detached ones checked) by the tests of em_routing
    gen = torch.Generator().manual_seed(3)
    inputs = em_poses(2, 6, 3, 3, gen=gen, scale=0.5)
    coords = torch.rand(6, 2, generator=gen, dtype=torch.float64)
    grads = {}
    for path in ("torch", "triton"):
        monkeypatch.setenv(em_kernel.ENV_VAR, path)
        leaves = [t.clone().requires_grad_() for t in inputs]
        mu, a, r = em_routing_poses(
            *leaves,
            3,
            coordinates=coords,
            inverse_temperature=_lambdas(formulation),
            formulation=formulation,
            detach_routing=detach,
            return_assignments=True,
        )
        (mu.square().sum() + a.sum() + (r * r.detach()).sum()).backward()
        grads[path] = [mu, a, r] + [t.grad for t in leaves]
    for got, want in zip(grads["triton"], grads["torch"]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_float32_convolutional_layer_matches_the_pytorch_path_in_float64(interpreted, monkeypatch):
    # a convolutional layer with the released code's routing and child groups per type, as in matrix_capsnet
    gen = torch.Generator().manual_seed(4)
    pose = torch.randn(1, 1, 4, 4, 4, 4, generator=gen, dtype=torch.float64)
    act = torch.rand(1, 1, 4, 4, generator=gen, dtype=torch.float64)
    grads = {}
    for path, dtype in (("torch", torch.float64), ("triton", torch.float32)):
        monkeypatch.setenv(em_kernel.ENV_VAR, path)
        torch.manual_seed(0)
        layer = ConvMatrixCapsules(
            1, 2, stride=1, routing=EMRouting.official(3), assignment_scope="per_type", dtype=torch.float64
        ).to(dtype)
        p = pose.to(dtype).detach().clone().requires_grad_()
        a = act.to(dtype).detach().clone().requires_grad_()
        out = layer(MatrixCapsules(p, a))
        probe = torch.randn(out.pose.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        ((out.pose * probe.to(dtype)).sum() + out.activation.sum() * 3).backward()
        grads[path] = [
            t.double()
            for t in (out.pose, out.activation, p.grad, a.grad, layer.weight.grad, layer.beta_v.grad, layer.beta_a.grad)
        ]
    for got, want in zip(grads["triton"], grads["torch"]):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("case", ["zero_activations", "huge_votes"])
def test_edge_cases_match_the_pytorch_path(interpreted, monkeypatch, case):
    gen = torch.Generator().manual_seed(7)
    poses, weight, acts, beta_v, beta_a = em_poses(1, 4, 4, 2, gen=gen, dtype=torch.float32)
    if case == "zero_activations":
        acts = torch.zeros_like(acts)
    else:
        poses = poses * 1e18  # votes beyond the float32 overflow bound of the squares: routed in float64
    results = {}
    for path in ("torch", "triton"):
        monkeypatch.setenv(em_kernel.ENV_VAR, path)
        leaves = [t.clone().requires_grad_() for t in (poses, weight, acts, beta_v, beta_a)]
        mu, a = em_routing_poses(*leaves, formulation="official")
        ((mu / mu.abs().max().clamp_min(1)).sum() + a.sum()).backward()
        results[path] = [mu, a] + [t.grad for t in leaves]
    for got, want in zip(results["triton"], results["torch"]):
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-3, atol=2e-4 * max(1.0, want.abs().max().item()))


def test_half_precision_poses_are_routed_in_float32(interpreted):
    poses, weight, acts, beta_v, beta_a = em_poses(
        2, 4, 2, 2, gen=torch.Generator().manual_seed(8), dtype=torch.float32
    )
    mu, a = em_routing_poses(poses.bfloat16(), weight.bfloat16(), acts.bfloat16(), beta_v, beta_a)
    assert mu.dtype == a.dtype == torch.float32
    want_mu, want_a = em_routing_poses(
        poses.bfloat16().float(), weight.bfloat16().float(), acts.bfloat16().float(), beta_v, beta_a
    )
    torch.testing.assert_close(mu, want_mu)
    torch.testing.assert_close(a, want_a)


def test_forcing_triton_without_a_usable_triton_says_what_to_install(interpreted, monkeypatch):
    monkeypatch.setitem(triton_votes._state, "available", False)
    inputs = em_poses(1, 2, 2, 2, gen=torch.Generator().manual_seed(9), dtype=torch.float32)
    with pytest.raises(RuntimeError, match=r"pip install 'triton>=3.9', or set CAPSNETS_EM_KERNEL=auto"):
        em_routing_poses(*inputs)
