"""``capsnets demo``: a local web page to see what capsules encode (Sabour, Frosst & Hinton 2017, Sec. 5.1).

Draw a digit (or pick a test image) and see the class capsules' lengths, the reconstruction from one capsule,
each capsule dimension moved with a slider (and the paper's perturbation grid, Fig. 4), and what the routing
sent to each class. For vector capsule networks and, without a decoder, matrix capsule networks.

- :mod:`capsnets.demo.source`: the model shown (a checkpoint, or a demo model trained on the 8x8 digits once);
- :mod:`capsnets.demo.capsules`: :class:`DemoModel`, the model's answers for one input;
- :mod:`capsnets.demo.images`: images in and out (drawings framed as training digits are, PNGs, routing maps);
- :mod:`capsnets.demo.app`: the FastAPI server and its JSON API (needs ``pip install -e '.[demo]'``);
- ``static/``: the page, plain HTML, JavaScript and CSS.

Example::

    >>> from capsnets.demo import load_demo_model                    # doctest: +SKIP
    >>> from capsnets.demo.app import serve                          # doctest: +SKIP
    >>> serve(load_demo_model(), "127.0.0.1", 8000)                  # doctest: +SKIP
"""

from capsnets.demo.capsules import Analysis, DemoModel
from capsnets.demo.source import DEMO_RUN_DIR, DEMO_TRAINING, load_demo_model

__all__ = ["Analysis", "DemoModel", "DEMO_RUN_DIR", "DEMO_TRAINING", "load_demo_model"]
