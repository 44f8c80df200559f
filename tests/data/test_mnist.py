import hashlib

import numpy as np
import pytest
import torch

from capsnets.data import MNIST, DatasetError, FashionMNIST, read_idx

TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_fake_root_loads(fake_mnist_root):
    train, test = MNIST(fake_mnist_root), MNIST(fake_mnist_root, train=False)
    assert train.images.shape == (50, 28, 28) and train.images.dtype == torch.uint8
    assert test.labels.shape == (20,) and test.labels.dtype == torch.int64
    expected = read_idx(fake_mnist_root / "mnist" / "t10k-images-idx3-ubyte.gz")
    assert torch.equal(test.images, torch.from_numpy(expected))
    assert train.labels.tolist() == [i % 10 for i in range(50)]
    assert train.classes == [str(d) for d in range(10)] and len(train) == 50
    image, label = test[3]
    assert image.shape == (28, 28) and label == 3


def test_missing_files_error(tmp_path):
    with pytest.raises(DatasetError) as info:
        FashionMNIST(tmp_path, train=False)
    message = str(info.value)
    for part in [
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
        str(tmp_path / "fashion-mnist"),
        "--data-dir",
        "CAPSNETS_DATA",
        "--download",
    ]:
        assert part in message


def test_md5_mismatch_names_file(fake_mnist_root, monkeypatch):
    monkeypatch.setitem(MNIST.md5s, "train-labels-idx1-ubyte.gz", "0" * 32)
    with pytest.raises(DatasetError, match=r"train-labels-idx1-ubyte.gz.*md5 mismatch.*expected 0{32}"):
        MNIST(fake_mnist_root)


def test_count_mismatch(fake_mnist_root, monkeypatch, write_idx):
    labels = write_idx(fake_mnist_root / "mnist" / "t10k-labels-idx1-ubyte.gz", np.zeros(19, np.uint8))
    monkeypatch.setitem(MNIST.md5s, labels.name, hashlib.md5(labels.read_bytes()).hexdigest())
    with pytest.raises(DatasetError, match=r"20 images but .*t10k-labels-idx1-ubyte.gz has 19 labels"):
        MNIST(fake_mnist_root, train=False)


def test_download_falls_back_to_next_mirror(fake_mnist_root, tmp_path, monkeypatch):
    source = fake_mnist_root / "mnist"
    monkeypatch.setattr(MNIST, "mirrors", [(tmp_path / "nowhere").as_uri() + "/", source.as_uri() + "/"])
    target_root = tmp_path / "fresh"
    (target_root / "mnist").mkdir(parents=True)
    (target_root / "mnist" / "train-images-idx3-ubyte.gz").write_bytes(b"corrupt")  # replaced by download
    data = MNIST(target_root, train=False, download=True)
    assert len(data) == 20
    assert sorted(p.name for p in (target_root / "mnist").iterdir()) == sorted(p.name for p in source.iterdir())
    assert torch.equal(MNIST(target_root).images, MNIST(fake_mnist_root).images)


def test_download_failure_leaves_no_partial_file(fake_mnist_root, tmp_path, monkeypatch):
    monkeypatch.setattr(MNIST, "mirrors", [(fake_mnist_root / "mnist").as_uri() + "/"])
    monkeypatch.setitem(MNIST.md5s, "train-images-idx3-ubyte.gz", "0" * 32)
    with pytest.raises(DatasetError, match=r"(?s)could not download train-images-idx3-ubyte.gz.*md5 mismatch"):
        MNIST(tmp_path, download=True)
    assert not (tmp_path / "mnist" / "train-images-idx3-ubyte.gz").exists()
    assert not list((tmp_path / "mnist").glob("*.part"))


def test_a_mirror_sending_more_than_any_data_file_is_cut_off_and_the_next_one_used(
    fake_mnist_root, tmp_path, monkeypatch
):
    from capsnets.data import download

    source = fake_mnist_root / "mnist"
    huge = tmp_path / "huge"
    huge.mkdir()
    for path in source.iterdir():
        (huge / path.name).write_bytes(path.read_bytes() + bytes(4096))  # larger than the limit set below
    monkeypatch.setattr(download, "MAX_DATA_FILE_BYTES", max(p.stat().st_size for p in source.iterdir()))
    monkeypatch.setattr(MNIST, "mirrors", [huge.as_uri() + "/", source.as_uri() + "/"])
    data = MNIST(tmp_path / "fresh", train=False, download=True)
    assert len(data) == 20
    monkeypatch.setattr(MNIST, "mirrors", [huge.as_uri() + "/"])
    with pytest.raises(DatasetError, match="more than .* bytes, more than any data set file takes"):
        MNIST(tmp_path / "other", train=False, download=True)
    assert not list((tmp_path / "other" / "mnist").glob("*"))


def test_real_mnist(shared_data_root):
    train, test = MNIST(shared_data_root), MNIST(shared_data_root, train=False)
    assert train.images.shape == (60_000, 28, 28) and len(train.labels) == 60_000
    assert test.images.shape == (10_000, 28, 28)
    assert torch.bincount(test.labels).tolist() == TEST_COUNTS


def test_real_fashion_mnist(shared_data_root):
    test = FashionMNIST(shared_data_root, train=False)
    assert torch.bincount(test.labels).tolist() == [1000] * 10
    assert len(test.classes) == 10
