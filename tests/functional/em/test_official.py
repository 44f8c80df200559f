"""The official formulation of EM routing (the equations of the authors' released code) against a literal
float64 reference, its gradients, and its settings."""

import math

import pytest
import torch
from torch.autograd import gradcheck

from capsnets.functional import EMRouting, em_inverse_temperatures, em_routing
from capsnets.functional.em import OFFICIAL_MASS_EPS, OFFICIAL_VARIANCE_FLOOR
from capsnets.testing import reference_em_routing


def _inputs(batch, children, parents, dim, *, gen, requires_grad=False, scale=1.0):
    votes = scale * torch.randn(batch, children, parents, dim, dtype=torch.float64, generator=gen)
    activations = torch.rand(batch, children, dtype=torch.float64, generator=gen)
    activations[torch.rand(batch, children, generator=gen) < 0.25] = 0.0  # some inactive children
    beta_u = torch.rand(parents, dtype=torch.float64, generator=gen)
    beta_a = 0.01 * torch.randn(parents, dtype=torch.float64, generator=gen)
    return tuple(t.requires_grad_(requires_grad) for t in (votes, activations, beta_u, beta_a))


@pytest.mark.parametrize("iterations", [1, 2, 3, 4])
@pytest.mark.parametrize("detach", [False, True])
def test_official_agrees_with_literal_equations(iterations, detach):
    gen = torch.Generator().manual_seed(10 + iterations)
    for dim, scale in ((4, 1.0), (16, 0.1)):
        for _ in range(2):
            batch, parents = (int(x) for x in torch.randint(1, 4, (2,), generator=gen))
            children = int(torch.randint(1, 13, (), generator=gen))
            inputs = _inputs(batch, children, parents, dim, gen=gen, scale=scale)
            lambdas = [0.01 * (t + 1) for t in range(iterations)]  # large enough that the E-step matters
            for eps in (1e-7, 1e-5):
                mu, a, r = em_routing(
                    *inputs,
                    iterations,
                    inverse_temperature=lambdas,
                    return_assignments=True,
                    formulation="official",
                    eps=eps,
                    detach_routing=detach,
                )
                mu_ref, a_ref, r_ref = reference_em_routing(
                    *inputs, iterations, lambdas, eps, variance_floor=OFFICIAL_VARIANCE_FLOOR
                )
                for got, ref in ((mu, mu_ref), (a, a_ref), (r, r_ref)):
                    torch.testing.assert_close(got, ref, rtol=0, atol=1e-8)


def test_official_e_step_changes_the_answer():
    # the check above is not vacuous: the assignments move away from uniform and the answer depends on them
    gen = torch.Generator().manual_seed(3)
    inputs = _inputs(2, 12, 3, 4, gen=gen)
    _, a1, r1 = em_routing(*inputs, 1, inverse_temperature=0.05, formulation="official", return_assignments=True)
    _, a3, r3 = em_routing(*inputs, 3, inverse_temperature=0.05, formulation="official", return_assignments=True)
    assert (r3 - 1 / 3).abs().max() > 0.1 and (a3 - a1).abs().max() > 1e-3


def test_official_terms_one_at_a_time():
    # one child, one parent, one iteration: every term of the logit by hand
    v = torch.tensor([[[[0.3, -0.2]]]], dtype=torch.float64)
    act = torch.tensor([[0.8]], dtype=torch.float64)
    mu, a = em_routing(v, act, 0.5, 0.01, 1, inverse_temperature=0.1, formulation="official", eps=1e-5)
    mass = 0.8 + 1e-5
    centre = 0.9 * 0.8 * v[0, 0, 0] / mass  # the previous centre is 0
    var = 5e-4 + 0.8 * (v[0, 0, 0] - centre) ** 2 / mass
    logit = 0.1 * (mass * (-var.log().sum() - 0.5 * 2 * (1 + math.log(2 * math.pi))) - 5000 * 0.01)
    torch.testing.assert_close(mu[0, 0], centre, rtol=0, atol=1e-12)
    torch.testing.assert_close(a[0, 0], torch.sigmoid(logit), rtol=0, atol=1e-12)


def test_official_gradcheck():
    gen = torch.Generator().manual_seed(5)
    inputs = _inputs(2, 5, 3, 4, gen=gen, requires_grad=True)
    with torch.no_grad():
        inputs[1].clamp_(min=0.1)  # keep away from exactly-zero activations (a valid but flat corner)

    def fn(votes, activations, beta_u, beta_a):
        return em_routing(
            votes, activations, beta_u, beta_a, 3, inverse_temperature=[0.01, 0.02, 0.03], formulation="official"
        )

    assert gradcheck(fn, inputs)


def test_official_detached_gradient_is_the_final_m_step_with_constant_assignments():
    # detach_routing: the gradient of the released code's final M-step written out, with the final assignments
    # and the previous centre (the poses of the procedure one iteration shorter) as constants
    gen = torch.Generator().manual_seed(6)
    votes, acts, beta_u, beta_a = _inputs(3, 20, 4, 16, gen=gen, scale=0.3)
    votes.requires_grad_()
    lams, eps, floor = [0.01, 0.02, 0.03], 1e-5, OFFICIAL_VARIANCE_FLOOR
    mu, a, r = em_routing(
        votes,
        acts,
        beta_u,
        beta_a,
        3,
        inverse_temperature=lams,
        formulation="official",
        detach_routing=True,
        return_assignments=True,
    )
    mu_prev, _ = em_routing(
        votes.detach(), acts, beta_u, beta_a, 2, inverse_temperature=lams[:2], formulation="official"
    )
    (g_detached,) = torch.autograd.grad(mu.square().sum() + a.sum(), votes)
    rp = r.detach() * acts.unsqueeze(-1)  # (B, I, J): R' = R a
    mass = rp.sum(1).unsqueeze(-1) + eps  # (B, J, 1)
    centre = 0.9 * torch.einsum("bij,bijh->bjh", rp, votes) / mass + 0.1 * mu_prev
    var = torch.einsum("bij,bijh->bjh", rp, (votes - centre.unsqueeze(1)) ** 2) / mass + floor
    win = mass.squeeze(-1) * (-var.log().sum(-1) - beta_u * 16 * (1 + math.log(2 * math.pi)))
    act = torch.sigmoid(lams[-1] * (win - 5000 * beta_a))
    torch.testing.assert_close(centre, mu, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(act, a, rtol=1e-12, atol=1e-12)
    (g_expected,) = torch.autograd.grad(centre.square().sum() + act.sum(), votes)
    torch.testing.assert_close(g_detached, g_expected, rtol=1e-9, atol=1e-11)
    mu, a = em_routing(votes, acts, beta_u, beta_a, 3, inverse_temperature=lams, formulation="official")
    (g_exact,) = torch.autograd.grad(mu.square().sum() + a.sum(), votes)
    assert torch.isfinite(g_exact).all() and not torch.allclose(g_exact, g_detached)


def test_official_routing_settings():
    conv, cls = EMRouting.official(3, layer="conv"), EMRouting.official(3, layer="class")
    assert conv.inverse_temperatures == pytest.approx(em_inverse_temperatures(3, final=0.01))
    assert cls.inverse_temperatures == pytest.approx(em_inverse_temperatures(3, final=0.0025))
    assert (conv.eps, cls.eps) == (OFFICIAL_MASS_EPS["conv"], OFFICIAL_MASS_EPS["class"]) == (1e-7, 1e-5)
    assert conv.variance_floor == cls.variance_floor == 5e-4
    assert "formulation='official'" in repr(conv)
    with pytest.raises(ValueError, match="layer must be"):
        EMRouting.official(3, layer="primary")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"formulation": "google"}, "formulation must be one of"),
        ({"formulation": "official", "cost_normalization": "mean_std"}, "cost_normalization must be None"),
        ({"variance_floor": 1e-3}, "variance_floor must be None"),
        ({"formulation": "official", "variance_floor": 0.0}, "variance_floor must be None"),
        ({"formulation": "official", "eps": -1.0}, "eps must be"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EMRouting(3, **kwargs)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=match):
        em_routing(*_inputs(1, 3, 2, 4, gen=gen), 3, **kwargs)


def test_official_edge_cases_stay_finite():
    gen = torch.Generator().manual_seed(1)
    votes, acts, bu, ba = _inputs(2, 6, 3, 16, gen=gen)
    for v, a in ((torch.zeros_like(votes), acts), (votes, torch.zeros_like(acts)), (1e4 * votes, acts)):
        mu, act = em_routing(v, a, bu, ba, formulation="official")
        assert torch.isfinite(mu).all() and torch.isfinite(act).all()
    mu, act = em_routing(votes.float().bfloat16(), acts.bfloat16(), bu, ba, formulation="official")
    assert mu.dtype == torch.float32 and torch.isfinite(act).all()
