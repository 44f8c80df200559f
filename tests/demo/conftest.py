"""Fixtures of the demo tests: what they need installed, untrained demo models, and one trained demo run."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch


def require(*needs: tuple[str, bool]) -> None:
    """Skip the test where something it needs is missing (each ``(what, present)``), except in CI (``CI`` set),
    where it fails: CI installs the ``test`` extra and Debian's chromium and chromium-driver (``.ci/run``)."""
    missing = [what for what, present in needs if not present]
    if missing:
        message = (
            f"needs {', '.join(missing)}: pip install -e '.[test]' (Python packages), apt-get install chromium "
            "chromium-driver (the browser test)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run it")
        pytest.skip(message)


def module(name: str) -> tuple[str, bool]:
    return name, importlib.util.find_spec(name) is not None


@pytest.fixture(scope="session")
def need():
    """:func:`require`, for the test files (``need(module("selenium"), ("chromium", found))``)."""
    return lambda *needs: require(*needs)


@pytest.fixture(scope="session")
def web() -> None:
    """FastAPI, uvicorn and the client of FastAPI's TestClient."""
    require(
        module("fastapi"),
        module("uvicorn"),
        ("httpx2 or httpx", any(importlib.util.find_spec(name) is not None for name in ("httpx2", "httpx"))),
    )


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, web) -> str:
    """A demo run directory: ``load_demo_model`` trained it (5 of the demo's 10 epochs, no figures; ~95% test
    accuracy in about 8 s on 2 CPU cores)."""
    from capsnets.demo import source
    from capsnets.engine import reporting

    run = tmp_path_factory.mktemp("demo") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
        patch.setitem(source.DEMO_TRAINING, "epochs", 5)
        demo = source.load_demo_model(out=run)
    assert demo.source.startswith("trained now"), demo.source
    return str(run)


@pytest.fixture(scope="session")
def trained(trained_run):
    """The trained demo model (loaded again from its run directory)."""
    from capsnets.demo import load_demo_model

    return load_demo_model(out=trained_run)


@pytest.fixture
def untrained_capsnet():
    """An untrained ``capsnet_digits`` as the demo shows it."""
    from capsnets.demo import DemoModel
    from capsnets.models import create_model

    torch.manual_seed(0)
    return DemoModel(
        create_model("capsnet_digits", routing={"iterations": 2}),
        dataset="digits",
        source="untrained",
        name="capsnet_digits",
    )


@pytest.fixture(scope="session")
def untrained_matrix():
    """An untrained ``matrix_capsnet_small`` for 28x28 MNIST-like inputs (no data set: no test images)."""
    from capsnets.demo import DemoModel
    from capsnets.models import create_model

    torch.manual_seed(0)
    model = create_model("matrix_capsnet_small", num_classes=10, input_size=(1, 28, 28), routing={"iterations": 1})
    return DemoModel(model, source="untrained", name="matrix_capsnet_small")
