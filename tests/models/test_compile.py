"""``torch.compile`` of a matrix capsule network: EM routing takes its own path when traced (plain autograd instead
of the lean custom backward), so a compiled training step must give the eager step's loss and gradients.

The step is compiled with the ``aot_eager`` backend: TorchDynamo traces the model and AOTAutograd derives its
backward, as for inductor, which then only generates the kernels of the same graph. That code generation is what
costs the time (30-60 s on 2 cores without inductor's cache, as on a fresh machine, against about 6 s for the
whole test here) and is PyTorch's to test; the traced path is capsnets' own."""

import pytest
import torch

import capsnets
from capsnets.losses import create_loss


@pytest.mark.long  # started first (tests/conftest.py)
def test_compiled_matrix_capsnet_training_step_matches_eager():
    torch.manual_seed(0)
    # float64: the default (official) formulation's gradients at its initialisation are small sums of terms
    # that cancel, so float32 rounding in another order moves the smallest by a few parts in a thousand
    model = capsnets.create_model("matrix_capsnet_small", num_classes=10, input_size=(1, 28, 28), dtype=torch.float64)
    criterion = create_loss(model.default_loss)
    images, labels = torch.rand(8, 1, 28, 28, dtype=torch.float64), torch.arange(8) % 10

    def step(forward):
        model.zero_grad(set_to_none=True)
        loss = criterion(forward(images, labels), images, labels)[0]
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    eager_loss, eager_grads = step(model)
    compiled_loss, compiled_grads = step(torch.compile(model, backend="aot_eager"))
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-9, atol=1e-12)
    assert eager_grads.keys() == compiled_grads.keys()
    for name, want in eager_grads.items():
        assert want.abs().max() > 0, name
        # sums in another order, through three EM iterations: relative to the gradient's scale
        torch.testing.assert_close(
            compiled_grads[name],
            want,
            rtol=1e-6,
            atol=1e-6 * want.abs().max().item(),
            msg=lambda text, name=name: f"{name}: {text}",
        )
