import pytest
import torch

from capsnets.data import random_shift


def reference_shift(image: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """One (C, H, W) image translated by (dy, dx) with zero fill: roll, then blank what wrapped around."""
    out = torch.roll(image, shifts=(dy, dx), dims=(-2, -1))
    height, width = image.shape[-2:]
    rows = torch.arange(height)[:, None] - dy
    cols = torch.arange(width)[None, :] - dx
    inside = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
    return out * inside


def test_zero_shift_is_identity():
    x = torch.rand(3, 2, 5, 7)
    assert random_shift(x, 0) is x
    assert torch.equal(random_shift(x, 3, shifts=torch.zeros(3, 2, dtype=torch.long)), x)


def test_explicit_shifts_match_reference():
    x = torch.rand(6, 2, 5, 7)
    shifts = torch.tensor([[0, 0], [1, -2], [-3, 4], [2, 2], [-1, -1], [5, 0]])
    out = random_shift(x, 0, shifts=shifts)
    for b, (dy, dx) in enumerate(shifts.tolist()):
        assert torch.equal(out[b], reference_shift(x[b], dy, dx)), (dy, dx)
    assert out[5].abs().sum() == 0  # shifted by the full height: nothing left


def test_drawn_shifts_in_range_and_match_reference():
    x = torch.rand(64, 1, 9, 9) + 0.1  # strictly positive, so zeros reveal the shift
    torch.manual_seed(0)
    drawn = torch.randint(-2, 3, (64, 2), generator=torch.Generator().manual_seed(7))
    out = random_shift(x, 2, generator=torch.Generator().manual_seed(7))
    for b, (dy, dx) in enumerate(drawn.tolist()):
        assert torch.equal(out[b], reference_shift(x[b], dy, dx))
    assert drawn.abs().max() == 2 and len({tuple(s) for s in drawn.tolist()}) > 10


def test_deterministic_with_seeded_generator():
    x = torch.rand(16, 1, 8, 8)
    a = random_shift(x, 2, torch.Generator().manual_seed(3))
    b = random_shift(x, 2, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and not torch.equal(a, x)


def test_gradient_flows():
    x = torch.rand(2, 1, 4, 4, requires_grad=True)
    random_shift(x, 0, shifts=torch.tensor([[1, 0], [0, -1]])).sum().backward()
    assert x.grad[0, 0, -1].sum() == 0 and x.grad[0, 0, :-1].sum() == 12


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(images=torch.rand(2, 4, 4), max_shift=1), "images"),
        (dict(images=torch.rand(2, 1, 4, 4), max_shift=-1), "max_shift"),
        (dict(images=torch.rand(2, 1, 4, 4), max_shift=0, shifts=torch.zeros(3, 2, dtype=torch.long)), "shifts"),
        (dict(images=torch.rand(2, 1, 4, 4), max_shift=0, shifts=torch.zeros(2, 2)), "shifts"),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        random_shift(**kwargs)
