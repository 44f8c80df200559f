"""SegCaps' initialisation: capsule lengths stay away from 0 through its layers, and the final lengths start on both
sides of the 0.5 threshold."""

import pytest
import torch

import capsnets
from capsnets.layers import ConvCapsules2d, ConvTransposeCapsules2d


def _square_images(count: int = 8, size: int = 16) -> torch.Tensor:
    """Black images with a bright 6x6 square at seeded places (a digit-sized object)."""
    generator = torch.Generator().manual_seed(0)
    images = torch.zeros(count, 1, size, size)
    for image, (y, x) in zip(images, torch.randint(0, size - 6, (count, 2), generator=generator)):
        image[:, y : y + 6, x : x + 6] = 1.0
    return images


@pytest.mark.parametrize("num_classes", [1, 4])
def test_lengths_stay_near_one_half_through_the_layers(num_classes):
    torch.manual_seed(0)
    model = capsnets.create_model("segcaps_small", input_size=(1, 16, 16), num_classes=num_classes)
    lengths = {}
    for name, layer in model.named_modules():
        if isinstance(layer, (ConvCapsules2d, ConvTransposeCapsules2d)):
            layer.register_forward_hook(lambda _, __, out, name=name: lengths.__setitem__(name, out.norm(dim=2)))
    with torch.no_grad():
        final = model(_square_images()).probabilities
    assert len(lengths) == 12 and all(b.abs().max() == 0 for b in (model.segment.conv.bias, model.enc1.conv.bias))
    # PyTorch's default initialisation shrinks them to 0.003-0.03 in the encoder, where no gradient gets through
    assert all(0.15 < value.mean() < 0.95 for value in lengths.values()), {k: v.mean() for k, v in lengths.items()}
    low, high = final.flatten().quantile(torch.tensor([0.1, 0.9])).tolist()
    assert low < 0.5 < high, (low, high)
