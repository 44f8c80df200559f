"""Fixtures of the fault-injection tests: uninterrupted runs to compare against, made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.faults import train_args


@pytest.fixture(scope="session")
def clean_runs(tmp_path_factory) -> dict[int, Path]:
    """Uninterrupted runs of ``train_args(epochs)`` for 1, 2 and 3 epochs, made in this process without figures
    (read-only: copy one with :func:`copy_run` to break it)."""
    from capsnets.cli import main
    from capsnets.engine import reporting

    root = tmp_path_factory.mktemp("clean-runs")
    runs = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
        for epochs in (1, 2, 3):
            runs[epochs] = root / f"epochs{epochs}"
            assert main([*train_args(epochs), "--out", str(runs[epochs])]) == 0
    return runs
