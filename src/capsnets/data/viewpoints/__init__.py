"""An offline, procedurally rendered stand-in for smallNORB (LeCun, Huang & Bottou 2004).

**What it is.** Five classes of toy-like objects (animal, human, airplane, truck, car), ten instances
("toys") per class, each photographed from 18 azimuths (0, 20, ..., 340 degrees) x 9 elevations (30, 35,
..., 70 degrees) under 6 lightings: 24,300 grey 48x48 uint8 images per split, the same count, fields and
split-by-instance protocol as smallNORB (LeCun, Huang & Bottou 2004; used by Hinton, Sabour & Frosst 2018
for the novel-viewpoint experiments). It exists because smallNORB cannot be downloaded on these machines.

**How it is generated.** Every class is an arrangement of the same three primitives (ellipsoids, boxes,
capped frusta: cylinders and cones), so classes differ by how parts are arranged, not by texture
(:mod:`.objects`). A toy's proportions are drawn from ``numpy.random.default_rng(SeedSequence([seed,
class, instance]))``; toys 0..4 form the training split, 5..9 the test split. Each view is ray cast by a
vectorised torch ray caster (:mod:`.render`, :mod:`.geometry`): a perspective camera at distance 6 looks
at the object (scaled into the unit sphere); all rays of a chunk of views are intersected analytically
with each part (only inside the pixel window the part's bounding sphere can cover), the nearest hit's
normal is found once, and the six lightings are applied as Lambertian + ambient shading of those normals.
2x2 supersampling (96x96 rays, area-averaged to 48x48, like smallNORB's 96 -> 48 downscale) anti-aliases
the edges. Output is bitwise a function of the seed, independent of global random state. Both splits
render in well under a minute on 2 CPU cores; :func:`load_viewpoints` caches them under
``<root>/viewpoints/`` (:mod:`.cache`).

**Info fields** (int64, as in smallNORB's ``-info`` files): ``instance`` 0..9, ``elevation`` 0..8,
``azimuth`` 0, 2, ..., 34 (x10 = degrees), ``lighting`` 0..5.

**How it differs from smallNORB.** Synthetic, untextured, single-albedo objects on a uniform background
(no turntable, no shadows, no specular light, no noise, no camera jitter); one image per view instead
of a stereo pair; stored at 48x48 rather than 96x96; the split is toys 0..4 / 5..9 (smallNORB's
training toys are 4, 6, 7, 8, 9); lamps are fixed relative to the camera's azimuth (as on smallNORB's
turntable) and room elevation, but their placement is our own; the stored order is a seeded
permutation. Accuracies on it are not comparable to the published smallNORB numbers: they only show
whether a model generalises to novel viewpoints in the same protocol.
"""

from .cache import GENERATOR_VERSION, cache_path, load_viewpoints
from .objects import VIEWPOINT_CLASSES, build_instance
from .render import AZIMUTHS, ELEVATIONS, LIGHTINGS, render_viewpoints, split_instances, viewpoint_grid

__all__ = [
    "load_viewpoints",
    "render_viewpoints",
    "viewpoint_grid",
    "split_instances",
    "build_instance",
    "cache_path",
    "VIEWPOINT_CLASSES",
    "AZIMUTHS",
    "ELEVATIONS",
    "LIGHTINGS",
    "GENERATOR_VERSION",
]
