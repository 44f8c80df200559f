"""train_classifier: mixed precision follows the trainer's rule (bf16 autocast on CUDA, or when asked)."""
import pytest
import torch
from torch import nn

from capsnets.experiments.common import train_classifier
from capsnets.models.output import ModelOutput


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, images, labels=None):
        return ModelOutput(scores=self.fc(images.flatten(1)))


@pytest.mark.parametrize("amp, dtype", [("auto", torch.float32), ("off", torch.float32), ("bf16", torch.bfloat16)])
def test_forward_and_loss_run_under_the_requested_autocast(amp, dtype):
    seen = []

    def loss_fn(model, images, labels):
        scores = model(images).scores
        seen.append(scores.dtype)
        return nn.functional.cross_entropy(scores.float(), labels)

    images, labels = torch.rand(8, 1, 2, 2), torch.arange(8) % 3
    history = train_classifier(Linear(), images, labels, loss_fn=loss_fn, epochs=1, batch_size=4, amp=amp,
                               progress=False)
    assert seen == [dtype, dtype] and len(history) == 1  # "auto" is full precision on the CPU
