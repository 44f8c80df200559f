"""Inputs the fault-injection suite's fuzz found ending in a traceback, kept as regression cases: each must now
end in a one-line error (the fuzz draws them too, among many others)."""

from __future__ import annotations

import pytest
from reliability.faults import copy_run, one_error_line

from capsnets.cli import main

TINY = ["--limit-train", "8", "--limit-test", "8", "--epochs", "1", "--no-progress"]


def _case(found: str, *argv: str):
    return pytest.param(list(argv), id=found)


CASES = [  # the id: what it once raised
    _case("meta-train-item-on-meta-tensor", "train", "--device", "meta", *TINY),
    _case("meta-evaluate-bincount-not-implemented", "evaluate", "--device", "meta"),
    _case("meta-reconstruct-cannot-copy-out-of-meta", "reconstruct", "--device", "meta"),
    _case(
        "num-classes-storage-size-overflowed",
        "train",
        "--device",
        "cpu",
        "--model-arg",
        "num_classes=1000000000000000",
        *TINY,
    ),
    _case(
        "input-size-storage-size-overflowed",
        "train",
        "--device",
        "cpu",
        "--model-arg",
        "input_size=[1, 1000000000000000, 8]",
        *TINY,
    ),
    _case(
        "em-routing-on-capsnet-digits-type-error",
        "train",
        "--device",
        "cpu",
        "--model-arg",
        "routing={type: em}",
        *TINY,
    ),
    _case(
        "dynamic-routing-on-matrix-capsnet",
        "train",
        "--device",
        "cpu",
        "--model",
        "matrix_capsnet_small",
        "--model-arg",
        "routing={type: dynamic}",
        *TINY,
    ),
    _case("segcaps-loss-on-classifier-attribute-error", "train", "--device", "cpu", "--loss", "segcaps", *TINY),
    _case("transforming-loss-on-classifier", "train", "--device", "cpu", "--loss", "transforming", *TINY),
    _case(
        "reconstruction-weight-without-decoder-silent",
        "train",
        "--device",
        "cpu",
        "--model-arg",
        "reconstruction=false",
        "--loss-arg",
        "reconstruction_weight=0.01",
        *TINY,
    ),
]


@pytest.mark.parametrize("argv", CASES)
def test_found_input_gets_one_error_line(argv, clean_runs, tmp_path, capsys, monkeypatch):
    from capsnets.engine import reporting

    monkeypatch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
    if argv[0] == "train":
        argv = [*argv, "--out", str(tmp_path / "run")]
    else:
        argv = [*argv, "--checkpoint", str(copy_run(clean_runs[1], tmp_path / "run"))]
    assert main(argv) == 1
    one_error_line(capsys.readouterr().err, argv[0])
