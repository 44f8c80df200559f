"""folder:PATH with images/ and labels.csv: multi-label folders written with Pillow, loaded, split, and refused
clearly."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from capsnets.data import DatasetError, TensorData, dataset_info, load_dataset, scan_image_folder
from capsnets.data.label_csv import MAX_LABEL_CLASSES, MAX_LABELS_CSV_BYTES_ENV


def write_folder(root: Path, rows: dict[str, str], header: str = "file,labels", size=(6, 5), extra: str = "") -> Path:
    """An image under ``root/images`` for each row's file, and ``labels.csv`` with ``header`` and the rows."""
    rng = np.random.default_rng(0)
    for name in rows:
        path = root / "images" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8), "L").save(path)
    lines = [header, *(f"{name},{cells}" for name, cells in rows.items())]
    (root / "labels.csv").write_text("\n".join(lines) + "\n" + extra)
    return root


ROWS = {f"{i:02d}.png": ["cat dog", "dog", "", "bird cat", "cat cat"][i % 5] for i in range(10)}


def test_seeded_split_multi_hot_targets_and_info(tmp_path):
    write_folder(tmp_path, ROWS)
    train, test = load_dataset(f"folder:{tmp_path}"), load_dataset(f"folder:{tmp_path}", train=False)
    assert train.multilabel and train.classes == ["bird", "cat", "dog"] and train.num_classes == 3
    assert train.labels.dtype == torch.float32 and train.labels.shape == (8, 3) and test.labels.shape == (2, 3)
    assert train.images.shape == (8, 1, 6, 5)
    # every row's set of classes, wherever the split put it ("cat cat" counts once; "" is no label)
    expected = {(0, 1, 1), (0, 0, 1), (0, 0, 0), (1, 1, 0), (0, 1, 0)}
    seen = {tuple(int(v) for v in row) for row in torch.cat([train.labels, test.labels])}
    assert seen == expected
    info = dataset_info(f"folder:{tmp_path}")
    assert info.multilabel and (info.num_classes, info.num_train, info.num_test) == (3, 8, 2)
    scan = scan_image_folder(tmp_path)
    assert scan.multilabel and not scan.presplit
    assert not {f for f, _ in scan.train} & {f for f, _ in scan.test}
    assert {f for f, _ in scan_image_folder(tmp_path, split_seed=1).test} != {f for f, _ in scan.test}
    assert torch.equal(load_dataset(f"folder:{tmp_path}", train=False).labels, test.labels)  # the same every time


def test_the_seeded_split_is_pinned(tmp_path):
    # saved runs name a folder and a seed: the same rows must give the same split in every version
    write_folder(tmp_path, {f"{i}.png": "x y" if i % 2 else "x" for i in range(7)})
    scan = scan_image_folder(tmp_path, test_fraction=0.3, split_seed=2)
    assert [f.name for f, _ in scan.test] == ["2.png", "4.png"]
    assert [f.name for f, _ in scan.train] == ["0.png", "1.png", "3.png", "5.png", "6.png"]


def test_split_column_subfolders_and_ignored_columns(tmp_path):
    rows = {"a/1.png": "x,train,note", "a/2.png": "x y,train,", "b/3.png": "y,test,", "4.png": ",TEST,"}
    write_folder(tmp_path, rows, header="file,labels,split,comment")
    scan = scan_image_folder(tmp_path)
    assert scan.presplit and scan.classes == ("x", "y")
    assert [(f.relative_to(tmp_path / "images").as_posix(), c) for f, c in scan.train] == [
        ("a/1.png", (0,)),
        ("a/2.png", (0, 1)),
    ]
    test = load_dataset(f"folder:{tmp_path}", train=False)
    assert sorted(test.labels.tolist()) == [[0.0, 0.0], [0.0, 1.0]]


def test_hidden_files_and_other_files_are_not_images(tmp_path):
    write_folder(tmp_path, {"1.png": "a", "2.png": "b", "3.png": "a b"})
    (tmp_path / "images" / ".hidden.png").write_bytes(b"")
    (tmp_path / "images" / "notes.txt").write_text("not an image")
    assert len(load_dataset(f"folder:{tmp_path}")) == 2


def _unlisted(root):
    write_folder(root, {"1.png": "a", "2.png": "b"})
    Image.new("L", (5, 6)).save(root / "images" / "3.png")


def _no_rows(root):
    (root / "images").mkdir()
    (root / "labels.csv").write_text("file,labels\n")


def _not_utf8(root):
    write_folder(root, {"1.png": "a"})
    (root / "labels.csv").write_bytes(b"file,labels\n1.png,\xe9\n")


def _too_many(root):
    names = " ".join(f"c{k}" for k in range(MAX_LABEL_CLASSES + 1))
    write_folder(root, {"1.png": names, "2.png": "c0"})


_ERRORS = {
    "no images folder": (lambda r: (r / "labels.csv").write_text("file,labels\n1.png,a\n"), "is not a folder"),
    "no labels column": (lambda r: write_folder(r, {"1.png": "a"}, header="file,label"), "no 'labels' column"),
    "no file column": (lambda r: write_folder(r, {"1.png": "a"}, header="name,labels"), "no 'file' column"),
    "no rows": (_no_rows, "has no rows"),
    "file absent": (lambda r: write_folder(r, {"1.png": "a"}, extra="2.png,b\n"), "2.png is not in"),
    "outside images": (lambda r: write_folder(r, {"1.png": "a"}, extra="../1.png,b\n"), "not a path under images/"),
    "not an image": (lambda r: write_folder(r, {"1.png": "a"}, extra="1.txt,b\n"), "is not an image"),
    "empty file cell": (lambda r: write_folder(r, {"1.png": "a b"}, extra=",b\n"), "line 3: the file cell is empty"),
    "duplicate row": (lambda r: write_folder(r, {"1.png": "a b"}, extra="1.png,b\n"), "has a row already .line 2"),
    "too many cells": (lambda r: write_folder(r, {"1.png": "a,b"}), "more cells than the 2 columns"),
    "image without a row": (_unlisted, "1 image.s. in .* have no row, e.g. 3.png"),
    "no label anywhere": (lambda r: write_folder(r, {"1.png": "", "2.png": ""}), "no row has a label"),
    "one class": (lambda r: write_folder(r, {"1.png": "a", "2.png": ""}), "only one class .a."),
    "too many classes": (_too_many, f"names 1,001 classes, more than the {MAX_LABEL_CLASSES:,}"),
    "unknown split": (
        lambda r: write_folder(r, {"1.png": "a,train", "2.png": "b,val"}, header="file,labels,split"),
        "line 3: split 'val' is unknown",
    ),
    "empty test split": (
        lambda r: write_folder(r, {"1.png": "a,train", "2.png": "b,train"}, header="file,labels,split"),
        "no row is in the test split",
    ),
    "single row": (lambda r: write_folder(r, {"1.png": "a b"}), "a single row, so no test split"),
    "not utf-8": (_not_utf8, "is not UTF-8"),
}


@pytest.mark.parametrize("case", list(_ERRORS))
def test_clear_errors(tmp_path, case):
    make, message = _ERRORS[case]
    make(tmp_path)
    with pytest.raises(DatasetError, match=message) as caught:
        load_dataset(f"folder:{tmp_path}")
    assert "Fix:" in str(caught.value)


def test_a_labels_file_over_the_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    write_folder(tmp_path, {"1.png": "a", "2.png": "b"})
    monkeypatch.setenv(MAX_LABELS_CSV_BYTES_ENV, "10")
    with pytest.raises(DatasetError, match=f"more than the 10 allowed.*{MAX_LABELS_CSV_BYTES_ENV}="):
        dataset_info(f"folder:{tmp_path}")


def test_tensor_data_takes_multi_hot_labels():
    labels = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    data = TensorData(torch.zeros(2, 1, 4, 4), labels, 3, info={"k": torch.tensor([5, 6])})
    assert data.multilabel and torch.equal(data.select(torch.tensor([False, True])).labels, labels[1:])
    assert torch.equal(data.subset(1).info["k"], torch.tensor([5]))
    with pytest.raises(ValueError, match="floating-point"):
        TensorData(torch.zeros(2, 1, 4, 4), labels.long(), 3)
    with pytest.raises(ValueError, match=r"\(N, num_classes\) multi-hot"):
        TensorData(torch.zeros(2, 1, 4, 4), labels, 4)
