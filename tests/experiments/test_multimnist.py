"""MultiMNIST generator (capsnets.data.multimnist) and the ``multimnist`` experiment."""

import pytest
import torch

from capsnets.data.multimnist import (
    MultiMNIST,
    average_overlap,
    bounding_boxes,
    box_overlap,
    frame_overlap,
    make_multimnist,
    multimnist_test_set,
)
from capsnets.experiments import run_experiment
from capsnets.experiments.multimnist import both_correct, two_hot
from capsnets.models import ModelOutput

from helpers import assert_contrasts_resolve


def fake_digits(per_class: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """28x28 'digits': a filled rectangle whose size and place depend on the index (labels 0..9)."""
    labels = torch.arange(10).repeat(per_class)
    images = torch.zeros(len(labels), 1, 28, 28)
    for n in range(len(labels)):
        top, left = 4 + n % 5, 6 + n % 3
        images[n, 0, top : top + 10 + n % 7, left : left + 6 + n % 9] = 0.3 + 0.07 * (n % 10)
    return images, labels


def test_deterministic_and_seed_dependent():
    images, labels = fake_digits()
    a = make_multimnist(images, labels, 200, seed=3)
    b = make_multimnist(images, labels, 200, seed=3)
    c = make_multimnist(images, labels, 200, seed=4)
    for name in ("images", "labels", "digits", "shifts", "sources"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.images, c.images)
    assert torch.equal(multimnist_test_set(images, labels).images, multimnist_test_set(images, labels).images)


def test_shapes_classes_differ_and_match_sources():
    images, labels = fake_digits()
    data = make_multimnist(images, labels, 500, seed=0)
    assert data.images.shape == (500, 1, 36, 36) and data.digits.shape == (500, 2, 1, 36, 36)
    assert data.labels.shape == (500, 2) and data.labels.dtype == torch.int64
    assert (data.labels[:, 0] != data.labels[:, 1]).all()
    assert torch.equal(data.labels, labels[data.sources])
    assert torch.equal(data.sources[:, 0], torch.arange(500) % len(labels))
    assert len(data) == 500


def test_shifts_within_four_pixels_checked_on_boxes():
    images, labels = fake_digits()
    data = make_multimnist(images, labels, 400, seed=1)
    source_boxes = bounding_boxes(images[data.sources][:, :, 0]) + 4  # (N, 2, 4), centred on the 36x36 canvas
    boxes = bounding_boxes(data.digits[:, :, 0])
    moved = boxes - source_boxes  # (dy, dx, dy, dx)
    assert torch.equal(moved[..., :2], moved[..., 2:])  # a pure translation: size unchanged
    assert moved.abs().max() <= 4
    assert torch.equal(moved[..., :2], data.shifts)
    assert set(data.shifts.flatten().tolist()) == set(range(-4, 5))  # the whole range is used
    assert torch.allclose(data.digits.sum((2, 3, 4)), images[data.sources].sum((2, 3, 4)))  # nothing cut off


@pytest.mark.parametrize("max_shift", [0, 1, 4])
def test_digits_are_the_padded_sources_moved_by_random_shift(max_shift):
    # The definition (pad by max_shift, then random_shift by the pair's shifts), on three channels of random pixels.
    import torch.nn.functional as F

    from capsnets.data import random_shift

    images = torch.rand(20, 3, 9, 11, generator=torch.Generator().manual_seed(max_shift))
    data = make_multimnist(images, torch.arange(20) % 10, 300, seed=5, max_shift=max_shift)
    padded = F.pad(images[data.sources.flatten()], (max_shift,) * 4)
    expected = random_shift(padded, 0, shifts=data.shifts.view(-1, 2)).view(data.digits.shape)
    assert torch.equal(data.digits, expected)


def test_combine_modes():
    images, labels = fake_digits()
    maxed = make_multimnist(images, labels, 50, seed=2)
    summed = make_multimnist(images, labels, 50, seed=2, combine="clipped_sum")
    assert torch.equal(maxed.images, maxed.digits.amax(1))
    assert torch.equal(summed.images, maxed.digits.sum(1).clamp(max=1))
    with pytest.raises(ValueError, match="combine"):
        make_multimnist(images, labels, 5, seed=0, combine="mean")
    with pytest.raises(ValueError, match="count"):
        make_multimnist(images, labels, 0, seed=0)


def test_box_overlap_on_a_constructed_case():
    a = torch.tensor([0, 0, 9, 9])  # 10x10
    b = torch.tensor([5, 5, 14, 14])  # 10x10, 5x5 in common
    small = torch.tensor([2, 2, 3, 3])  # 2x2 inside a
    assert box_overlap(a, b).item() == pytest.approx(25 / 100)
    assert box_overlap(a, b, mode="union").item() == pytest.approx(25 / 175)
    assert box_overlap(a, small).item() == pytest.approx(1.0)
    assert box_overlap(a, torch.tensor([20, 20, 25, 25])).item() == 0.0
    digits = torch.zeros(1, 2, 1, 36, 36)
    digits[0, 0, 0, 0:10, 0:10] = 1
    digits[0, 1, 0, 5:15, 5:15] = 1
    data = MultiMNIST(digits.amax(1), torch.tensor([[0, 1]]), digits, torch.zeros(1, 2, 2), torch.zeros(1, 2))
    assert average_overlap(data) == pytest.approx(0.25)
    assert torch.equal(bounding_boxes(torch.zeros(3, 5)), torch.tensor([0, 0, -1, -1]))


def test_frame_overlap_on_constructed_shifts_and_its_expectation():
    shifts = torch.tensor([[[0, 0], [0, 0]], [[4, -4], [-4, 4]], [[1, 2], [-1, 2]]])  # (N, 2, 2) (dy, dx)
    assert frame_overlap(shifts).tolist() == pytest.approx([1.0, 20 * 20 / 784, 26 * 28 / 784])
    assert frame_overlap(torch.tensor([[[0, 0], [30, 0]]])).item() == 0.0
    # uniform independent shifts in [-4, 4]: E = (1 - E|s1 - s2| / 28) ** 2 with E|s1 - s2| = 240 / 81
    images, labels = fake_digits()
    data = make_multimnist(images, labels, 20000, seed=5)
    assert average_overlap(data, mode="frame") == pytest.approx((1 - 240 / 81 / 28) ** 2, abs=0.005)
    assert (1 - 240 / 81 / 28) ** 2 == pytest.approx(0.7996, abs=1e-4)
    # the paper's 20x20 boxes would overlap by 72.6% under the same shifts, not its stated 80%
    assert average_overlap(data, mode="frame", frame=20) == pytest.approx((1 - 240 / 81 / 20) ** 2, abs=0.005)
    assert (1 - 240 / 81 / 20) ** 2 == pytest.approx(0.7257, abs=1e-4)


def test_paper_metric_and_targets():
    labels = torch.tensor([[3, 7], [1, 2]])
    scores = torch.zeros(2, 10)
    scores[0, [7, 3]] = torch.tensor([0.9, 0.8])  # right, order does not matter
    scores[1, [1, 5]] = torch.tensor([0.9, 0.8])  # one wrong
    assert both_correct(ModelOutput(scores), (labels,)).tolist() == [True, False]
    assert two_hot(labels)[0].nonzero().flatten().tolist() == [3, 7]


def test_multimnist_smoke_end_to_end(shared_data_root, tmp_path):
    result = run_experiment(
        "multimnist",
        tmp_path,
        smoke=True,
        device="cpu",
        data_dir=shared_data_root,
        train_digits=300,
        pairs_per_epoch=64,
        test_digits=100,
        batch_size=32,
        epochs=2,
        train_minutes=1e-9,
    )  # the time limit cuts each model to one epoch
    assert result.report == tmp_path / "report.md" and result.report.is_file()
    text = result.report.read_text()
    assert "5.20%" in text and "8.10%" in text and "segmentation.png" in text
    assert (tmp_path / "segmentation.png").stat().st_size > 0
    assert 0 <= result.metrics["capsnet_error"] <= 1 and result.metrics["cnn_parameters"] > 0
    assert "overlap of the two digits' 28x28 frames" in text and 0 < result.metrics["test_overlap_frame"] <= 1
    assert "1 of 2 (time limit) x 64 pairs" in text and "| train_minutes | 1e-09 |" in text
    assert_contrasts_resolve("multimnist", result.metrics, 1)
    # the training table: epoch 1 only (the time limit), each model's loss and validation mAP on 64 pairs
    assert "mean average precision on 64 validation pairs" in text
    rows = [line for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert len(rows) == 1 and len(cells) == 5 and all(0 <= float(c) <= 1 for c in cells[2::2])


def test_multimnist_training_history_is_kept_with_the_checkpoint(shared_data_root, tmp_path):
    options = dict(
        smoke=True,
        device="cpu",
        data_dir=shared_data_root,
        train_digits=300,
        pairs_per_epoch=32,
        test_digits=100,
        batch_size=32,
        checkpoint_dir=str(tmp_path / "ckpt"),
        epochs=2,
        train_minutes=1e-9,
    )  # each run trains one epoch
    first = run_experiment("multimnist", tmp_path / "a", **options).report.read_text()
    second = run_experiment("multimnist", tmp_path / "b", **options).report.read_text()  # continues: epoch 2
    third = run_experiment("multimnist", tmp_path / "c", **options).report.read_text()  # finished: loaded

    def rows(text, epochs):
        return [line for line in text.splitlines() if line.startswith(tuple(f"| {e} |" for e in epochs))]

    assert first.count("| 1 of 2 (time limit) x 32 pairs |") == 2 and len(rows(first, [1, 2])) == 1
    assert second.count("| 2 x 32 pairs |") == 2 and rows(second, [1]) == rows(first, [1])
    assert third.count("| 2 (loaded) x 32 pairs |") == 2  # the run's records, read from its run directory
    assert rows(third, [1, 2]) == rows(second, [1, 2]) and len(rows(third, [1, 2])) == 2
