"""The routing procedures' matrix-times-column products, as ``@`` and as :func:`capsnets.functional.products.matvec`.

Dynamic routing's agreements ``u_hat . v`` and EM routing's E-step products (and their gradients in the lean
backward) are batched products of a matrix and a column. This script times each routing procedure alone, on the
routing problems of the paper's models, once with those products written as ``matrix @ column`` and once as
:func:`~capsnets.functional.products.matvec` (a row times the transposed matrix, what the library uses), the two
alternating in one process (``--repeats`` rounds, the order swapped every round), and saves the medians and the
median per-round ratio as JSON.

Problems (``B`` images): dynamic routing of ``capsnet``'s 1,152 primary capsules to 10 class capsules of 16-D,
``(B, 1152, 10, 16)``; EM routing of ``matrix_capsnet_small``'s first convolutional capsule layer, 36 output
positions folded into the batch, 72 children, 16 parents, 4x4 poses: ``(B * 36, 72, 16, 16)``. Each is timed
forward only (no gradients: inference; dynamic routing with its default ``detach_routing=True``) and forward + backward
with gradients through every iteration (``detach_routing=False`` / exact EM gradients).

Run ``python benchmarks/routing_products.py --help``; ``benchmarks/README.md`` has the recorded results.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from pathlib import Path

import torch

from capsnets.engine.runtime import resolve_device, retain_freed_memory
from capsnets.files import atomic_write
from capsnets.functional import em_routing

from throughput import environment, max_rss_bytes, synchronize

# the modules whose ``matvec`` is swapped (importlib: the package re-exports functions of the same names)
_MODULES = {"dynamic": "capsnets.functional.dynamic_routing", "em": "capsnets.functional.em.procedure"}


def _plain(matrix, column):
    return matrix @ column


def _problem(routing: str, batch: int, device: torch.device):
    """``(forward, forward_backward)`` closures on a fixed random problem of ``routing``."""
    g = torch.Generator().manual_seed(0)
    module = importlib.import_module(_MODULES[routing])
    if routing == "dynamic":
        u_hat = torch.randn(batch, 1152, 10, 16, generator=g).to(device)
        leaf = u_hat.clone().requires_grad_()
        return (
            lambda: module.dynamic_routing(u_hat, 3),
            lambda: module.dynamic_routing(leaf, 3, detach_routing=False).square().sum().backward(),
        )
    votes = torch.randn(batch * 36, 72, 16, 16, generator=g).to(device)
    acts = torch.rand(batch * 36, 72, generator=g).to(device)
    leaf = votes.clone().requires_grad_()
    beta_v, beta_a = torch.zeros(16, device=device), torch.zeros(16, device=device)

    def forward_backward():
        pose, act = em_routing(leaf, acts, beta_v, beta_a, 3)
        (pose.square().sum() + act.sum()).backward()

    def forward():
        with torch.no_grad():
            em_routing(votes, acts, beta_v, beta_a, 3)

    return forward, forward_backward


def _time_ms(fn, steps: int, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / steps * 1e3


def measure(routing: str, batch: int, args, device: torch.device) -> list[dict]:
    """Rows for one routing problem: forward and forward + backward, each as ``@`` and as ``matvec``."""
    module = importlib.import_module(_MODULES[routing])
    variants = {"matrix_at_column": _plain, "matvec": module.matvec}
    runs = {}
    try:
        for kind, fn in zip(("forward", "forward_backward"), _problem(routing, batch, device)):
            for product in variants.values():  # warm-up
                module.matvec = product
                fn()
            for repeat in range(args.repeats):
                for name in list(variants) if repeat % 2 == 0 else list(variants)[::-1]:
                    module.matvec = variants[name]
                    runs.setdefault(kind, {}).setdefault(name, []).append(_time_ms(fn, args.steps, device))
    finally:
        module.matvec = variants["matvec"]
    rows = []
    for kind, by_name in runs.items():
        plain, row = by_name["matrix_at_column"], by_name["matvec"]
        rows.append(
            {
                "routing": routing,
                "batch_size": batch,
                "kind": kind,
                "matrix_at_column_ms": statistics.median(plain),
                "matvec_ms": statistics.median(row),
                "matrix_at_column_images_per_s": batch * 1e3 / statistics.median(plain),
                "matvec_images_per_s": batch * 1e3 / statistics.median(row),
                "speedup": statistics.median(p / r for p, r in zip(plain, row)),
                "matrix_at_column_ms_runs": plain,
                "matvec_ms_runs": row,
                "process_max_rss_bytes": max_rss_bytes(),
            }
        )
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--routings", nargs="+", choices=sorted(_MODULES), default=sorted(_MODULES))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[32])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    parser.add_argument("--steps", type=int, default=5, help="timed calls per repeat and variant")
    parser.add_argument("--repeats", type=int, default=5, help="alternating repeats; medians are reported")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: print only)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or min(args.batch_sizes) < 1:
        parser.error("--steps, --repeats and --batch-sizes must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    retain_freed_memory()  # as `capsnets --retain-freed-memory` does
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    meta = environment(device, args)
    rows = []
    print(f"{'routing':<8} {'batch':>5} {'kind':<17} {'A @ x ms':>9} {'matvec ms':>9} {'speed-up':>8}")
    for routing in args.routings:
        for batch in args.batch_sizes:
            for row in measure(routing, batch, args, device):
                rows.append(row)
                print(
                    f"{routing:<8} {batch:>5} {row['kind']:<17} {row['matrix_at_column_ms']:>9.2f} "
                    f"{row['matvec_ms']:>9.2f} {row['speedup']:>8.2f}",
                    flush=True,
                )
    if args.out is not None:
        text = json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n"
        atomic_write(args.out, lambda tmp: Path(tmp).write_text(text))
        print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
