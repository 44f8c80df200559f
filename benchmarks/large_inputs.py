"""Capsule models at large inputs: one training step's time and memory, each beside its CNN counterpart.

For each pair (capsule model, CNN of the same task) at each input size and batch size:

- **time**: both models' training steps (forward pass, the model's default loss or cross-entropy on the class
  scores, backward pass, Adam) in one child process, alternating which goes first, after a warm-up step each; the
  median step over ``--repeats``;
- **peak memory**: the first training step, in a fresh child process per model: the peak resident set size during
  the step (Linux ``VmHWM``, reset through ``/proc/self/clear_refs`` once the model and the batch are built) minus
  the resident size before it (activations, gradients, Adam's state and the step's temporaries), and the
  process's whole peak. The children use the C library's default allocator settings, as the ``capsnets``
  command does; ``--retain-freed-memory`` measures with
  :func:`~capsnets.engine.runtime.retain_freed_memory` instead (faster steps, a larger resident set);
- **peak tensor bytes**: the most bytes that tensors made during one forward and backward pass hold at once,
  beyond the weights, their gradients and the batch (the activations, those kept for the backward pass and the
  temporaries); like the next figure it depends on the model and the input only, not on the machine or its
  allocator;
- **saved activations**: the bytes of the tensors autograd keeps for the backward pass (each storage counted
  once, parameters left out).

Inputs are random images in [0, 1] (and random 0/1 masks or labels). Segmentation pairs train with their default
losses; classification pairs with cross-entropy on the class scores. The matrix capsule models route through the
fused CPU kernel where it loads (``CAPSNETS_EM_KERNEL`` as set, recorded in the JSON).

    python benchmarks/large_inputs.py --out benchmarks/results/large_inputs_cpu.json
    python benchmarks/large_inputs.py --dry-run          # tiny sizes: checks that the script runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capsnets  # noqa: E402
from capsnets.engine.runtime import retain_freed_memory  # noqa: E402
from capsnets.losses import create_loss  # noqa: E402
from capsnets.models import model_task  # noqa: E402

from throughput import environment  # noqa: E402

#: (capsule model, CNN counterpart, input sides): the segmentation models at 256x256 and SegCaps' own resolution,
#: smallNORB's own and its 32x32 crops.
PAIRS = (
    ("segcaps", "unet", (256, 512)),
    ("capsule_unet", "unet", (256, 512)),
    ("matrix_capsnet", "cnn_smallnorb", (32, 96)),
)
#: The same at sizes a CPU test can afford.
DRY_PAIRS = (
    ("segcaps_small", "unet_small", (32,)),
    ("capsule_unet_small", "unet_small", (32,)),
    ("matrix_capsnet_small", "cnn_smallnorb_narrow", (32,)),
)


def build(name: str, side: int):
    """Model ``name`` for ``1 x side x side`` images, its Adam, and a function making one batch."""
    torch.manual_seed(0)
    model = capsnets.create_model(name, input_size=(1, side, side))
    model.train()
    segmentation = model_task(name) == "segmentation"
    loss = create_loss(model.default_loss) if segmentation else None

    def batch(size: int):
        gen = torch.Generator().manual_seed(size)
        images = torch.rand(size, 1, side, side, generator=gen)
        if segmentation:
            return images, (torch.rand(size, 1, side, side, generator=gen) > 0.5).float()
        return images, torch.randint(0, model.num_classes, (size,), generator=gen)

    def objective(images, targets):
        if segmentation:
            return loss(model(images, targets), images, targets)[0]
        return torch.nn.functional.cross_entropy(model(images).scores, targets)

    return model, torch.optim.Adam(model.parameters(), 1e-3), batch, objective


def step(model, optimizer, objective, images, targets) -> float:
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    objective(images, targets).backward()
    optimizer.step()
    return time.perf_counter() - start


def saved_activation_bytes(model, objective, images, targets) -> int:
    """The bytes of the tensors autograd saves for the backward pass of one training step's loss (each storage
    once, the parameters' left out)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        objective(images, targets)
    return sum(seen.values())


class _LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of the storages that the operators run inside it create while they live, and their peak.
    Storages that exist before (``outside``) are not counted, even when an in-place operator returns one."""

    def __init__(self, outside) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.tracked = {tensor.untyped_storage().data_ptr() for tensor in outside}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size and key not in self.tracked:
                self.tracked.add(key)
                self.live += size
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._free, key, size)
        return out

    def _free(self, key: int, size: int) -> None:
        self.tracked.discard(key)
        self.live -= size


def peak_tensor_bytes(model, objective, images, targets) -> int:
    """The most bytes the tensors of one forward and backward pass hold at once, beyond the weights, their
    gradients (made before, so that accumulating into them adds nothing) and the batch."""
    model.zero_grad(set_to_none=True)
    objective(images, targets).backward()
    model.zero_grad(set_to_none=False)
    params = list(model.parameters())
    meter = _LiveTensorBytes([*params, *(p.grad for p in params if p.grad is not None), images, targets])
    with meter:
        objective(images, targets).backward()
    model.zero_grad(set_to_none=True)
    return meter.peak


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_child(name: str, side: int, batch: int) -> dict:
    """The first training step of ``name`` in this (fresh) process, measured."""
    model, optimizer, make, objective = build(name, side)
    images, targets = make(batch)
    Path("/proc/self/clear_refs").write_text("5")  # Linux: reset this process's peak RSS (VmHWM) to its RSS now
    before = _status_bytes("VmRSS")
    step(model, optimizer, objective, images, targets)
    peak = _status_bytes("VmHWM")  # the kernel syncs its RSS counters lazily: it can read a few pages below VmRSS
    return {
        "peak_rss_increase_bytes": max(peak - before, 0),
        "peak_rss_bytes": peak,
        "saved_activation_bytes": saved_activation_bytes(model, objective, images, targets),
        "peak_tensor_bytes": peak_tensor_bytes(model, objective, images, targets),
        "parameters": capsnets.count_parameters(model),
    }


def timing_child(names: list[str], side: int, batch: int, repeats: int) -> dict:
    """The median training step of each model, the models alternating (the first of each round swaps)."""
    built = {name: build(name, side) for name in names}
    data = {name: built[name][2](batch) for name in names}
    for name in names:  # warm-up
        model, optimizer, _, objective = built[name]
        step(model, optimizer, objective, *data[name])
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            model, optimizer, _, objective = built[name]
            times[name].append(step(model, optimizer, objective, *data[name]))
    return {name: {"step_s": statistics.median(t), "steps_s": t} for name, t in times.items()}


def _child(args: list[str]) -> dict:
    result = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if result.returncode != 0:  # e.g. killed for memory: recorded, not fatal
        return {"error": f"exit {result.returncode}: {(result.stderr.strip().splitlines() or [''])[-1]}"}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per model (after one warm-up step)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dry-run", action="store_true", help="the small models at 32x32, one repeat")
    parser.add_argument("--memory-only", action="store_true", help="measure memory only, not the steps' time")
    parser.add_argument(
        "--pairs",
        nargs="+",
        default=None,
        metavar="MODEL",
        help="only the pairs of these capsule models (default: all)",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--retain-freed-memory",
        action="store_true",
        help="keep freed CPU memory in the processes (capsnets.engine.runtime.retain_freed_memory; default: the C "
        "library's settings, as the capsnets command uses)",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.retain_freed_memory:
        retain_freed_memory()
    if args.child:
        kind, side, batch, *rest = args.child
        if kind == "memory":
            out = memory_child(rest[0], int(side), int(batch))
        else:
            out = timing_child(rest[1:], int(side), int(batch), int(rest[0]))
        print(json.dumps(out))
        return 0
    pairs, repeats = (DRY_PAIRS, 1) if args.dry_run else (PAIRS, args.repeats)
    if args.pairs:
        unknown = set(args.pairs) - {capsules for capsules, _, _ in pairs}
        if unknown:
            parser.error(
                f"--pairs: no pair has the capsule model {sorted(unknown)}; choose from {[p[0] for p in pairs]}"
            )
        pairs = tuple(pair for pair in pairs if pair[0] in args.pairs)
    threads = ["--threads", str(args.threads)] if args.threads else []
    threads += ["--retain-freed-memory"] if args.retain_freed_memory else []
    rows = []
    for capsules, cnn, sides in pairs:
        for side in sides:
            for batch in args.batch_sizes:
                timing = (
                    {}
                    if args.memory_only
                    else _child([*threads, "--child", "timing", str(side), str(batch), str(repeats), capsules, cnn])
                )
                row = {"capsules": capsules, "cnn": cnn, "side": side, "batch": batch, "models": {}}
                for name in (capsules, cnn):
                    memory = _child([*threads, "--child", "memory", str(side), str(batch), name])
                    untimed = {} if args.memory_only else {"timing_error": timing.get("error")}
                    row["models"][name] = {**timing.get(name, untimed), **memory}
                caps, base = row["models"][capsules], row["models"][cnn]
                for key in ("step_s", "peak_rss_increase_bytes", "peak_tensor_bytes", "saved_activation_bytes"):
                    if key in caps and key in base and base[key]:
                        row[f"{key}_ratio_capsules_to_cnn"] = caps[key] / base[key]
                rows.append(row)
                print(_line(row), flush=True)
    result = {
        **environment(torch.device("cpu"), args),
        "em_kernel": os.environ.get("CAPSNETS_EM_KERNEL", "auto"),
        "retain_freed_memory": args.retain_freed_memory,
        "memory_only": args.memory_only,
        "rows": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _line(row: dict) -> str:
    parts = [f"{row['side']}x{row['side']} batch {row['batch']}:"]
    for name, rec in row["models"].items():
        if "error" in rec:
            parts.append(f"{name} {rec['error']}")
            continue
        step = (
            f"{rec['step_s']:.3f} s/step"
            if "step_s" in rec
            else f"untimed ({rec.get('timing_error') or 'memory only'})"
        )
        parts.append(
            f"{name} {step}, peak +{rec['peak_rss_increase_bytes'] / 2**20:,.0f} MiB, "
            f"tensors {rec['peak_tensor_bytes'] / 2**20:,.0f} MiB, saved {rec['saved_activation_bytes'] / 2**20:,.1f} MiB"
        )
    return "  ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
