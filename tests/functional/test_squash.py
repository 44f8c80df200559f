import torch
from torch.autograd import gradcheck

from capsnets.functional import capsule_length, safe_norm, squash


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
