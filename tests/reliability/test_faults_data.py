"""Fault class: data. Image files that are bombs (a few hundred bytes that claim 30000x30000 pixels), too many
or too large images in a ``folder:PATH`` data set, damaged files, unusual modes and formats. Each is refused from
its header, before any pixel is decoded, with one line that names the file, the size, the limit and how to raise
it, through ``capsnets.cli.main`` (train, predict) and the library functions."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile
from reliability.faults import one_error_line, train_args

from capsnets.cli import main
from capsnets.data import DatasetError, load_dataset, load_image_folder, read_image, scan_image_folder
from capsnets.data.image_folder import MAX_FOLDER_BYTES, MAX_FOLDER_BYTES_ENV, max_folder_bytes
from capsnets.engine import reporting
from capsnets.images import (
    MAX_IMAGE_PIXELS,
    MAX_IMAGE_PIXELS_ENV,
    ImageFileError,
    ImageTooLargeError,
    ImageTransform,
    max_image_pixels,
    open_image,
    open_image_header,
)
from capsnets.validation import ArgumentError


def png_claiming(path: Path, width: int, height: int) -> Path:
    """A 1-bit PNG of 8x8 pixels whose header (IHDR, its CRC recomputed) claims ``width x height``: a bomb of
    about 70 bytes, refused from its header or, if it were decoded, a truncated file."""
    Image.new("1", (8, 8), 1).save(path)
    data = bytearray(path.read_bytes())
    data[16:24] = struct.pack(">II", width, height)  # IHDR's data starts after the signature, length and type
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    path.write_bytes(bytes(data))
    return path


def image_folder(root: Path, bomb: Path | None = None, size=(12, 12), count: int = 3) -> Path:
    """``root/train`` and ``root/test`` with classes ``a`` and ``b`` of ``count`` grey images each; ``bomb``, if
    given, becomes the first training image (``train/a/0.png``)."""
    for split in ("train", "test"):
        for label, name in enumerate(("a", "b")):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.new("L", (size[1], size[0]), 60 * label + 20 * i).save(root / split / name / f"{i + 1}.png")
    if bomb is not None:
        (root / "train" / "a" / "0.png").write_bytes(bomb.read_bytes())
    return root


@pytest.fixture
def no_decoding(monkeypatch):
    """Decoding any image's pixels fails the test: what is refused must be refused from the header."""

    def load(self):
        raise AssertionError(f"pixels of {getattr(self, 'filename', '?')} decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("data-faults") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
        assert main([*train_args(1), "--out", str(out)]) == 0
    return out


def folder_train(root: Path, out: Path, *extra: str) -> list[str]:
    return [*train_args(1)[:3], "--dataset", f"folder:{root}", *train_args(1)[5:], "--out", str(out), *extra]


# -- bombs -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("side", [30000, 9000])
@pytest.mark.parametrize("image_size", [[], ["--image-size", "8"]])
def test_a_bomb_in_a_folder_is_one_line_from_its_header(tmp_path, capsys, no_decoding, side, image_size):
    bomb = png_claiming(tmp_path / "bomb.png", side, side)
    root = image_folder(tmp_path / "images", bomb)
    assert main(folder_train(root, tmp_path / "run", *image_size)) == 1
    line = one_error_line(capsys.readouterr().err)
    assert str(root / "train" / "a" / "0.png") in line
    assert f"{side * side:,} pixels" in line and f"more than the {MAX_IMAGE_PIXELS:,}" in line
    assert f"{MAX_IMAGE_PIXELS_ENV}={side * side}" in line
    assert not (tmp_path / "run" / "last.safetensors").exists()


@pytest.mark.parametrize("side", [30000, 9000])
def test_predict_refuses_a_bomb_from_its_header(run, tmp_path, capsys, side):
    bomb = png_claiming(tmp_path / "bomb.png", side, side)
    with pytest.MonkeyPatch.context() as patch:  # the checkpoint loads before the image: only images are watched
        patch.setattr(ImageFile.ImageFile, "load", lambda self: pytest.fail("a bomb was decoded"))
        assert main(["predict", "--checkpoint", str(run), str(bomb)]) == 1
    line = one_error_line(capsys.readouterr().err, "predict")
    assert f"'{bomb}' is an image of" in line and f"{side * side:,} pixels" in line and MAX_IMAGE_PIXELS_ENV in line


def test_the_library_refuses_bombs_with_a_specific_error(tmp_path, no_decoding):
    bomb = png_claiming(tmp_path / "bomb.png", 30000, 30000)
    for call in (
        lambda: open_image(bomb),
        lambda: open_image_header(bomb),
        lambda: ImageTransform((1, 28, 28), "mnist")(bomb),
    ):
        with pytest.raises(ImageTooLargeError, match=r"bomb\.png' is an image of 900,000,000 pixels") as info:
            call()
        assert isinstance(info.value, ValueError) and info.value.path == bomb
    opened = Image.open(png_claiming(tmp_path / "opened.png", 9000, 9000))  # opened by the caller, not decoded
    with pytest.raises(ImageTooLargeError, match=r"opened\.png' is an image of 81,000,000 pixels"):
        ImageTransform((1, 28, 28))(opened)
    with pytest.raises(DatasetError, match=r"bomb\.png' is an image of 900,000,000 pixels"):
        read_image(bomb, 1, (8, 8))
    root = image_folder(tmp_path / "images", bomb)
    for call in (lambda: scan_image_folder(root), lambda: load_dataset(f"folder:{root}", image_size=8)):
        with pytest.raises(DatasetError, match=f"{MAX_IMAGE_PIXELS_ENV}=900000000"):
            call()


def test_the_pixel_limit_at_and_past_its_default(tmp_path, no_decoding):
    assert max_image_pixels() == MAX_IMAGE_PIXELS == 8192 * 8192
    with open_image_header(png_claiming(tmp_path / "at.png", 8192, 8192)) as image:
        assert image.size == (8192, 8192)
    with pytest.raises(ImageTooLargeError, match="an image of 67,117,056 pixels, more than the 67,108,864"):
        open_image_header(png_claiming(tmp_path / "past.png", 8192, 8193))


def test_the_pixel_limit_is_raised_and_lowered_by_its_variable(tmp_path, monkeypatch):
    image_folder(tmp_path / "images", size=(8, 8))
    monkeypatch.setenv(MAX_IMAGE_PIXELS_ENV, "64")
    assert max_image_pixels() == 64
    assert load_image_folder(tmp_path / "images").images.shape[1:] == (1, 8, 8)  # at the limit: read
    Image.new("L", (9, 8)).save(tmp_path / "images" / "train" / "b" / "9.png")
    with pytest.raises(DatasetError, match=r"9\.png' is an image of 72 pixels, more than the 64"):
        load_image_folder(tmp_path / "images")
    monkeypatch.setenv(MAX_IMAGE_PIXELS_ENV, "72")
    assert load_image_folder(tmp_path / "images", image_size=(8, 9)).images.shape[1:] == (1, 8, 9)
    with pytest.raises(ValueError, match=r"image_size=\(9, 9\) is invalid: 9x9 is more than the 72 pixels"):
        load_image_folder(tmp_path / "images", image_size=(9, 9))
    monkeypatch.setenv(MAX_IMAGE_PIXELS_ENV, str(9000 * 9000))  # raised: a 9000x9000 header is let through
    with open_image_header(png_claiming(tmp_path / "big.png", 9000, 9000)) as image:
        assert image.size == (9000, 9000)


def test_the_variable_replaces_pillows_own_limit_and_leaves_it_as_it_was(tmp_path, monkeypatch, no_decoding):
    default = Image.MAX_IMAGE_PIXELS
    monkeypatch.setenv(MAX_IMAGE_PIXELS_ENV, str(10**9))  # past Pillow's default, 2 x 89,478,485
    with open_image_header(png_claiming(tmp_path / "bomb.png", 30000, 30000)) as image:
        assert image.size == (30000, 30000)
    monkeypatch.setenv(MAX_IMAGE_PIXELS_ENV, "64")
    with pytest.warns(Image.DecompressionBombWarning), Image.open(png_claiming(tmp_path / "own.png", 9500, 9500)):
        pass  # the caller's own Pillow keeps its limit (a warning past it)
    with pytest.raises(ImageTooLargeError):
        open_image_header(tmp_path / "own.png")
    assert Image.MAX_IMAGE_PIXELS == default


@pytest.mark.parametrize("value", ["many", "-5", "0", "1e9", "²"])
def test_a_bad_limit_variable_is_refused_in_one_line(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv(MAX_IMAGE_PIXELS_ENV, value)
    with pytest.raises(ArgumentError, match=f"{MAX_IMAGE_PIXELS_ENV}=.* is invalid: expected a positive whole"):
        max_image_pixels()
    root = image_folder(tmp_path / "images", size=(8, 8))
    assert main(folder_train(root, tmp_path / "run")) == 1
    assert MAX_IMAGE_PIXELS_ENV in one_error_line(capsys.readouterr().err)
    monkeypatch.setenv(MAX_FOLDER_BYTES_ENV, value)
    with pytest.raises(ArgumentError, match=f"{MAX_FOLDER_BYTES_ENV}=.* is invalid"):
        max_folder_bytes()


# -- many or large images in a folder ---------------------------------------------------------------------
def test_a_split_too_large_for_memory_is_refused_before_decoding(tmp_path, monkeypatch):
    root = image_folder(tmp_path / "images", size=(8, 8))
    assert max_folder_bytes() == MAX_FOLDER_BYTES == 4 * 2**30
    need = 6 * 1 * 8 * 8 * 4  # 6 training images of 1x8x8 as float32
    monkeypatch.setenv(MAX_FOLDER_BYTES_ENV, str(need))
    assert load_image_folder(root).images.shape == (6, 1, 8, 8)  # at the limit
    monkeypatch.setenv(MAX_FOLDER_BYTES_ENV, str(need - 1))
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: pytest.fail("decoded"))
    with pytest.raises(DatasetError) as info:
        load_image_folder(root)
    message = str(info.value)
    assert "the training split's 6 images of 1x8x8 (the size of the first image, as no image size was given)" in message
    assert "--image-size" in message and f"{MAX_FOLDER_BYTES_ENV}={need}" in message


def test_the_first_images_size_cannot_ask_for_unbounded_memory(tmp_path, capsys, no_decoding):
    # 8000x8000 is under the pixel limit, but 6 of them as float32 would be 1.4 GiB: refused under a small limit
    root = image_folder(tmp_path / "images", png_claiming(tmp_path / "large.png", 8000, 8000), size=(8, 8))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(MAX_FOLDER_BYTES_ENV, str(2**30))
        assert main(folder_train(root, tmp_path / "run")) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "the training split's 7 images of 1x8000x8000" in line and "--image-size" in line


# -- damaged files, modes and formats ---------------------------------------------------------------------
def _damaged(path: Path, how: str) -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG" if path.suffix == ".jpg" else "PNG")
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbled":
        path.write_bytes(data[:60] + bytes(40) + data[100:])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "text":
        path.write_text("not an image")


@pytest.mark.parametrize("how", ["truncated", "garbled", "empty", "text"])
@pytest.mark.parametrize("suffix", [".png", ".jpg"])
def test_a_damaged_file_in_a_folder_is_one_line_naming_it(tmp_path, capsys, how, suffix):
    root = image_folder(tmp_path / "images", size=(8, 8))
    damaged = root / "train" / "b" / f"damaged{suffix}"
    _damaged(damaged, how)
    assert main(folder_train(root, tmp_path / "run", "--image-size", "8")) == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"{damaged}: cannot be read as an image" in line and "Fix: replace or delete the file" in line
    with pytest.raises(ImageFileError, match=f"damaged{suffix}' is not an image that can be read"):
        open_image(damaged)


def _odd_images(folder: Path) -> None:
    folder.mkdir(parents=True)
    Image.new("CMYK", (10, 12), (10, 200, 30, 40)).save(folder / "cmyk.jpg")
    Image.fromarray((np.arange(120, dtype=np.uint16) * 500).reshape(12, 10)).save(folder / "sixteen.png")
    Image.new("RGB", (10, 12), (255, 0, 0)).convert("RGBA").save(folder / "rgba.png")
    palette = Image.new("P", (10, 12), 3)
    palette.putpalette([v for i in range(256) for v in (i, 255 - i, i // 2)])
    palette.save(folder / "palette.png", transparency=3)
    Image.new("LA", (10, 12), (100, 128)).save(folder / "la.png")
    Image.new("1", (10, 12), 1).save(folder / "bilevel.png")
    frames = [Image.new("RGB", (10, 12), (40 * i, 0, 0)) for i in range(4)]
    frames[0].save(folder / "animated.png", save_all=True, append_images=frames[1:])  # APNG: the first frame
    frames[0].convert("P").save(folder / "gif.png", format="GIF", save_all=True, append_images=frames[1:])


def test_unusual_modes_and_animations_load(tmp_path):
    _odd_images(tmp_path / "images" / "a")
    (tmp_path / "images" / "b").mkdir()
    for i in range(3):
        Image.new("L", (10, 12), 50 * i).save(tmp_path / "images" / "b" / f"{i}.png")
    data = load_image_folder(tmp_path / "images", test_fraction=0.5)
    test = load_image_folder(tmp_path / "images", test_fraction=0.5, train=False)
    images = torch.cat([data.images, test.images])
    assert images.shape[1:] == (3, 12, 10) and len(images) == 11
    assert torch.isfinite(images).all() and images.min() >= 0 and images.max() <= 1
    for name in ("cmyk.jpg", "sixteen.png", "palette.png", "animated.png", "gif.png"):
        path = tmp_path / "images" / "a" / name
        assert ImageTransform((1, 28, 28), "mnist")(path).shape == (1, 28, 28)
        assert read_image(path, 3).shape == (3, 12, 10)


def test_formats_outside_the_list_are_refused_whatever_the_name(tmp_path, no_decoding):
    eps = tmp_path / "drawing.png"
    Image.new("L", (8, 8)).save(eps, format="EPS")  # Pillow would run Ghostscript to decode it
    with pytest.raises(ImageFileError, match=r"drawing\.png' is not an image that can be read .*formats read: PNG"):
        open_image(eps)
    root = image_folder(tmp_path / "images", size=(8, 8))
    (root / "train" / "a" / "drawing.png").write_bytes(eps.read_bytes())
    with pytest.raises(DatasetError, match=r"drawing\.png: cannot be read as an image"):
        scan_image_folder(root)


def test_a_folder_is_sized_and_coloured_from_its_headers_alone(tmp_path, monkeypatch):
    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6  # the camera was turned: the sensor's 20x10 is shown 10 wide and 20 high
    Image.new("L", (20, 10), 90).save(root / "a" / "0.jpg", exif=exif)
    for folder in ("a", "b"):
        for i in range(1, 4):
            grey = Image.new("P", (10, 20), i)
            grey.putpalette([v for k in range(256) for v in (k, k, k)])
            grey.save(root / folder / f"{i}.png")
    with monkeypatch.context() as patch:
        patch.setattr(ImageFile.ImageFile, "load", lambda self: pytest.fail(f"{self.filename} decoded"))
        scan = scan_image_folder(root)
    assert scan.image_shape == (1, 20, 10)
    data = load_image_folder(root)
    assert data.images.shape[1:] == (1, 20, 10)


def real_png(path: Path, width: int, height: int) -> Path:
    """A decodable 8-bit grey PNG of zeros, compressed as it is written (9000x9000: 78 kB, in about a second)."""
    compressor, row = zlib.compressobj(9), bytes(width + 1)  # each row: filter type 0, then the pixels
    data = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", data) + chunk(b"IEND", b""))
    return path


_MEASURE = """
import json, resource, sys, time
from capsnets.cli import main
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
status = main(sys.argv[1:])
print(json.dumps({"status": status, "seconds": time.perf_counter() - start,
                  "grown_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before}))
"""


@pytest.mark.faults_long
@pytest.mark.parametrize("side", [9000, 30000])
def test_a_real_bomb_costs_no_memory_in_a_fresh_process(tmp_path, side):
    """The decodable PNGs themselves, in a fresh process: the peak memory of the refusal stays that of the imports."""
    root = image_folder(tmp_path / "images", real_png(tmp_path / "bomb.png", side, side), size=(8, 8))
    argv = [sys.executable, "-c", _MEASURE, *folder_train(root, tmp_path / "run")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["status"] == 1 and f"{side * side:,} pixels" in one_error_line(done.stderr)
    assert result["grown_kib"] < 100 * 1024 and result["seconds"] < 30, result


def test_a_damaged_exif_is_read_as_far_as_it_goes(run, tmp_path, capsys):
    exif = Image.Exif()
    exif[0x010F], exif[0x0112] = "cam", 6  # the camera's make, then the orientation: turned a quarter
    photo = tmp_path / "photo.jpg"
    Image.new("L", (20, 10), 200).save(photo, exif=exif)
    data = bytearray(photo.read_bytes())
    make = data.index(b"Exif") + 16  # the first entry of the first IFD: the make, as big-endian 0x010F
    assert data[make : make + 2] == b"\x01\x0f"
    data[make + 1] = 0  # now ImageWidth (a number) holding the text "cam": Pillow cannot write this EXIF back
    photo.write_bytes(bytes(data))
    assert read_image(photo, 1).shape == (1, 20, 10)  # still turned by its orientation
    assert ImageTransform((1, 28, 28), "mnist")(photo).shape == (1, 28, 28)
    assert main(["predict", "--checkpoint", str(run), str(photo)]) == 0
    assert "Traceback" not in capsys.readouterr().err
