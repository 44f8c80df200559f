"""Where the fused EM kernel is built (capsnets.functional.em.build) and what its loading says, without compiling:
one directory per source, torch and Python, under TORCH_EXTENSIONS_DIR or XDG_CACHE_HOME, and a one-line notice
on stderr when (and only when) a build is needed."""

from pathlib import Path

import pytest

from capsnets.functional.em import build
from capsnets.functional.em import kernel as em_kernel


def test_the_build_directory_is_one_per_source_torch_and_python(tmp_path):
    environ = {"TORCH_EXTENSIONS_DIR": str(tmp_path)}
    base = {"digest": "0123456789abcdef", "torch_version": "2.5.1", "python_version": "py312"}
    name = build.build_directory(**base, environ=environ)
    assert name == tmp_path / "capsnets" / "em_kernel" / "0123456789abcdef-torch2.5.1-py312"
    changed = [
        build.build_directory(**{**base, "digest": "fedcba9876543210"}, environ=environ),
        build.build_directory(**{**base, "torch_version": "2.6.0"}, environ=environ),
        build.build_directory(**{**base, "python_version": "py313"}, environ=environ),
        build.build_directory(**{**base, "python_version": "py313t"}, environ=environ),
    ]
    assert len({name, *changed}) == 5  # every change gets its own directory, none collides


def test_the_digest_covers_the_source_compiler_and_platform():
    source = build.SOURCE.read_bytes()
    digest = build.source_digest(source, environ={})
    assert len(digest) == 16 and digest == build.source_digest(source, environ={})
    assert build.source_digest(source + b"\n// changed", environ={}) != digest
    assert build.source_digest(source, environ={"CXX": "clang++"}) != digest
    assert build.source_digest(environ={}) == digest  # by default, the shipped source


def test_the_build_root_follows_torch_extensions_dir_then_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    args = {"digest": "0" * 16, "torch_version": "2.5.1", "python_version": "py312"}
    cache = build.build_directory(**args, environ={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert cache.parent == tmp_path / "xdg" / "capsnets" / "em_kernel"
    both = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    assert build.build_directory(**args, environ=both).parent == tmp_path / "ext" / "capsnets" / "em_kernel"
    assert build.build_directory(**args, environ={}).parent == tmp_path / "home" / ".cache" / "capsnets" / "em_kernel"
    # by default: this source, torch and Python, under the environment's root
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    assert build.build_directory().parent == tmp_path / "ext" / "capsnets" / "em_kernel"


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process that has not loaded the kernel, its builds under tmp_path; building and importing recorded."""
    monkeypatch.setattr(
        em_kernel, "_state", {"tried": False, "module": None, "error": None, "warned": False, "building": False}
    )
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv(em_kernel.ENV_VAR, "auto")
    calls = []

    def fake_build(directory: Path, verbose: bool):
        calls.append(("build", directory))
        assert em_kernel.build_needed()  # while it compiles, a use waits for it
        directory.mkdir(parents=True, exist_ok=True)
        build.library_path(directory).write_bytes(b"built")
        return "module"

    monkeypatch.setattr(em_kernel, "_build", fake_build)
    monkeypatch.setattr(em_kernel, "_import", lambda library: calls.append(("import", library)) or "module")
    return calls


def test_the_first_build_says_so_in_one_line_and_a_cached_one_is_loaded_silently(fresh, monkeypatch, capfd):
    directory = build.build_directory()
    assert em_kernel.build_needed()
    assert em_kernel.load() == "module"
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "compiling the fused EM routing kernel once" in err and str(directory) in err
    assert fresh == [("build", directory)]
    assert not em_kernel.build_needed()  # loaded in this process

    monkeypatch.setattr(
        em_kernel, "_state", {"tried": False, "module": None, "error": None, "warned": False, "building": False}
    )
    assert not em_kernel.build_needed()  # a new process: the library is there
    assert em_kernel.load() == "module"
    assert capfd.readouterr().err == ""
    assert fresh[-1] == ("import", build.library_path(directory))


def test_no_build_is_needed_on_the_pytorch_path(fresh, monkeypatch):
    assert em_kernel.build_needed()
    monkeypatch.setenv(em_kernel.ENV_VAR, "torch")
    assert not em_kernel.build_needed()
    assert fresh == []  # asking compiled nothing


def test_a_failed_build_is_reported_by_load_error(fresh, monkeypatch):
    def failing(directory, verbose):
        raise RuntimeError("Error building extension 'capsnets_em_votes'\nno compiler")

    monkeypatch.setattr(em_kernel, "_build", failing)
    assert em_kernel.load() is None
    assert em_kernel.load_error() == "RuntimeError: no compiler"
