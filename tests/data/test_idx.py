import gzip

import numpy as np
import pytest

from capsnets.data import DatasetError, check_md5, md5sum, read_idx


@pytest.mark.parametrize("name", ["x-idx3-ubyte.gz", "x-idx3-ubyte"])
def test_round_trip_uint8_images_and_labels(tmp_path, write_idx, name):
    images = np.random.default_rng(0).integers(0, 256, (7, 28, 28), dtype=np.uint8)
    labels = np.arange(7, dtype=np.uint8)
    got = read_idx(write_idx(tmp_path / name, images))
    assert got.dtype == np.uint8 and np.array_equal(got, images)
    assert np.array_equal(read_idx(write_idx(tmp_path / "l.gz", labels)), labels)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.float32, np.float64])
def test_round_trip_other_dtypes_to_native_order(tmp_path, write_idx, dtype):
    array = (np.arange(24).reshape(2, 3, 4) - 12).astype(dtype)
    got = read_idx(write_idx(tmp_path / "a.idx", array))
    assert got.dtype == np.dtype(dtype) and got.dtype.isnative and np.array_equal(got, array)


def test_truncated_file(tmp_path, write_idx):
    path = write_idx(tmp_path / "trunc-idx3-ubyte", np.zeros((4, 28, 28), np.uint8))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DatasetError, match=r"trunc-idx3-ubyte.*truncated.*3136.*3126"):
        read_idx(path)


def test_trailing_bytes(tmp_path, write_idx):
    path = write_idx(tmp_path / "long.idx", np.zeros((4,), np.uint8))
    path.write_bytes(path.read_bytes() + b"xx")
    with pytest.raises(DatasetError, match=r"long.idx.*2 trailing bytes"):
        read_idx(path)


def test_wrong_magic(tmp_path):
    path = tmp_path / "magic.idx"
    path.write_bytes(gzip.compress(b"\x01\x00\x08\x01\x00\x00\x00\x01\x05"))
    with pytest.raises(DatasetError, match=r"magic.idx.*wrong idx magic.*0x01000801") as info:
        read_idx(path)
    assert "--download" in str(info.value)


def test_unknown_dtype_code(tmp_path):
    path = tmp_path / "code.idx"
    path.write_bytes(b"\x00\x00\x07\x01\x00\x00\x00\x01\x05")
    with pytest.raises(DatasetError, match=r"code.idx.*unknown idx dtype code 0x07"):
        read_idx(path)


def test_corrupt_gzip(tmp_path, write_idx):
    path = write_idx(tmp_path / "bad.gz", np.zeros((100,), np.uint8))
    path.write_bytes(path.read_bytes()[:15])
    with pytest.raises(DatasetError, match=r"bad.gz.*corrupt gzip"):
        read_idx(path)
    (tmp_path / "plain.gz").write_bytes(b"\x00\x00\x08\x01")
    with pytest.raises(DatasetError, match=r"plain.gz.*expected gzip magic"):
        read_idx(tmp_path / "plain.gz")


def test_md5(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"hello")
    assert md5sum(path) == "5d41402abc4b2a76b9719d911017c592"
    check_md5(path, "5D41402ABC4B2A76B9719D911017C592")
    with pytest.raises(DatasetError, match=r"f.bin.*md5 mismatch.*expected 0{32}.*found 5d41402abc"):
        check_md5(path, "0" * 32)
