"""The offline viewpoint data set: index grid, determinism, image sanity, cache."""

from __future__ import annotations

import json
import warnings
from collections import Counter

import numpy as np
import pytest
import torch

from capsnets.data.norb_common import RawNorbLike
from capsnets.data.viewpoints import (
    AZIMUTHS,
    VIEWPOINT_CLASSES,
    build_instance,
    cache_path,
    load_viewpoints,
    render_viewpoints,
    viewpoint_grid,
)
from capsnets.data.viewpoints import cache as cache_module
from capsnets.data.viewpoints.render import BACKGROUND

BG = round(BACKGROUND * 255)
SMALL = dict(instances=None, elevations=[0, 8], azimuths=[0, 10, 18], lightings=[0, 3])


def small(split="train", seed=0, **kw):
    """All classes, the first toy of the split, 2 elevations x 3 azimuths x 2 lightings, grid order."""
    args = {**SMALL, "instances": [0] if split == "train" else [5], "shuffle": False, **kw}
    return render_viewpoints(split, seed, **args)


@pytest.fixture(scope="module")
def train_small() -> RawNorbLike:
    return small()


def _box(images: torch.Tensor):
    """Foreground bounding box per image: (row_lo, row_hi, col_lo, col_hi), each (N,)."""
    fg = images != BG
    idx = torch.arange(images.shape[-1])
    out = []
    for m in (fg.any(2), fg.any(1)):
        out += [torch.where(m, idx, 10**6).amin(1), torch.where(m, idx, -1).amax(1)]
    return out


# ---------------------------------------------------------------- index grid (no rendering)
@pytest.mark.parametrize("split, toys", [("train", range(5)), ("test", range(5, 10))])
def test_full_grid_matches_smallnorb(split, toys):
    labels, info = viewpoint_grid(split)
    assert len(labels) == 24_300 and all(len(v) == 24_300 for v in info.values())
    assert Counter(labels.tolist()) == {c: 4_860 for c in range(5)}
    assert Counter(info["instance"].tolist()) == {t: 4_860 for t in toys}
    assert Counter(info["elevation"].tolist()) == {e: 2_700 for e in range(9)}
    assert Counter(info["azimuth"].tolist()) == {a: 1_350 for a in range(0, 35, 2)}
    assert Counter(info["lighting"].tolist()) == {lit: 4_050 for lit in range(6)}
    keys = torch.stack([labels, *info.values()], 1)
    assert len(torch.unique(keys, dim=0)) == 24_300  # every (class, toy, view, lighting) once
    assert all(v.dtype == torch.int64 for v in [labels, *info.values()])


def test_bad_arguments_rejected():
    with pytest.raises(ValueError, match="split"):
        viewpoint_grid("val")
    with pytest.raises(ValueError, match="instances"):
        viewpoint_grid("train", instances=[5])  # toy 5 belongs to the test split
    with pytest.raises(ValueError, match="azimuths"):
        viewpoint_grid("test", azimuths=[3])
    with pytest.raises(ValueError, match="lightings"):
        viewpoint_grid("test", lightings=[1, 1])
    with pytest.raises(ValueError, match="seed"):
        render_viewpoints("train", seed=-1, classes=[0], instances=[0], elevations=[0], azimuths=[0])


# ---------------------------------------------------------------- rendering
def test_render_info_matches_grid(train_small):
    labels, info = viewpoint_grid("train", **{**SMALL, "instances": [0]})
    assert isinstance(train_small, RawNorbLike) and train_small.classes == VIEWPOINT_CLASSES
    assert train_small.images.shape == (len(labels), 48, 48) and train_small.images.dtype == torch.uint8
    assert torch.equal(train_small.labels, labels)
    for key, value in info.items():
        assert torch.equal(train_small.info[key], value)


def test_shuffle_is_a_seeded_permutation_of_the_same_images(train_small):
    mixed = small(shuffle=True)

    def key(raw):
        return raw.labels * 10**6 + raw.info["elevation"] * 10**4 + raw.info["azimuth"] * 10 + raw.info["lighting"]

    order = torch.argsort(key(mixed))
    assert not torch.equal(key(mixed), key(train_small))
    assert torch.equal(mixed.images[order], train_small.images)


def test_deterministic_and_independent_of_global_rng(train_small):
    torch.manual_seed(123)
    np.random.seed(123)
    threads = torch.get_num_threads()
    again = small(classes=[1], num_threads=2)  # the pixels do not depend on the thread count
    assert torch.equal(again.images, train_small.images[train_small.labels == 1])
    assert torch.get_num_threads() == threads
    other = small(seed=1)
    assert not torch.equal(other.images, train_small.images)


def test_objects_centred_and_filling_the_frame(train_small):
    images = train_small.images
    r0, r1, c0, c1 = _box(images)
    extent = torch.maximum(r1 - r0 + 1, c1 - c0 + 1) / 48
    assert extent.min() > 0.3 and extent.median() > 0.55 and extent.max() < 0.95
    assert (r0 > 0).all() and (c0 > 0).all() and (r1 < 47).all() and (c1 < 47).all()
    assert ((r0 + r1) / 2 - 23.5).abs().max() <= 5 and ((c0 + c1) / 2 - 23.5).abs().max() <= 5
    assert (images == BG).all(1).any(1).all()  # uniform background remains around the object


def test_lightings_and_azimuths_change_the_image(train_small):
    im = train_small.images.reshape(5, 2, 3, 2, 48, 48).float()  # class, elevation, azimuth, lighting
    fg = (im != BG).any(-1).any(-1)
    assert fg.all()
    lighting_change = (im[..., 0, :, :] - im[..., 1, :, :]).abs().mean((-1, -2))
    assert (lighting_change > 2).all()
    azimuth_change = (im[:, :, 0] - im[:, :, 1]).abs().mean((-1, -2))
    assert (azimuth_change > 2).all()
    # shading: pixels of one object under one lighting take many grey levels, not a flat silhouette
    levels = [len(torch.unique(img[img != BG])) for img in train_small.images[:20]]
    assert min(levels) >= 10


def test_size_and_supersample_arguments():
    raw = render_viewpoints(
        "test",
        3,
        size=32,
        supersample=1,
        classes=[2],
        instances=[9],
        elevations=[4],
        azimuths=[AZIMUTHS[5]],
        lightings=[1],
    )
    assert raw.images.shape == (1, 32, 32) and raw.info["instance"].tolist() == [9]
    assert (raw.images != BG).float().mean() > 0.03


def test_instances_fit_the_unit_sphere_and_share_primitives():
    kinds = []
    for label in range(5):
        parts, albedo = build_instance(label, 3, seed=0)
        points = np.concatenate([p.surface_points() for p in parts])
        assert np.linalg.norm(points, axis=1).max() == pytest.approx(1.0, abs=1e-6)
        assert 0 < albedo <= 1
        kinds.append({p.kind for p in parts})
    assert sum("frustum" in k for k in kinds) == 5 and sum("box" in k for k in kinds) >= 3
    a, b = build_instance(0, 1, seed=0)[0], build_instance(0, 2, seed=0)[0]
    assert not np.allclose(a[0].scale, b[0].scale)  # toys of one class differ in proportions


# ---------------------------------------------------------------- cache
@pytest.fixture
def tiny_render(monkeypatch):
    """Make load_viewpoints render a tiny subset, and count the renders."""
    calls = []

    def render(split, seed, size):
        calls.append((split, seed, size))
        return render_viewpoints(
            split,
            seed,
            size,
            classes=[0, 3],
            instances=[0] if split == "train" else [5],
            elevations=[2],
            azimuths=[4, 20],
            lightings=[5],
        )

    monkeypatch.setattr(cache_module, "render_viewpoints", render)
    return calls


def test_cache_round_trip(tmp_path, tiny_render, monkeypatch):
    monkeypatch.setenv("CAPSNETS_DATA", str(tmp_path))
    first = load_viewpoints(None, train=False, seed=2)
    path = cache_path(None, train=False, seed=2)
    assert path.parent == tmp_path / "viewpoints" and path.name == "viewpoints-seed2-test.safetensors"
    assert path.is_file() and not list(path.parent.glob("*.tmp"))
    second = load_viewpoints(tmp_path, train=False, seed=2)
    assert len(tiny_render) == 1  # the second call read the file
    assert torch.equal(first.images, second.images) and torch.equal(first.labels, second.labels)
    assert all(torch.equal(first.info[k], second.info[k]) for k in first.info)
    assert second.classes == VIEWPOINT_CLASSES


@pytest.mark.parametrize("damage", ["truncate", "flip_pixel", "garbage"])
def test_corrupt_cache_is_re_rendered(tmp_path, tiny_render, damage):
    good = load_viewpoints(tmp_path, train=True)
    path = cache_path(tmp_path, train=True)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip_pixel":  # one byte in the middle of the images tensor; the header stays valid
        header_len = int.from_bytes(data[:8], "little")
        start, end = json.loads(data[8 : 8 + header_len])["images"]["data_offsets"]
        data[8 + header_len + (start + end) // 2] ^= 0xFF
    else:
        data = bytearray(b"not a safetensors file")
    path.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="re-rendering"):
        again = load_viewpoints(tmp_path, train=True)
    assert len(tiny_render) == 2 and torch.equal(again.images, good.images)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_viewpoints(tmp_path, train=True)  # the rewritten file is good again
    assert len(tiny_render) == 2


def test_mismatched_cache_is_re_rendered(tmp_path, tiny_render):
    load_viewpoints(tmp_path, train=True, seed=0)
    cache_path(tmp_path, train=True, seed=5).write_bytes(cache_path(tmp_path, train=True, seed=0).read_bytes())
    with pytest.warns(UserWarning, match="seed"):
        raw = load_viewpoints(tmp_path, train=True, seed=5)
    assert tiny_render[-1] == ("train", 5, 48) and raw.info["instance"].tolist() == [0] * 4
    assert torch.equal(load_viewpoints(tmp_path, train=True, seed=5).images, raw.images)
    assert len(tiny_render) == 2


# ---------------------------------------------------------------- full size (slow: ~15 s per split)
@pytest.mark.slow
def test_full_split_renders_24300(tmp_path):
    raw = load_viewpoints(tmp_path, train=True)
    labels, info = viewpoint_grid("train")
    assert raw.images.shape == (24_300, 48, 48)
    order = torch.argsort(
        ((raw.labels * 10 + raw.info["instance"]) * 9 + raw.info["elevation"]) * 36 * 6
        + raw.info["azimuth"] * 6
        + raw.info["lighting"]
    )
    assert torch.equal(raw.labels[order], labels)
    assert all(torch.equal(raw.info[k][order], info[k]) for k in info)
    assert torch.equal(load_viewpoints(tmp_path, train=True).images, raw.images)
