"""affNIST: the .mat reader on fabricated files, the affNIST-style generator, translated MNIST, the smoke run."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from capsnets.data import DatasetError
from capsnets.data.affnist import (
    AffineParams,
    RandomPlacement,
    affine_matrices,
    affnist_style,
    load_affnist,
    make_affnist_style,
    place_randomly,
    read_affnist_mat,
    sample_affine_params,
    translated_test_set,
)
from capsnets.data.base import TensorData

from helpers import assert_contrasts_resolve

scipy_io = pytest.importorskip("scipy.io")


def _write_affnist(path, images, labels):
    """A .mat file in the real layout: struct affNISTdata, image uint8 (1600, N) one row-major 40x40 image per
    column (field 3 of 6, as in the public files), label_int uint8 (1, N)."""
    n = len(labels)
    record = {
        "affine_transform": np.zeros((6, n)),
        "transform": np.zeros((6, n)),
        "image": np.ascontiguousarray(images.reshape(n, 1600).T).astype(np.uint8),
        "human_readable_transform": np.zeros((7, n)),
        "label_one_of_n": np.eye(10)[labels].T,
        "label_int": labels.reshape(1, n).astype(np.uint8),
    }
    scipy_io.savemat(path, {"affNISTdata": record}, format="5")


def _fake(n, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 40, 40), dtype=np.uint8)
    images[:, 0, :5] = 255  # a mark in the top-left row: orientation must survive
    images[:, 1:, 0] = 0
    return images, rng.integers(0, 10, n)


def test_reader_decodes_the_real_layout(tmp_path):
    images, labels = _fake(7)
    _write_affnist(tmp_path / "test.mat", images, labels)
    got_images, got_labels = read_affnist_mat(tmp_path / "test.mat")
    assert got_images.dtype == torch.uint8 and got_images.shape == (7, 40, 40)
    assert np.array_equal(got_images.numpy(), images)
    assert np.array_equal(got_labels.numpy(), labels)
    data = load_affnist(tmp_path)
    assert data.images.shape == (7, 1, 40, 40) and data.images.max() <= 1 and data.num_classes == 10


def test_reader_concatenates_test_batches_in_numeric_order(tmp_path):
    (tmp_path / "affnist" / "test_batches").mkdir(parents=True)
    parts = [_fake(3, seed) for seed in range(11)]
    for k, (images, labels) in enumerate(parts, start=1):
        _write_affnist(tmp_path / "affnist" / "test_batches" / f"{k}.mat", images, labels)
    data = load_affnist(tmp_path)
    assert len(data) == 33
    expected = np.concatenate([p[1] for p in parts])
    assert np.array_equal(data.labels.numpy(), expected)


def test_reader_rejects_other_files(tmp_path):
    scipy_io.savemat(tmp_path / "other.mat", {"x": np.zeros((2, 2))})
    with pytest.raises(DatasetError, match="affNISTdata"):
        read_affnist_mat(tmp_path / "other.mat")
    (tmp_path / "junk.mat").write_bytes(b"not a mat file at all" * 10)
    with pytest.raises(DatasetError):
        read_affnist_mat(tmp_path / "junk.mat")
    with pytest.raises(DatasetError, match="no affNIST test files"):
        load_affnist(tmp_path / "empty")


def _digits(n=64, seed=0):
    """Blobby stand-in digits: a random 12x16 block inside a 28x28 image."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.zeros(n, 1, 28, 28)
    images[:, :, 6:22, 8:20] = torch.rand(n, 1, 16, 12, generator=generator) * 0.9 + 0.1
    return images


def test_affnist_style_is_deterministic_and_within_ranges():
    images = _digits()
    a, pa = affnist_style(images, torch.Generator().manual_seed(5))
    b, pb = affnist_style(images, torch.Generator().manual_seed(5))
    c, _ = affnist_style(images, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (64, 1, 40, 40) and a.min() >= 0 and a.max() <= 1
    assert pa.rotation.abs().max() <= 20 and pa.shear.abs().max() <= 0.2
    for scale in (pa.scale_x, pa.scale_y):
        assert scale.min() >= 0.8 and scale.max() <= 1.2
    assert pa.rotation.std() > 5  # spread over the range, not stuck at one value
    assert pa.shift_x.abs().max() > 2 and pa.shift_y.abs().max() > 2


def test_affnist_style_keeps_the_whole_digit_in_the_frame():
    out, _ = affnist_style(_digits(), torch.Generator().manual_seed(0), margin=1.0)
    border = torch.cat([out[:, 0, 0], out[:, 0, -1], out[:, 0, :, 0], out[:, 0, :, -1]])
    assert border.max() == 0
    # nothing was cut: mass ratio equals the area change |det A| (bilinear sampling preserves mass on average)
    ratio = out.sum(dim=(1, 2, 3)) / _digits().sum(dim=(1, 2, 3))
    assert ratio.min() > 0.5 and ratio.max() < 1.6


def test_affnist_style_known_parameters():
    images = _digits(4)
    centred = F.pad(images, (6, 6, 6, 6))

    def params(**kw):
        base = dict(rotation=0.0, shear=0.0, scale_x=1.0, scale_y=1.0, shift_x=0.0, shift_y=0.0) | kw
        return AffineParams(*(torch.tensor(v) for v in base.values()))

    same, _ = affnist_style(images, None, params=params())
    assert torch.allclose(same, centred, atol=1e-5)
    moved, _ = affnist_style(images, None, params=params(shift_x=3.0, shift_y=-2.0))
    assert torch.allclose(moved, torch.roll(centred, (-2, 3), (2, 3)), atol=1e-5)
    turned, _ = affnist_style(images, None, params=params(rotation=90.0))
    assert torch.allclose(turned, torch.rot90(centred, 1, (2, 3)), atol=1e-5)  # counter-clockwise on screen
    block = (images > 0).float()  # a uniform 12 wide x 16 high block
    for scale_x, scale_y in ((1.2, 1.0), (0.8, 1.2)):
        out, _ = affnist_style(block, None, params=params(scale_x=scale_x, scale_y=scale_y))
        width = (out[:, 0] > 0.5).any(dim=1).sum(dim=1).float()
        height = (out[:, 0] > 0.5).any(dim=2).sum(dim=1).float()
        assert ((width - 12 * scale_x).abs() <= 1).all() and ((height - 16 * scale_y).abs() <= 1).all()


def test_affine_matrices_compose_rotation_shear_scale():
    rot, shear, sx, sy = sample_affine_params(10, torch.Generator().manual_seed(0))
    matrices = affine_matrices(rot, shear, sx, sy)
    assert torch.allclose(torch.linalg.det(matrices), sx * sy, atol=1e-5)  # rotation and shear keep area


def test_make_affnist_style_dataset_is_seeded():
    digits = TensorData(_digits(10), torch.arange(10), 10, [str(i) for i in range(10)], "fake")
    a, pa = make_affnist_style(digits, seed=3, batch_size=4)
    b, _ = make_affnist_style(digits, seed=3, batch_size=4)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, digits.labels)
    assert a.images.shape == (10, 1, 40, 40) and pa.rotation.shape == (10,)


def test_place_randomly_covers_positions_and_clips_nothing():
    images = _digits(200)
    out = place_randomly(images, torch.Generator().manual_seed(0))
    assert out.shape == (200, 1, 40, 40)
    assert torch.allclose(out.sum(dim=(1, 2, 3)), images.sum(dim=(1, 2, 3)))
    rows = (out[:, 0] > 0).any(dim=2).float().argmax(dim=1)  # first digit row: 6 + dy with dy in [0, 12]
    assert rows.min() == 6 and rows.max() == 18
    again = RandomPlacement()(images, torch.Generator().manual_seed(0))
    assert torch.equal(out, again) and RandomPlacement().output_shape((1, 28, 28)) == (1, 40, 40)
    known = place_randomly(images[:1], offsets=torch.tensor([[12, 0]]))
    assert torch.equal(known[0, :, 12:40, 0:28], images[0])
    digits = TensorData(images, torch.zeros(200, dtype=torch.long), 10, name="fake")
    assert torch.equal(translated_test_set(digits, seed=1).images, translated_test_set(digits, seed=1).images)


def test_affnist_smoke_run(tmp_path, shared_data_root):
    from capsnets.experiments import run_experiment

    options = dict(
        smoke=True,
        device="cpu",
        data_dir=str(shared_data_root),
        checkpoint_dir=str(tmp_path / "ckpt"),
        train_size=128,
        val_size=32,
        test_size=64,
        max_epochs=2,
        target_accuracy=1.0,
        train_minutes=1e-9,
    )  # the time limit cuts each model to one epoch
    result = run_experiment("affnist", tmp_path, **options)
    text = (tmp_path / "report.md").read_text()
    assert text.count("| 1 of 2 (time limit) |") == 2 and "within `max_epochs` or `train_minutes`" in text
    assert "affNIST-style accuracy" in text and "79.00%" in text and "66.00%" in text
    assert list(tmp_path.glob("*.png")) and all(f.stat().st_size > 0 for f in result.figures)
    assert 0 <= result.metrics["CapsNet_affNIST-style"] <= 1
    assert result.metrics["CNN_epochs"] == 1 and 0 <= result.metrics["CapsNet_val_accuracy"] <= 1
    assert_contrasts_resolve("affnist", result.metrics, 2)
    # a second run with the same checkpoint folder continues both trainings (epoch 2 of 2)
    again = run_experiment("affnist", tmp_path / "again", **options)
    assert again.cut_short == [] and again.metrics["CNN_epochs"] == again.metrics["CapsNet_epochs"] == 2


def test_affnist_smoke_reads_real_files_when_given(tmp_path, shared_data_root):
    from capsnets.experiments import run_experiment

    images, labels = _fake(16)
    _write_affnist(tmp_path / "test.mat", images, labels)
    result = run_experiment(
        "affnist",
        tmp_path / "out",
        smoke=True,
        device="cpu",
        data_dir=str(shared_data_root),
        train_size=64,
        val_size=32,
        test_size=32,
        max_epochs=1,
        affnist_path=str(tmp_path / "test.mat"),
    )
    assert "affNIST (real) accuracy" in result.report.read_text()
    assert_contrasts_resolve("affnist", result.metrics, 3)
