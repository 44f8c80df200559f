"""CUDA checks: the same library on a GPU, against the CPU.

Run on a machine with a GPU: ``pytest -m gpu`` (about two minutes). They are deselected by default (CI has
no GPU); selected without CUDA they fail with a message rather than skip, so a GPU run can never pass
without having run them. ``CAPSNETS_GPU_TEST_DEVICE=cpu pytest -m gpu`` runs the same checks on the CPU,
to check the tests themselves on a machine without a GPU (slow; the NCCL test then uses gloo).
"""

import dataclasses
import json
import os
import subprocess
import sys
import unittest.mock
from pathlib import Path

import pytest
import torch

import capsnets
from capsnets.functional import ChildGroups, dynamic_routing, em_routing, grid_child_groups
from capsnets.losses import create_loss

from helpers import assert_finite


def _finite(**tensors):
    for name, tensor in tensors.items():
        assert_finite(tensor, name)


pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda() -> torch.device:
    if os.environ.get("CAPSNETS_GPU_TEST_DEVICE"):
        return torch.device(os.environ["CAPSNETS_GPU_TEST_DEVICE"])
    if not torch.cuda.is_available():
        pytest.fail("the gpu tests need CUDA: torch.cuda.is_available() is False on this machine")
    return torch.device("cuda")


def _grads(fn, *inputs):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    outputs = fn(*inputs)
    weights = [torch.linspace(-1, 1, o.numel(), dtype=o.dtype, device=o.device).view_as(o) for o in outputs]
    sum((o * w).sum() for o, w in zip(outputs, weights)).backward()
    return [o.detach() for o in outputs], [x.grad for x in inputs]


def _close(cuda_values, cpu_values, atol, rtol=1e-3):
    for got, want in zip(cuda_values, cpu_values):
        torch.testing.assert_close(got.double().cpu(), want.double(), atol=atol, rtol=rtol)


def test_dynamic_routing_on_cuda_matches_cpu_float64(cuda):
    u_hat = torch.randn(8, 96, 10, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.1
    for detach in (True, False):

        def fn(u, detach=detach):
            return (dynamic_routing(u, 3, detach_routing=detach),)

        want, want_grad = _grads(fn, u_hat)
        got, got_grad = _grads(fn, u_hat.float().to(cuda))
        _close(got, want, atol=1e-5)
        _close(got_grad, want_grad, atol=1e-4)


def test_em_routing_on_cuda_matches_cpu_float64(cuda):
    g = torch.Generator().manual_seed(1)
    votes = torch.randn(6, 72, 8, 16, generator=g, dtype=torch.float64)
    activations = torch.rand(6, 72, generator=g, dtype=torch.float64)
    beta_v, beta_a = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    for detach in (False, True):

        def fn(v, a, bv, ba, detach=detach):
            return em_routing(v, a, bv, ba, 3, detach_routing=detach)

        want, want_grad = _grads(fn, votes, activations, beta_v, beta_a)
        got, got_grad = _grads(fn, *(t.float().to(cuda) for t in (votes, activations, beta_v, beta_a)))
        _close(got, want, atol=1e-4)
        _close(got_grad, want_grad, atol=1e-3, rtol=1e-2)


def test_em_routing_with_child_groups_on_cuda_matches_cpu_float64(cuda):
    g = torch.Generator().manual_seed(2)
    groups = grid_child_groups(2, 4, 6, 6, 3, stride=1)  # 2 examples, 4 types, 6x6 grid, K=3: (32, 36) slots
    votes = torch.randn(32, 36, 5, 16, generator=g, dtype=torch.float64)
    activations = torch.rand(32, 36, generator=g, dtype=torch.float64)
    beta_v, beta_a = torch.randn(5, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)

    def routed(device):
        def fn(v, a, bv, ba):
            return em_routing(
                v,
                a,
                bv,
                ba,
                3,
                inverse_temperature=0.2,
                child_groups=ChildGroups(groups.index.to(device), groups.count),
            )

        return fn

    want, want_grad = _grads(routed("cpu"), votes, activations, beta_v, beta_a)
    got, got_grad = _grads(routed(cuda), *(t.float().to(cuda) for t in (votes, activations, beta_v, beta_a)))
    _close(got, want, atol=1e-4)
    _close(got_grad, want_grad, atol=1e-3, rtol=1e-2)


@pytest.mark.parametrize("path", ["torch", "triton"])
def test_matrix_capsule_routing_on_cuda_matches_cpu_float64(cuda, monkeypatch, path):
    """em_routing_poses as a convolutional layer calls it (child groups, per type) and as a class layer (shared
    transforms, coordinates), by the PyTorch path and by the Triton kernels (which CUDA runs by default)."""
    from capsnets.functional import em_routing_poses
    from capsnets.functional.em import triton_votes

    g = torch.Generator().manual_seed(3)
    conv = grid_child_groups(2, 4, 6, 6, 3, stride=1, normalize="per_type")  # (32, 36) slots
    cases = [
        (torch.randn(32, 36, 4, 4, generator=g), torch.randn(36, 5, 4, 4, generator=g) / 2, None, conv),
        (torch.randn(4, 48, 4, 4, generator=g), torch.randn(12, 10, 4, 4, generator=g) / 2, torch.rand(48, 2), None),
    ]
    for poses, weight, coords, groups in cases:
        activations = torch.rand(poses.shape[:2], generator=g)
        beta_v, beta_a = torch.rand(weight.shape[1], generator=g), 0.01 * torch.randn(weight.shape[1], generator=g)

        def routed(device, coords=coords, groups=groups):
            def fn(p, w, a, bv, ba):
                return em_routing_poses(
                    p,
                    w,
                    a,
                    bv,
                    ba,
                    3,
                    coordinates=None if coords is None else coords.to(device, p.dtype),
                    formulation="official",
                    child_groups=None if groups is None else dataclasses.replace(groups, index=groups.index.to(device)),
                )

            return fn

        inputs = (poses, weight, activations, beta_v, beta_a)
        monkeypatch.setenv("CAPSNETS_EM_KERNEL", "torch")
        want, want_grad = _grads(routed("cpu"), *(t.double() for t in inputs))
        monkeypatch.setenv("CAPSNETS_EM_KERNEL", path)
        with unittest.mock.patch.object(triton_votes, "moments", wraps=triton_votes.moments) as moments:
            got, got_grad = _grads(routed(cuda), *(t.to(cuda) for t in inputs))
        assert (moments.call_count > 0) == (path == "triton")
        _close(got, want, atol=1e-4)
        _close(got_grad, want_grad, atol=1e-3, rtol=1e-2)
    if path == "triton":  # what auto mode, the default, checks before it takes the kernels on this GPU
        from capsnets.functional.em import triton_path

        assert triton_path.works_on(torch.device(cuda))


@pytest.mark.parametrize("path", ["torch", "triton"])
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_matrix_capsnet_routes_without_waiting_on_the_host(cuda, monkeypatch, path, training):
    """No host synchronisation inside EM routing (forward and backward) on either GPU path: a step of
    matrix_capsnet under ``torch.cuda.set_sync_debug_mode("error")``, after a first step outside it (the Triton
    path's one-time trial of the kernels on the device, and the allocator's warm-up)."""
    if cuda.type != "cuda":
        pytest.skip("the sync debug mode is CUDA's")
    monkeypatch.setenv("CAPSNETS_EM_KERNEL", path)
    torch.manual_seed(0)
    model = capsnets.create_model("matrix_capsnet", device=cuda).train(training)
    images = torch.rand(4, *model.input_size, device=cuda)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16), torch.set_grad_enabled(training):
            out = model(images)
            loss = out.scores.float().sum()
        if training:
            loss.backward()
        return loss

    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss).item()


def test_em_routing_under_bf16_autocast_is_finite_float32(cuda):
    votes = (torch.randn(4, 288, 16, 16, device=cuda) * 50).requires_grad_()
    activations = torch.rand(4, 288, device=cuda)
    with torch.autocast(cuda.type, dtype=torch.bfloat16):
        mu, a = em_routing(
            votes.bfloat16(), activations.bfloat16(), torch.zeros(16, device=cuda), torch.zeros(16, device=cuda)
        )
    assert mu.dtype == a.dtype == torch.float32
    (mu.sum() + a.sum()).backward()
    _finite(poses=mu, activations=a, votes_grad=votes.grad)


@pytest.mark.parametrize("name", capsnets.list_models(task="classification"))
def test_every_model_trains_a_step_on_cuda_under_bf16(cuda, name):
    torch.manual_seed(0)
    model = capsnets.create_model(name, device=cuda)
    images = torch.rand(4, *model.input_size, device=cuda)
    labels = torch.arange(4, device=cuda) % model.num_classes
    criterion = create_loss(model.default_loss)
    with torch.autocast(cuda.type, dtype=torch.bfloat16):
        loss = criterion(model(images, labels), images, labels)[0]
    loss.backward()
    _finite(loss=loss, **{f"grad of {n}": p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert all(p.grad is not None and p.grad.device.type == cuda.type for p in model.parameters())


@pytest.mark.parametrize("name", ["capsnet_small", "matrix_capsnet_small"])
def test_model_on_cuda_matches_cpu(cuda, name):
    torch.manual_seed(0)
    model = capsnets.create_model(name).eval()
    images = torch.rand(8, *model.input_size)
    with torch.no_grad():
        want = model(images).scores
        got = model.to(cuda)(images.to(cuda)).scores
    torch.testing.assert_close(got.cpu(), want, atol=2e-3, rtol=2e-2)  # cuDNN may use TF32 convolutions


@pytest.mark.parametrize("name", ["capsnet_small", "matrix_capsnet_small"])
def test_compiled_training_step_matches_eager_on_cuda(cuda, name):
    torch.manual_seed(0)
    model = capsnets.create_model(name, device=cuda)
    compiled = torch.compile(model)
    images = torch.rand(16, *model.input_size, device=cuda)
    labels = torch.arange(16, device=cuda) % model.num_classes
    criterion = create_loss(model.default_loss)
    eager_loss = criterion(model(images, labels), images, labels)[0]
    compiled_loss = criterion(compiled(images, labels), images, labels)[0]
    torch.testing.assert_close(compiled_loss, eager_loss, atol=1e-4, rtol=1e-3)
    compiled_loss.backward()
    _finite(**{f"grad of {n}": p.grad for n, p in model.named_parameters()})


def test_trainer_on_cuda_with_bf16_resumes_and_loads_on_cpu(cuda, tmp_path):
    from capsnets.engine.config import TrainConfig
    from capsnets.engine.trainer import train
    from capsnets.models import load_model

    settings = dict(
        model="capsnet_digits",
        dataset="digits",
        batch_size=64,
        device=str(cuda),
        amp="bf16",
        progress=False,
        out=str(tmp_path / "run"),
    )
    first = train(TrainConfig(epochs=1, **settings))
    assert first["device"].startswith(cuda.type)
    resumed = train(TrainConfig(epochs=3, **settings), resume=True)
    lines = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [line["epoch"] for line in lines] == [1, 2, 3]
    assert resumed["test_accuracy"] > 0.8
    model = load_model(tmp_path / "run", device="cpu")
    assert next(model.parameters()).device.type == "cpu"


def _experiment_training_in_run(cuda, checkpoint_dir, train_minutes, rng_seed):
    """One process's share of an experiment's training on the device (bf16, CNN with dropout), through Runs."""
    from capsnets.data import TensorData
    from capsnets.experiments.runs import Runs
    from capsnets.models import create_model

    torch.manual_seed(0)
    model = create_model("cnn_baseline_narrow", device=cuda)
    images, labels = torch.rand(64, 1, 28, 28, device=cuda), torch.arange(64, device=cuda) % 10
    data = TensorData(images, labels, 10, classes=[str(k) for k in range(10)], name="random")
    torch.manual_seed(rng_seed)  # what a new process holds: the checkpoint's CPU and CUDA RNG states count
    with Runs(checkpoint_dir) as runs:
        settings = dict(batch_size=32, amp="bf16", max_shift=0, device=str(cuda), progress=False)
        training = runs.fit("m", model, data, data, epochs=3, train_minutes=train_minutes, **settings)
    return model, training.history


def test_an_experiment_training_cut_short_is_continued_on_cuda(cuda, tmp_path):
    """train_minutes + --checkpoint-dir on the device: optimizer state back on the device, RNG restored."""
    whole, whole_history = _experiment_training_in_run(cuda, tmp_path / "whole", None, 0)
    for run in range(3):  # one epoch per run; the first starts as the uninterrupted one did
        model, history = _experiment_training_in_run(cuda, tmp_path / "cut", 1e-9, 100 * run)
    assert [r["epoch"] for r in history] == [1, 2, 3]
    # equal up to the order of floating-point sums in non-deterministic kernels
    losses = [torch.tensor([r["train_loss"] for r in h]) for h in (history, whole_history)]
    _close(losses[:1], losses[1:], atol=1e-3)
    _close(list(model.state_dict().values()), [v.cpu() for v in whole.state_dict().values()], atol=1e-3)


def test_torchrun_nccl_single_gpu(cuda, tmp_path):
    out = tmp_path / "ddp"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=1",
        "-m",
        "capsnets",
        "train",
        "--model",
        "capsnet_digits",
        "--dataset",
        "digits",
        "--epochs",
        "2",
        "--batch-size",
        "32",
        "--device",
        str(cuda),
        "--out",
        str(out),
        "--no-progress",
    ]
    subprocess.run(command, check=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device"].startswith(cuda.type) and summary["test_accuracy"] > 0.5


_SMOKE = {
    "multimnist": dict(train_digits=300, pairs_per_epoch=64, test_digits=100, batch_size=32),
    "dimensions": dict(train_images=200, test_images=100, digits=1),
    "adversarial": dict(train_size=128, val_size=32, test_size=32, max_epochs=1, eps=(0.3,), bim_steps=2),
    "affnist": dict(train_size=128, val_size=32, test_size=64, max_epochs=1),
    "viewpoints": dict(train_size=24, test_size=12),
    "segmentation": dict(images_per_epoch=64, test_images=16),
    "synthesis": dict(train_images=32, test_images=16),
    "routers": dict(
        fashion_train_size=64,
        affnist_train_size=64,
        affnist_val_size=32,
        viewpoints_train_size=32,
        test_size=32,
        throughput_steps=1,
        throughput_repeats=1,
    ),
}


@pytest.mark.parametrize("name", sorted(_SMOKE))
def test_experiment_smoke_runs_on_cuda(cuda, name, shared_data_root, tmp_path):
    from capsnets.experiments import run_experiment

    assert set(_SMOKE) == set(capsnets.experiments.list_experiments())
    data_dir = tmp_path / "data" if name == "viewpoints" else shared_data_root  # viewpoints: rendered set
    result = run_experiment(
        name, tmp_path / "out", smoke=True, device=str(cuda), data_dir=str(data_dir), **_SMOKE[name]
    )
    assert result.report.is_file() and list(Path(tmp_path / "out").glob("*.png"))
    assert f"--device {cuda}" in result.report.read_text()


@pytest.mark.parametrize("name", capsnets.list_models(task="segmentation"))
def test_every_segmentation_model_trains_a_step_on_cuda_under_bf16(cuda, name):
    torch.manual_seed(0)
    model = capsnets.create_model(name, input_size=(1, 64, 64), device=cuda)
    images = torch.rand(2, 1, 64, 64, device=cuda)
    masks = (images > 0.7).float()
    with torch.autocast(cuda.type, dtype=torch.bfloat16):
        loss = create_loss(model.default_loss)(model(images, masks), images, masks)[0]
    loss.backward()
    _finite(loss=loss, **{f"grad of {n}": p.grad for n, p in model.named_parameters() if p.grad is not None})


def test_synthesis_and_autoencoder_models_train_a_step_on_cuda_under_bf16(cuda):
    from capsnets.data import shift_pairs
    from capsnets.experiments.synthesis import train_pix2pix
    from capsnets.models import PatchDiscriminator

    torch.manual_seed(0)
    maps = (torch.rand(4, 10, 32, 32, device=cuda) > 0.5).float()
    images = torch.rand(4, 1, 32, 32, device=cuda)
    for name in capsnets.list_models(task="synthesis"):
        generator = capsnets.create_model(name, device=cuda)
        history = train_pix2pix(
            generator,
            PatchDiscriminator(11, width=8, device=cuda),
            maps,
            images,
            epochs=1,
            batch_size=4,
            progress=False,
        )
        _finite(**{f"{name} losses": torch.tensor([history[0]["generator"], history[0]["discriminator"]])})
    model = capsnets.create_model("transforming_autoencoder", device=cuda)
    digits = torch.rand(4, 1, 28, 28, device=cuda)
    shifts, targets = shift_pairs(digits, 2, torch.Generator(device=cuda).manual_seed(0))
    with torch.autocast(cuda.type, dtype=torch.bfloat16):
        loss = create_loss("transforming")(model(digits, shifts), digits, targets)[0]
    loss.backward()
    _finite(loss=loss, **{f"grad of {n}": p.grad for n, p in model.named_parameters()})
