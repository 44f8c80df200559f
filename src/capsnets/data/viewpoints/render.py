"""Rendering the viewpoint data set: the index grid, the camera, the ray caster and the shading.

For each toy, the rays of a chunk of views (one perspective camera per elevation x azimuth, every pixel at
once, ``supersample x supersample`` rays per pixel) are cast against every part; the nearest hit's normal is
computed once and shaded under all six lightings (Lambertian + ambient), then the rays are averaged down
to ``size x size`` and quantised to uint8.

Dimension legend: ``V`` views in a chunk, ``P`` rays per view (``(size * supersample) ** 2``),
``L`` lightings, ``S`` side of a supersampled image.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from capsnets.validation import ArgumentError

from ..norb_common import RawNorbLike
from .geometry import Part, intersect, local_normal
from .objects import VIEWPOINT_CLASSES, build_instance

__all__ = ["render_viewpoints", "viewpoint_grid", "split_instances", "AZIMUTHS", "ELEVATIONS", "LIGHTINGS"]

#: smallNORB azimuth units (x10 = degrees): 0, 20, ..., 340 degrees.
AZIMUTHS = tuple(range(0, 35, 2))
#: Elevation indices: 30, 35, ..., 70 degrees above the horizontal.
ELEVATIONS = tuple(range(9))
#: The six lightings: ``(ambient, ((azimuth, elevation, intensity), ...))``. Light azimuths (degrees) are
#: relative to the camera's azimuth (0 = from the camera's side), light elevations are fixed in the room,
#: as on smallNORB's turntable where the object turns and the lamps stay put.
LIGHTINGS = (
    (0.20, ((35.0, 50.0, 0.85),)),
    (0.20, ((-50.0, 40.0, 0.85),)),
    (0.25, ((0.0, 85.0, 0.75),)),
    (0.15, ((80.0, 30.0, 0.5), (-80.0, 30.0, 0.5))),
    (0.30, ((10.0, 15.0, 0.65),)),
    (0.20, ((150.0, 60.0, 0.6), (-20.0, 45.0, 0.35))),
)
BACKGROUND = 0.15
_CAMERA_DISTANCE = 6.0
_FILL = 0.85  # the unit sphere around the object spans this fraction of the frame
_SHUFFLE_SALT = 7919  # salts the seed of the shuffle so that it differs from the instances' seeds


def split_instances(split: str) -> tuple[int, ...]:
    """The toy instances of a split: 0..4 for ``"train"``, 5..9 for ``"test"``."""
    if split not in ("train", "test"):
        raise ArgumentError(f"split must be 'train' or 'test', got {split!r}")
    return tuple(range(5)) if split == "train" else tuple(range(5, 10))


def _pick(name: str, chosen: Sequence[int] | None, allowed: Sequence[int]) -> list[int]:
    if chosen is None:
        return list(allowed)
    bad = [c for c in chosen if c not in allowed]
    if bad or not chosen or len(set(chosen)) != len(chosen):
        raise ArgumentError(f"{name} must be distinct values from {list(allowed)}, got {list(chosen)}")
    return list(chosen)


def viewpoint_grid(
    split: str, *, classes=None, instances=None, elevations=None, azimuths=None, lightings=None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Labels and info of every image of a split (or the chosen subset), without rendering.

    Order: class, instance, elevation, azimuth, lighting (the last varies fastest). Every argument left
    as None means all of it; ``instances`` are toy indices 0..9 of the split, ``azimuths`` in smallNORB
    units (0, 2, ..., 34).

    Returns:
        ``(labels, info)``: int64 ``(N,)`` and a dict of int64 ``(N,)`` with keys ``instance``,
        ``elevation``, ``azimuth``, ``lighting``. The full grid has N = 5 x 5 x 9 x 18 x 6 = 24,300.
    """
    axes = [
        _pick("classes", classes, range(len(VIEWPOINT_CLASSES))),
        _pick("instances", instances, split_instances(split)),
        _pick("elevations", elevations, ELEVATIONS),
        _pick("azimuths", azimuths, AZIMUTHS),
        _pick("lightings", lightings, range(len(LIGHTINGS))),
    ]
    grids = torch.meshgrid(*[torch.tensor(a, dtype=torch.int64) for a in axes], indexing="ij")
    label, instance, elevation, azimuth, lighting = (g.reshape(-1) for g in grids)
    return label, {"instance": instance, "elevation": elevation, "azimuth": azimuth, "lighting": lighting}


@dataclass
class _Camera:
    """Perspective cameras of a chunk of views, looking at the origin from ``distance * back``.

    ``back``, ``right``, ``up``: ``(V, 3)`` orthonormal frames (world z is up); ``origin`` ``(V, 1, 3)``;
    ``direction`` ``(V, P, 3)`` (not unit) for pixel ``P = row * side + column``, rows top to bottom.
    """

    back: np.ndarray
    right: np.ndarray
    up: np.ndarray
    side: int
    tan_half: float = math.tan(math.asin(1.0 / _CAMERA_DISTANCE)) / _FILL

    def __post_init__(self) -> None:
        self.coords = ((np.arange(self.side) + 0.5) / self.side * 2 - 1) * self.tan_half
        v, u = np.meshgrid(-self.coords, self.coords, indexing="ij")  # (S, S): row r looks at height -coords[r]
        u, v = u.reshape(1, -1, 1), v.reshape(1, -1, 1)
        direction = -self.back[:, None] + u * self.right[:, None] + v * self.up[:, None]
        self.direction = torch.from_numpy(direction.astype(np.float32))
        self.origin = torch.from_numpy((_CAMERA_DISTANCE * self.back[:, None]).astype(np.float32))

    @classmethod
    def looking_from(cls, azimuth_deg: np.ndarray, elevation_deg: np.ndarray, side: int) -> _Camera:
        az, el = np.radians(azimuth_deg)[:, None], np.radians(elevation_deg)[:, None]
        back = np.concatenate([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], 1)
        right = np.concatenate([-np.sin(az), np.cos(az), np.zeros_like(az)], 1)
        return cls(back, right, np.cross(back, right), side)

    def pixel_window(self, center: np.ndarray, radius: float) -> Tensor:
        """Flat pixel indices ``(V, h * w)`` of a window, the same size in every view, that holds the
        image of the sphere ``(center, radius)`` in each view (a conservative bound; no repeats)."""
        rel = center[None] - _CAMERA_DISTANCE * self.back  # (V, 3)
        depth = -(rel * self.back).sum(1)
        u, v = (rel * self.right).sum(1) / depth, (rel * self.up).sum(1) / depth
        spread_u = radius * (1 + np.abs(u)) / (depth - radius)
        spread_v = radius * (1 + np.abs(v)) / (depth - radius)
        to_px = lambda x: (x / self.tan_half + 1) / 2 * self.side - 0.5  # noqa: E731
        c_lo, c_hi = np.floor(to_px(u - spread_u)) - 1, np.ceil(to_px(u + spread_u)) + 1
        r_lo, r_hi = np.floor(to_px(-v - spread_v)) - 1, np.ceil(to_px(-v + spread_v)) + 1
        h = int(min(self.side, (r_hi - r_lo).max() + 1))
        w = int(min(self.side, (c_hi - c_lo).max() + 1))
        r0 = np.clip(r_lo, 0, self.side - h).astype(np.int64)
        c0 = np.clip(c_lo, 0, self.side - w).astype(np.int64)
        flat = (r0[:, None, None] + np.arange(h)[None, :, None]) * self.side + c0[:, None, None] + np.arange(w)
        return torch.from_numpy(flat.reshape(len(flat), -1))


def _hits(parts: Sequence[Part], camera: _Camera) -> tuple[Tensor, Tensor, Tensor]:
    """The rays that hit the object: view and pixel indices ``(K,)`` and unit normals ``(K, 3)``.

    Each part is cast only against the window of pixels its bounding sphere can cover.
    """
    shape = camera.direction.shape[:2]
    best = torch.full(shape, math.inf)
    which = torch.full(shape, -1, dtype=torch.int64)
    for k, part in enumerate(parts):
        window = camera.pixel_window(*part.bounding_sphere())  # (V, h * w)
        direction = camera.direction.gather(1, window.unsqueeze(-1).expand(-1, -1, 3))
        t = intersect(part, camera.origin, direction)
        current = best.gather(1, window)
        closer = t < current
        best.scatter_(1, window, torch.where(closer, t, current))
        which.scatter_(1, window, torch.where(closer, k, which.gather(1, window)))
    views, rays = (which >= 0).nonzero(as_tuple=True)
    normals = torch.empty(len(views), 3)
    owner = which[views, rays]
    for k, part in enumerate(parts):
        mine = (owner == k).nonzero(as_tuple=True)[0]
        v, r = views[mine], rays[mine]
        points = camera.origin[v, 0] + best[v, r].unsqueeze(-1) * camera.direction[v, r]
        normals[mine] = local_normal(part, points)
    return views, rays, normals


def _light_directions(azimuth_deg: np.ndarray, lighting: tuple) -> list[tuple[Tensor, float]]:
    """Per-view unit vectors ``(V, 3)`` towards each lamp of one lighting, with its intensity."""
    out = []
    for lamp_az, lamp_el, intensity in lighting[1]:
        az, el = np.radians(azimuth_deg + lamp_az), math.radians(lamp_el)
        vec = np.stack([math.cos(el) * np.cos(az), math.cos(el) * np.sin(az), np.full_like(az, math.sin(el))], 1)
        out.append((torch.from_numpy(vec.astype(np.float32)), intensity))
    return out


def _shade(
    views: Tensor,
    rays: Tensor,
    normals: Tensor,
    albedo: float,
    azimuth_deg: np.ndarray,
    lightings: Sequence[int],
    side: int,
    supersample: int,
) -> Tensor:
    """uint8 images ``(V, L, side, side)`` of one chunk under each chosen lighting."""
    big = torch.full((len(azimuth_deg), len(lightings), (side * supersample) ** 2), BACKGROUND)
    for slot, index in enumerate(lightings):
        value = torch.full((len(views),), LIGHTINGS[index][0])
        for vec, intensity in _light_directions(azimuth_deg, LIGHTINGS[index]):
            value = value + intensity * (normals * vec[views]).sum(-1).clamp_min(0)
        big[views, slot, rays] = (albedo * value).clamp(0, 1)
    big = big.reshape(len(azimuth_deg), len(lightings), side * supersample, side * supersample)
    small = F.avg_pool2d(big, supersample) if supersample > 1 else big
    return (small * 255).round().to(torch.uint8)


def _render_instance(parts, albedo, views: list[tuple[int, int]], lightings, size, supersample, chunk):
    out = []
    for start in range(0, len(views), chunk):
        el_idx, az_units = np.array(views[start : start + chunk]).T
        azimuth_deg, elevation_deg = az_units * 10.0, 30.0 + 5.0 * el_idx
        camera = _Camera.looking_from(azimuth_deg, elevation_deg, size * supersample)
        views_hit, rays, normals = _hits(parts, camera)
        out.append(_shade(views_hit, rays, normals, albedo, azimuth_deg, lightings, size, supersample))
    return torch.cat(out).reshape(-1, size, size)  # (views x lightings, size, size)


def render_viewpoints(
    split: str,
    seed: int = 0,
    size: int = 48,
    *,
    classes=None,
    instances=None,
    elevations=None,
    azimuths=None,
    lightings=None,
    supersample: int = 2,
    shuffle: bool = True,
    views_per_chunk: int = 54,
    num_threads: int | None = 1,
) -> RawNorbLike:
    """Render one split of the viewpoint data set (no caching; see ``load_viewpoints`` for that).

    Args:
        split: ``"train"`` (toys 0..4 of each class) or ``"test"`` (toys 5..9).
        seed: drives the toys' proportions and the stored order; the output is a pure function of the
            arguments (bitwise), whatever torch's or numpy's global random state.
        size: side of the square images.
        classes, instances, elevations, azimuths, lightings: render only these (see :func:`viewpoint_grid`);
            None means all.
        supersample: rays per pixel along each side (2 = 2x2 antialiasing).
        shuffle: store the images in a seeded random order (as smallNORB's files are mixed); else in the
            grid order of :func:`viewpoint_grid`.
        views_per_chunk: views cast at once; bounds memory (about 50 MB at 54 views, 48 px, 2x2).
        num_threads: torch intra-op threads while rendering (the previous setting is restored after).
            The default 1 is the fastest: the tensors are small, and on a busy machine two threads
            waiting for each other at every operation were measured 10-20x slower. None: leave as is.
            The pixels do not depend on it.

    Returns:
        A :class:`~capsnets.data.norb_common.RawNorbLike` with ``images`` uint8 ``(N, size, size)``.
    """
    if size < 1 or supersample < 1 or views_per_chunk < 1:
        raise ArgumentError(
            f"size, supersample, views_per_chunk must be >= 1, got {size}, {supersample}, {views_per_chunk}"
        )
    if seed < 0:
        raise ArgumentError(f"seed must be >= 0, got {seed}")
    with _torch_threads(num_threads):
        return _render(
            split,
            seed,
            size,
            classes,
            instances,
            elevations,
            azimuths,
            lightings,
            supersample,
            shuffle,
            views_per_chunk,
        )


@contextmanager
def _torch_threads(num_threads: int | None):
    before = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _render(
    split, seed, size, classes, instances, elevations, azimuths, lightings, supersample, shuffle, views_per_chunk
) -> RawNorbLike:
    labels, info = viewpoint_grid(
        split, classes=classes, instances=instances, elevations=elevations, azimuths=azimuths, lightings=lightings
    )
    chosen_lightings = _pick("lightings", lightings, range(len(LIGHTINGS)))
    views = [(e, a) for e in _pick("elevations", elevations, ELEVATIONS) for a in _pick("azimuths", azimuths, AZIMUTHS)]
    images = []
    for label in _pick("classes", classes, range(len(VIEWPOINT_CLASSES))):
        for instance in _pick("instances", instances, split_instances(split)):
            parts, albedo = build_instance(label, instance, seed)
            images.append(_render_instance(parts, albedo, views, chosen_lightings, size, supersample, views_per_chunk))
    images = torch.cat(images)
    if shuffle:
        rng = np.random.default_rng(np.random.SeedSequence([seed, _SHUFFLE_SALT, split == "train"]))
        order = torch.from_numpy(rng.permutation(len(labels)))
        images, labels, info = images[order], labels[order], {k: v[order] for k, v in info.items()}
    return RawNorbLike(images, labels, info, list(VIEWPOINT_CLASSES))
