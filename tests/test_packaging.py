"""The source distribution: it carries the package data (the EM kernel's C++ source, the shipped weights and their
cards, the demo's page), and an installation from it runs the fused EM kernel on this machine from the build of its
source, which is the checkout's."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "capsnets"
# the globs of [tool.setuptools.package-data] in pyproject.toml, as files of the source tree
DATA = [
    "functional/em/csrc/*.cpp",
    "weights/*.safetensors",
    "weights/*.json",
    "demo/static/*.html",
    "demo/static/*.js",
    "demo/static/*.css",
]
IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "runs", "build", "dist", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache"
)

pytestmark = pytest.mark.skipif(not (ROOT / "pyproject.toml").is_file(), reason="needs the source tree")


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    """Build the sdist from a copy of the source tree (the build writes egg-info next to the sources)."""
    work = tmp_path_factory.mktemp("sdist")
    tree = work / "tree"
    shutil.copytree(ROOT, tree, ignore=IGNORED)
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(work / 'dist')!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return work / "dist" / done.stdout.split()[-1]


def test_sdist_carries_the_kernel_source_weights_and_demo(sdist):
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    expected = {f"src/capsnets/{path.relative_to(PACKAGE).as_posix()}" for glob in DATA for path in PACKAGE.glob(glob)}
    assert any(name.endswith("em_votes.cpp") for name in expected) and any(
        name.endswith(".safetensors") for name in expected
    )
    assert expected <= names, sorted(expected - names)


def test_installed_sdist_runs_the_em_kernel_from_its_build(sdist, tmp_path):
    """pip installs the sdist (no dependencies: they are this environment's); in a fresh process that imports the
    installed copy, the kernel's source is the checkout's byte for byte, so it loads from the build directory this
    machine keeps for that source (built there by the first process that needs it: the compiler, the notice and the
    cache are tested in tests/functional/em/test_build.py), and a matrix-capsule model gives the PyTorch path's scores
    with it; the shipped weights load from it."""
    from capsnets.functional.em import build

    target = tmp_path / "site"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(sdist),
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    code = """
import json, os, torch, capsnets
from capsnets.functional.em import kernel as em_kernel
torch.manual_seed(0)
model = capsnets.create_model("matrix_capsnet_small").eval()
images = torch.rand(2, 1, 32, 32)
with torch.no_grad():
    os.environ[em_kernel.ENV_VAR] = "torch"
    reference = model(images).scores
    os.environ[em_kernel.ENV_VAR] = "cpp"
    fused = model(images).scores
module = em_kernel.load()
capsnets.create_model("efficient_capsnet", pretrained="mnist")  # its SHA-256 checked on load
weights = [name for m in capsnets.list_models(pretrained=True) for name in capsnets.get_model_weights(m)]
print(json.dumps({"package": capsnets.__file__, "kernel": module.__file__, "source": str(em_kernel._SOURCE),
                  "difference": (fused - reference).abs().max().item(), "weights": sorted(weights)}))
"""
    env = {**os.environ, "PYTHONPATH": str(target), "CAPSNETS_EM_KERNEL": "cpp"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(report["package"]).is_relative_to(target)
    assert Path(report["source"]).is_relative_to(target)
    assert Path(report["source"]).read_bytes() == build.SOURCE.read_bytes()
    assert Path(report["kernel"]) == build.library_path(build.build_directory())  # the build of the checkout's source
    assert report["difference"] < 1e-4
    assert report["weights"] == sorted(p.stem for p in (PACKAGE / "weights").glob("*.safetensors"))
