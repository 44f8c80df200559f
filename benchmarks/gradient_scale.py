"""The cost of the routings' gradient normalisation (``capsnets.functional.routing_common.normalized_gradients``).

Times a training step (forward, loss, backward, Adam) of each model with the routing functions as they are
(``wrapped``) and with the wrapper taken off (``unwrapped``: each function's ``__wrapped__``), alternating in one
process on synthetic inputs, so that the ratio holds on a busy machine. Writes JSON with the device, torch,
threads, batch, images/s of both and the median per-repeat ratio wrapped / unwrapped, and peak resident memory.

    python benchmarks/gradient_scale.py --out benchmarks/results/gradient_scale_cpu.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import resource
import statistics
import time
from pathlib import Path

import torch

import capsnets
import capsnets.functional.em.procedure as em_procedure
import capsnets.functional.em.routing as em_routing
from capsnets.losses import create_loss

# the module: capsnets.functional's function of the same name shadows it for `import ... as`
dynamic = importlib.import_module("capsnets.functional.dynamic_routing")

#: The wrapped routing functions the registered vector and matrix capsule models call, by module.
WRAPPED = {(dynamic, "dynamic_routing"), (em_routing, "_route_poses"), (em_procedure, "route_votes")}


def _wrapper(on: bool, originals: dict) -> None:
    for (module, name), function in originals.items():
        setattr(module, name, function if on else function.__wrapped__)


def measure(name: str, batch: int, repeats: int, steps: int) -> dict:
    originals = {(module, attr): getattr(module, attr) for module, attr in WRAPPED}
    torch.manual_seed(0)
    model = capsnets.create_model(name)
    loss_fn = create_loss(model.default_loss)
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    images = torch.rand(batch, *model.input_size)
    labels = torch.randint(0, int(model.num_classes), (batch,))

    def step() -> None:
        loss, _ = loss_fn(model(images, labels), images, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    rates = {True: [], False: []}
    try:
        for repeat in range(repeats + 1):  # the first round warms up
            for on in (True, False) if repeat % 2 else (False, True):
                _wrapper(on, originals)
                step()
                start = time.perf_counter()
                for _ in range(steps):
                    step()
                if repeat:
                    rates[on].append(batch * steps / (time.perf_counter() - start))
    finally:
        _wrapper(True, originals)
    return {
        "model": name,
        "batch": batch,
        "images_per_s_wrapped": statistics.median(rates[True]),
        "images_per_s_unwrapped": statistics.median(rates[False]),
        "ratio_wrapped_over_unwrapped": statistics.median(a / b for a, b in zip(rates[True], rates[False])),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--models", nargs="+", default=["capsnet_small", "matrix_capsnet_small"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--steps", type=int, default=3, help="training steps per timed block")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="JSON file to write (default: print only)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [measure(name, args.batch_size, args.repeats, args.steps) for name in args.models]
    record = {
        "device": f"cpu ({platform.machine()})",
        "torch": torch.__version__,
        "threads": args.threads,
        "repeats": args.repeats,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "results": rows,
    }
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return record


if __name__ == "__main__":
    main()
