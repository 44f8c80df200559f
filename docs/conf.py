"""Sphinx configuration: the user guides (Markdown, MyST) and the API reference from the docstrings.

Build: ``sphinx-build -W --keep-going -n -b html docs docs/_build/html`` (the ``docs`` extra). ``-n`` makes every
unresolved cross-reference a warning and ``-W`` makes warnings errors, so a docstring that names a capsnets object
that does not exist fails the build. Names outside capsnets (torch, numpy, PIL, the standard library) are not
looked up: the build runs offline, without intersphinx, and ``nitpick_ignore_regex`` lists them.
"""

import importlib
import inspect
import re
import sys
from pathlib import Path

from sphinx import addnodes
from sphinx.util.nodes import make_refnode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # the checkout's capsnets, installed or not

from capsnets import __version__  # noqa: E402

project = "capsnets"
author = "capsnets contributors"
copyright = "capsnets contributors"
version = release = __version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
# docs/results holds the measurement reports, rendered as they are: pages that results/README.md links to, outside
# the navigation (see _results_are_orphans)
RESULTS = "results/"

html_theme = "furo"
html_title = f"capsnets {release}"

# Markdown guides: headings get anchors so that links such as training.md#data resolve
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# Docstrings: Google style as torch.nn writes it (Args, Returns, Raises, Examples, Attributes) plus "Shape"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_custom_sections = ["Shape"]
napoleon_use_ivar = False  # "Attributes:" as attribute entries, so that :attr: references reach them
napoleon_use_rtype = False

autodoc_default_options = {"members": True, "show-inheritance": True, "member-order": "bysource"}
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autoclass_content = "class"  # the class docstring holds the arguments (torch.nn style)
autodoc_inherit_docstrings = False  # no torch.nn.Module text under forward() and extra_repr()

# -n: every cross-reference must resolve. External names cannot be looked up offline (no intersphinx); these
# patterns cover them, and only them: a capsnets name that does not resolve stays an error.
nitpicky = True
# Markdown links to files of the repository outside docs/ (benchmarks/README.md) or to a folder render as text
_OUTSIDE_THE_SITE = [("myst", r".*/benchmarks/README"), ("myst", r"(\.\./)?models/")]
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|numpy|np|PIL|matplotlib|scipy|sklearn|safetensors|onnx|onnxruntime|fastapi|yaml|tqdm)(\..*)?"),
    (r"py:.*", r"(Tensor|Module|nn\..*|F\..*|Parameter|Figure|Axes|ndarray|Image|dtype|device|Generator|Size)"),
    (r"py:.*", r"(typing|collections|os|pathlib|io|json|dataclasses|enum|argparse|logging|subprocess|types)\..*"),
    (r"py:.*", r"(Any|Callable|Iterable|Iterator|Sequence|Mapping|MutableMapping|Literal|Optional|Union|TypeVar)"),
    (r"py:.*", r"(Path|PathLike|Enum|IntEnum|Namespace|ArgumentParser|Protocol|NamedTuple|TextIO|BinaryIO)"),
    (r"py:.*", r"(int|float|str|bool|bytes|dict|list|tuple|set|object|None|type|callable|optional)"),
    (r"py:.*", r"(ValueError|TypeError|KeyError|RuntimeError|OSError|FileNotFoundError|Exception)"),
    *_OUTSIDE_THE_SITE,
]


# ---------------------------------------------------------------------------------------------------------------
# Cross-references to capsnets objects. A docstring may name an object by any path Python accepts: the package
# that re-exports it (capsnets.layers.LinearCapsules), the module that defines it
# (capsnets.layers.linear.LinearCapsules), or a name of the docstring's own module. Sphinx knows only the path an
# object is documented under, so a reference it cannot find is looked up in Python and sent to the page that
# documents that object. A name that Python cannot find, or an object that no page documents, stays a warning, and
# so fails the build.

_MISSING = object()
_DOCSTRING_OF = re.compile(r"docstring of ([\w.]+)")


def _lookup(dotted: str, base: object = None):
    """The object ``dotted`` names from ``base`` (or from the top package), as Python finds it: attributes
    first, then submodules (``capsnets.engine.evaluate`` is a function, ``capsnets.engine.evaluate.accuracy``
    a function of the module of that name)."""
    parts = dotted.split(".")
    if base is None:
        if parts[0] != "capsnets":
            return _MISSING
        base, parts = importlib.import_module("capsnets"), parts[1:]
    obj, path = base, base.__name__ if inspect.ismodule(base) else None
    for part in parts:
        parent, path = path, f"{path}.{part}" if path else None
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = _submodule_attribute(parent, part) if parent else _MISSING
            if obj is _MISSING:
                return obj
    return obj


def _submodule_attribute(parent: str, part: str):
    """``part`` of the module named ``parent`` (which a package attribute of the same name may hide), or the
    submodule ``parent.part``."""
    try:
        return getattr(importlib.import_module(parent), part)
    except (ImportError, AttributeError):
        pass
    try:
        return importlib.import_module(f"{parent}.{part}")
    except ImportError:
        return _MISSING


def _identity(obj) -> int:
    """The same for every access to an object: a bound or class method is a new object each time, its function
    is not."""
    return id(getattr(obj, "__func__", obj))


_DOCUMENTED: dict[tuple[int, int], dict[int, list[str]]] = {}  # by (the domain's id, its object count)


def _documented(env) -> dict[int, list[str]]:
    """The names under which each capsnets object is documented, by :func:`_identity` (kept for this process only:
    ids do not outlive it)."""
    domain = env.get_domain("py")
    key = (id(domain), len(domain.objects))
    if key not in _DOCUMENTED:
        names: dict[int, list[str]] = {}
        for name in domain.objects:
            obj = _lookup(name)
            if obj is not _MISSING:
                names.setdefault(_identity(obj), []).append(name)
        _DOCUMENTED.clear()
        _DOCUMENTED[key] = names
    return _DOCUMENTED[key]


def _ancestors(node):
    while node is not None:
        yield node
        node = node.parent


def _owners(node):
    """The dotted names of the objects whose documentation holds ``node``: the docstring it came from, and the
    object described around it (type hints in a field list come from no docstring)."""
    source = next((n.source for n in _ancestors(node) if n.source), "")
    match = _DOCSTRING_OF.search(source or "")
    if match:
        yield match.group(1)
    for ancestor in _ancestors(node):
        if isinstance(ancestor, addnodes.desc):
            signature = next(iter(ancestor.findall(addnodes.desc_signature)), None)
            if signature is not None and signature.get("module") and signature.get("fullname"):
                yield f"{signature['module']}.{signature['fullname']}"


def _candidates(node, target: str):
    """The objects ``target`` can denote from where it is written, most specific first."""
    if target.startswith("capsnets."):
        yield _lookup(target)
        return
    target = target.lstrip(".")
    module, cls = node.get("py:module"), node.get("py:class")
    if module:
        if cls:
            yield _lookup(f"{module}.{cls}.{target}")
        yield _lookup(f"{module}.{target}")
    for owner in _owners(node):
        obj = _lookup(owner)
        if obj is not _MISSING:
            if inspect.isclass(obj):
                yield _lookup(target, obj)
            owner_module = obj if inspect.ismodule(obj) else inspect.getmodule(obj)
            if owner_module is not None:
                yield _lookup(target, owner_module)


def _resolve_capsnets_reference(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    documented = _documented(env)
    domain = env.get_domain("py")
    for obj in _candidates(node, target):
        if obj is _MISSING:
            continue
        names = documented.get(_identity(obj), [])
        if not names and inspect.ismodule(obj):  # a module without its own section: its package's page
            parent = obj.__name__
            while parent and parent not in domain.modules:
                parent = parent.rpartition(".")[0]
            names = [parent] if parent else []
        if names:
            last = target.rpartition(".")[2]
            name = next((n for n in names if n.rpartition(".")[2] == last), names[0])
            entry = domain.objects[name]
            return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, name)
    return None


def _package_reexports(module_name: str) -> set[int]:
    """The ids of the objects that a submodule's parent package lists in ``__all__`` (documented there)."""
    package = sys.modules.get(module_name.rpartition(".")[0])
    return {id(getattr(package, name, None)) for name in getattr(package, "__all__", ())}


def _skip_member(app, what, name, obj, skip, options):
    """A submodule's section (``capsnets.models.hub``) leaves out what its package's page documents."""
    if what != "module":
        return None
    module_name = app.env.temp_data.get("autodoc:module") or ""
    if module_name.count(".") > 1 and id(obj) in _package_reexports(module_name):
        return True
    return None


def _public_bases(app, name, obj, options, bases):
    """Shows a class's public ancestors in place of a private capsnets base class."""
    for i, base in reversed(list(enumerate(bases))):
        if isinstance(base, type) and base.__name__.startswith("_") and base.__module__.startswith("capsnets"):
            bases[i : i + 1] = [b for b in base.__bases__ if b is not object]


def _results_are_orphans(app, docname, source):
    """The reports under results/ are reached from results/README.md, not from the navigation."""
    if docname.startswith(RESULTS) and not source[0].startswith("---"):
        source[0] = "---\norphan: true\n---\n" + source[0]


_SENTENCES: dict[str, list[str]] = {}


def _keep_sentence(app, what, name, obj, options, lines):
    """A data or attribute docstring is a sentence; napoleon would read the text before its first colon as a type
    (Google style's ``int: the count``), which these docstrings do not use. Keeps the lines before napoleon runs,
    and puts them back after (:func:`_restore_sentence`)."""
    if what in ("data", "attribute"):
        _SENTENCES[name] = list(lines)


def _restore_sentence(app, what, name, obj, options, lines):
    if name in _SENTENCES:
        lines[:] = _SENTENCES.pop(name)


def setup(app):
    app.connect("missing-reference", _resolve_capsnets_reference)
    app.connect("autodoc-skip-member", _skip_member)
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("autodoc-process-docstring", _keep_sentence, priority=400)  # napoleon's runs at 500
    app.connect("autodoc-process-docstring", _restore_sentence, priority=600)
    app.connect("source-read", _results_are_orphans)
