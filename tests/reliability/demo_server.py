"""Serves the demo as ``capsnets demo`` does (:func:`capsnets.demo.app.serve`: uvicorn on a free port of localhost)
for the demo's fault tests, and prints its address on the first line of stdout.

The model is an untrained ``capsnet_digits`` (the demo's own model, seeded), so that no training is needed. The
log goes to stderr with ``capsnets`` loggers at INFO, so that the tests can count the lines a request leaves.

    python tests/reliability/demo_server.py [BODY_TIMEOUT_S]
"""

from __future__ import annotations

import logging
import sys

import torch

from capsnets.demo import DemoModel, app
from capsnets.models import create_model


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("capsnets").setLevel(logging.INFO)
    if argv:
        app.BODY_TIMEOUT_S = float(argv[0])
    torch.manual_seed(0)
    model = create_model("capsnet_digits", routing={"iterations": 2})
    demo = DemoModel(model, dataset="digits", source="untrained", name="capsnet_digits")
    app.serve(demo, "127.0.0.1", 0, announce=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main(sys.argv[1:])
