"""The fused CPU kernel of EM routing against the PyTorch path, and the capsule tax against CNNs.

Training images/s at one batch size of every model, in one run: the matrix capsule models on both EM paths
(``CAPSNETS_EM_KERNEL=torch`` and ``cpp``, the same model object, the path switched between timings) and
the CNN baselines of similar size, all in one rotation whose order alternates between repeats; each figure
is the median over repeats, each speed-up the median of per-repeat ratios. A CNN's timing runs ``--cnn-steps``
steps (16 times ``--steps`` by default), so that it lasts about as long as a capsule model's on the kernel's path:
a CNN step takes a few milliseconds, and a timing of a few steps measures mostly the machine's noise. Peak memory
of one training step at ``--memory-batch`` is measured per model and path in a fresh child process: the peak
resident set size during the step (Linux: ``VmHWM``, reset through ``/proc/self/clear_refs`` after the set-up)
minus the resident size before it.

    python benchmarks/em_kernel.py --out benchmarks/results/em_kernel_cpu_2core.json

Every model is trained with cross-entropy on its class scores (the same loss for every path and model) and
Adam; inputs are random ``(B, 1, 32, 32)`` images with 5 classes, the models' smallNORB defaults.

``--profile`` adds where a kernel training step's time goes: the milliseconds per step inside each of the
kernel's calls (timed around each call) and in PyTorch's operations outside them (``torch.profiler``'s self
times), after the timed rotation, on the same model objects. ``--inference`` adds the inference images/s of each
matrix capsule model at ``--inference-batch`` on the kernel's path, in slices of ``CPU_IMAGES_AT_A_TIME`` images
(the model's way) against the batch whole, alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capsnets  # noqa: E402
from capsnets.engine.runtime import retain_freed_memory  # noqa: E402
from capsnets.functional.em import kernel as em_kernel  # noqa: E402

from throughput import environment  # noqa: E402

PAIRS = (("matrix_capsnet_small", "cnn_smallnorb_narrow"), ("matrix_capsnet", "cnn_smallnorb"))
PATHS = ("torch", "cpp")


def build(name: str, detach: bool):
    kwargs = {"routing": {"detach_routing": True}} if detach and name.startswith("matrix") else {}
    torch.manual_seed(0)
    model = capsnets.create_model(name, **kwargs)
    return model, torch.optim.Adam(model.parameters(), 1e-3)


def train(model, optimizer, images, labels, steps: int) -> None:
    model.train()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images).scores, labels)
        loss.backward()
        optimizer.step()


def timed(fn, images: int) -> float:
    start = time.perf_counter()
    fn()
    return images / (time.perf_counter() - start)


class _TimedKernel:
    """The loaded kernel module with every call timed: ``seconds[name]`` accumulates each function's time."""

    def __init__(self, module) -> None:
        self._module, self.seconds = module, {}

    def __getattr__(self, name: str):
        function = getattr(self._module, name)
        if not callable(function):
            return function

        def timed_call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        return timed_call


def profile(model, optimizer, images, labels, steps: int, top: int = 10) -> dict:
    """Milliseconds per training step on the kernel's path: in all, in each kernel call, and in the ``top``
    PyTorch operations outside the kernel by self time."""
    os.environ[em_kernel.ENV_VAR] = "cpp"
    timed_kernel = _TimedKernel(em_kernel.load())
    module, em_kernel._state["module"] = em_kernel._state["module"], timed_kernel
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            train(model, optimizer, images, labels, steps)
            total = time.perf_counter() - start
    finally:
        em_kernel._state["module"] = module
    per_step = 1000.0 / steps
    kernel = {name: s * per_step for name, s in sorted(timed_kernel.seconds.items(), key=lambda kv: -kv[1])}
    ops = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    ops.sort(key=lambda e: -e.self_cpu_time_total)
    return {
        "steps": steps,
        "step_ms": total * per_step,
        "kernel_ms": kernel,
        "kernel_total_ms": sum(kernel.values()),
        "outside_kernel_ms": total * per_step - sum(kernel.values()),
        "top_ops_self_ms": {e.key: e.self_cpu_time_total / 1000.0 / steps for e in ops[:top]},
    }


def inference(model, images, steps: int, repeats: int) -> dict:
    """Inference images/s of ``model`` on ``images`` (the kernel's path, ``steps`` forwards a timing): the batch in
    slices of ``CPU_IMAGES_AT_A_TIME`` images against the batch whole, alternating over ``repeats``."""
    from capsnets.models import matrix_capsnet

    os.environ[em_kernel.ENV_VAR] = "cpp"
    size, runs = matrix_capsnet.CPU_IMAGES_AT_A_TIME, {"slices": [], "whole": []}

    def forwards():
        for _ in range(steps):
            model(images)

    model.eval()
    try:
        with torch.no_grad():
            forwards()  # warm-up
            for repeat in range(repeats):
                for name in ("slices", "whole") if repeat % 2 == 0 else ("whole", "slices"):
                    matrix_capsnet.CPU_IMAGES_AT_A_TIME = size if name == "slices" else len(images)
                    runs[name].append(timed(forwards, len(images) * steps))
    finally:
        matrix_capsnet.CPU_IMAGES_AT_A_TIME = size
        model.train()
    return {
        "batch": len(images),
        "images_at_a_time": size,
        "images_per_s": {name: statistics.median(r) for name, r in runs.items()},
        "speedup": statistics.median(s / w for s, w in zip(runs["slices"], runs["whole"])),
        "per_repeat": runs,
    }


def memory_child(name: str, path: str, batch: int, detach: bool) -> None:
    """One training step at ``batch`` in this (fresh) process; prints the peak RSS increase as JSON."""
    retain_freed_memory()
    os.environ[em_kernel.ENV_VAR] = path
    model, optimizer = build(name, detach)
    gen = torch.Generator().manual_seed(0)
    images, labels = torch.rand(batch, 1, 32, 32, generator=gen), torch.randint(0, 5, (batch,), generator=gen)
    if path == "cpp":
        em_kernel.load()
    Path("/proc/self/clear_refs").write_text("5")  # Linux: reset this process's peak RSS (VmHWM) to its RSS now
    before = _status_bytes("VmRSS")
    train(model, optimizer, images, labels, 1)
    peak = _status_bytes("VmHWM")  # the kernel syncs its RSS counters lazily: it can read a few pages below VmRSS
    print(json.dumps({"peak_rss_increase_bytes": max(peak - before, 0), "peak_rss_bytes": peak}))


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure_memory(name: str, path: str, batch: int, detach: bool) -> dict:
    command = [sys.executable, __file__, "--memory-child", name, path, str(batch)] + (["--detach"] if detach else [])
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:  # e.g. killed for memory: recorded, not fatal
        return {"error": f"exit {result.returncode}: {(result.stderr.strip().splitlines() or [''])[-1]}"}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--memory-batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2, help="timed training steps per repeat, path and model")
    parser.add_argument("--cnn-steps", type=int, default=None, help="timed steps of a CNN (default: 16 x --steps)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--detach", action="store_true", help="detached routing gradients (default: exact)")
    parser.add_argument("--skip-large", action="store_true", help="only matrix_capsnet_small and its CNN")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--profile", action="store_true", help="where a kernel training step's time goes")
    parser.add_argument("--inference", action="store_true", help="inference in slices against the batch whole")
    parser.add_argument("--inference-batch", type=int, default=64)
    parser.add_argument("--memory-child", nargs=3, metavar=("MODEL", "PATH", "BATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        name, path, batch = args.memory_child
        memory_child(name, path, int(batch), args.detach)
        return 0
    retain_freed_memory()
    if em_kernel.load() is None:
        raise SystemExit(f"the fused EM kernel could not be built: {em_kernel.load_error()}")
    pairs = PAIRS[:1] if args.skip_large else PAIRS
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(args.batch, 1, 32, 32, generator=gen)
    labels = torch.randint(0, 5, (args.batch,), generator=gen)
    models = {name: build(name, args.detach) for pair in pairs for name in pair}
    entries = [(caps, path) for caps, _ in pairs for path in PATHS] + [(cnn, None) for _, cnn in pairs]
    for name, path in entries:  # warm-up: one step each (and the kernel's first call)
        if path:
            os.environ[em_kernel.ENV_VAR] = path
        train(*models[name], images, labels, 1)
    runs = {entry: [] for entry in entries}
    cnn_steps = args.cnn_steps or 16 * args.steps
    for repeat in range(args.repeats):
        for name, path in entries if repeat % 2 == 0 else entries[::-1]:
            if path:
                os.environ[em_kernel.ENV_VAR] = path
            steps = args.steps if path else cnn_steps
            runs[name, path].append(
                timed(lambda name=name, steps=steps: train(*models[name], images, labels, steps), args.batch * steps)
            )
            print(f"repeat {repeat}: {name:<22} {path or 'cnn':<6} {runs[name, path][-1]:8.1f} images/s", flush=True)
    rows = []
    for caps, cnn in pairs:
        row = {
            "model": caps,
            "cnn": cnn,
            "batch": args.batch,
            "steps": {"capsules": args.steps, "cnn": cnn_steps},
            "train_images_per_s": {p: statistics.median(runs[caps, p]) for p in PATHS},
            "cnn_train_images_per_s": statistics.median(runs[cnn, None]),
            "kernel_speedup": statistics.median(c / t for c, t in zip(runs[caps, "cpp"], runs[caps, "torch"])),
            "capsule_tax": {p: statistics.median(n / c for n, c in zip(runs[cnn, None], runs[caps, p])) for p in PATHS},
            "per_repeat": {p: runs[caps, p] for p in PATHS} | {"cnn": runs[cnn, None]},
        }
        if args.profile:
            row["profile"] = profile(*models[caps], images, labels, args.steps * args.repeats)
            print(json.dumps(row["profile"], indent=1))
        if args.inference:
            batch = torch.rand(args.inference_batch, 1, 32, 32, generator=gen)
            row["inference"] = inference(models[caps][0], batch, args.steps, args.repeats)
            print(f"{caps} inference: {json.dumps(row['inference']['images_per_s'])}", flush=True)
        if not args.skip_memory:
            row["memory_batch"] = args.memory_batch
            row["memory"] = {p: measure_memory(caps, p, args.memory_batch, args.detach) for p in PATHS}
            row["memory"]["cnn"] = measure_memory(cnn, "torch", args.memory_batch, args.detach)
            if all("error" not in row["memory"][p] for p in PATHS):
                row["memory_ratio_cpp_to_torch"] = (
                    row["memory"]["cpp"]["peak_rss_increase_bytes"] / row["memory"]["torch"]["peak_rss_increase_bytes"]
                )
        rows.append(row)
        mem = (
            f", peak memory at batch {args.memory_batch}: cpp/torch {row['memory_ratio_cpp_to_torch']:.2f}"
            if "memory_ratio_cpp_to_torch" in row
            else ""
        )
        print(
            f"{caps}: torch {row['train_images_per_s']['torch']:.1f}, cpp {row['train_images_per_s']['cpp']:.1f} "
            f"images/s ({row['kernel_speedup']:.2f}x); {cnn} {row['cnn_train_images_per_s']:.1f} images/s "
            f"(tax: torch {row['capsule_tax']['torch']:.1f}x, cpp {row['capsule_tax']['cpp']:.1f}x){mem}"
        )
    result = {
        "environment": environment(torch.device("cpu"), args),
        "loss": "cross_entropy on scores",
        "gradients": "detached routing" if args.detach else "exact",
        "rows": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
