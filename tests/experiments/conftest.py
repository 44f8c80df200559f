"""Fixtures of the experiments' tests."""

import hashlib
import json
import os

import pytest
from filelock import FileLock
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from capsnets.data.norb_common import RawNorbLike
from capsnets.experiments import views
from capsnets.files import atomic_write


@pytest.fixture(scope="session", autouse=True)
def _viewpoints_rendered_once(tmp_path_factory):
    """The smoke runs that render a reduced viewpoint grid (``viewpoints``, ``routers``) render each split once for
    the whole test session, pytest-xdist's workers included: the first to need a split renders it into a folder the
    workers share, under a lock, and every run gets it from there (the renderer is a pure function of its
    arguments, and its pixels are tested in tests/data/)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's folder is in the one the run made for all of them
        root = root.parent
    folder = root / "viewpoint-renders"
    folder.mkdir(exist_ok=True)
    real = views.render_viewpoints

    def render_viewpoints(split, **kwargs):
        key = hashlib.sha256(repr((split, sorted(kwargs.items()))).encode()).hexdigest()[:16]
        path = folder / f"{key}.safetensors"
        with FileLock(f"{path}.lock"):
            if not path.is_file():
                raw = real(split, **kwargs)
                tensors = {"images": raw.images, "labels": raw.labels, **{f"info.{k}": v for k, v in raw.info.items()}}
                atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={"classes": json.dumps(raw.classes)}))
        tensors = load_file(str(path))
        with safe_open(str(path), framework="pt") as file:
            classes = json.loads(file.metadata()["classes"])
        info = {k.removeprefix("info."): v for k, v in tensors.items() if k.startswith("info.")}
        return RawNorbLike(tensors["images"], tensors["labels"], info, classes)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(views, "render_viewpoints", render_viewpoints)
        yield
