"""Where the fused EM kernel (:mod:`capsnets.functional.em.kernel`) is built, and whether it must be.

Each build lives in a directory of its own, named by what makes a build usable:

``<root>/<digest>-torch<version>-py<version>``, where ``digest`` is the first 16 hex digits of the SHA-256 of
the C++ source, the compiler flags, the compiler (``CXX``), the platform and the CPU (the kernel is built with
``-march=native``). ``root`` is ``$TORCH_EXTENSIONS_DIR/capsnets/em_kernel`` when that variable is set, else
``$XDG_CACHE_HOME/capsnets/em_kernel`` (by default ``~/.cache/capsnets/em_kernel``).

So checkouts, virtual environments, torch versions and Python versions that need different builds use
different directories, and those that can share one do, instead of rebuilding a single shared directory
after each other. A directory that holds its library is loaded from it without running the build tool.

Example::

    >>> from capsnets.functional.em import build
    >>> build.build_directory(digest="0" * 16, torch_version="2.5.1", python_version="py312").name
    '0000000000000000-torch2.5.1-py312'
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

import torch

__all__ = [
    "CFLAGS",
    "LDFLAGS",
    "NAME",
    "SOURCE",
    "build_directory",
    "compile_notice",
    "library_path",
    "python_tag",
    "source_digest",
]

#: The extension module's name.
NAME = "capsnets_em_votes"
#: The kernel's C++ source.
SOURCE = Path(__file__).with_name("csrc") / "em_votes.cpp"
#: Compiler and linker flags of the build (part of the digest).
CFLAGS = ("-O3", "-march=native", "-fopenmp")
LDFLAGS = ("-fopenmp",)


def python_tag() -> str:
    """This interpreter as an extension ABI sees it: ``py`` + major + minor + ABI flags (``py312``, ``py313t``)."""
    return f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"


def _cpu() -> str:
    """The CPU the ``-march=native`` code is for: its model and instruction-set flags (Linux), else the platform's
    processor string."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor()
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
        if not line.strip() and fields:  # the first processor is enough
            break
    return f"{fields.get('model name', '')}|{fields.get('flags', '')}"


def source_digest(source: bytes | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The first 16 hex digits of the SHA-256 of the source (default: :data:`SOURCE`'s bytes), the flags, the
    compiler (``CXX``, default ``c++``), the platform and the CPU."""
    environ = os.environ if environ is None else environ
    source = SOURCE.read_bytes() if source is None else source
    parts = [
        source,
        " ".join(CFLAGS).encode(),
        " ".join(LDFLAGS).encode(),
        environ.get("CXX", "c++").encode(),
        f"{sys.platform}|{platform.machine()}|{_cpu()}".encode(),
    ]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "little") + part)
    return digest.hexdigest()[:16]


def _root(environ: Mapping[str, str]) -> Path:
    if environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(environ["TORCH_EXTENSIONS_DIR"]).expanduser() / "capsnets" / "em_kernel"
    cache = environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(cache).expanduser() / "capsnets" / "em_kernel"


def build_directory(
    *,
    digest: str | None = None,
    torch_version: str | None = None,
    python_version: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Path:
    """The kernel's build directory for this source, torch and Python (not created).

    Args:
        digest: the build's :func:`source_digest` (default: this source's).
        torch_version: default ``torch.__version__``.
        python_version: default :func:`python_tag`.
        environ: where ``TORCH_EXTENSIONS_DIR``, ``XDG_CACHE_HOME`` and ``CXX`` are read (default ``os.environ``).
    """
    environ = os.environ if environ is None else environ
    digest = source_digest(environ=environ) if digest is None else digest
    torch_version = str(torch.__version__) if torch_version is None else torch_version
    python_version = python_tag() if python_version is None else python_version
    return _root(environ) / f"{digest}-torch{torch_version}-{python_version}"


def library_path(directory: Path) -> Path:
    """The built library in a build directory (it exists once the build finished)."""
    return directory / (NAME + (".pyd" if sys.platform == "win32" else ".so"))


def compile_notice(directory: Path) -> str:
    """The one line said when the kernel is compiled in ``directory``."""
    return (
        f"capsnets: compiling the fused EM routing kernel once for this environment (a minute or less); "
        f"later runs reuse it from {directory}"
    )
