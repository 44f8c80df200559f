"""The fused CPU kernel of EM routing: the vote products computed from poses and transforms, in cache.

EM routing (:mod:`capsnets.functional.em_routing`) uses the votes ``V = M W`` only through products with
``[x, x^2]``, ``x = V / scale - c``: one per M-step, one per E-step, and their transposes in the backward.
``csrc/em_votes.cpp`` computes each product straight from the child poses ``M`` and the transforms ``W``,
one routing problem at a time in cache, so the ``(N, J, I, 16)`` vote tensor is never written to memory,
forward or backward (the backward recomputes the votes it needs). The kernel also runs whole iterations
(``route_head``: M-step, E-step and the child groups' normalisation): every iteration but the last where no
gradient flows through them (inference, ``detach_routing=True``), and with exact gradients the whole
procedure, keeping what the backward needs; that backward is the procedure's derivative written out by hand
(``_manual_backward`` in :mod:`capsnets.functional.em_routing`). The last M-step with detached gradients, and
every iteration with a cost normalisation, are the PyTorch path's Python code, differentiated by an autograd
replay of the procedure.

Inside each routing problem the loops over children run on chunks of 16 vote components held in vector
registers (GCC and Clang vector extensions: the kernel builds with those compilers only; elsewhere the PyTorch
path runs). In float32, the child groups' exponentials and the log variances use the polynomials of Cephes'
``expf`` and ``logf`` (within 2 ulp) instead of the C library's calls, which do not vectorise; float64 uses
the library's.

The kernel is C++ with OpenMP (``at::parallel_for``), compiled by PyTorch's extension tooling
(:func:`torch.utils.cpp_extension.load`, with the compiler and ninja that are on the machine) the first time
it is needed and cached (``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``);
``python -m capsnets.functional.em_kernel`` builds it ahead of time. It is compiled for the machine's own CPU
(``-march=native``), so a home directory shared by machines of different CPUs needs one
``TORCH_EXTENSIONS_DIR`` per machine. It is compiled on the machine rather
than at ``pip install``: a build-time step would need torch inside pip's isolated build environment, which
fetches a torch build of its own (possibly another version, breaking the extension's ABI).

Which path runs is set by the environment variable ``CAPSNETS_EM_KERNEL``:

- ``auto`` (default): the kernel for float32/float64 pose matrices (4x4) on the CPU, when it builds and
  loads; otherwise the PyTorch path, with one warning that says why;
- ``cpp``: the kernel wherever it applies, and an error if it cannot be built or loaded;
- ``torch``: always the PyTorch path (the reference, and the path for CUDA, half precision,
  ``torch.compile`` and export).
"""
from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path

import torch

ENV_VAR = "CAPSNETS_EM_KERNEL"
MODES = ("auto", "cpp", "torch")
_SOURCE = Path(__file__).with_name("csrc") / "em_votes.cpp"
_lock = threading.Lock()
_state: dict = {"tried": False, "module": None, "error": None, "warned": False}


def kernel_mode() -> str:
    """The path chosen by ``CAPSNETS_EM_KERNEL``: ``"auto"``, ``"cpp"`` or ``"torch"``."""
    mode = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV_VAR} must be one of {MODES}, got {os.environ.get(ENV_VAR)!r}")
    return mode


def load(verbose: bool = False):
    """Build (the first time on this machine) and load the extension. Returns the module, or None if it
    cannot be built or loaded (:func:`load_error` says why). Tried once per process."""
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            path = os.environ.get("PATH", "")
            try:
                from torch.utils.cpp_extension import load as load_extension  # slow; only to build the kernel

                try:  # the ninja of the pip package (a dependency), also when the environment is not activated
                    import ninja  # optional: a system ninja serves too

                    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + path
                except ImportError:
                    pass
                flags = ["-O3", "-march=native", "-fopenmp"]
                _state["module"] = load_extension(name="capsnets_em_votes", sources=[str(_SOURCE)],
                                                  extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=verbose)
            except Exception as exc:  # no compiler, no ninja, a failed build: the PyTorch path remains
                _state["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
            finally:
                os.environ["PATH"] = path
    return _state["module"]


def load_error() -> str | None:
    """Why the extension could not be built or loaded (None if it loaded or was not tried)."""
    return _state["error"]


def fused_kernel(pose: torch.Tensor):
    """The extension module to use for poses like ``pose`` ``(..., 4, 4)``, or None for the PyTorch path.

    None when ``CAPSNETS_EM_KERNEL=torch``, off the CPU, for dtypes other than float32/float64, for poses
    other than 4x4, or while ``torch.compile``/export traces the model. With ``cpp``, raises if the kernel
    cannot be loaded; with ``auto``, warns once and returns None.
    """
    mode = kernel_mode()
    if (mode == "torch" or pose.device.type != "cpu" or pose.dtype not in (torch.float32, torch.float64)
            or tuple(pose.shape[-2:]) != (4, 4) or torch.compiler.is_compiling()
            or torch.jit.is_scripting() or torch.jit.is_tracing()):
        return None
    module = load()
    if module is None:
        if mode == "cpp":
            raise RuntimeError(f"{ENV_VAR}=cpp, but the fused EM kernel could not be built or loaded "
                               f"({load_error()}). Install a C++ compiler and ninja (pip install ninja), or "
                               f"set {ENV_VAR}=torch for the PyTorch path.")
        if not _state["warned"]:
            _state["warned"] = True
            warnings.warn(f"capsnets: the fused EM kernel could not be built or loaded ({load_error()}); EM "
                          f"routing uses the PyTorch path (same results, slower). Set {ENV_VAR}=torch to "
                          f"silence this.", RuntimeWarning, stacklevel=3)
    return module


if __name__ == "__main__":  # python -m capsnets.functional.em_kernel: build ahead of time and report
    module = load(verbose=True)
    if module is None:
        raise SystemExit(f"the fused EM kernel could not be built: {load_error()}")
    print(f"fused EM kernel ready: {module.__file__}")
