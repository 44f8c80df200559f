"""Shared helpers for the engine tests: a small, fast training config on the offline digits."""

import pytest

from capsnets.engine.config import TrainConfig


@pytest.fixture
def tiny_config(tmp_path):
    """Two epochs of capsnet_digits on 64 training / 32 test digits (a few seconds on a CPU), without figures
    unless a test asks for them (``figures=True``): drawing them takes longer than such a training."""

    def make(**overrides):
        values = dict(
            model="capsnet_digits",
            dataset="digits",
            epochs=2,
            batch_size=32,
            limit_train=64,
            limit_test=32,
            device="cpu",
            progress=False,
            figures=False,
            out=str(tmp_path / "run"),
            model_args={"routing": {"iterations": 2}},
        )
        values.update(overrides)
        return TrainConfig(**values)

    return make
