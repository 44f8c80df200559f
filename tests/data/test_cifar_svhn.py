"""CIFAR-10 and SVHN on small files written in the real formats: the binary-version tarball
(1 label byte + 3072 RGB plane bytes per record) and format-2 MATLAB v5 .mat files (X: 32x32x3xN, y: Nx1)."""

import hashlib

import numpy as np
import pytest
import scipy.io
import torch

from capsnets.data import CIFAR10, SVHN, DatasetError, dataset_info, load_dataset

from fake_datasets import CIFAR_CLASSES, fake_cifar_splits, write_cifar_tarball, write_svhn_mat


@pytest.fixture
def fake_cifar_root(tmp_path, monkeypatch):
    """A data root with a fake binary-version tarball (4+5+6+7+8 = 30 train / 7 test) and its md5 patched in."""
    splits = fake_cifar_splits()
    path = write_cifar_tarball(tmp_path / "root" / "cifar-10" / "cifar-10-binary.tar.gz", splits)
    monkeypatch.setattr(CIFAR10, "md5", hashlib.md5(path.read_bytes()).hexdigest())
    return tmp_path / "root", splits


def test_cifar_reads_records(fake_cifar_root):
    root, splits = fake_cifar_root
    train, test = CIFAR10(root), CIFAR10(root, train=False)
    assert train.images.shape == (30, 3, 32, 32) and train.images.dtype == torch.uint8 and len(train) == 30
    assert test.labels.dtype == torch.int64 and test.labels.tolist() == [i % 10 for i in range(7)]
    expected = np.concatenate([splits[f"data_batch_{i}"][0] for i in range(1, 6)])
    assert torch.equal(train.images, torch.from_numpy(expected))  # channel planes R, G, B in that order
    assert torch.equal(test.images, torch.from_numpy(splits["test_batch"][0]))
    assert train.classes == CIFAR_CLASSES and test[3][1] == 3


def test_cifar_through_the_registry(fake_cifar_root):
    root, splits = fake_cifar_root
    data = load_dataset("cifar10", root=root, train=False)
    assert data.images.shape == (7, 3, 32, 32) and data.images.dtype == torch.float32
    assert 0 <= data.images.min() and data.images.max() <= 1 and data.name == "cifar10"
    assert torch.equal((data.images * 255).round().to(torch.uint8), torch.from_numpy(splits["test_batch"][0]))
    assert data.classes == CIFAR_CLASSES and data.num_classes == 10
    info = dataset_info("cifar10")
    assert (info.image_shape, info.num_classes, info.num_train, info.num_test) == ((3, 32, 32), 10, 50_000, 10_000)


def test_cifar_md5_refuses_a_wrong_file(fake_cifar_root, monkeypatch):
    root, _ = fake_cifar_root
    monkeypatch.setattr(CIFAR10, "md5", "0" * 32)
    with pytest.raises(DatasetError, match=r"cifar-10-binary.tar.gz: md5 mismatch: expected 0{32}"):
        CIFAR10(root)


def test_cifar_missing_file(tmp_path):
    with pytest.raises(DatasetError) as info:
        CIFAR10(tmp_path, train=False)
    for part in [
        "cifar-10-binary.tar.gz",
        str(tmp_path / "cifar-10"),
        "--data-dir",
        "--download",
        "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
    ]:
        assert part in str(info.value)


@pytest.mark.parametrize(
    "case, pattern",
    [
        ("partial_record", r"test_batch.bin: 3074 bytes is not a whole number of 3073-byte CIFAR records"),
        ("bad_label", r"test_batch.bin: label 10 out of range for 10 classes"),
        ("no_test_batch", r"the tarball lacks cifar-10-batches-bin/test_batch.bin; is it the binary version"),
        ("wrong_meta", r"batches.meta.txt names the classes \['a', 'b'\]"),
    ],
    ids=["partial_record", "bad_label", "no_test_batch", "wrong_meta"],
)
def test_cifar_malformed_tarballs(tmp_path, monkeypatch, case, pattern):
    splits = fake_cifar_splits()
    meta, extra = "\n".join(CIFAR_CLASSES), b""
    if case == "partial_record":  # one record and one stray byte
        splits["test_batch"] = (splits["test_batch"][0][:1], splits["test_batch"][1][:1])
        extra = b"\x00"
    elif case == "bad_label":
        splits["test_batch"][1][0] = 10
    elif case == "no_test_batch":
        del splits["test_batch"]
    elif case == "wrong_meta":
        meta = "a\nb\n"
    path = write_cifar_tarball(tmp_path / "cifar-10" / "cifar-10-binary.tar.gz", splits, meta, extra)
    monkeypatch.setattr(CIFAR10, "md5", hashlib.md5(path.read_bytes()).hexdigest())
    with pytest.raises(DatasetError, match=pattern):
        CIFAR10(tmp_path, train=False)


def test_cifar_download_from_a_mirror(fake_cifar_root, tmp_path, monkeypatch):
    root, _ = fake_cifar_root
    monkeypatch.setattr(CIFAR10, "mirrors", [(tmp_path / "nowhere").as_uri() + "/", (root / "cifar-10").as_uri() + "/"])
    fresh = CIFAR10(tmp_path / "fresh", train=False, download=True)
    assert torch.equal(fresh.images, CIFAR10(root, train=False).images)


# --- SVHN format 2 ----------------------------------------------------------------------------------------
@pytest.fixture
def fake_svhn_root(tmp_path, monkeypatch):
    """A data root with fake train (12) and test (10) .mat files and SVHN's md5s patched to match."""
    folder = tmp_path / "root" / "svhn"
    arrays = {
        "train": write_svhn_mat(folder / "train_32x32.mat", 12, 0),
        "test": write_svhn_mat(folder / "test_32x32.mat", 10, 1),
    }
    monkeypatch.setattr(SVHN, "md5s", {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in folder.iterdir()})
    return folder.parent, arrays


def test_svhn_reads_mat_files(fake_svhn_root):
    root, arrays = fake_svhn_root
    train, test = SVHN(root), SVHN(root, train=False)
    assert train.images.shape == (12, 3, 32, 32) and train.images.dtype == torch.uint8 and len(test) == 10
    assert test.labels.dtype == torch.int64
    assert test.labels.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0]  # the file's 10 is the digit 0
    images, _ = arrays["test"]
    # X[row, column, channel, i] is image i's pixel (channel, row, column)
    assert test.images[4, 2, 7, 19] == images[7, 19, 2, 4] and test.images[0, 0, 31, 0] == images[31, 0, 0, 0]
    assert torch.equal(test.images, torch.from_numpy(images).permute(3, 2, 0, 1))
    assert train.classes == [str(d) for d in range(10)]


def test_svhn_through_the_registry(fake_svhn_root):
    root, _ = fake_svhn_root
    data = load_dataset("svhn", root=root)
    assert data.images.shape == (12, 3, 32, 32) and data.images.dtype == torch.float32
    assert 0 <= data.images.min() and data.images.max() <= 1 and data.labels.max() == 9
    info = dataset_info("svhn")
    assert (info.image_shape, info.num_classes, info.num_train, info.num_test) == ((3, 32, 32), 10, 73_257, 26_032)


def test_svhn_md5_refuses_a_wrong_file(fake_svhn_root, monkeypatch):
    root, _ = fake_svhn_root
    monkeypatch.setitem(SVHN.md5s, "test_32x32.mat", "f" * 32)
    with pytest.raises(DatasetError, match=r"test_32x32.mat: md5 mismatch: expected f{32}"):
        SVHN(root, train=False)


def test_svhn_missing_file(tmp_path):
    with pytest.raises(DatasetError, match=r"SVHN: missing train_32x32.mat in .*svhn.*--data-dir.*--download"):
        SVHN(tmp_path)


@pytest.mark.parametrize(
    "content, pattern",
    [
        (
            {"X": np.zeros((32, 32, 1, 2), np.uint8), "y": np.ones((2, 1), np.uint8)},
            r"expected X to be uint8 \(32, 32, 3, N\)",
        ),
        ({"X": np.zeros((32, 32, 3, 2), np.uint8), "y": np.ones((3, 1), np.uint8)}, r"expected y to be \(2, 1\)"),
        ({"X": np.zeros((32, 32, 3, 2), np.uint8), "y": np.zeros((2, 1), np.uint8)}, r"labels must be 1..10"),
        ({"images": np.zeros(3)}, r"expected variables X and y"),
        (b"not a mat file at all", r"not a readable MATLAB v5 .mat file"),
    ],
    ids=["one_channel", "label_count", "label_zero", "no_X_y", "garbage"],
)
def test_svhn_malformed_files(tmp_path, monkeypatch, content, pattern):
    path = tmp_path / "svhn" / "test_32x32.mat"
    path.parent.mkdir()
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        scipy.io.savemat(path, content, format="5")
    monkeypatch.setitem(SVHN.md5s, path.name, hashlib.md5(path.read_bytes()).hexdigest())
    with pytest.raises(DatasetError, match=pattern):
        SVHN(tmp_path, train=False)


def test_svhn_download_fetches_both_splits(fake_svhn_root, tmp_path, monkeypatch):
    root, _ = fake_svhn_root
    monkeypatch.setattr(SVHN, "mirrors", [(root / "svhn").as_uri() + "/"])
    data = SVHN(tmp_path / "fresh", train=False, download=True)
    assert len(data) == 10 and sorted(p.name for p in (tmp_path / "fresh" / "svhn").iterdir()) == [
        "test_32x32.mat",
        "train_32x32.mat",
    ]
