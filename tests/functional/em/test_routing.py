import pytest
import torch
from torch.autograd import gradcheck

from capsnets.functional import (
    ChildGroups,
    EMRouting,
    em_inverse_temperatures,
    em_routing,
    em_routing_poses,
    grid_child_groups,
    group_softmax,
)
from capsnets.testing import reference_em_routing

from helpers import assert_finite, live_tensors, only_new_objects


def _inputs(batch, children, parents, dim, *, gen, dtype=torch.float64, requires_grad=False):
    votes = torch.randn(batch, children, parents, dim, dtype=dtype, generator=gen)
    activations = torch.rand(batch, children, dtype=dtype, generator=gen)
    activations[torch.rand(batch, children, generator=gen) < 0.25] = 0.0  # some inactive children
    beta_v = torch.randn(parents, dtype=dtype, generator=gen)
    beta_a = torch.randn(parents, dtype=dtype, generator=gen)
    tensors = (votes, activations, beta_v, beta_a)
    return tuple(t.requires_grad_(requires_grad) for t in tensors)


@pytest.mark.parametrize("iterations", [1, 2, 3, 4])
def test_agrees_with_literal_procedure(iterations):
    gen = torch.Generator().manual_seed(iterations)
    for dim in (4, 16):
        for _ in range(2):
            batch, parents = (int(x) for x in torch.randint(1, 4, (2,), generator=gen))
            parents += int(torch.randint(0, 3, (), generator=gen))  # J in 1..5
            children = int(torch.randint(1, 13, (), generator=gen))
            inputs = _inputs(batch, children, parents, dim, gen=gen)
            # lambda large enough that the E-step matters (the default schedule keeps a_j near 1/2)
            lambdas = [0.05 * (t + 1) for t in range(iterations)]
            mu, a, r = em_routing(*inputs, iterations, inverse_temperature=lambdas, return_assignments=True)
            mu_ref, a_ref, r_ref = reference_em_routing(*inputs, iterations, lambdas, 1e-6)
            torch.testing.assert_close(mu, mu_ref, rtol=0, atol=1e-10)
            torch.testing.assert_close(a, a_ref, rtol=0, atol=1e-10)
            torch.testing.assert_close(r, r_ref, rtol=0, atol=1e-10)


def test_default_schedule_agrees_with_literal_procedure():
    gen = torch.Generator().manual_seed(7)
    inputs = _inputs(2, 9, 4, 16, gen=gen)
    mu, a, r = em_routing(*inputs, 3, return_assignments=True, eps=1e-5)
    mu_ref, a_ref, r_ref = reference_em_routing(*inputs, 3, em_inverse_temperatures(3), 1e-5)
    for got, ref in ((mu, mu_ref), (a, a_ref), (r, r_ref)):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-10)


def test_default_schedule_values():
    assert em_inverse_temperatures(3) == pytest.approx([0.01 * (1 - 0.95 ** (t + 1)) for t in range(3)])


def test_assignments_sum_to_one_and_activations_in_unit_interval():
    gen = torch.Generator().manual_seed(0)
    votes, activations, beta_v, beta_a = _inputs(3, 30, 6, 16, gen=gen, dtype=torch.float32)
    for routing in (EMRouting(3), EMRouting(3, 0.01), EMRouting(2, cost_normalization="mean_std")):
        poses, a, r = routing(votes, activations, beta_v, beta_a, return_assignments=True)
        assert poses.shape == (3, 6, 16) and a.shape == (3, 6) and r.shape == (3, 30, 6)
        torch.testing.assert_close(r.sum(-1), torch.ones(3, 30))
        assert (r >= 0).all() and (a > 0).all() and (a < 1).all()


def test_gradcheck():
    gen = torch.Generator().manual_seed(1)
    inputs = _inputs(2, 5, 3, 4, gen=gen, requires_grad=True)
    with torch.no_grad():
        inputs[1].clamp_(min=0.1)  # keep away from exactly-zero activations (a valid but flat corner)

    def fn(votes, activations, beta_v, beta_a):
        return em_routing(votes, activations, beta_v, beta_a, 3, inverse_temperature=[0.1, 0.2, 0.3])

    assert gradcheck(fn, inputs)


@pytest.mark.parametrize("norm", ["mean_std", "mass"])
def test_gradcheck_with_cost_normalization(norm):
    gen = torch.Generator().manual_seed(2)
    inputs = _inputs(2, 5, 3, 4, gen=gen, requires_grad=True)
    with torch.no_grad():
        inputs[1].clamp_(min=0.1)

    def fn(votes, activations, beta_v, beta_a):
        return em_routing(votes, activations, beta_v, beta_a, 3, inverse_temperature=1.0, cost_normalization=norm)

    assert gradcheck(fn, inputs)


def test_cost_normalization_standardises_the_cost_across_parents():
    # Recompute the final M-step by hand from the returned assignments.
    gen = torch.Generator().manual_seed(3)
    votes, activations, beta_v, beta_a = _inputs(2, 10, 4, 16, gen=gen)
    eps, lam = 1e-6, 0.7
    for norm in (None, "mean_std", "mass"):
        _, a, r = em_routing(
            votes,
            activations,
            beta_v,
            beta_a,
            2,
            inverse_temperature=lam,
            return_assignments=True,
            eps=eps,
            cost_normalization=norm,
        )
        rp = r * activations.unsqueeze(-1)  # (B, I, J)
        mass = rp.sum(1)  # (B, J)
        mu = torch.einsum("bij,bijh->bjh", rp, votes) / (mass + eps).unsqueeze(-1)
        var = torch.einsum("bij,bijh->bjh", rp, (votes - mu.unsqueeze(1)) ** 2) / (mass + eps).unsqueeze(-1)
        cost = ((beta_v.unsqueeze(-1) + 0.5 * (var + eps).log()) * mass.unsqueeze(-1)).sum(-1)
        if norm == "mean_std":
            centred = cost - cost.mean(1, keepdim=True)
            cost = centred / (cost.var(1, unbiased=False, keepdim=True) + eps).sqrt()
        elif norm == "mass":  # per child and pose component of a uniform assignment: J / (I H)
            cost = cost * 4 / (10 * 16)
        torch.testing.assert_close(a, torch.sigmoid(lam * (beta_a - cost)), rtol=0, atol=1e-10)


def test_mass_normalization_is_a_rescaled_inverse_temperature_and_beta_a():
    # lambda (beta_a - k cost) = (lambda k) (beta_a / k - cost) with k = J / (I H): the same routing as the
    # paper's with inverse temperature lambda k and beta_a / k, for every iteration.
    gen = torch.Generator().manual_seed(5)
    votes, activations, beta_v, beta_a = _inputs(3, 12, 5, 16, gen=gen)
    k, lambdas = 5 / (12 * 16), [0.5, 1.0, 1.5]
    got = em_routing(
        votes,
        activations,
        beta_v,
        beta_a,
        3,
        inverse_temperature=lambdas,
        cost_normalization="mass",
        return_assignments=True,
    )
    want = em_routing(
        votes, activations, beta_v, beta_a / k, 3, inverse_temperature=[x * k for x in lambdas], return_assignments=True
    )
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)


def _forward_backward(votes, activations, beta_v, beta_a, **kwargs):
    leaves = [t.detach().clone().requires_grad_() for t in (votes, activations, beta_v, beta_a)]
    poses, a, r = em_routing(*leaves, 3, return_assignments=True, **kwargs)
    for name, t in (("poses", poses), ("activations", a), ("assignments", r)):
        assert_finite(t, name)
    loss = poses.float().square().mean() + a.float().sum() + (r.float() * torch.arange(r.shape[-1])).sum()
    loss.backward()
    for name, t in zip(("votes", "activations", "beta_v", "beta_a"), leaves):
        assert_finite(t.grad, f"grad of {name}")
    return poses, a, r


@pytest.mark.parametrize("lam", [None, 1.0])
def test_edge_cases_are_finite(lam):
    gen = torch.Generator().manual_seed(4)
    votes, activations, beta_v, beta_a = _inputs(2, 18, 5, 16, gen=gen, dtype=torch.float32)
    kw = {"inverse_temperature": lam}
    # all children inactive: no mass reaches any parent
    poses, a, _ = _forward_backward(votes, torch.zeros_like(activations), beta_v, beta_a, **kw)
    assert (poses == 0).all() and torch.allclose(
        a, torch.sigmoid(em_inverse_temperatures(3)[-1] * beta_a) if lam is None else torch.sigmoid(beta_a)
    )
    # identical votes: zero variance everywhere
    same = votes[:, :1].expand_as(votes).contiguous()
    poses, _, _ = _forward_backward(same, activations.clamp(min=0.5), beta_v, beta_a, **kw)
    torch.testing.assert_close(poses, same[:, 0], rtol=1e-5, atol=1e-5)
    # a single active child
    one = torch.zeros_like(activations)
    one[:, 3] = 1.0
    _forward_backward(votes, one, beta_v, beta_a, **kw)
    # large votes
    for scale in (1e3, 1e4):
        _forward_backward(votes * scale, activations, beta_v, beta_a, **kw)
        _forward_backward(votes + scale, activations, beta_v, beta_a, **kw)


def test_bf16_autocast_computes_in_float32():
    gen = torch.Generator().manual_seed(5)
    votes, activations, beta_v, beta_a = _inputs(2, 18, 5, 16, gen=gen, dtype=torch.float32)
    expected = em_routing(votes, activations, beta_v, beta_a, 3, inverse_temperature=0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        poses, a, r = _forward_backward(votes, activations, beta_v, beta_a, inverse_temperature=0.5)
        low = _forward_backward(votes.bfloat16(), activations.bfloat16(), beta_v, beta_a, inverse_temperature=0.5)
    assert poses.dtype == a.dtype == r.dtype == torch.float32 and low[0].dtype == torch.float32
    torch.testing.assert_close(poses, expected[0])  # autocast did not lower the routing's precision
    torch.testing.assert_close(a, expected[1])
    torch.testing.assert_close(low[0], expected[0], rtol=0.05, atol=0.05)  # bf16-rounded inputs only


def test_inverse_temperature_scalar_equals_constant_list():
    gen = torch.Generator().manual_seed(6)
    inputs = _inputs(2, 7, 3, 16, gen=gen)
    by_scalar = em_routing(*inputs, 3, inverse_temperature=0.3, return_assignments=True)
    by_list = em_routing(*inputs, 3, inverse_temperature=[0.3, 0.3, 0.3], return_assignments=True)
    by_tensor = EMRouting(3, torch.tensor(0.3, dtype=torch.float64))(*inputs, return_assignments=True)
    for x, y, z in zip(by_scalar, by_list, by_tensor):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
        torch.testing.assert_close(x, z, rtol=0, atol=0)
    default = em_routing(*inputs, 3)
    explicit = em_routing(*inputs, 3, inverse_temperature=em_inverse_temperatures(3))
    torch.testing.assert_close(default, explicit, rtol=0, atol=0)


def test_scalar_betas_broadcast():
    gen = torch.Generator().manual_seed(8)
    votes, activations, _, _ = _inputs(2, 7, 3, 4, gen=gen)
    got = em_routing(votes, activations, torch.tensor(0.5), 1.5, 2, inverse_temperature=0.2)
    want = em_routing(
        votes,
        activations,
        torch.full((3,), 0.5, dtype=torch.float64),
        torch.full((3,), 1.5, dtype=torch.float64),
        2,
        inverse_temperature=0.2,
    )
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_bad_inputs():
    v, a, bv, ba = torch.randn(2, 5, 3, 16), torch.rand(2, 5), torch.zeros(3), torch.zeros(3)
    with pytest.raises(ValueError, match="inverse_temperature.*length"):
        em_routing(v, a, bv, ba, 3, inverse_temperature=[0.1, 0.2])
    with pytest.raises(ValueError, match="inverse_temperature"):
        EMRouting(2, [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=r"votes .*\(B, I, J, H\).*\(2, 5, 3\)"):
        em_routing(v[..., 0], a, bv, ba)
    with pytest.raises(ValueError, match=r"activations .*\(2, 5\).*\(2, 4\)"):
        em_routing(v, a[:, :4], bv, ba)
    with pytest.raises(ValueError, match=r"activations .*\(2, 5, 1\)"):
        em_routing(v, a.unsqueeze(-1), bv, ba)
    with pytest.raises(ValueError, match=r"beta_v .*\(3,\).*\(4,\)"):
        em_routing(v, a, torch.zeros(4), ba)
    with pytest.raises(ValueError, match=r"beta_a .*\(3, 1\)"):
        em_routing(v, a, bv, torch.zeros(3, 1))
    with pytest.raises(ValueError, match="iterations"):
        em_routing(v, a, bv, ba, 0)
    with pytest.raises(ValueError, match="iterations"):
        EMRouting(0)
    with pytest.raises(ValueError, match="eps"):
        em_routing(v, a, bv, ba, eps=0.0)
    with pytest.raises(ValueError, match="cost_normalization"):
        EMRouting(cost_normalization="layer")


def test_repr():
    assert "iterations=3" in repr(EMRouting()) and "cost_normalization=None" in repr(EMRouting())


def test_detach_routing_same_forward_and_constant_assignment_gradient():
    from capsnets.functional import em_routing

    gen = torch.Generator().manual_seed(3)
    votes = torch.randn(2, 7, 3, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    acts = torch.rand(2, 7, dtype=torch.float64, generator=gen)
    beta_v, beta_a = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    lams = [0.5, 0.8, 1.0]
    pose, act, r = em_routing(votes, acts, beta_v, beta_a, 3, inverse_temperature=lams, return_assignments=True)
    pose_d, act_d = em_routing(votes, acts, beta_v, beta_a, 3, inverse_temperature=lams, detach_routing=True)
    torch.testing.assert_close(pose_d, pose)
    torch.testing.assert_close(act_d, act)
    # detached: the gradient of the final M-step written out with the final assignments as constants
    (g_detached,) = torch.autograd.grad(pose_d.sum() + act_d.sum(), votes)
    eps = 1e-6
    rp = r.detach() * acts.unsqueeze(-1)  # (B, I, J): R' = R * a
    mass = rp.sum(1).unsqueeze(-1)  # (B, J, 1)
    mu = torch.einsum("bij,bijh->bjh", rp, votes) / (mass + eps)
    var = torch.einsum("bij,bijh->bjh", rp, (votes - mu.unsqueeze(1)) ** 2) / (mass + eps) + eps
    cost = ((beta_v.unsqueeze(-1) + 0.5 * var.log()) * mass).sum(-1)
    a = torch.sigmoid(lams[-1] * (beta_a - cost))
    (g_expected,) = torch.autograd.grad(mu.sum() + a.sum(), votes)
    torch.testing.assert_close(g_detached, g_expected)
    (g_full,) = torch.autograd.grad(pose.sum() + act.sum(), votes)
    assert not torch.allclose(g_detached, g_full)
    assert "detach_routing=True" in repr(EMRouting(3, detach_routing=True))


@pytest.mark.parametrize("detach", [False, True])
def test_training_steps_leave_no_tensors_behind(detach):
    # A reference cycle through the autograd graph (which the garbage collector cannot break) once kept
    # every training step's routing tensors alive: matrix_capsnet ran out of 80 GB of GPU memory within
    # a few steps. Count the tensors Python can still see after each step.
    def step():
        votes = torch.randn(2, 12, 3, 16, requires_grad=True)
        activations = torch.rand(2, 12, requires_grad=True)
        beta_v, beta_a = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
        mu, a = em_routing(votes, activations, beta_v, beta_a, 3, detach_routing=detach)
        (mu.square().sum() + a.sum()).backward()
        assert torch.isfinite(votes.grad).all()

    with only_new_objects():
        step()
        before = live_tensors()
        for _ in range(3):
            step()
        assert live_tensors() == before


def _random_groups(problems, children, count, gen):
    index = torch.randint(0, count, (problems, children), generator=gen)
    index.view(-1)[:count] = torch.arange(count)  # every group has a slot
    return ChildGroups(index, count)


def test_group_softmax_normalises_over_every_slot_of_a_child():
    gen = torch.Generator().manual_seed(11)
    logits = 30 * torch.randn(4, 3, 5, dtype=torch.float64, generator=gen)  # wide range: needs the log space
    groups = _random_groups(4, 5, 7, gen)
    r = group_softmax(logits, groups)
    totals = torch.zeros(7, dtype=torch.float64).index_add(0, groups.index.flatten(), r.sum(1).flatten())
    torch.testing.assert_close(totals, torch.ones(7, dtype=torch.float64))
    for g in range(7):  # within a child, proportional to exp(logits)
        slots = (groups.index == g).nonzero()
        values = torch.cat([logits[n, :, i] for n, i in slots])
        torch.testing.assert_close(torch.cat([r[n, :, i] for n, i in slots]), torch.softmax(values, 0))
    singletons = ChildGroups(torch.arange(20).view(4, 5), 20)
    torch.testing.assert_close(group_softmax(logits, singletons), torch.softmax(logits, dim=1))


def test_singleton_child_groups_change_nothing():
    gen = torch.Generator().manual_seed(12)
    inputs = _inputs(3, 6, 4, 16, gen=gen)
    singletons = ChildGroups(torch.arange(18).view(3, 6), 18)
    plain = em_routing(*inputs, 3, inverse_temperature=0.1, return_assignments=True)
    grouped = em_routing(*inputs, 3, inverse_temperature=0.1, return_assignments=True, child_groups=singletons)
    for p, g in zip(plain, grouped):
        torch.testing.assert_close(g, p, rtol=0, atol=1e-12)


def test_gradcheck_with_child_groups():
    gen = torch.Generator().manual_seed(13)
    inputs = _inputs(3, 4, 3, 4, gen=gen, requires_grad=True)
    with torch.no_grad():
        inputs[1].clamp_(min=0.1)
    groups = _random_groups(3, 4, 5, gen)

    def fn(votes, activations, beta_v, beta_a):
        return em_routing(
            votes, activations, beta_v, beta_a, 3, inverse_temperature=[0.1, 0.2, 0.3], child_groups=groups
        )

    assert gradcheck(fn, inputs)


def test_grid_child_groups_count_the_receptive_fields_of_each_child():
    groups = grid_child_groups(2, 3, 6, 6, 3, stride=2, padding=1)
    # per example: 3 * 36 capsules and one group of its padding slots; the examples' problems are two runs
    assert groups.index.shape == (2 * 3 * 3, 3 * 9) and groups.count == 2 * (3 * 36 + 1) and groups.blocks == 2
    copies = torch.bincount(groups.index.flatten(), minlength=groups.count).view(2, 3 * 36 + 1)
    per_axis = torch.tensor([1, 2, 1, 2, 1, 1])  # K=3, stride 2, padding 1 over 6 cells: fields covering each
    expected = (per_axis.view(-1, 1) * per_axis.view(1, -1)).flatten().repeat(3)  # (T * H * W,)
    torch.testing.assert_close(copies[:, :-1], expected.expand(2, -1))
    assert (copies[:, -1] == 9 * 27 - expected.sum()).all()  # the padding slots
    run = groups.index.view(2, 9 * 27) // (3 * 36 + 1)  # each example's slots stay in its own groups
    assert (run == torch.arange(2).view(2, 1)).all()


def test_bad_child_groups_are_refused():
    gen = torch.Generator().manual_seed(14)
    inputs = _inputs(2, 5, 3, 4, gen=gen)
    with pytest.raises(ValueError, match=r"child_groups must be a ChildGroups whose index has the votes' \(B, I\)"):
        em_routing(*inputs, child_groups=ChildGroups(torch.zeros(2, 4, dtype=torch.long), 1))
    with pytest.raises(ValueError, match="int64"):
        ChildGroups(torch.zeros(2, 5), 1)
    for blocks in (0, 3, True, 2.0):  # 3 divides neither N = 2 nor count = 4
        with pytest.raises(ValueError, match="ChildGroups.blocks must be a positive int dividing"):
            ChildGroups(torch.zeros(2, 5, dtype=torch.long), 4, blocks=blocks)


@pytest.mark.parametrize("kind", ["votes", "poses"])
def test_a_program_of_em_routing_is_saved_loaded_and_agrees(tmp_path, kind):
    # The routing computes outside autocast only where autocast is on: an autocast region in the traced graph
    # could not be written by torch.export.save (capsnets export --format torch_export of a matrix network).
    gen = torch.Generator().manual_seed(0)
    poses, weight = torch.randn(2, 6, 4, 4, generator=gen), 0.3 * torch.randn(6, 3, 4, 4, generator=gen)
    votes, activations = torch.randn(2, 6, 3, 16, generator=gen), torch.rand(2, 6, generator=gen)

    class Route(torch.nn.Module):
        def forward(self, x, a):
            if kind == "votes":
                return em_routing(x, a, 0.1, 0.2, 2)[:2]
            return em_routing_poses(x, weight, a, 0.1, 0.2, 2)[:2]

    inputs = (votes if kind == "votes" else poses, activations)
    torch.export.save(torch.export.export(Route(), inputs, strict=False), tmp_path / "route.pt2")
    loaded = torch.export.load(tmp_path / "route.pt2").module()
    for got, expected in zip(loaded(*inputs), Route()(*inputs)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast, still computed in float32
        assert all(out.dtype == torch.float32 for out in Route()(*inputs))
