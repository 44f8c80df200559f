"""The fused CPU kernel of EM routing (capsnets.functional.em.kernel) against the float64 references and the
PyTorch path: forward, gradients, both layouts, both formulations, edge cases, training, and the switch."""

import dataclasses
import unittest.mock
import warnings

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck

from capsnets import create_model
from capsnets.functional import ChildGroups, EMRouting, em_routing, em_routing_poses, grid_child_groups
from capsnets.functional.em import OFFICIAL_VARIANCE_FLOOR
from capsnets.functional.em import kernel as em_kernel
from capsnets.functional.patches import gather_patches, patch_index
from capsnets.layers import ClassMatrixCapsules, ConvMatrixCapsules, MatrixCapsules
from capsnets.testing import reference_conv_em_routing, reference_em_routing

from helpers import em_poses, em_votes, only_new_objects


@pytest.fixture
def cpp(monkeypatch):
    """Force the kernel: a test that uses it fails (does not skip) where it cannot be built or loaded."""
    monkeypatch.setenv(em_kernel.ENV_VAR, "cpp")
    assert em_kernel.load() is not None, f"the fused EM kernel did not build or load: {em_kernel.load_error()}"


def test_the_kernel_is_used_where_it_applies(cpp):
    with unittest.mock.patch.object(em_kernel, "load", wraps=em_kernel.load) as load:
        em_routing_poses(*em_poses(2, 6, 6, 3, gen=torch.Generator().manual_seed(0)))
        assert load.call_count == 1
        em_routing_poses(*em_poses(2, 6, 6, 3, gen=torch.Generator().manual_seed(0), dtype=torch.bfloat16))
        assert load.call_count == 1  # half precision: the PyTorch path


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_votes_stats_against_the_votes(cpp, dtype):
    """The origin and scale of every routing problem: the w0-weighted sum of the votes and the largest |vote|,
    computed from poses and transforms (J = 5, 12 and 4: chunks of 16 lanes and the 4-lane remainder), with and
    without coordinates; a NaN vote makes its problem's largest |vote| NaN."""
    kernel = em_kernel.load()
    gen = torch.Generator().manual_seed(5)
    for children, child_types, parents, coordinates in ((12, 12, 5, False), (12, 3, 12, True), (1, 1, 4, True)):
        poses, weight, acts, _, _ = em_poses(3, children, child_types, parents, gen=gen, dtype=dtype)
        coords = torch.rand(children, 2, generator=gen, dtype=dtype) if coordinates else None
        w0 = acts / (acts.sum(-1, keepdim=True) + 1e-6)
        votes = em_votes(poses.double(), weight.double(), None if coords is None else coords.double())
        mean, top = kernel.votes_stats(
            poses.flatten(-2).contiguous(),
            weight.flatten(-2).contiguous(),
            torch.empty(0, dtype=dtype) if coords is None else coords,
            w0,
        )
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(mean.double(), (w0.double()[..., None, None] * votes).sum(1), rtol=tol, atol=tol)
        torch.testing.assert_close(top.double(), votes.abs().flatten(1).amax(1), rtol=tol, atol=tol)
    poses[1, 0, 2, 3] = float("nan")
    _, top = kernel.votes_stats(poses.flatten(-2).contiguous(), weight.flatten(-2).contiguous(), coords, w0)
    assert top[1].isnan() and not top[[0, 2]].isnan().any()


@pytest.mark.parametrize("formulation", ["paper", "official"])
@pytest.mark.parametrize("detach", [False, True])
@pytest.mark.parametrize("coordinates", [False, True])
def test_fully_connected_layout_agrees_with_the_literal_reference(cpp, formulation, detach, coordinates):
    gen = torch.Generator().manual_seed(1)
    for children, child_types in ((12, 12), (12, 3), (1, 1)):  # per-child weights, shared by type, one child
        poses, weight, acts, beta_v, beta_a = em_poses(2, children, child_types, 3, gen=gen, scale=0.5)
        coords = torch.rand(children, 2, generator=gen, dtype=torch.float64) if coordinates else None
        lambdas = [0.01, 0.02, 0.03] if formulation == "official" else [0.5, 1.0, 2.0]
        floor = OFFICIAL_VARIANCE_FLOOR if formulation == "official" else None
        for eps in (1e-7, 1e-5):
            mu, a, r = em_routing_poses(
                poses,
                weight,
                acts,
                beta_v,
                beta_a,
                3,
                coordinates=coords,
                inverse_temperature=lambdas,
                return_assignments=True,
                eps=eps,
                detach_routing=detach,
                formulation=formulation,
            )
            ref = reference_em_routing(
                em_votes(poses, weight, coords), acts, beta_v, beta_a, 3, lambdas, eps, variance_floor=floor
            )
            for got, want in zip((mu, a, r), ref):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-8)


@pytest.mark.parametrize("formulation", ["paper", "official"])
@pytest.mark.parametrize("scope", ["position", "all_parents", "per_type"])
def test_convolutional_layout_agrees_with_the_literal_reference(cpp, formulation, scope):
    gen = torch.Generator().manual_seed(2)
    caps = MatrixCapsules(
        torch.randn(2, 2, 5, 5, 4, 4, generator=gen, dtype=torch.float64),
        torch.rand(2, 2, 5, 5, generator=gen, dtype=torch.float64),
    )
    routing = EMRouting.official(3) if formulation == "official" else EMRouting(3, [0.2, 0.5, 1.0])
    torch.manual_seed(0)
    layer = ConvMatrixCapsules(2, 3, stride=1, padding=1, routing=routing, assignment_scope=scope, dtype=torch.float64)
    with torch.no_grad():
        layer.beta_v.uniform_(0.0, 1.0)
        layer.beta_a.uniform_(-0.01, 0.01)
    with torch.no_grad():  # without gradients every iteration but the last runs inside the kernel
        head = layer(caps)
    out = layer(caps)  # with gradients (exact): only the vote products run in the kernel
    torch.testing.assert_close(head.pose, out.pose.detach(), rtol=0, atol=1e-10)
    torch.testing.assert_close(head.activation, out.activation.detach(), rtol=0, atol=1e-10)
    ref_pose, ref_act = reference_conv_em_routing(
        caps.pose,
        caps.activation,
        layer.weight.detach(),
        layer.beta_v.detach(),
        layer.beta_a.detach(),
        stride=1,
        padding=1,
        inverse_temperatures=list(routing.inverse_temperature),
        eps=routing.eps,
        scope=scope,
        variance_floor=routing.variance_floor,
    )
    torch.testing.assert_close(out.pose.flatten(4), ref_pose, rtol=0, atol=1e-8)
    torch.testing.assert_close(out.activation, ref_act, rtol=0, atol=1e-8)


def _fc_inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    poses, weight, acts, beta_v, beta_a = em_poses(2, 6, 3, 3, gen=gen, scale=0.5)
    coords = torch.rand(6, 2, generator=gen, dtype=torch.float64)
    return (poses, weight, acts.clamp_min(0.05), beta_v, beta_a), coords


def _lambdas(formulation):
    return [0.05, 0.1, 0.15] if formulation == "official" else [0.3, 0.6, 1.0]


@pytest.mark.parametrize("formulation", ["paper", "official"])
def test_gradcheck(cpp, formulation):
    inputs, coords = _fc_inputs(3)

    def route(p, w, a, bv, ba):
        return em_routing_poses(
            p, w, a, bv, ba, 3, coordinates=coords, inverse_temperature=_lambdas(formulation), formulation=formulation
        )

    assert gradcheck(route, tuple(t.clone().requires_grad_() for t in inputs), eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("scope", ["all_parents", "per_type"])
def test_gradcheck_of_a_convolutional_layer_with_child_groups(cpp, scope):
    # exact gradients through every iteration and the groups' normalisation (the hand-written backward)
    gen = torch.Generator().manual_seed(14)
    torch.manual_seed(0)
    layer = ConvMatrixCapsules(
        2,
        3,
        stride=1,
        routing=EMRouting.official(3, final_inverse_temperature=0.2),
        assignment_scope=scope,
        dtype=torch.float64,
    )
    pose = torch.randn(1, 2, 4, 4, 4, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    act = (0.1 + 0.8 * torch.rand(1, 2, 4, 4, generator=gen, dtype=torch.float64)).requires_grad_()

    def run(p, a):
        out = layer(MatrixCapsules(p, a))
        return out.pose, out.activation

    assert gradcheck(run, (pose, act), eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("scope", ["all_parents", "per_type"])
def test_child_groups_by_runs_of_problems_match_the_whole_batch_at_once(cpp, scope):
    # grid_child_groups declares one run of problems per example (blocks = B): the kernel then routes and
    # normalises example by example; with blocks = 1 it normalises the whole batch at once
    gen = torch.Generator().manual_seed(15)
    batch, types, side = 3, 2, 5
    poses, weight, acts, beta_v, beta_a = em_poses(batch, types * side * side, types * 9, 4, gen=gen)
    grid = MatrixCapsules(poses.view(batch, types, side, side, 4, 4), acts.view(batch, types, side, side))
    index = patch_index(types, side, side, 3, 2, 1)  # stride 2, padding 1: 3x3 positions, padding slots
    patch_poses = gather_patches(grid.pose.reshape(batch, -1, 16), index, 1).view(-1, types * 9, 4, 4)
    patch_acts = gather_patches(grid.activation.reshape(batch, -1), index, 1)
    runs = grid_child_groups(batch, types, side, side, 3, 2, 1, normalize=scope)
    assert runs.blocks == batch
    whole = dataclasses.replace(runs, blocks=1)
    results = {}
    for name, groups in (("runs", runs), ("whole", whole)):
        leaves = [t.clone().requires_grad_() for t in (patch_poses, weight, patch_acts, beta_v, beta_a)]
        mu, a, r = em_routing_poses(
            *leaves,
            3,
            inverse_temperature=[0.01, 0.02, 0.2],
            formulation="official",
            child_groups=groups,
            return_assignments=True,
        )
        (mu.square().sum() + a.sum() + (r * r.detach()).sum()).backward()
        results[name] = [mu, a, r] + [t.grad for t in leaves]
    for got, want in zip(results["runs"], results["whole"]):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # a run declaration the index does not keep is refused (the examples' problems swapped)
    swapped = ChildGroups(
        runs.index.view(batch, -1, types * 9).flip(0).reshape(runs.index.shape), runs.count, scope, blocks=batch
    )
    with pytest.raises(RuntimeError, match="outside its run"):
        em_routing_poses(
            patch_poses, weight, patch_acts, beta_v, beta_a, 3, formulation="official", child_groups=swapped
        )


@pytest.mark.parametrize("formulation", ["paper", "official"])
def test_detached_gradients_match_the_pytorch_path(monkeypatch, formulation):
    # detach_routing's gradient is not the derivative (the assignments act as constants), so no gradcheck:
    # the same float64 gradients as the PyTorch path, whose detached gradients the em_routing tests check
    inputs, coords = _fc_inputs(12)
    grads = {}
    for path in ("torch", "cpp"):
        monkeypatch.setenv(em_kernel.ENV_VAR, path)
        leaves = [t.clone().requires_grad_() for t in inputs]
        mu, a = em_routing_poses(
            *leaves,
            3,
            coordinates=coords,
            inverse_temperature=_lambdas(formulation),
            formulation=formulation,
            detach_routing=True,
        )
        (mu.square().sum() + a.sum()).backward()
        grads[path] = [t.grad for t in leaves]
    for got, want in zip(grads["cpp"], grads["torch"]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("scope", ["position", "all_parents", "per_type"])
@pytest.mark.parametrize("detach", [False, True])
def test_float32_gradients_match_the_pytorch_path_in_float64(cpp, monkeypatch, scope, detach):
    # a convolutional layer with the released code's routing, as in matrix_capsnet: float32 kernel gradients
    # against the PyTorch path's float64 gradients (which the tests of em_routing check by gradcheck)
    gen = torch.Generator().manual_seed(4)
    pose = torch.randn(2, 4, 6, 6, 4, 4, generator=gen, dtype=torch.float64)
    act = torch.rand(2, 4, 6, 6, generator=gen, dtype=torch.float64)
    grads = {}
    for path, dtype in (("torch", torch.float64), ("cpp", torch.float32)):
        monkeypatch.setenv(em_kernel.ENV_VAR, path)
        torch.manual_seed(0)
        layer = ConvMatrixCapsules(
            4,
            5,
            stride=1,
            routing=EMRouting.official(3, detach_routing=detach),
            assignment_scope=scope,
            dtype=torch.float64,
        ).to(dtype)
        p = pose.to(dtype).detach().clone().requires_grad_()
        a = act.to(dtype).detach().clone().requires_grad_()
        out = layer(MatrixCapsules(p, a))
        probe = torch.randn(out.pose.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        loss = (out.pose * probe.to(dtype)).sum() + out.activation.sum() * 3
        loss.backward()
        grads[path] = [
            t.double()
            for t in (out.pose, out.activation, p.grad, a.grad, layer.weight.grad, layer.beta_v.grad, layer.beta_a.grad)
        ]
    for got, want in zip(grads["cpp"], grads["torch"]):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4 * want.abs().max().item())


def test_class_layer_with_coordinate_addition_matches_the_pytorch_path(cpp, monkeypatch):
    gen = torch.Generator().manual_seed(6)
    caps = MatrixCapsules(torch.randn(3, 4, 3, 3, 4, 4, generator=gen), torch.rand(3, 4, 3, 3, generator=gen))
    outs = {}
    for path in ("torch", "cpp"):
        monkeypatch.setenv(em_kernel.ENV_VAR, path)
        torch.manual_seed(0)
        layer = ClassMatrixCapsules(4, 5, routing=EMRouting.official(3, layer="class"))
        pose = caps.pose.clone().requires_grad_()
        out = layer(MatrixCapsules(pose, caps.activation))
        (out.pose.sum() + 10 * out.activation.sum()).backward()
        outs[path] = (out.pose, out.activation, pose.grad, layer.weight.grad, layer.beta_a.grad)
    for got, want in zip(outs["cpp"], outs["torch"]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["zero_activations", "identical_votes", "huge_votes"])
def test_edge_cases_match_the_pytorch_path(cpp, monkeypatch, case):
    gen = torch.Generator().manual_seed(7)
    poses, weight, acts, beta_v, beta_a = em_poses(3, 8, 8, 4, gen=gen, dtype=torch.float32)
    if case == "zero_activations":
        acts = torch.zeros_like(acts)
    elif case == "identical_votes":
        poses = poses[:, :1].expand_as(poses).contiguous()
        weight = weight[:1].expand_as(weight).contiguous()
    else:
        poses = poses * 1e18  # votes beyond the float32 overflow bound of the squares: rescaled
    results = {}
    for path in ("torch", "cpp"):
        monkeypatch.setenv(em_kernel.ENV_VAR, path)
        leaves = [t.clone().requires_grad_() for t in (poses, weight, acts, beta_v, beta_a)]
        mu, a = em_routing_poses(*leaves, formulation="official")
        ((mu / mu.abs().max().clamp_min(1)).sum() + a.sum()).backward()
        results[path] = [mu, a] + [t.grad for t in leaves]
    for got, want in zip(results["cpp"], results["torch"]):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-3, atol=2e-4 * max(1.0, want.abs().max().item()))


@pytest.mark.parametrize("case", ["zero_activations", "identical_votes", "huge_votes", "tiny_variances"])
def test_convolutional_edge_cases_match_the_pytorch_path(cpp, monkeypatch, case):
    # 36 children per position and 5 parent types: the child groups' sums and the log variances run through the
    # kernel's 16-lane exp and log (and their scalar ends), with extreme logits
    gen = torch.Generator().manual_seed(12)
    pose = torch.randn(2, 4, 5, 5, 4, 4, generator=gen)
    act = torch.rand(2, 4, 5, 5, generator=gen)
    if case == "zero_activations":
        act = torch.zeros_like(act)
    elif case == "identical_votes":
        pose = pose[:, :1, :1, :1].expand_as(pose).contiguous()
    elif case == "huge_votes":
        pose = pose * 1e18
    results = {}
    for path in ("torch", "cpp"):
        monkeypatch.setenv(em_kernel.ENV_VAR, path)
        torch.manual_seed(0)
        layer = ConvMatrixCapsules(4, 5, stride=1, routing=EMRouting.official(3), assignment_scope="per_type")
        if case == "identical_votes":
            with torch.no_grad():
                layer.weight.copy_(layer.weight[:1, :1].expand_as(layer.weight))
        if case == "tiny_variances":  # votes close to their centres: logits of size ~1e5, most exps underflow
            with torch.no_grad():
                layer.weight.mul_(1e-3)
        p, a = pose.clone().requires_grad_(), act.clone().requires_grad_()
        out = layer(MatrixCapsules(p, a))
        ((out.pose / out.pose.abs().max().clamp_min(1)).sum() + out.activation.sum()).backward()
        results[path] = [out.pose, out.activation, p.grad, a.grad, layer.weight.grad]
    for got, want in zip(results["cpp"], results["torch"]):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-3, atol=2e-4 * max(1.0, want.abs().max().item()))


def test_training_steps_give_the_same_losses(monkeypatch):
    x = torch.randn(8, 1, 28, 28, generator=torch.Generator().manual_seed(8))
    y = torch.arange(8) % 10
    losses = {}
    for path in ("torch", "cpp"):
        monkeypatch.setenv(em_kernel.ENV_VAR, path)
        torch.manual_seed(0)
        model = create_model("matrix_capsnet_small", num_classes=10, input_size=(1, 28, 28))
        opt = torch.optim.Adam(model.parameters(), 1e-2)
        losses[path] = []
        for _ in range(4):
            loss = torch.nn.functional.cross_entropy(model(x).scores * 10, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[path].append(loss.item())
    assert losses["cpp"] == pytest.approx(losses["torch"], rel=1e-4)
    assert losses["cpp"][-1] != losses["cpp"][0]  # the steps did change the model


@given(
    st.sampled_from([("paper", None), ("paper", "mass"), ("official", None)]),
    st.booleans(),
    st.integers(1, 3),
    st.integers(1, 33),
    st.integers(1, 20),
    st.integers(1, 6),
    st.booleans(),
    st.integers(0, 2**16),
)
@settings(max_examples=40, deadline=None, derandomize=True, database=None)
def test_the_one_pass_backward_equals_the_backward_step_by_step(
    formulation_and_normalization, detach, iterations, problems, children, parents, per_child_weights, seed
):
    # without child groups the kernel differentiates in one pass over the routing problems (backward_fused, each
    # problem's votes made once); the same backward's steps, each over all problems in turn, are its reference
    formulation, cost_normalization = formulation_and_normalization
    assert em_kernel.load() is not None, f"the fused EM kernel did not build or load: {em_kernel.load_error()}"
    gen = torch.Generator().manual_seed(seed)
    lambdas = [0.05, 0.1, 0.15][:iterations] if formulation == "official" else [0.3, 0.6, 1.0][:iterations]
    child_types = children if per_child_weights else 1
    inputs = em_poses(problems, children, child_types, parents, gen=gen)
    coords = torch.rand(children, 2, generator=gen, dtype=torch.float64)
    probe = torch.Generator()
    grads = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(em_kernel.ENV_VAR, "cpp")
        for one_pass in (True, False):
            mp.setattr(em_kernel, "_one_pass", lambda ctx, one_pass=one_pass: one_pass and ctx.groups is None)
            leaves = [t.clone().requires_grad_() for t in inputs]
            mu, a, r = em_routing_poses(
                *leaves,
                iterations,
                coordinates=coords,
                inverse_temperature=lambdas,
                formulation=formulation,
                cost_normalization=cost_normalization,
                detach_routing=detach,
                return_assignments=True,
            )
            probes = [torch.randn(x.shape, generator=probe.manual_seed(seed), dtype=x.dtype) for x in (mu, a, r)]
            sum((x * p).sum() for x, p in zip((mu, a, r), probes)).backward()
            grads[one_pass] = [t.grad for t in leaves]
    for got, want in zip(grads[True], grads[False]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12 * max(want.abs().max().item(), 1.0))


@pytest.mark.parametrize("cost_normalization", ["mean_std", "mass"])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("detach", [False, True])
def test_cost_normalizations_match_the_pytorch_path(cpp, monkeypatch, cost_normalization, grad, detach):
    gen = torch.Generator().manual_seed(13)
    inputs = em_poses(3, 10, 5, 4, gen=gen)
    results = {}
    for path in ("torch", "cpp"):
        monkeypatch.setenv(em_kernel.ENV_VAR, path)
        with torch.set_grad_enabled(grad):
            leaves = [t.clone().requires_grad_(grad) for t in inputs]
            mu, a, r = em_routing_poses(
                *leaves,
                3,
                inverse_temperature=1.0,
                cost_normalization=cost_normalization,
                detach_routing=detach,
                return_assignments=True,
            )
        results[path] = [mu, a, r]
        if grad:
            (mu.square().sum() + a.sum() + (r * r.detach()).sum()).backward()
            results[path] += [t.grad for t in leaves]
    for k, (got, want) in enumerate(zip(results["cpp"], results["torch"])):
        torch.testing.assert_close(got, want, rtol=0 if k < 3 else 1e-9, atol=1e-10)  # gradients up to ~1e3


@pytest.mark.parametrize("cost_normalization", ["mean_std", "mass"])
def test_gradcheck_with_cost_normalization(cpp, cost_normalization):
    inputs, coords = _fc_inputs(3)

    def route(p, w, a, bv, ba):
        return em_routing_poses(
            p,
            w,
            a,
            bv,
            ba,
            3,
            coordinates=coords,
            inverse_temperature=[0.3, 0.6, 1.0],
            cost_normalization=cost_normalization,
        )

    assert gradcheck(route, tuple(t.clone().requires_grad_() for t in inputs), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_em_routing_poses_agrees_with_em_routing_on_the_pytorch_path(monkeypatch):
    monkeypatch.setenv(em_kernel.ENV_VAR, "torch")
    gen = torch.Generator().manual_seed(9)
    poses, weight, acts, beta_v, beta_a = em_poses(2, 9, 3, 4, gen=gen)
    coords = torch.rand(9, 2, generator=gen, dtype=torch.float64)
    got = em_routing_poses(poses, weight, acts, beta_v, beta_a, coordinates=coords, formulation="official")
    want = em_routing(em_votes(poses, weight, coords), acts, beta_v, beta_a, formulation="official")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_bad_inputs_get_clear_errors(cpp):
    gen = torch.Generator().manual_seed(10)
    poses, weight, acts, beta_v, beta_a = em_poses(2, 6, 3, 3, gen=gen)
    with pytest.raises(ValueError, match="multiple of Iw"):
        em_routing_poses(poses, weight[:, :, :, :2], acts, beta_v, beta_a)
    with pytest.raises(ValueError, match="multiple of Iw"):
        em_routing_poses(poses, torch.randn(4, 3, 4, 4, dtype=torch.float64), acts, beta_v, beta_a)
    with pytest.raises(ValueError, match=r"\(B, I, P, P\)"):
        em_routing_poses(poses.flatten(2), weight, acts, beta_v, beta_a)
    with pytest.raises(ValueError, match="activations"):
        em_routing_poses(poses, weight, acts[:, :3], beta_v, beta_a)
    with pytest.raises(ValueError, match="coordinates"):
        em_routing_poses(poses, weight, acts, beta_v, beta_a, coordinates=torch.zeros(6, 3))


def test_the_switch(monkeypatch):
    monkeypatch.setenv(em_kernel.ENV_VAR, "fast")
    with pytest.raises(ValueError, match="CAPSNETS_EM_KERNEL must be one of"):
        em_kernel.kernel_mode()
    monkeypatch.setenv(em_kernel.ENV_VAR, "torch")
    assert em_kernel.fused_kernel(torch.zeros(1, 1, 4, 4)) is None
    monkeypatch.setenv(em_kernel.ENV_VAR, "auto")
    assert em_kernel.fused_kernel(torch.zeros(1, 1, 3, 3)) is None  # 3x3 poses: the PyTorch path
    with unittest.mock.patch("torch.compiler.is_compiling", return_value=True):
        assert em_kernel.fused_kernel(torch.zeros(1, 1, 4, 4)) is None  # traced: the PyTorch path


def test_a_kernel_that_cannot_load_falls_back_once_or_fails_when_forced(monkeypatch):
    monkeypatch.setattr(
        em_kernel, "_state", {"tried": True, "module": None, "error": "OSError: no compiler", "warned": False}
    )
    gen = torch.Generator().manual_seed(11)
    inputs = em_poses(2, 6, 3, 3, gen=gen)
    monkeypatch.setenv(em_kernel.ENV_VAR, "auto")
    with pytest.warns(RuntimeWarning, match="no compiler"):
        mu, _ = em_routing_poses(*inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once only
        mu_again, _ = em_routing_poses(*inputs)
    torch.testing.assert_close(mu, mu_again)
    monkeypatch.setenv(em_kernel.ENV_VAR, "cpp")
    with pytest.raises(RuntimeError, match="CAPSNETS_EM_KERNEL=torch"):
        em_routing_poses(*inputs)


@pytest.mark.parametrize("detach", [False, True])
def test_a_training_step_leaves_no_reference_cycles(cpp, detach):
    # the autograd graph of a step must be freed by reference counting alone (a cycle through a node's ctx
    # would keep every step's graph alive until a garbage collection, or forever through C++ references)
    import gc

    torch.manual_seed(0)
    model = create_model("matrix_capsnet_small", routing={"detach_routing": detach})
    images, labels = torch.rand(2, *model.input_size), torch.arange(2)

    def step():
        torch.nn.functional.cross_entropy(model(images).scores, labels).backward()

    step()
    with only_new_objects():  # a quick collection that sees the step's objects only
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            step()
            gc.collect()
            cycles = [type(o).__name__ for o in gc.garbage]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert cycles == []


@given(
    st.sampled_from([torch.float32, torch.float64]),
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 9),
    st.integers(1, 9),
    st.integers(1, 3),
    st.integers(1, 2),
    st.integers(0, 1),
    st.sampled_from([16, 1, None]),
    st.integers(0, 2**16),
)
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
def test_the_kernels_gather_of_receptive_fields_equals_gather_patches(
    dtype, batch, types, height, width, kernel, stride, padding, features, seed
):
    # the same values and gradients, bit for bit: each slot a copy, each child the sum of its slots in slot order
    assume(height + 2 * padding >= kernel and width + 2 * padding >= kernel)
    assert em_kernel.load() is not None, f"the fused EM kernel did not build or load: {em_kernel.load_error()}"
    gen = torch.Generator().manual_seed(seed)
    index = patch_index(types, height, width, kernel, stride=stride, padding=padding)
    shape = (batch, types * height * width) + ((features,) if features else ())
    values = torch.randn(shape, generator=gen, dtype=dtype)
    probe = torch.randn(gather_patches(values, index, padding).shape, generator=gen, dtype=dtype)
    results = []
    for gather in (
        lambda v: gather_patches(v, index, padding),
        lambda v: em_kernel.gather_patches(em_kernel.load(), v, index),
    ):
        leaf = values.clone().requires_grad_()
        out = gather(leaf)
        (out * probe).sum().backward()
        results.append((out, leaf.grad))
    for got, want in zip(results[1], results[0]):
        assert torch.equal(got, want)


def test_the_kernels_gather_rejects_an_index_out_of_range(cpp):
    with pytest.raises(RuntimeError, match=r"index out of range \[0, 4\]"):
        em_kernel.load().gather_rows(torch.zeros(1, 4, 16), torch.tensor([0, 5]))
