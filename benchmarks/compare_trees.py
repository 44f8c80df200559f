"""Throughput of two source trees of capsnets, measured alternately: does a change keep the speed?

Runs each tree's own ``benchmarks/throughput.py`` (with the arguments after ``--``) as a separate process with
that tree's ``src`` first on ``PYTHONPATH``, in turns: old then new in even rounds, new then old in odd ones.
A ratio new / old is taken per round and per model, so that a machine whose speed drifts over minutes still
gives a fair ratio; the median over the rounds is reported. Each tree may get its own
``TORCH_EXTENSIONS_DIR``, so that their fused EM kernels do not rebuild each other.

Example (a checkout of the earlier revision at /tmp/old)::

    python benchmarks/compare_trees.py --old /tmp/old --new . --rounds 5 \\
        -- --models capsnet_small matrix_capsnet_small --batch-sizes 32 --skip-naive --repeats 1 --steps 20

The JSON (``--out``) holds each round's rows of both trees (device, torch, batch, images/s, peak memory, as
``throughput.py`` writes them), the per-round ratios and their medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--old", type=Path, required=True, help="root of the earlier source tree")
    parser.add_argument("--new", type=Path, required=True, help="root of the changed source tree")
    parser.add_argument("--old-extensions", help="TORCH_EXTENSIONS_DIR for the old tree (default: inherited)")
    parser.add_argument("--new-extensions", help="TORCH_EXTENSIONS_DIR for the new tree (default: inherited)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each runs both trees once")
    parser.add_argument("--out", type=Path, help="JSON file (default: print only)")
    return parser.parse_args(argv), rest


def run_tree(root: Path, extensions: str | None, arguments: list[str]) -> dict:
    """One run of ``root``'s throughput.py; its JSON."""
    env = {**os.environ, "PYTHONPATH": str(root.resolve() / "src")}
    if extensions:
        env["TORCH_EXTENSIONS_DIR"] = extensions
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        command = [sys.executable, str(root / "benchmarks" / "throughput.py"), *arguments, "--out", str(out)]
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def main(argv=None) -> int:
    args, arguments = parse_args(argv)
    trees = {"old": (args.old, args.old_extensions), "new": (args.new, args.new_extensions)}
    rounds, ratios = [], {}
    for k in range(args.rounds):
        order = ("old", "new") if k % 2 == 0 else ("new", "old")
        result = {name: run_tree(*trees[name], arguments) for name in order}
        rounds.append(result)
        for old, new in zip(result["old"]["rows"], result["new"]["rows"], strict=True):
            key = f"{new['model']} batch {new['batch_size']} {new['path']}"
            ratio = new["train_images_per_s"] / old["train_images_per_s"]
            ratios.setdefault(key, []).append(ratio)
            print(
                f"round {k} ({order[0]} first) {key}: old {old['train_images_per_s']:.1f}, "
                f"new {new['train_images_per_s']:.1f} images/s, new/old {ratio:.3f}",
                flush=True,
            )
    summary = {key: {"median_new_over_old": statistics.median(v), "ratios": v} for key, v in ratios.items()}
    for key, value in summary.items():
        print(f"{key}: new/old training throughput, median of {args.rounds} rounds: {value['median_new_over_old']:.3f}")
    if args.out:
        record = {
            "command": sys.argv,
            "old": str(args.old),
            "new": str(args.new),
            "summary": summary,
            "rounds": rounds,
        }
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
