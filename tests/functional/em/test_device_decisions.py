"""EM routing on CUDA reads no value on the host (capsnets.functional.em.spec.host_reads): the activations'
range is a device-side assertion and votes too large for float32 gradients are scaled on the device instead of
rerouted in float64. Run here on CPU tensors with the device's decisions forced, on the PyTorch path, the fused
CPU kernel's set-up and the Triton path (in Triton's interpreter): no ``.item()``, ``.tolist()``, ``bool()``,
``float()``, ``int()``, ``.cpu()`` or ``.numpy()`` on a tensor from capsnets' code, forward or backward, and
finite outputs and gradients for float32 votes of every finite magnitude."""

import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

import capsnets
from capsnets.functional import em_routing_poses
from capsnets.functional.em import kernel as em_kernel
from capsnets.functional.em import procedure, recomputed, routing, spec

from helpers import em_poses

#: Tensor methods that hand a value to the host (and so wait for the device).
HOST_READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
}


class HostReads(TorchFunctionMode):
    """Records where capsnets' code reads a tensor's value on the host (the first caller outside torch)."""

    def __init__(self):
        super().__init__()
        self.sites = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            frame = sys._getframe(1)
            while frame is not None and "/torch/" in frame.f_code.co_filename:
                frame = frame.f_back
            if frame is not None and "/capsnets/" in frame.f_code.co_filename:
                self.sites.append(f"{func.__name__} at {frame.f_code.co_filename}:{frame.f_lineno}")
        return func(*args, **(kwargs or {}))


def _decide_on_the_device(patch: pytest.MonkeyPatch) -> None:
    for module in (spec, procedure, recomputed, routing):
        patch.setattr(module, "host_reads", lambda device: False)


@pytest.fixture
def on_the_device(monkeypatch):
    """Every decision as on CUDA: no host reads."""
    _decide_on_the_device(monkeypatch)


PATHS = ["torch", "fused", "triton"]


def _mode(path: str) -> str:
    if path == "triton":
        pytest.importorskip("triton")
    return {"torch": "torch", "fused": "auto", "triton": "triton"}[path]


@pytest.mark.parametrize("path", PATHS)
def test_routing_reads_no_value_on_the_host(path, monkeypatch, on_the_device):
    monkeypatch.setenv(em_kernel.ENV_VAR, _mode(path))
    gen = torch.Generator().manual_seed(0)
    poses, weight, acts, beta_v, beta_a = em_poses(2, 8, 4, 3, gen=gen, dtype=torch.float32)
    leaves = [poses.requires_grad_(), weight.requires_grad_()]
    with HostReads() as reads:
        mu, a = em_routing_poses(*leaves, acts, beta_v, beta_a)
        (mu.square().sum() + a.sum()).backward()
        huge, _ = em_routing_poses(poses.detach() * 1e20, weight, acts, beta_v, beta_a)  # scaled, not rerouted
    if path != "triton":  # a whole network's step (Triton's interpreter is too slow for one)
        model = capsnets.create_model("matrix_capsnet_small")
        with HostReads() as model_reads:
            out = model(torch.rand(2, *model.input_size))
            (out.scores.sum() + out.capsules.square().sum()).backward()
        reads.sites += model_reads.sites
    assert reads.sites == []
    assert huge.dtype == torch.float32 and torch.isfinite(huge).all()
    assert all(torch.isfinite(leaf.grad).all() for leaf in leaves)


def test_the_host_reads_are_seen_where_the_cpu_decides(monkeypatch):
    """The check above can fail: on the CPU the same routing reads the activations' range and the votes' size."""
    monkeypatch.setenv(em_kernel.ENV_VAR, "torch")
    poses, weight, acts, beta_v, beta_a = em_poses(
        2, 8, 4, 3, gen=torch.Generator().manual_seed(0), dtype=torch.float32
    )
    with HostReads() as reads:
        em_routing_poses(poses.requires_grad_(), weight, acts, beta_v, beta_a)
    assert any("spec.py" in site for site in reads.sites) and any("procedure.py" in site for site in reads.sites)


def test_activations_out_of_range_fail_a_device_side_assertion(on_the_device):
    poses, weight, acts, beta_v, beta_a = em_poses(
        1, 4, 4, 2, gen=torch.Generator().manual_seed(1), dtype=torch.float32
    )
    with pytest.raises(RuntimeError, match=r"child activations in \[0, 1\] \(probabilities\)"):
        em_routing_poses(poses, weight, acts + 2.0, beta_v, beta_a)


@given(st.sampled_from(["torch", "fused"]), st.floats(-30.0, 30.0), st.integers(0, 2**16))
@settings(max_examples=30, deadline=None, derandomize=True, database=None)
def test_float32_routing_decided_on_the_device_is_finite_with_finite_gradients(path, exponent, seed):
    """Every finite float32 input: finite poses, activations and gradients of the poses and transforms, and
    below ``WIDE_VOTES`` the very numbers the host's decision gives (no scale, no float64)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(em_kernel.ENV_VAR, _mode(path))
        results = []
        for host in (True, False):
            if not host:
                _decide_on_the_device(patch)
            gen = torch.Generator().manual_seed(seed)
            poses, weight, acts, beta_v, beta_a = em_poses(
                2, 8, 8, 3, gen=gen, dtype=torch.float32, scale=10.0**exponent
            )
            leaves = [poses.requires_grad_(), weight.requires_grad_()]
            mu, a = em_routing_poses(*leaves, acts, beta_v, beta_a)
            ((mu / mu.detach().abs().max().clamp_min(1.0)).sum() + a.sum()).backward()
            results.append([mu, a, *(leaf.grad for leaf in leaves)])
    for value in results[1]:
        assert torch.isfinite(value).all()
    # votes within 2^32 by the bound the host checks (4 products of a pose entry and a transform entry): as there
    if 4 * poses.detach().abs().max() * weight.detach().abs().max() <= spec.WIDE_VOTES:
        for got, want in zip(results[1], results[0]):
            assert torch.equal(got, want)
