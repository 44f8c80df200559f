import math
import unittest.mock

import pytest
import torch
from torch.autograd import gradcheck

from capsnets.functional import capsule_length, safe_norm, squash
from capsnets.functional.squash import _wide_length, _WideSquash


def test_squash_length_below_one_and_direction_kept():
    s = torch.randn(64, 16, dtype=torch.float64) * torch.logspace(-3, 3, 64, dtype=torch.float64)[:, None]
    v = squash(s)
    lengths = capsule_length(v)
    assert (lengths < 1).all()
    cosine = (v * s).sum(-1) / (s.norm(dim=-1) * v.norm(dim=-1))
    torch.testing.assert_close(cosine, torch.ones(64, dtype=torch.float64))


def test_squash_matches_paper_formula():
    s = torch.randn(10, 8, dtype=torch.float64)
    n = s.norm(dim=-1, keepdim=True)
    expected = n**2 / (1 + n**2) * s / n
    torch.testing.assert_close(squash(s), expected, rtol=1e-12, atol=1e-12)


def test_squash_finite_value_and_gradient_at_zero():
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        s = torch.zeros(3, 8, dtype=dtype, requires_grad=True)
        v = squash(s)
        v.sum().backward()
        assert torch.isfinite(v).all() and (v == 0).all()
        assert torch.isfinite(s.grad).all()
        length = capsule_length(s)
        assert torch.isfinite(length).all()


def test_squash_other_dim():
    s = torch.randn(2, 8, 5, dtype=torch.float64)
    torch.testing.assert_close(squash(s, dim=1), squash(s.transpose(1, 2)).transpose(1, 2))


def test_gradcheck_squash_and_norm():
    s = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert gradcheck(squash, (s,))
    assert gradcheck(lambda x: safe_norm(x, dim=-1), (s,))


@pytest.mark.parametrize("unit", [1.0, 2.0**-11])
def test_gradcheck_float64_accumulated_squash(unit):
    # float32 and half-precision capsules take this function (float64 ones, and traced code, the scaled form);
    # eps = 1 keeps the length at s = 0 (eps * unit) well above the step of the numerical derivative
    gen = torch.Generator().manual_seed(0)
    s = torch.randn(4, 6, dtype=torch.float64, generator=gen) * torch.logspace(-3, 3, 4, dtype=torch.float64)[:, None]
    s = torch.cat([s, torch.zeros(1, 6, dtype=torch.float64)]).requires_grad_()
    assert gradcheck(lambda x: _WideSquash.apply(x, -1, 1.0, unit), (s,))
    assert gradcheck(lambda x: _WideSquash.apply(x, 0, 1.0, unit), (s,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_both_forms_agree(dtype):
    # eager float32/half: float64 accumulation with its own backward; traced: the scaled form, plain autograd
    gen, top = torch.Generator().manual_seed(1), torch.finfo(dtype).max
    s = (torch.randn(6, 5, 8, generator=gen) * torch.logspace(-6, math.log10(top) - 1, 6)[:, None, None]).to(dtype)
    grad = torch.randn(6, 5, 8, generator=gen).to(dtype)
    results = []
    for compiling in (False, True):
        leaf = s.clone().requires_grad_()
        with unittest.mock.patch("torch.compiler.is_compiling", return_value=compiling):
            v = squash(leaf, dim=1)
        v.backward(grad)
        results.append((v.float(), leaf.grad.float()))
    eps = torch.finfo(dtype).eps
    for wide, scaled in zip(*results):
        assert torch.isfinite(wide).all()
        torch.testing.assert_close(wide, scaled, rtol=4 * eps, atol=4 * eps * scaled.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_length_accumulations_agree(dtype):
    # float16 lengths accumulate in float32; float32/bfloat16 ones in float32 on the CPU unless that overflows,
    # elsewhere in float64
    gen, top = torch.Generator().manual_seed(2), torch.finfo(dtype).max
    s = (torch.randn(6, 5, 8, generator=gen) * torch.logspace(-6, math.log10(top) - 1, 6)[:, None, None]).to(dtype)
    for part in (s[:3], s):  # ordinary lengths (float32 sums), and with lengths beyond 1e19 (float64 sums)
        cpu = _wide_length(part, -1, 1e-14)[0]
        with unittest.mock.patch("torch.compiler.is_compiling", return_value=True):  # as off the CPU
            wide = _wide_length(part, -1, 1e-14)[0]
        assert torch.isfinite(cpu).all() and wide.dtype == (torch.float32 if dtype == torch.float16 else torch.float64)
        torch.testing.assert_close(cpu.double(), wide.double(), rtol=1e-6, atol=0)
