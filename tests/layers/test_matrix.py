import math
import unittest.mock

import pytest
import torch

from capsnets.functional import EMRouting
from capsnets.functional.patches import capsule_patches, patch_index
from capsnets.layers import ClassMatrixCapsules, ConvMatrixCapsules, MatrixCapsules, PrimaryMatrixCapsules
from capsnets.testing import reference_conv_em_routing


def random_capsules(batch=2, types=3, height=5, width=5, side=4, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    pose = torch.randn(batch, types, height, width, side, side, generator=gen, dtype=dtype)
    act = torch.rand(batch, types, height, width, generator=gen, dtype=dtype)
    return MatrixCapsules(pose, act)


class Recorder:
    """A routing stand-in that records its inputs and returns the activation-weighted mean vote."""

    def __init__(self):
        self.calls = []

    def __call__(self, votes, activations, beta_v, beta_a, **kwargs):
        self.calls.append((votes, activations))
        weights = activations / activations.sum(1, keepdim=True).clamp_min(1e-9)
        return torch.einsum("ni,nijh->njh", weights, votes), torch.sigmoid(votes.mean(dim=(1, 3)) + beta_a)


def test_container_validates_shapes():
    caps = random_capsules()
    assert caps.types == 3 and caps.grid == (5, 5) and caps.pose_size == 4
    assert caps.flat()[0].shape == (2, 75, 16)
    with pytest.raises(ValueError, match="activation"):
        MatrixCapsules(caps.pose, caps.activation[:, :2])
    with pytest.raises(ValueError, match="pose"):
        MatrixCapsules(torch.zeros(2, 3, 5, 5, 16), caps.activation)


def test_primary_matrix_capsules():
    layer = PrimaryMatrixCapsules(6, 3, dtype=torch.float64)
    x = torch.randn(2, 6, 7, 7, dtype=torch.float64)
    caps = layer(x)
    assert caps.pose.shape == (2, 3, 7, 7, 4, 4) and caps.activation.shape == (2, 3, 7, 7)
    flat_pose = layer.pose(x)  # (B, T*16, H, W): type t, row r, col c -> channels t*16 + r*4 + c
    torch.testing.assert_close(caps.pose[1, 2, 3, 4], flat_pose[1, 2 * 16 : 3 * 16, 3, 4].view(4, 4))
    assert ((caps.activation > 0) & (caps.activation < 1)).all()


def test_capsule_patches_order():
    feats = torch.arange(2 * 3 * 1 * 4 * 4, dtype=torch.float64).view(2, 3, 1, 4, 4)
    patches, grid = capsule_patches(feats, 3, stride=1, padding=1)
    assert grid == (4, 4) and patches.shape == (2, 4, 4, 27, 1)
    # output (1, 2): child (type 2, kernel row 0, kernel col 2) is input (row 0, col 3)
    assert patches[1, 1, 2, 2 * 9 + 0 * 3 + 2, 0] == feats[1, 2, 0, 0, 3]
    assert patches[0, 0, 0, 0, 0] == 0  # padding


@pytest.mark.parametrize("stride, padding", [(1, 0), (2, 0), (2, 1)])
def test_conv_matrix_capsules_equal_naive_per_position(stride, padding):
    torch.manual_seed(0)
    routing = EMRouting(2)
    layer = ConvMatrixCapsules(
        3, 2, kernel_size=3, stride=stride, padding=padding, routing=routing, dtype=torch.float64
    )
    with torch.no_grad():
        layer.beta_v.normal_()
        layer.beta_a.normal_()
    caps = random_capsules()
    out = layer(caps)
    pose = torch.nn.functional.pad(caps.pose, (0, 0, 0, 0, padding, padding, padding, padding))
    act = torch.nn.functional.pad(caps.activation, (padding, padding, padding, padding))
    out_h, out_w = out.grid
    for y in range(out_h):
        for x in range(out_w):
            votes, acts = [], []
            for t in range(3):
                for ky in range(3):
                    for kx in range(3):
                        m = pose[:, t, y * stride + ky, x * stride + kx]  # (B, 4, 4)
                        votes.append(torch.stack([m @ layer.weight[t, ky, kx, j] for j in range(2)], dim=1))
                        acts.append(act[:, t, y * stride + ky, x * stride + kx])
            votes = torch.stack(votes, dim=1).flatten(3)  # (B, I, J, 16)
            ref_pose, ref_act = routing(votes, torch.stack(acts, dim=1), layer.beta_v, layer.beta_a)
            torch.testing.assert_close(out.pose[:, :, y, x].flatten(2), ref_pose, rtol=1e-9, atol=1e-10)
            torch.testing.assert_close(out.activation[:, :, y, x], ref_act, rtol=1e-9, atol=1e-10)


def test_coordinate_addition_offsets():
    recorder = Recorder()
    with_ca = ClassMatrixCapsules(3, 4, routing=recorder, coordinate_addition=True, dtype=torch.float64)
    without = ClassMatrixCapsules(3, 4, routing=recorder, coordinate_addition=False, dtype=torch.float64)
    without.load_state_dict(with_ca.state_dict())
    caps = random_capsules(height=4, width=5)
    out = with_ca(caps)
    assert out.pose.shape == (2, 4, 1, 1, 4, 4) and out.activation.shape == (2, 4, 1, 1)
    without(caps)
    (votes_ca, acts), (votes, _) = recorder.calls
    # children are ordered (row, col, type); component 0 gets (row + 0.5) / H, component 1 (col + 0.5) / W
    diff = (votes_ca - votes).view(2, 4, 5, 3, 4, 16)
    for r in range(4):
        for c in range(5):
            row, col = diff[:, r, c, :, :, 0], diff[:, r, c, :, :, 1]
            torch.testing.assert_close(row, torch.full((2, 3, 4), (r + 0.5) / 4, dtype=torch.float64))
            torch.testing.assert_close(col, torch.full((2, 3, 4), (c + 0.5) / 5, dtype=torch.float64))
    assert (diff[..., 2:] == 0).all()
    # the weight is shared across positions: the same pose at two positions gives the same votes (but offsets)
    torch.testing.assert_close(acts.view(2, 4, 5, 3), caps.activation.permute(0, 2, 3, 1))


def test_matrix_layers_reject_wrong_inputs():
    caps = random_capsules(types=3)
    with pytest.raises(ValueError, match="4 types"):
        ConvMatrixCapsules(4, 2)(caps)
    with pytest.raises(ValueError, match="kernel_size"):
        ConvMatrixCapsules(3, 2, kernel_size=0)
    with pytest.raises(ValueError, match="smaller than kernel_size"):
        ConvMatrixCapsules(3, 2, kernel_size=7, routing=Recorder())(caps)
    with pytest.raises(ValueError, match=r"expects \(B, 6, H, W\)"):
        PrimaryMatrixCapsules(6, 3)(torch.randn(1, 5, 4, 4))


@pytest.mark.parametrize("detach", [False, True])
def test_checkpoint_chunks_give_the_same_values_and_gradients(detach):
    caps = random_capsules(batch=3, types=3, height=6, width=6)
    grads = []
    for chunks in (0, 4):
        torch.manual_seed(0)
        layer = ConvMatrixCapsules(
            3,
            2,
            kernel_size=3,
            stride=1,
            routing=EMRouting(3, detach_routing=detach),
            checkpoint_chunks=chunks,
            dtype=torch.float64,
        )
        pose = caps.pose.clone().requires_grad_()
        out = layer(MatrixCapsules(pose, caps.activation))
        (out.pose.square().sum() + out.activation.sum()).backward()
        grads.append((out.pose.detach(), out.activation.detach(), pose.grad, layer.weight.grad, layer.beta_a.grad))
    for plain, chunked in zip(*grads):
        torch.testing.assert_close(chunked, plain, rtol=1e-10, atol=1e-12)
    assert "checkpoint_chunks=4" in repr(layer)
    with pytest.raises(ValueError, match="checkpoint_chunks"):
        ConvMatrixCapsules(3, 2, checkpoint_chunks=-1)


@pytest.mark.parametrize("scope", ["position", "all_parents"])
@pytest.mark.parametrize("stride, padding", [(1, 0), (2, 0), (2, 1)])
def test_conv_matrix_capsules_agree_with_literal_grid_routing(scope, stride, padding):
    torch.manual_seed(1)
    lambdas = [0.05, 0.1, 0.15]  # large enough that the E-steps matter
    layer = ConvMatrixCapsules(
        2,
        3,
        kernel_size=3,
        stride=stride,
        padding=padding,
        assignment_scope=scope,
        routing=EMRouting(3, lambdas),
        dtype=torch.float64,
    )
    with torch.no_grad():
        layer.beta_v.normal_()
        layer.beta_a.normal_()
    caps = random_capsules(types=2, height=5, width=5, seed=stride + padding)
    with torch.no_grad():
        caps.activation[caps.activation < 0.2] = 0.0  # some inactive children
    out = layer(caps)
    ref_pose, ref_act = reference_conv_em_routing(
        caps.pose,
        caps.activation,
        layer.weight.detach(),
        layer.beta_v.detach(),
        layer.beta_a.detach(),
        stride=stride,
        padding=padding,
        inverse_temperatures=lambdas,
        eps=1e-6,
        scope=scope,
    )
    torch.testing.assert_close(out.pose.flatten(4), ref_pose, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(out.activation, ref_act, rtol=1e-9, atol=1e-10)


def test_all_parents_scope_differs_where_fields_overlap_and_not_elsewhere():
    caps = random_capsules(types=2, height=7, width=7)
    outs = {}
    for scope in ("position", "all_parents"):
        for stride in (1, 3):  # K=3: overlapping fields at stride 1, disjoint ones at stride 3
            torch.manual_seed(0)
            layer = ConvMatrixCapsules(
                2, 3, stride=stride, assignment_scope=scope, routing=EMRouting(3, 0.1), dtype=torch.float64
            )
            outs[scope, stride] = layer(caps).activation
    torch.testing.assert_close(outs["all_parents", 3], outs["position", 3], rtol=0, atol=1e-12)
    assert (outs["all_parents", 1] - outs["position", 1]).abs().max() > 1e-3


def assert_lean_backward_matches_autograd(make_layer, caps):
    """Gradients of a layer from ``make_layer()`` through EM routing's lean backward (eager training) and
    through plain autograd of the same procedure (as when traced): finite, non-zero and equal."""
    grads = []
    for plain in (False, True):
        torch.manual_seed(0)
        layer = make_layer()
        pose = caps.pose.clone().requires_grad_()
        with unittest.mock.patch("torch.compiler.is_compiling", return_value=plain):
            out = layer(MatrixCapsules(pose, caps.activation))
        (out.pose.square().sum() + out.activation.sum()).backward()
        grads.append((pose.grad, layer.weight.grad, layer.beta_v.grad, layer.beta_a.grad))
    for lean, ref in zip(*grads):
        assert torch.isfinite(lean).all() and lean.abs().sum() > 0
        torch.testing.assert_close(lean, ref, rtol=1e-9, atol=1e-11)


def test_all_parents_gradients_flow_and_match_autograd_of_the_plain_path():
    caps = random_capsules(batch=2, types=2, height=5, width=5)
    assert_lean_backward_matches_autograd(
        lambda: ConvMatrixCapsules(
            2, 2, stride=1, assignment_scope="all_parents", routing=EMRouting(3, 0.2), dtype=torch.float64
        ),
        caps,
    )


def test_assignment_scope_is_validated():
    with pytest.raises(ValueError, match="assignment_scope must be"):
        ConvMatrixCapsules(3, 2, assignment_scope="grid")
    with pytest.raises(ValueError, match="takes child_groups"):
        ConvMatrixCapsules(3, 2, assignment_scope="all_parents", routing=Recorder())
    with pytest.raises(ValueError, match="checkpoint_chunks must be 0"):
        ConvMatrixCapsules(3, 2, assignment_scope="all_parents", checkpoint_chunks=2)
    assert "assignment_scope='all_parents'" in repr(ConvMatrixCapsules(3, 2, assignment_scope="all_parents"))


@pytest.mark.parametrize("scope", ["position", "all_parents", "per_type"])
@pytest.mark.parametrize("stride, padding", [(1, 0), (2, 0), (2, 1)])
def test_official_conv_routing_agrees_with_literal_grid_routing(scope, stride, padding):
    # the released code's equations in a convolutional layer (every assignment scope), float64, to 1e-8
    torch.manual_seed(2)
    lambdas = [0.01, 0.02, 0.03]  # large enough that the E-steps matter
    routing = EMRouting(3, lambdas, formulation="official", eps=1e-7)
    layer = ConvMatrixCapsules(
        2,
        3,
        kernel_size=3,
        stride=stride,
        padding=padding,
        assignment_scope=scope,
        routing=routing,
        dtype=torch.float64,
    )
    with torch.no_grad():
        layer.weight.mul_(0.3)
        layer.beta_v.uniform_(0.2, 0.8)
        layer.beta_a.normal_(0.0, 0.01)
    caps = random_capsules(types=2, height=5, width=5, seed=10 + stride + padding)
    with torch.no_grad():
        caps.activation[caps.activation < 0.2] = 0.0  # some inactive children
    out = layer(caps)
    ref_pose, ref_act = reference_conv_em_routing(
        caps.pose,
        caps.activation,
        layer.weight.detach(),
        layer.beta_v.detach(),
        layer.beta_a.detach(),
        stride=stride,
        padding=padding,
        inverse_temperatures=lambdas,
        eps=1e-7,
        scope=scope,
        variance_floor=5e-4,
    )
    torch.testing.assert_close(out.pose.flatten(4), ref_pose, rtol=0, atol=1e-8)
    torch.testing.assert_close(out.activation, ref_act, rtol=0, atol=1e-8)


def test_per_type_scope_differs_from_the_others_and_its_gradients_match_autograd():
    caps = random_capsules(batch=2, types=2, height=5, width=5)
    acts = {}
    for scope in ("position", "all_parents", "per_type"):
        torch.manual_seed(0)
        layer = ConvMatrixCapsules(
            2, 3, stride=1, assignment_scope=scope, routing=EMRouting(3, 0.1), dtype=torch.float64
        )
        acts[scope] = layer(caps).activation
    assert (acts["per_type"] - acts["position"]).abs().max() > 1e-3
    assert (acts["per_type"] - acts["all_parents"]).abs().max() > 1e-3
    assert_lean_backward_matches_autograd(
        lambda: ConvMatrixCapsules(
            2,
            2,
            stride=1,
            assignment_scope="per_type",
            routing=EMRouting.official(3, layer="conv"),
            dtype=torch.float64,
        ),
        caps,
    )


def test_primary_capsules_without_bias_and_with_an_activation_offset():
    layer = PrimaryMatrixCapsules(4, 2, bias=False, activation_offset=-1.0)
    assert layer.pose.bias is None and layer.activation.bias is None
    x = torch.zeros(1, 4, 3, 3)
    torch.testing.assert_close(layer(x).activation, torch.full((1, 2, 3, 3), 1 / (1 + math.e)))
    assert "activation_offset=-1.0" in repr(layer)


def test_class_capsules_with_fixed_coordinates():
    coords = torch.randn(2, 3, 2)
    layer = ClassMatrixCapsules(2, 4, coordinates=coords)
    torch.testing.assert_close(layer.coordinates(2, 3), coords)
    assert "fixed_coordinates" not in layer.state_dict()  # derived from the geometry, not a weight
    caps = random_capsules(types=2, height=2, width=3, seed=0)
    assert layer(MatrixCapsules(caps.pose.float(), caps.activation.float())).activation.shape == (2, 4, 1, 1)
    with pytest.raises(ValueError, match="grid"):
        layer(MatrixCapsules(torch.randn(2, 2, 3, 3, 4, 4), torch.rand(2, 2, 3, 3)))
    with pytest.raises(ValueError, match=r"\(H, W, 2\)"):
        ClassMatrixCapsules(2, 4, coordinates=torch.zeros(3, 3))


@pytest.mark.parametrize("kernel_size,stride,padding", [(3, 1, 0), (3, 2, 0), (3, 2, 1), (2, 1, 1), (1, 1, 0)])
def test_capsule_patches_equal_unfold_with_gradients(kernel_size, stride, padding):
    gen = torch.Generator().manual_seed(kernel_size * 100 + stride * 10 + padding)
    feats = torch.randn(2, 3, 5, 7, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    patches, grid = capsule_patches(feats, kernel_size, stride=stride, padding=padding)
    # reference: unfold over (B, T*F, H, W), columns ordered (T, F, K, K) per position
    cols = torch.nn.functional.unfold(feats.reshape(2, 15, 7, 6), kernel_size, padding=padding, stride=stride)
    want = cols.view(2, 3, 5, kernel_size**2, *grid).permute(0, 4, 5, 1, 3, 2).reshape(2, *grid, -1, 5)
    torch.testing.assert_close(patches, want, rtol=0, atol=0)
    weight = torch.randn(patches.shape, dtype=torch.float64, generator=gen)
    (got_grad,) = torch.autograd.grad((patches * weight).sum(), feats)
    (want_grad,) = torch.autograd.grad((want * weight).sum(), feats)
    torch.testing.assert_close(got_grad, want_grad)


def test_patch_index_is_cached_and_marks_padding():
    index = patch_index(2, 3, 3, kernel_size=3, stride=1, padding=1)
    assert index is patch_index(2, 3, 3, kernel_size=3, stride=1, padding=1)
    assert index.shape == (9, 18) and index[0, 0] == 2 * 3 * 3  # the first slot of the corner is padding
    assert index[4].tolist() == list(range(18))  # the centre position reads the whole grid of both types
    with pytest.raises(ValueError, match="smaller than kernel_size"):
        patch_index(1, 2, 2, kernel_size=3)


def test_a_traced_graph_leaves_no_patch_index_in_the_cache():
    # A geometry first met while torch.export traced a layer: the index made then (a fake tensor) was cached, and
    # the next eager forward of the layer failed ("Could not guard on data-dependent expression").
    layer = ConvMatrixCapsules(2, 3, kernel_size=3, stride=2, routing=EMRouting(2)).eval()
    caps = MatrixCapsules(torch.randn(2, 2, 9, 7, 4, 4), torch.rand(2, 2, 9, 7))

    class Parents(torch.nn.Module):
        def forward(self, pose, activation):
            parents = layer(MatrixCapsules(pose, activation))
            return parents.pose, parents.activation

    with torch.no_grad():
        torch.export.export(Parents(), (caps.pose, caps.activation), strict=False)
        eager = Parents()(caps.pose, caps.activation)
    assert type(patch_index(2, 9, 7, kernel_size=3, stride=2)) is torch.Tensor
    assert eager[0].shape == (2, 3, 4, 3, 4, 4)
