from unittest import mock

import pytest
import torch
from torch.autograd import gradcheck

from capsnets.functional import DynamicRouting, dynamic_routing
from capsnets.testing import reference_dynamic_routing


@pytest.mark.parametrize("iterations", [1, 2, 3, 4, 5])
def test_agrees_with_literal_procedure_1(iterations):
    gen = torch.Generator().manual_seed(iterations)
    for _ in range(3):
        batch, children, parents, dim = (int(x) for x in torch.randint(1, 7, (4,), generator=gen))
        u_hat = torch.randn(batch, children, parents, dim, dtype=torch.float64, generator=gen)
        v, c = dynamic_routing(u_hat, iterations, return_couplings=True)
        v_ref, c_ref = reference_dynamic_routing(u_hat, iterations)
        torch.testing.assert_close(v, v_ref, rtol=0, atol=1e-10)
        torch.testing.assert_close(c, c_ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("none_of_the_above", [False, True])
def test_exported_elementwise_form_agrees_with_literal_procedure_1(none_of_the_above):
    # Under export, few children take sums of products instead of batched matmuls (faster in onnxruntime).
    u_hat = torch.randn(40, 2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with mock.patch("torch.compiler.is_exporting", return_value=True):
        v, c = dynamic_routing(u_hat, 3, none_of_the_above=none_of_the_above, return_couplings=True)
    v_ref, c_ref = reference_dynamic_routing(u_hat, 3, none_of_the_above=none_of_the_above)
    torch.testing.assert_close(v, v_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(c, c_ref[..., :5], rtol=0, atol=1e-10)  # the extra parent's share is left out


@pytest.mark.parametrize("detach", [True, False])
def test_couplings_sum_to_one_over_parents(detach):
    u_hat = torch.randn(3, 20, 7, 4, dtype=torch.float64)
    _, c = dynamic_routing(u_hat, 3, detach_routing=detach, return_couplings=True)
    torch.testing.assert_close(c.sum(-1), torch.ones(3, 20, dtype=torch.float64))
    assert (c >= 0).all()


def test_gradcheck():
    # detach_routing=False is the true derivative of Procedure 1; detach_routing=True a deliberate surrogate (below).
    u_hat = torch.randn(2, 5, 3, 4, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda u: dynamic_routing(u, 3, detach_routing=False), (u_hat,))


def test_detach_option_changes_gradient_path():
    u_hat = torch.randn(2, 6, 3, 4, dtype=torch.float64, requires_grad=True)
    (g_detached,) = torch.autograd.grad(dynamic_routing(u_hat, 3, detach_routing=True).sum(), u_hat)
    (g_full,) = torch.autograd.grad(dynamic_routing(u_hat, 3, detach_routing=False).sum(), u_hat)
    assert not torch.allclose(g_detached, g_full)
    # with one iteration there is nothing to detach
    (g1,) = torch.autograd.grad(dynamic_routing(u_hat, 1, detach_routing=True).sum(), u_hat)
    (g2,) = torch.autograd.grad(dynamic_routing(u_hat, 1, detach_routing=False).sum(), u_hat)
    torch.testing.assert_close(g1, g2)


def test_detached_gradient_equals_constant_couplings():
    # detach_routing=True means: couplings are constants, gradient flows only through the final weighted sum.
    u_hat = torch.randn(2, 6, 3, 4, dtype=torch.float64, requires_grad=True)
    _, c = dynamic_routing(u_hat.detach(), 3, return_couplings=True)
    from capsnets.functional import squash

    expected = squash(torch.einsum("bij,bijd->bjd", c, u_hat))
    (g_expected,) = torch.autograd.grad(expected.pow(2).sum(), u_hat)
    (g,) = torch.autograd.grad(dynamic_routing(u_hat, 3, detach_routing=True).pow(2).sum(), u_hat)
    torch.testing.assert_close(g, g_expected)


def test_zero_predictions_are_finite():
    u_hat = torch.zeros(2, 4, 3, 5, requires_grad=True)
    v = dynamic_routing(u_hat, 3, detach_routing=False)
    v.sum().backward()
    assert torch.isfinite(v).all() and torch.isfinite(u_hat.grad).all()


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"\(B, I, J, D\)"):
        dynamic_routing(torch.randn(3, 4, 5), 3)
    with pytest.raises(ValueError, match="iterations"):
        dynamic_routing(torch.randn(1, 2, 3, 4), 0)
    with pytest.raises(ValueError, match="iterations"):
        DynamicRouting(0)
