"""Heinsen's capsule classifier and Byerly et al.'s homogeneous vector capsule network: parameter counts against
the authors' code, the data flow, and bad arguments."""

import pytest
import torch

import capsnets
from capsnets.functional import HeinsenRouting, heinsen_routing, homogeneous_vector_capsules
from capsnets.models import HeinsenCapsNet, HVCCapsNet, training_recipe
from capsnets.validation import ArgumentError


def test_heinsen_parameter_count_is_the_codes():
    # glassroom/heinsen_routing_2019_paper, models.py, SmallNORBClassifier(n_objs=5, n_parts=64, d_chns=64) on
    # stereo pairs (2 channels + 2 coordinates), by hand: convolutions 8 + 2,368 + 5 x (128 + 36,928) = 187,656;
    # compute_a 128 + 4,160 = 4,288; compute_mu 128 + 66,560 = 66,688; the first routing (weights shared by the
    # children) W and B 1,024 each and two betas of 64 = 2,176; the second W and B 5,120 each, betas 320 = 10,880.
    model = capsnets.create_model("heinsen_capsnet", input_size=(2, 32, 32), device="meta")
    assert capsnets.count_parameters(model) == 187_656 + 4_288 + 66_688 + 2_176 + 10_880


def test_hvc_parameter_count_is_the_codes():
    # AdamByerly/BMCNNwHFCs, SmallImageBranchingMerging with the MNIST settings, no reconstruction: nine 3x3
    # convolutions (no bias) of 32 + 16 k channels with a batch-norm offset each; HVC weights 10 x 484 x 64,
    # 10 x 256 x 112, 10 x 100 x 160 with offsets of 64, 112, 160; the branch logits' offsets (3).
    channels = [1] + [32 + 16 * k for k in range(9)]
    convs = sum(9 * a * b + b for a, b in zip(channels, channels[1:]))
    capsules = 10 * (484 * 64 + 256 * 112 + 100 * 160) + 64 + 112 + 160
    assert capsnets.count_parameters(capsnets.create_model("hvc_capsnet", device="meta")) == convs + capsules + 3


def test_heinsen_routes_parts_then_classes():
    torch.manual_seed(0)
    model = HeinsenCapsNet(parts=8, channels=16, routing={"type": "heinsen", "iterations": 2}).double()
    assert model.route_parts.routing.spec == model.route_classes.routing.spec == HeinsenRouting(2)
    assert model.route_parts.routing is not model.route_classes.routing  # each layer learns its own benefits
    images = torch.rand(3, 1, 32, 32, dtype=torch.float64)
    out = model(images)
    # the same from the layers by hand
    grid = torch.stack(torch.meshgrid(torch.linspace(-1, 1, 32), torch.linspace(-1, 1, 32), indexing="ij"))
    x = model.convolve(torch.cat((images, grid.double().expand(3, -1, -1, -1)), 1))
    scores = model.part_scores(x).flatten(1)
    poses = model.part_poses(x).view(3, 8, 4, 4, 4, 4).permute(0, 1, 4, 5, 2, 3).reshape(3, -1, 4, 4)
    r1, r2 = model.route_parts.routing, model.route_classes.routing
    parts = heinsen_routing(model.route_parts.votes(poses), scores, r1.beta_use, r1.beta_ign, iterations=2)
    classes = heinsen_routing(
        model.route_classes.votes(parts.mu.view(3, 8, 4, 4)), parts.scores, r2.beta_use, r2.beta_ign, iterations=2
    )
    torch.testing.assert_close(out.scores, classes.scores)
    torch.testing.assert_close(out.capsules, classes.mu)
    assert out.score_kind == "logits" and model.default_loss == "cross_entropy"


def test_hvc_branches_merge_their_capsule_lengths():
    torch.manual_seed(0)
    model = HVCCapsNet(convolutions=4, filters=8, growth=4, branches=(2, 4)).double()
    images = torch.rand(5, 1, 28, 28, dtype=torch.float64)
    out = model(images)
    x, lengths = images, []
    for index, conv in enumerate(model.convs, start=1):
        x = conv(x)
        if index in (2, 4):
            layer = model.branches[str(index)]
            s = homogeneous_vector_capsules(x.permute(0, 2, 3, 1).flatten(1, 2), layer.weight)
            capsules = torch.relu((s - s.mean((0, 1))) / torch.sqrt(s.var((0, 1), unbiased=False) + 1e-3))
            lengths.append(capsules.norm(dim=-1))
    logits = torch.stack(lengths, 1)
    merged = (
        (logits - logits.mean((0, 2), keepdim=True))
        / torch.sqrt(logits.var((0, 2), unbiased=False, keepdim=True) + 1e-3)
    ).sum(1)
    torch.testing.assert_close(out.scores, merged)
    torch.testing.assert_close(out.capsules, capsules)
    assert training_recipe("hvc_capsnet") == {"lr": 1e-3, "lr_decay": 0.98}


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(ArgumentError, match="too small for 9 unpadded 3x3 convolutions: each side must be at least 19"):
        capsnets.create_model("hvc_capsnet", input_size=(1, 16, 16))
    with pytest.raises(ArgumentError, match="branches=.*from 1 to 4"):
        HVCCapsNet(convolutions=4, branches=(2, 6))
    with pytest.raises(ArgumentError, match="parts must be a positive integer"):
        HeinsenCapsNet(parts=0)
    with pytest.raises(ArgumentError, match="iterations"):
        capsnets.create_model("heinsen_capsnet", routing={"iterations": 0})
    with pytest.raises(ArgumentError, match=r"does not take iterations: its routing does; pass routing=\{'iterations'"):
        capsnets.create_model("heinsen_capsnet", iterations=2)
    with pytest.raises(ArgumentError, match="its type is 'dynamic'"):
        capsnets.create_model("heinsen_capsnet", routing="dynamic")
