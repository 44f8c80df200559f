"""The documentation's API reference (docs/conf.py, docs/api/): every public module has a page, and a docstring
reference that names no documented capsnets object fails ``sphinx-build -W -n``.

The builds below use the project's own ``docs/conf.py`` (``-c docs``) on a two-file project in a temporary folder,
so they test the settings that CI's full build (``.ci/run``) uses, in a second or two. They need Sphinx, which is
the optional ``docs`` extra: they are skipped where it is not installed, except in CI (``CI`` set), where they fail,
since ``.ci/run`` installs it into the environment that runs the tests.
"""

import importlib.util
import os
import pkgutil
import re
from pathlib import Path

import pytest

import capsnets

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# modules without an API page: the command line (``capsnets --help`` and docs/training.md document it), the demo's
# web application (docs/demo.md) and ``python -m capsnets``
WITHOUT_PAGE = {"cli", "demo", "__main__"}

pytestmark = pytest.mark.skipif(not (DOCS / "conf.py").is_file(), reason="needs the source tree's docs/")


def test_every_public_module_has_an_api_page():
    pages = "\n".join(page.read_text() for page in (DOCS / "api").glob("*.rst"))
    documented = set(re.findall(r"^\.\. automodule:: capsnets\.(\w+)", pages, flags=re.MULTILINE))
    public = {m.name for m in pkgutil.iter_modules(capsnets.__path__) if not m.name.startswith("_")}
    assert public - WITHOUT_PAGE - documented == set(), "add a page to docs/api/ (and its index.rst) for these"
    assert documented <= public, "docs/api/ documents modules that do not exist"


def _build(tmp_path: Path, body: str) -> tuple[int, str]:
    """Builds a two-file project with docs/conf.py's settings; returns sphinx-build's exit code and warnings."""
    if importlib.util.find_spec("sphinx") is None:
        message = "needs Sphinx: pip install -e '.[docs]'"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run it")
        pytest.skip(message)
    from sphinx.cmd import build as sphinx_build

    source = tmp_path / "source"
    source.mkdir()
    (source / "index.rst").write_text("Index\n=====\n\n.. toctree::\n\n   api\n")
    documented = ".. py:module:: capsnets.functional.masking\n\n.. autofunction:: mask_capsules\n"
    (source / "api.rst").write_text(f"API\n===\n\n{documented}\n{body}\n")
    warnings = tmp_path / "warnings.txt"
    args = ["-W", "--keep-going", "-n", "-q", "-E", "-w", str(warnings), "-c", str(DOCS), "-b", "html"]
    code = sphinx_build.build_main([*args, str(source), str(tmp_path / "html")])
    return code, warnings.read_text()


def test_a_broken_docstring_reference_fails_the_build(tmp_path):
    code, warnings = _build(tmp_path, "Routes with :func:`capsnets.functional.no_such_routing`.")
    assert code != 0
    assert "capsnets.functional.no_such_routing" in warnings


def test_a_reference_to_an_undocumented_object_fails_the_build(tmp_path):
    # dynamic_routing exists, but the two-file project documents only mask_capsules: a link would lead nowhere
    code, warnings = _build(tmp_path, "See :func:`capsnets.functional.dynamic_routing`.")
    assert code != 0
    assert "capsnets.functional.dynamic_routing" in warnings


def test_references_by_any_import_path_and_external_names_build(tmp_path):
    # the defining module's name, the package's that re-exports it, and names outside capsnets (not looked up)
    body = (
        ":func:`capsnets.functional.masking.mask_capsules`, :func:`capsnets.functional.mask_capsules`, "
        ":mod:`capsnets.functional.masking`, :class:`torch.Tensor`, :class:`numpy.ndarray`."
    )
    code, warnings = _build(tmp_path, body)
    assert (code, warnings) == (0, "")


def test_the_docs_name_the_image_formats_read_as_the_code_does():
    """Every list of image formats in the docs and the README (a list starting "PNG, JPEG", "PNG and JPEG",
    "PNG/JPEG"...) names all of :data:`capsnets.images.IMAGE_FORMATS`, in its order, and every list of file name
    endings is :data:`capsnets.images.IMAGE_SUFFIXES`; the folder data sets' and predict's paragraphs name them."""
    from capsnets.images import IMAGE_FORMATS, IMAGE_FORMATS_TEXT, IMAGE_SUFFIXES

    names = IMAGE_FORMATS_TEXT.split(", ")
    assert [name.upper() for name in names] == list(IMAGE_FORMATS)
    separator = r"(?:,\s+(?:and\s+|or\s+)?|\s+and\s+|\s+or\s+|\s*/\s*)"
    one = "|".join(names)
    lists = re.compile(rf"\bPNG{separator}JPEG\b(?:{separator}(?:{one})\b)*")
    endings = re.compile(r"`\.\w+`(?:,\s+(?:and\s+|or\s+)?`\.\w+`)+")
    found = {}
    for page in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        text = " ".join(page.read_text().split())  # lists broken over lines read as one
        for match in lists.finditer(text):
            listed = re.findall(one, match.group())
            assert listed == names, f"{page.name}: {match.group()!r} is not the list of formats read, {names}"
            found.setdefault(page.name, []).append(match.group())
        for match in endings.finditer(text):
            if ".png" in match.group():
                listed = tuple(re.findall(r"\.\w+", match.group()))
                assert listed == IMAGE_SUFFIXES, f"{page.name}: {match.group()!r} is not {IMAGE_SUFFIXES}"
    training = " ".join((DOCS / "training.md").read_text().split())
    assert f"one subfolder of images per class ({IMAGE_FORMATS_TEXT}:" in training
    assert f"`predict` reads image files ({IMAGE_FORMATS_TEXT})" in training
    assert {"training.md", "reliability.md", "demo.md", "README.md"} <= set(found), found
