"""The five object classes, each an arrangement of the same three primitives.

Every class is a function ``(rng, variant) -> list[Part]`` that draws one instance's proportions from a
numpy ``Generator``; discrete variants (engines, axles, cabin shape) follow ``variant = instance % 5`` so
that both splits hold the same mix. Classes share the ellipsoid / box / frustum (cylinder, cone) library
and differ only in how the parts are arranged. Objects are built z-up, facing +x, standing on ``z = 0``,
then centred on their bounding box and scaled to touch the unit sphere by :func:`build_instance`.

- animal: ellipsoid body on four tapered legs, neck, ellipsoid head, cone ears, cone tail
- human: two legs, hips, box torso, two arms hanging at an angle, neck, spherical head
- airplane: cylinder fuselage, cone nose, tapering tail, swept box wings, fin, tailplane (+ 2 engines)
- truck: box cab, longer taller box cargo, chassis, two or three axles of cylinder wheels
- car: low box body, box (or, in one toy per split, ellipsoid) cabin, four cylinder wheels
"""

from __future__ import annotations

import numpy as np

from capsnets.validation import ArgumentError

from .geometry import Part, rotation

__all__ = ["VIEWPOINT_CLASSES", "build_instance"]

VIEWPOINT_CLASSES = ["animal", "human", "airplane", "truck", "car"]
_I = np.eye(3)


def _part(kind: str, center, scale, rot=_I, taper: float = 1.0) -> Part:
    return Part(kind, np.asarray(center, float), np.asarray(scale, float), np.asarray(rot, float), taper)


def _limb(start, tilt_y: float, tilt_x: float, length: float, radius: float, taper: float) -> Part:
    """A frustum hanging from ``start`` (its top), tilted by ``tilt_y`` (about y) then ``tilt_x`` (x)."""
    rot = rotation(("x", 180.0), ("y", tilt_y), ("x", tilt_x))  # local +z points down, then tilted
    axis = rot[:, 2]
    center = np.asarray(start, float) + axis * length / 2
    return _part("frustum", center, (radius, radius, length / 2), rot, taper)


def _animal(rng: np.random.Generator, variant: int) -> list[Part]:
    u = rng.uniform
    length, width, height = u(0.6, 0.9), u(0.25, 0.38), u(0.25, 0.35)
    leg, leg_r = u(0.5, 0.8), u(0.07, 0.1)
    body_z = leg + 0.6 * height
    parts = [_part("ellipsoid", (0, 0, body_z), (length, width, height))]
    for sx in (1, -1):
        for sy in (1, -1):
            top = (sx * 0.6 * length, sy * 0.55 * width, body_z - 0.2 * height)
            parts.append(_limb(top, sx * u(-8, 8), 0.0, body_z - 0.2 * height, leg_r, 0.8))
    neck_len, neck_tilt = u(0.25, 0.5), u(30, 60)
    neck_rot = rotation(("y", neck_tilt))  # local +z leans forward (+x)
    neck_start = np.array([0.75 * length, 0, body_z + 0.2 * height])
    neck_end = neck_start + neck_rot[:, 2] * neck_len
    parts.append(_part("frustum", (neck_start + neck_end) / 2, (0.13, 0.13, neck_len / 2), neck_rot, 0.75))
    head = u(0.85, 1.2)
    head_rot = rotation(("y", u(-10, 25)))
    parts.append(
        _part("ellipsoid", neck_end + np.array([0.1, 0, 0]), (0.26 * head, 0.15 * head, 0.15 * head), head_rot)
    )
    for sy in (1, -1):  # ears
        ear = neck_end + np.array([-0.02, sy * 0.08 * head, 0.15 * head])
        parts.append(_part("frustum", ear, (0.05, 0.05, 0.08), rotation(("x", -sy * 20.0)), 0.0))
    tail_rot = rotation(("y", -u(100, 140)))  # local +z points backwards and down
    tail_len = u(0.3, 0.6)
    tail_start = np.array([-0.95 * length, 0, body_z + 0.2 * height])
    parts.append(
        _part("frustum", tail_start + tail_rot[:, 2] * tail_len / 2, (0.07, 0.07, tail_len / 2), tail_rot, 0.0)
    )
    return parts


def _human(rng: np.random.Generator, variant: int) -> list[Part]:
    u = rng.uniform
    leg, leg_r, hip_w = u(0.75, 0.95), u(0.08, 0.11), u(0.09, 0.13)
    torso_h, torso_w, torso_d = u(0.28, 0.36), u(0.2, 0.27), u(0.1, 0.14)
    stride = u(0, 12)
    parts = [_limb((0, sy * hip_w, leg), sy * stride, 0.0, leg, leg_r, 0.75) for sy in (1, -1)]
    parts.append(_part("ellipsoid", (0, 0, leg + 0.02), (torso_d, hip_w + leg_r, 0.1)))
    torso_z = leg + torso_h
    parts.append(_part("box", (0, 0, torso_z), (torso_d, torso_w, torso_h)))
    shoulder_z = torso_z + 0.8 * torso_h
    arm, arm_r = u(0.6, 0.75), u(0.055, 0.075)
    for sy in (1, -1):
        spread, swing = u(8, 40), u(-25, 25)
        parts.append(_limb((0, sy * (torso_w + arm_r), shoulder_z), swing, sy * spread, arm, arm_r, 0.75))
    top = torso_z + torso_h
    parts.append(_part("frustum", (0, 0, top + 0.05), (0.05, 0.05, 0.06)))
    head = u(0.11, 0.15)
    parts.append(_part("ellipsoid", (0, 0, top + 0.08 + head), (head, 0.9 * head, 1.15 * head)))
    return parts


def _airplane(rng: np.random.Generator, variant: int) -> list[Part]:
    u = rng.uniform
    half_len, radius = u(1.0, 1.3), u(0.11, 0.16)
    z = 0.3
    along_x = rotation(("y", 90.0))  # local +z -> world +x
    parts = [_part("frustum", (0, 0, z), (radius, radius, half_len), along_x)]
    nose = u(0.2, 0.4)
    parts.append(_part("frustum", (half_len + nose, 0, z), (radius, radius, nose), along_x, 0.0))
    tail = u(0.3, 0.5)
    parts.append(
        _part("frustum", (-half_len - tail, 0, z + 0.3 * radius), (radius, radius, tail), rotation(("y", -90.0)), 0.35)
    )
    span, chord, sweep, wing_x = u(0.9, 1.4), u(0.18, 0.32), u(0, 35), u(-0.2, 0.25)
    engines = variant in (1, 3)
    for sy in (1, -1):
        rot = rotation(("z", sy * sweep))  # wing's local +y -> outward and backward
        center = np.array([wing_x, 0, z - 0.3 * radius]) + rot[:, 1] * sy * span / 2
        parts.append(_part("box", center, (chord, span / 2, 0.025), rot))
        stab = rotation(("z", sy * (sweep + 10)))
        sc = np.array([-half_len - 0.6 * tail, 0, z + 0.3 * radius]) + stab[:, 1] * sy * 0.25 * span / 2
        parts.append(_part("box", sc, (0.45 * chord, 0.25 * span / 2, 0.02), stab))
        if not engines:
            continue
        engine = center - rot[:, 1] * sy * span * 0.15 + np.array([0.1, 0, -0.15])
        parts.append(_part("frustum", engine, (0.07, 0.07, 0.22), along_x, 0.9))
    fin_h = u(0.3, 0.5)
    fin_rot = rotation(("y", -u(15, 35)))
    fin_center = (-half_len - 0.5 * tail, 0, z + radius + fin_h / 2)
    parts.append(_part("box", fin_center, (0.55 * chord, 0.025, fin_h / 2), fin_rot))
    return parts


def _wheels(rng, xs, half_width: float, radius: float) -> list[Part]:
    across = rotation(("x", 90.0))  # local +z -> world -y: wheel axles
    thick = rng.uniform(0.07, 0.1)
    return [
        _part("frustum", (x, sy * (half_width - 0.5 * thick), radius), (radius, radius, thick), across)
        for x in xs
        for sy in (1, -1)
    ]


def _truck(rng: np.random.Generator, variant: int) -> list[Part]:
    u = rng.uniform
    wheel, width = u(0.17, 0.23), u(0.4, 0.5)
    cargo_len, cargo_h, cab_len, cab_h = u(0.75, 1.1), u(0.45, 0.65), u(0.25, 0.35), u(0.35, 0.45)
    floor = wheel * 1.3
    cab_x = cargo_len + 0.05 + cab_len
    chassis = (cargo_len + cab_len + 0.075, 0.8 * width, 0.05)
    parts = [_part("box", (cab_len - 0.025, 0, floor - 0.03), chassis)]
    parts.append(_part("box", (cab_x, 0, floor + cab_h), (cab_len, 0.9 * width, cab_h)))
    parts.append(_part("box", (-0.1, 0, floor + cargo_h + 0.05), (cargo_len, width, cargo_h + 0.05)))
    axles = [cab_x] + ([-cargo_len * 0.55] if variant in (1, 3) else [-cargo_len * 0.35, -cargo_len * 0.8])
    return parts + _wheels(rng, axles, width, wheel)


def _car(rng: np.random.Generator, variant: int) -> list[Part]:
    u = rng.uniform
    wheel, length, width = u(0.15, 0.2), u(0.85, 1.15), u(0.38, 0.46)
    body_h = u(0.13, 0.19)
    body_z = wheel + 0.1
    parts = [_part("box", (0, 0, body_z + body_h / 2), (length, width, body_h))]
    cabin_len, cabin_h = u(0.4, 0.6) * length, u(0.12, 0.18)
    cabin_center = (u(-0.25, 0.05) * length, 0, body_z + body_h * 1.5 + cabin_h * 0.8)
    if variant == 4:  # a rounded cabin sunk into the body
        parts.append(_part("ellipsoid", cabin_center, (0.9 * cabin_len, 0.75 * width, 1.5 * cabin_h)))
    else:
        parts.append(_part("box", cabin_center, (cabin_len, 0.85 * width, cabin_h)))
    return parts + _wheels(rng, (0.68 * length, -0.68 * length), width, wheel)


_BUILDERS = {"animal": _animal, "human": _human, "airplane": _airplane, "truck": _truck, "car": _car}


def build_instance(label: int, instance: int, seed: int) -> tuple[list[Part], float]:
    """The parts of toy ``instance`` (0..9) of class ``label``, centred and scaled, and its albedo.

    A pure function of ``(label, instance, seed)``: the proportions come from
    ``numpy.random.default_rng(SeedSequence([seed, label, instance]))``.
    The object's bounding box is centred on the origin and the object scaled to fit the unit sphere.
    """
    if not 0 <= label < len(VIEWPOINT_CLASSES):
        raise ArgumentError(f"label must be in [0, {len(VIEWPOINT_CLASSES)}), got {label}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, label, instance]))
    parts = _BUILDERS[VIEWPOINT_CLASSES[label]](rng, instance % 5)
    albedo = float(rng.uniform(0.75, 0.95))
    points = np.concatenate([p.surface_points() for p in parts])
    center = (points.min(0) + points.max(0)) / 2
    factor = 1.0 / float(np.linalg.norm(points - center, axis=1).max())
    return [p.transformed(-center, factor) for p in parts], albedo
