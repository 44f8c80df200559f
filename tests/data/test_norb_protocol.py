"""TensorData.info / select, the smallNORB protocol, and load_dataset("smallnorb" | "viewpoints")."""

import sys

import pytest
import torch

from capsnets.data import DatasetError, DeviceLoader, RawNorbLike, TensorData, dataset_info, load_dataset, norb_protocol


def toy(n=10):
    info = {"azimuth": torch.arange(n) * 2, "elevation": torch.arange(n) % 3}
    return TensorData(
        torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1), torch.arange(n) % 2, 2, ["a", "b"], "toy", info=info
    )


def test_select_keeps_info_aligned():
    data = toy()
    picked = data.select(data.info["elevation"] == 1)
    assert picked.images.flatten().tolist() == [1, 4, 7] and picked.labels.tolist() == [1, 0, 1]
    assert picked.info["azimuth"].tolist() == [2, 8, 14] and picked.info["elevation"].tolist() == [1, 1, 1]
    assert picked.name == "toy[3 selected]" and picked.classes == ["a", "b"] and len(picked) == 3
    by_index = data.select(torch.tensor([9, 0]))
    assert by_index.info["azimuth"].tolist() == [18, 0] and by_index.images.flatten().tolist() == [9, 0]
    assert data.select([2, 3]).info["azimuth"].tolist() == [4, 6]
    assert data.select(slice(5, None)).info["elevation"].tolist() == [2, 0, 1, 2, 0]
    with pytest.raises(ValueError, match="mask"):
        data.select(torch.ones(3, dtype=torch.bool))


def test_subset_and_to_keep_info_and_augment():
    data = toy()
    data.augment = lambda images, generator: images
    small = data.subset(4)
    assert small.info["azimuth"].tolist() == [0, 2, 4, 6] and small.augment is data.augment
    moved = data.to("cpu")
    assert moved.info["elevation"].device.type == "cpu" and moved.augment is data.augment
    with pytest.raises(ValueError, match="info"):
        TensorData(torch.zeros(3, 1, 2, 2), torch.zeros(3, dtype=torch.long), 1, info={"x": torch.zeros(2)})
    assert TensorData(torch.zeros(1, 1, 2, 2), torch.zeros(1, dtype=torch.long), 1).info is None


def test_raw_norb_like_validates():
    info = {k: torch.zeros(3, dtype=torch.int32) for k in ("instance", "elevation", "azimuth", "lighting")}
    raw = RawNorbLike(torch.zeros(3, 48, 48, dtype=torch.uint8), torch.zeros(3, dtype=torch.int32), info, ["x"])
    assert raw.labels.dtype == torch.int64 and raw.info["azimuth"].dtype == torch.int64 and len(raw) == 3
    with pytest.raises(ValueError, match="lacks keys"):
        RawNorbLike(raw.images, raw.labels, {"instance": raw.labels}, ["x"])
    with pytest.raises(ValueError, match="uint8"):
        RawNorbLike(raw.images.float(), raw.labels, info, ["x"])


def test_protocol_on_48px_raw_images():
    n = 6
    images = torch.randint(0, 256, (n, 48, 48), dtype=torch.uint8)
    info = {k: torch.arange(n) for k in ("instance", "elevation", "azimuth", "lighting")}
    raw = RawNorbLike(images, torch.arange(n) % 5, info, ["animal", "human", "airplane", "truck", "car"])
    test = norb_protocol(raw, train=False, name="v")
    full = images.unsqueeze(1).float() / 255
    full = (full - full.mean((1, 2, 3), keepdim=True)) / full.std((1, 2, 3), keepdim=True, unbiased=False)
    torch.testing.assert_close(test.images, full[:, :, 8:40, 8:40])
    train = norb_protocol(raw, train=True)
    torch.testing.assert_close(train.images, full)
    assert train.input_shape == (1, 32, 32) and train.image_shape == (1, 48, 48) and test.augment is None


def test_load_fake_smallnorb(fake_smallnorb_root):
    root, arrays = fake_smallnorb_root
    test = load_dataset("smallnorb", root=root, train=False)
    assert test.images.shape == (8, 1, 32, 32) and test.images.dtype == torch.float32 and test.augment is None
    assert test.image_shape == dataset_info("smallnorb").image_shape == (1, 32, 32) and test.name == "smallnorb"
    assert test.info["azimuth"].tolist() == arrays["test"]["info"][:, 2].tolist()
    assert test.classes == ["animal", "human", "airplane", "truck", "car"] and test.num_classes == 5
    train = load_dataset("smallnorb", root=root, train=True)
    assert train.images.shape == (12, 1, 48, 48) and train.input_shape == (1, 32, 32)
    torch.testing.assert_close(train.images.mean((1, 2, 3)), torch.zeros(12), atol=1e-5, rtol=0)
    left = torch.from_numpy(arrays["train"]["dat"][:, 0]).float()[:, None] / 255  # (N, 1, 96, 96)
    expected = torch.nn.functional.avg_pool2d(left, 2)
    mean, std = expected.mean((1, 2, 3), keepdim=True), expected.std((1, 2, 3), keepdim=True, unbiased=False)
    expected = (expected - mean) / std
    torch.testing.assert_close(train.images, expected, atol=1e-5, rtol=1e-5)
    batches = list(DeviceLoader(train, 4, seed=0))
    assert [tuple(x.shape) for x, _ in batches] == [(4, 1, 32, 32)] * 3
    az = train.select(train.info["azimuth"] < 18)
    assert az.augment is train.augment and (az.info["azimuth"] < 18).all()


def test_viewpoints_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "capsnets.data.viewpoints", None)  # as if the package were absent
    with pytest.raises(DatasetError, match="viewpoints"):
        load_dataset("viewpoints", train=False)


def test_viewpoints_uses_the_protocol(monkeypatch, tmp_path):
    import types

    calls = []

    def load_viewpoints(root, train, seed=0):
        calls.append((root, train))
        n = 5
        info = {k: torch.arange(n) for k in ("instance", "elevation", "azimuth", "lighting")}
        return RawNorbLike(
            torch.randint(0, 256, (n, 48, 48), dtype=torch.uint8),
            torch.arange(n),
            info,
            ["animal", "human", "airplane", "truck", "car"],
        )

    module = types.ModuleType("capsnets.data.viewpoints")
    module.load_viewpoints = load_viewpoints
    monkeypatch.setitem(sys.modules, "capsnets.data.viewpoints", module)
    test = load_dataset("viewpoints", root=tmp_path, train=False)
    train = load_dataset("viewpoints", root=tmp_path, train=True)
    assert test.images.shape == (5, 1, 32, 32) and train.images.shape == (5, 1, 48, 48)
    assert train.augment is not None and test.name == "viewpoints" and calls == [(tmp_path, False), (tmp_path, True)]
    assert dataset_info("viewpoints").image_shape == (1, 32, 32)
