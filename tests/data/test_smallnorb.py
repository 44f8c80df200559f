"""The NORB matrix reader and SmallNORB on small files fabricated in the exact on-disk format."""

import gzip
import hashlib
import struct

import numpy as np
import pytest
import torch

from capsnets.data import DatasetError, SmallNORB, read_norb_matrix
from capsnets.data.smallnorb import azimuth_degrees, elevation_degrees

from .conftest import fake_norb_split, norb_bytes


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float32, np.float64, np.int16])
@pytest.mark.parametrize("shape", [(5,), (4, 3), (2, 3, 4), (2, 2, 3, 5)])
def test_round_trip(tmp_path, write_norb, dtype, shape):
    array = (np.arange(np.prod(shape)) % 120).astype(dtype).reshape(shape)
    for name in ("m.mat", "m.mat.gz"):
        out = read_norb_matrix(write_norb(tmp_path / name, array))
        assert out.dtype == array.dtype and out.shape == shape and np.array_equal(out, array)


def test_stores_three_dims_for_low_rank(tmp_path):
    data = norb_bytes(np.arange(7, dtype=np.int32))
    assert struct.unpack("<Ii3i", data[:20]) == (0x1E3D4C54, 1, 7, 1, 1) and len(data) == 20 + 28
    (tmp_path / "cat.mat").write_bytes(data)
    assert read_norb_matrix(tmp_path / "cat.mat").tolist() == list(range(7))


def test_bad_magic(tmp_path):
    data = bytearray(norb_bytes(np.zeros((2, 3, 4), np.uint8)))
    data[:4] = struct.pack("<I", 0x1E3D4C52)  # packed matrix: unsupported
    (tmp_path / "x.mat").write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"x\.mat: wrong NORB magic.*0x1E3D4C55 \(uint8\).*found 0x1E3D4C52"):
        read_norb_matrix(tmp_path / "x.mat")


def test_truncated_and_trailing(tmp_path):
    data = norb_bytes(np.zeros((3, 4, 5), np.uint8))
    (tmp_path / "short.mat.gz").write_bytes(gzip.compress(data[:-7]))
    with pytest.raises(DatasetError, match=r"short\.mat\.gz: truncated file.*need 60 data bytes, found 53.*download"):
        read_norb_matrix(tmp_path / "short.mat.gz")
    (tmp_path / "long.mat").write_bytes(data + b"\0\0")
    with pytest.raises(DatasetError, match=r"long\.mat: 2 trailing bytes"):
        read_norb_matrix(tmp_path / "long.mat")
    (tmp_path / "head.mat").write_bytes(data[:14])
    with pytest.raises(DatasetError, match=r"head\.mat: truncated NORB header.*needs 20 bytes, found 14"):
        read_norb_matrix(tmp_path / "head.mat")
    (tmp_path / "corrupt.mat.gz").write_bytes(gzip.compress(data)[:30])
    with pytest.raises(DatasetError, match="corrupt gzip"):
        read_norb_matrix(tmp_path / "corrupt.mat.gz")


def test_smallnorb_round_trip(fake_smallnorb_root):
    root, arrays = fake_smallnorb_root
    for train, split in ((True, "train"), (False, "test")):
        data = SmallNORB(root, train=train)
        written = arrays[split]
        assert len(data) == len(written["cat"]) and data.images.dtype == torch.uint8
        assert torch.equal(data.images, torch.from_numpy(written["dat"][:, 0]))  # the left camera
        assert data.labels.dtype == torch.int64 and data.labels.tolist() == written["cat"].tolist()
        assert list(data.info) == ["instance", "elevation", "azimuth", "lighting"]
        for column, key in enumerate(data.info):
            assert data.info[key].dtype == torch.int64
            assert data.info[key].tolist() == written["info"][:, column].tolist()
        assert data.classes == ["animal", "human", "airplane", "truck", "car"]
    stereo = SmallNORB(root, train=False, stereo=True)
    assert torch.equal(stereo.images, torch.from_numpy(arrays["test"]["dat"]))
    assert torch.equal(stereo.raw().images, torch.from_numpy(arrays["test"]["dat"][:, 0]))


def test_uncompressed_files_are_read(tmp_path, monkeypatch):
    folder = tmp_path / "smallnorb"
    folder.mkdir()
    written = fake_norb_split(folder, "smallnorb-5x01235x9x18x6x2x96x96-testing", 3, 2, compress=False)
    md5s = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    monkeypatch.setattr(SmallNORB, "md5s", md5s)
    assert SmallNORB(tmp_path, train=False).labels.tolist() == written["cat"].tolist()


def test_degrees():
    assert azimuth_degrees(torch.tensor([0, 2, 34])).tolist() == [0, 20, 340]
    assert elevation_degrees(torch.tensor([0, 8])).tolist() == [30, 70]


def test_missing_files_and_md5(tmp_path, fake_smallnorb_root):
    with pytest.raises(DatasetError, match=r"missing smallnorb-5x46789.*training-dat\.mat\.gz.*--download"):
        SmallNORB(tmp_path / "empty")
    root, _ = fake_smallnorb_root
    SmallNORB.md5s["smallnorb-5x01235x9x18x6x2x96x96-testing-cat.mat.gz"] = "0" * 32
    with pytest.raises(DatasetError, match=r"testing-cat\.mat\.gz: md5 mismatch: expected 0{32}"):
        SmallNORB(root, train=False)


def _replace(root, name, array, monkeypatch):
    path = root / "smallnorb" / name
    path.write_bytes(gzip.compress(norb_bytes(array)))
    monkeypatch.setitem(SmallNORB.md5s, name, hashlib.md5(path.read_bytes()).hexdigest())


def test_count_mismatch(fake_smallnorb_root, monkeypatch):
    root, _ = fake_smallnorb_root
    _replace(root, "smallnorb-5x01235x9x18x6x2x96x96-testing-cat.mat.gz", np.zeros(7, np.int32), monkeypatch)
    with pytest.raises(DatasetError, match=r"has 8 image pairs but .*testing-cat\.mat\.gz has 7 rows"):
        SmallNORB(root, train=False)


def test_wrong_shape_dtype_and_labels(fake_smallnorb_root, monkeypatch):
    root, _ = fake_smallnorb_root
    prefix = "smallnorb-5x01235x9x18x6x2x96x96-testing"
    _replace(root, f"{prefix}-info.mat.gz", np.zeros((8, 3), np.int32), monkeypatch)
    with pytest.raises(DatasetError, match=r"info\.mat\.gz: expected a int32 matrix of shape \(N, 4\), found int32"):
        SmallNORB(root, train=False)
    _replace(root, f"{prefix}-info.mat.gz", np.zeros((8, 4), np.int32), monkeypatch)
    _replace(root, f"{prefix}-dat.mat.gz", np.zeros((8, 2, 96, 96), np.int16), monkeypatch)
    with pytest.raises(DatasetError, match=r"dat\.mat\.gz: expected a uint8 matrix of shape \(N, 2, 96, 96\)"):
        SmallNORB(root, train=False)
    _replace(root, f"{prefix}-dat.mat.gz", np.zeros((8, 2, 96, 96), np.uint8), monkeypatch)
    _replace(root, f"{prefix}-cat.mat.gz", np.full(8, 5, np.int32), monkeypatch)
    with pytest.raises(DatasetError, match=r"labels must be in 0\.\.4, found 5\.\.5"):
        SmallNORB(root, train=False)


def test_download_from_file_mirror(tmp_path, fake_smallnorb_root, monkeypatch):
    source, _ = fake_smallnorb_root
    monkeypatch.setattr(SmallNORB, "mirrors", [(source / "smallnorb").as_uri() + "/"])
    data = SmallNORB(tmp_path / "fresh", train=True, download=True)
    assert len(data) == 12 and len(list((tmp_path / "fresh" / "smallnorb").glob("*.mat.gz"))) == 6
