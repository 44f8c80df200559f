"""Shape primitives and their vectorised ray intersections.

A :class:`Part` is a unit shape (sphere, cube or capped frustum) mapped into the world by a scale, a
rotation and a translation: ``world = R @ (scale * local) + center``. Rays are moved into each part's
local frame (``local = M @ (world - center)`` with ``M = diag(1/scale) @ R.T``), intersected with the unit
shape analytically, and the normal found there is carried back with ``M.T`` (the inverse transpose).

Only elementwise operations and sums over the last axis of size 3 are used (no matmul), so results are
bitwise reproducible whatever the thread count.

Dimension legend: ``V`` views in a chunk, ``P`` pixels per view, ``3`` xyz.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from capsnets.validation import ArgumentError

__all__ = ["Part", "rotation", "intersect", "local_normal", "KINDS"]

KINDS = ("ellipsoid", "box", "frustum")


@dataclass(frozen=True)
class Part:
    """One primitive of an object.

    Args:
        kind: ``"ellipsoid"`` (unit sphere), ``"box"`` (cube ``[-1, 1]^3``) or ``"frustum"`` (along local
            z from ``z = -1`` with radius 1 to ``z = 1`` with radius ``taper``; 1 is a cylinder, 0 a cone).
        center: world position of the local origin, ``(3,)``.
        scale: half-sizes along the local axes, ``(3,)``, all positive.
        rot: ``(3, 3)`` rotation whose columns are the local axes in world coordinates.
        taper: top radius of a frustum relative to its bottom radius (ignored for other kinds).
    """

    kind: str
    center: np.ndarray
    scale: np.ndarray
    rot: np.ndarray
    taper: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ArgumentError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if np.any(np.asarray(self.scale) <= 0):
            raise ArgumentError(f"scale must be positive, got {self.scale}")
        if self.taper < 0:
            raise ArgumentError(f"taper must be >= 0, got {self.taper}")

    def surface_points(self) -> np.ndarray:
        """World points ``(K, 3)`` on the part whose hull (nearly) holds it: box corners, frustum rims,
        a Fibonacci lattice of 200 points on an ellipsoid."""
        if self.kind == "box":
            local = np.array(np.meshgrid([-1, 1], [-1, 1], [-1, 1], indexing="ij")).reshape(3, -1).T
        elif self.kind == "frustum":
            a = np.linspace(0, 2 * np.pi, 48, endpoint=False)
            rim = np.stack([np.cos(a), np.sin(a), np.ones_like(a)], 1)
            local = np.concatenate([rim * [1, 1, -1], rim * [self.taper, self.taper, 1]])
        else:
            k = np.arange(200) + 0.5
            z, phi = 1 - 2 * k / 200, np.pi * (1 + 5**0.5) * k
            r = np.sqrt(1 - z * z)
            local = np.stack([r * np.cos(phi), r * np.sin(phi), z], 1)
        return (local * np.asarray(self.scale)) @ np.asarray(self.rot).T + np.asarray(self.center)

    def bounding_sphere(self) -> tuple[np.ndarray, float]:
        """Centre ``(3,)`` and radius of a sphere around the part (1% larger than its surface points)."""
        points = self.surface_points()
        return np.asarray(self.center), 1.01 * float(np.linalg.norm(points - self.center, axis=1).max())

    def transformed(self, shift: np.ndarray, factor: float) -> Part:
        """The part after ``world -> factor * (world + shift)``."""
        return Part(
            self.kind, (np.asarray(self.center) + shift) * factor, np.asarray(self.scale) * factor, self.rot, self.taper
        )


def rotation(*turns: tuple[str, float]) -> np.ndarray:
    """The rotation ``R_n @ ... @ R_1`` for ``turns = (("x"|"y"|"z", degrees), ...)``, applied in order."""
    out = np.eye(3)
    for axis, degrees in turns:
        a = math.radians(degrees)
        c, s = math.cos(a), math.sin(a)
        i, j = {"x": (1, 2), "y": (2, 0), "z": (0, 1)}[axis]
        r = np.eye(3)
        r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
        out = r @ out
    return out


def _apply(m: Tensor, v: Tensor) -> Tensor:
    """``m @ v`` for a ``(3, 3)`` matrix and ``(..., 3)`` vectors, as elementwise products and sums."""
    return (m * v.unsqueeze(-2)).sum(-1)


def _sphere(o: Tensor, d: Tensor) -> Tensor:
    a, b, c = (d * d).sum(-1), (o * d).sum(-1), (o * o).sum(-1) - 1.0
    disc = b * b - a * c
    t = (-b - disc.clamp_min(0).sqrt()) / a
    return torch.where((disc >= 0) & (t > 0), t, math.inf)


def _box(o: Tensor, d: Tensor) -> Tensor:
    inv = 1.0 / d  # +-inf where a component is 0: the slab test still works
    t1, t2 = (-1.0 - o) * inv, (1.0 - o) * inv
    near = torch.minimum(t1, t2).amax(-1)
    far = torch.maximum(t1, t2).amin(-1)
    return torch.where((far >= near) & (near > 0), near, math.inf)


def _frustum(o: Tensor, d: Tensor, taper: float) -> Tensor:
    a, b = (1.0 + taper) / 2, (taper - 1.0) / 2  # radius(z) = a + b z
    ox, oy, oz = o.unbind(-1)
    dx, dy, dz = d.unbind(-1)
    r0 = a + b * oz
    qa = dx * dx + dy * dy - b * b * dz * dz
    qb = ox * dx + oy * dy - b * dz * r0
    qc = ox * ox + oy * oy - r0 * r0
    disc = (qb * qb - qa * qc).clamp_min(0).sqrt()
    ok = (qb * qb - qa * qc >= 0) & (qa.abs() > 1e-12)
    best = torch.full_like(qa, math.inf)
    for sign in (-1.0, 1.0):  # side wall: both roots, the valid nearer one wins
        t = (-qb + sign * disc) / qa
        z = oz + t * dz
        best = torch.where(ok & (t > 0) & (z.abs() <= 1) & (t < best), t, best)
    for z_cap, radius in ((-1.0, 1.0), (1.0, taper)):  # the two discs
        if radius <= 0:
            continue
        t = (z_cap - oz) / dz
        x, y = ox + t * dx, oy + t * dy
        best = torch.where((t > 0) & (x * x + y * y <= radius * radius) & (t < best), t, best)
    return best


def intersect(part: Part, origin: Tensor, direction: Tensor) -> Tensor:
    """Ray parameter ``t`` of the first hit of each ray with ``part`` (``inf`` where it misses).

    Args:
        origin: ray origins, ``(V, 1, 3)`` or ``(V, P, 3)``.
        direction: ray directions (need not be unit), ``(V, P, 3)``.

    Returns:
        ``(V, P)`` float tensor; hit point ``origin + t * direction``.
    """
    m = _to_local(part, direction.dtype)
    o = _apply(m, origin - torch.as_tensor(part.center, dtype=direction.dtype))
    d = _apply(m, direction)
    if part.kind == "ellipsoid":
        return _sphere(o, d)
    if part.kind == "box":
        return _box(o, d)
    return _frustum(o, d, float(part.taper))


def _to_local(part: Part, dtype: torch.dtype) -> Tensor:
    m = np.asarray(part.rot).T / np.asarray(part.scale)[:, None]  # diag(1/scale) @ R.T
    return torch.as_tensor(m, dtype=dtype)


def local_normal(part: Part, points: Tensor) -> Tensor:
    """Unit world-space outward normals at world ``points`` ``(K, 3)`` lying on ``part``'s surface."""
    m = _to_local(part, points.dtype)
    p = _apply(m, points - torch.as_tensor(part.center, dtype=points.dtype))
    if part.kind == "ellipsoid":
        n = p
    elif part.kind == "box":
        mag = p.abs()
        n = torch.where(mag >= mag.amax(-1, keepdim=True), p.sign(), torch.zeros_like(p))
    else:
        a, b = (1.0 + part.taper) / 2, (part.taper - 1.0) / 2
        side = torch.stack([p[:, 0], p[:, 1], -b * (a + b * p[:, 2])], -1)
        cap = torch.zeros_like(p)
        cap[:, 2] = p[:, 2].sign()
        n = torch.where((p[:, 2].abs() > 1 - 1e-4).unsqueeze(-1), cap, side)
    n = _apply(m.T, n)
    return n / n.norm(dim=-1, keepdim=True).clamp_min(1e-12)
