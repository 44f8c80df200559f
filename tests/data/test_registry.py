from pathlib import Path

import pytest
import torch

from capsnets.data import TensorData, data_root, dataset_info, list_datasets, load_dataset


def test_data_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("CAPSNETS_DATA", str(tmp_path / "env"))
    assert data_root(tmp_path / "arg") == tmp_path / "arg"
    assert data_root() == tmp_path / "env"
    monkeypatch.delenv("CAPSNETS_DATA")
    assert data_root() == Path.home() / ".cache" / "capsnets" / "data"


def test_list_and_info_without_files():
    assert list_datasets() == [
        "digits",
        "mnist",
        "fashion_mnist",
        "multimnist",
        "smallnorb",
        "viewpoints",
        "cifar10",
        "svhn",
    ]
    assert dataset_info("multimnist").multilabel and not dataset_info("mnist").multilabel
    info = dataset_info("Fashion-MNIST")
    assert info.name == "fashion_mnist" and info.image_shape == (1, 28, 28) and info.num_classes == 10
    assert info.classes[-1] == "Ankle boot"
    assert dataset_info("digits").image_shape == (1, 8, 8)
    assert dataset_info("CIFAR-10").image_shape == (3, 32, 32) and dataset_info("svhn").num_train == 73_257
    with pytest.raises(ValueError, match="known: digits, mnist, fashion_mnist.*folder:PATH"):
        dataset_info("cifar100")


def test_load_digits():
    data = load_dataset("digits", train=False)
    assert isinstance(data, TensorData) and len(data) == 360 and data.num_classes == 10
    assert data.images.shape == (360, 1, 8, 8) and data.image_shape == (1, 8, 8)
    small = data.subset(20)
    assert len(small) == 20 and torch.equal(small.labels, data.labels[:20]) and small.name == "digits[:20]"
    assert data.to("cpu").device.type == "cpu"
    with pytest.raises(ValueError, match="n must be"):
        data.subset(0)


def test_load_fake_mnist(fake_mnist_root):
    data = load_dataset("mnist", root=fake_mnist_root, train=False)
    assert data.images.shape == (20, 1, 28, 28) and data.images.dtype == torch.float32
    assert 0 <= data.images.min() and data.images.max() <= 1 and data.labels.dtype == torch.int64
    assert data.classes == [str(d) for d in range(10)] and data.name == "mnist"


def test_load_real_mnist_test(shared_data_root):
    data = load_dataset("mnist", root=shared_data_root, train=False)
    assert data.images.shape == (10_000, 1, 28, 28) and data.images.max() == 1.0


def test_tensordata_validation():
    with pytest.raises(ValueError, match="images"):
        TensorData(torch.zeros(3, 4, 4), torch.zeros(3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="labels"):
        TensorData(torch.zeros(3, 1, 4, 4), torch.zeros(2, dtype=torch.long), 2)
