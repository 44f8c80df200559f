"""Training and inference throughput, peak memory, and the speed-up of production over naive routing.

For each model and batch size, on synthetic random inputs, this script times
  * training: forward + loss + backward + Adam step, ``model.train()``, ``model(images, labels)``;
  * inference: ``model.eval()`` under ``torch.no_grad()``, ``model(images)``;
for the production routing (the model's own default routing: the model is built without a ``routing``
argument) and, for capsule models, the naive vectorised routing of the same family
(``NaiveDynamicRouting`` of ``benchmarks/baselines.py`` for vector capsule models such as ``capsnet``,
``NaiveEMRouting`` for matrix capsule models such as ``matrix_capsnet``). The two
paths share weights and inputs and are measured alternately
(production first on even repeats, naive first on odd ones); each figure is the median over ``--repeats``,
and the speed-up is the median of the per-repeat ratios production / naive. With ``--compare-compile`` a
third path, ``compiled`` (the production model, or the model without routing, under ``torch.compile``, with
the same weights), is timed in the same rotation, and its rows give the median ratio compiled / eager.

Run ``python benchmarks/throughput.py --help``; ``benchmarks/README.md`` describes the JSON it writes.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import platform
import resource
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

import capsnets
from capsnets.engine.runtime import autocast, freed_memory_retained, resolve_device, retain_freed_memory
from capsnets.losses import create_loss
from capsnets.models import CapsNet, MatrixCapsNet, model_arguments, routing_keys

from baselines import NaiveDynamicRouting, NaiveEMRouting  # benchmarks/baselines.py, beside this script

# ----------------------------------------------------------------------------------------- environment


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what :mod:`platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device, args: argparse.Namespace) -> dict:
    """Everything needed to compare a result file with another one."""
    cuda = device.type == "cuda"
    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else cpu_name(),
        "cpu_name": cpu_name(),
        "threads": torch.get_num_threads(),
        "retain_freed_memory": freed_memory_retained(),  # in effect? (a query: main() applies it, or not)
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "capsnets": capsnets.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "settings": {
            **{k: v for k, v in vars(args).items() if k not in ("out", "model_arg")},
            **({"model_arg": dict(args.model_arg)} if hasattr(args, "model_arg") else {}),
        },
    }


def max_rss_bytes() -> int:
    """The process's peak resident set size (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -------------------------------------------------------------------------------------------- one path


def naive_routing(model: torch.nn.Module, iterations: int):
    """The naive routing of ``model``'s family, or None for a model family without one."""
    if isinstance(model, MatrixCapsNet):
        return NaiveEMRouting(iterations)
    if isinstance(model, CapsNet):
        return NaiveDynamicRouting(iterations)
    return None


def model_routing(model: torch.nn.Module):
    """The routing object the model's capsule layers use (the first one found), or None."""
    return next((m.routing for m in model.modules() if getattr(m, "routing", None) is not None), None)


def build_paths(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    """``{"production": model, "naive": model}`` with shared weights; ``{"default": model}`` without routing.

    production: the model's default routing (with ``--routing-iterations`` where that routing has iterations);
    naive: the naive routing of the model's family with the same iterations;
    compiled (``--compare-compile``): a copy of the production (or default) model run through ``torch.compile``.
    """
    accepted = model_arguments(name)
    kwargs = {key: value for key, value in args.model_arg if "." not in key}
    for key, value in args.model_arg:  # routing.KEY=VALUE: a setting of the model's routing
        if "." in key:
            head, _, rest = key.partition(".")
            kwargs.setdefault(head, {})[rest] = value
    if "iterations" in routing_keys(name):
        kwargs["routing"] = {"iterations": args.routing_iterations, **kwargs.get("routing", {})}
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise SystemExit(f"{name} does not take {unknown}; it takes {sorted(accepted)}")
    production = capsnets.create_model(name, **kwargs)
    naive = None if args.skip_naive or "routing" not in accepted else naive_routing(production, args.routing_iterations)
    if model_routing(production) is None:  # a model without routing (e.g. cnn_baseline): one path
        models = {"default": production}
    else:
        models = {"production": production}
    if naive is not None and "production" in models:
        models["naive"] = capsnets.create_model(name, **{**kwargs, "routing": naive})
        models["naive"].load_state_dict(production.state_dict())
    if args.compare_compile:
        models["compiled"] = capsnets.create_model(name, **kwargs)
        models["compiled"].load_state_dict(production.state_dict())
    paths = {}
    for path, model in models.items():
        model.to(device)
        routing = model_routing(model)
        paths[path] = {
            "model": model,
            "routing": None if routing is None else repr(routing),
            "step": torch.compile(model) if args.compile or path == "compiled" else model,
            "optimizer": torch.optim.Adam(model.parameters(), lr=1e-4),
        }
    return paths


def parse_model_arg(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` -> ``(key, value)``; VALUE is a Python literal (``true``/``false``/``none`` too) or a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    words = {"true": True, "false": False, "none": None}
    if value.lower() in words:
        return key, words[value.lower()]
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def train_steps(p: dict, criterion, images, labels, steps: int, amp, device) -> None:
    """``steps`` optimisation steps on the same batch."""
    p["model"].train()
    for _ in range(steps):
        p["optimizer"].zero_grad(set_to_none=True)
        with autocast(device, amp):
            output = p["step"](images, labels)
            loss, _ = criterion(output, images, labels)
        loss.backward()
        p["optimizer"].step()


def infer_steps(p: dict, images, steps: int, amp, device) -> None:
    p["model"].eval()
    with torch.no_grad(), autocast(device, amp):
        for _ in range(steps):
            p["step"](images)


def timed(fn, batch: int, steps: int, device: torch.device) -> float:
    """Images per second of ``fn()``, which runs ``steps`` batches of ``batch`` images."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return batch * steps / (time.perf_counter() - start)


def resident_bytes(p: dict) -> int:
    """Bytes held between steps by a path's parameters, gradients and optimizer state."""
    tensors = [t for t in p["model"].parameters()]
    tensors += [t.grad for t in p["model"].parameters() if t.grad is not None]
    tensors += [v for s in p["optimizer"].state.values() for v in s.values() if torch.is_tensor(v)]
    return sum(t.numel() * t.element_size() for t in tensors)


def cuda_peak(fn, paths: dict, path: str, device: torch.device) -> int:
    """Peak CUDA bytes of ``fn()`` attributable to ``path``: what the other paths hold is subtracted."""
    for p in paths.values():
        p["optimizer"].zero_grad(set_to_none=True)
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    synchronize(device)
    others = sum(resident_bytes(p) for name, p in paths.items() if name != path)
    return torch.cuda.max_memory_allocated(device) - others


# ------------------------------------------------------------------------------------ one (model, batch)


def bench_config(name: str, batch: int, args, device, amp) -> list[dict]:
    """Rows for every path of ``name`` at ``batch``."""
    torch.manual_seed(0)
    rss_before = max_rss_bytes()
    paths = build_paths(name, args, device)
    first = next(iter(paths.values()))["model"]
    criterion = create_loss(first.default_loss).to(device)
    images = torch.rand(batch, *first.input_size, device=device)
    labels = torch.randint(0, first.num_classes, (batch,), device=device)

    def train(p, steps):
        return lambda: train_steps(p, criterion, images, labels, steps, amp, device)

    def infer(p, steps):
        return lambda: infer_steps(p, images, steps, amp, device)

    for p in paths.values():  # warm-up: allocator, cuDNN autotuning, Adam state, torch.compile
        train(p, args.warmup)()
        infer(p, args.warmup)()
    runs = {path: {"train": [], "infer": []} for path in paths}
    order = list(paths)
    for repeat in range(args.repeats):
        for path in order if repeat % 2 == 0 else order[::-1]:
            runs[path]["train"].append(timed(train(paths[path], args.steps), batch, args.steps, device))
            runs[path]["infer"].append(timed(infer(paths[path], args.steps), batch, args.steps, device))
    rows = [make_row(name, batch, path, paths[path], runs[path]) for path in paths]
    record_memory(rows, paths, train, infer, device, rss_before)
    add_speedups(rows, runs)
    return rows


def make_row(name: str, batch: int, path: str, p: dict, runs: dict) -> dict:
    return {
        "model": name,
        "batch_size": batch,
        "path": path,
        "routing": p["routing"],
        "parameters": sum(t.numel() for t in p["model"].parameters()),
        "train_images_per_s": statistics.median(runs["train"]),
        "infer_images_per_s": statistics.median(runs["infer"]),
        "train_images_per_s_runs": runs["train"],
        "infer_images_per_s_runs": runs["infer"],
    }


def record_memory(rows: list[dict], paths: dict, train, infer, device, rss_before: int) -> None:
    """CUDA: per-path peak of one train step and one inference step. CPU: process-wide peak RSS."""
    for row in rows:
        if device.type == "cuda":
            row["memory_kind"] = "cuda_max_memory_allocated"
            row["train_peak_memory_bytes"] = cuda_peak(train(paths[row["path"]], 1), paths, row["path"], device)
            row["infer_peak_memory_bytes"] = cuda_peak(infer(paths[row["path"]], 1), paths, row["path"], device)
        else:  # ru_maxrss is a high-water mark of the whole process, shared by every path of this block
            row["memory_kind"] = "process_max_rss"
            row["train_peak_memory_bytes"] = row["infer_peak_memory_bytes"] = max_rss_bytes()
            row["rss_increase_bytes"] = max_rss_bytes() - rss_before


def add_speedups(rows: list[dict], runs: dict) -> None:
    """Medians over repeats of per-repeat ratios of images per second: production / naive on production rows
    (``*_speedup_vs_naive``), compiled / eager (the production or default path) on compiled rows
    (``*_speedup_vs_eager``)."""
    eager = "production" if "production" in runs else "default"
    pairs = [("production", "naive", "vs_naive"), ("compiled", eager, "vs_eager")]
    for path, other, suffix in pairs:
        if path not in runs or other not in runs:
            continue
        for kind in ("train", "infer"):
            ratios = [a / b for a, b in zip(runs[path][kind], runs[other][kind])]
            for row in rows:
                if row["path"] == path:
                    row[f"{kind}_speedup_{suffix}"] = statistics.median(ratios)


# ---------------------------------------------------------------------------------------------- output


_HEADER = (
    f"{'model':<20} {'batch':>5} {'path':<10} {'train img/s':>11} {'infer img/s':>11} "
    f"{'peak MiB':>9} {'train x':>7} {'infer x':>7}"
)


def format_row(r: dict) -> str:
    """One table line; the last two columns are the speed-ups: production / naive, compiled / eager."""
    ratios = [r.get(f"{kind}_speedup_vs_naive", r.get(f"{kind}_speedup_vs_eager")) for kind in ("train", "infer")]
    speed = [" " * 7 if x is None else f"{x:7.2f}" for x in ratios]
    return (
        f"{r['model']:<20} {r['batch_size']:>5} {r['path']:<10} {r['train_images_per_s']:>11.1f} "
        f"{r['infer_images_per_s']:>11.1f} {r['train_peak_memory_bytes'] / 2**20:>9.0f} " + " ".join(speed)
    )


def format_table(rows: list[dict]) -> str:
    return "\n".join([_HEADER, "-" * len(_HEADER), *map(format_row, rows)])


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument(
        "--models",
        nargs="+",
        default=["capsnet_small", "capsnet"],
        help="registered model names (see capsnets.list_models())",
    )
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[32])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    parser.add_argument("--amp", choices=["off", "bf16"], default="off", help="bf16 autocast (meant for CUDA)")
    parser.add_argument("--compile", action="store_true", help="torch.compile each model (compile in warm-up)")
    parser.add_argument(
        "--compare-compile",
        action="store_true",
        help="also time the production model under torch.compile, in the same rotation",
    )
    parser.add_argument("--steps", type=int, default=3, help="timed batches per repeat and path")
    parser.add_argument("--warmup", type=int, default=1, help="untimed batches per path before timing")
    parser.add_argument("--repeats", type=int, default=5, help="alternating repeats; medians are reported")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--routing-iterations", type=int, default=3, help="routing iterations of both paths")
    parser.add_argument("--skip-naive", action="store_true", help="do not measure the naive routing path")
    parser.add_argument(
        "--model-arg",
        action="append",
        type=parse_model_arg,
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for create_model, e.g. routing.detach_routing=true (repeatable)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON file (default benchmarks/results/throughput_<device>_<time>.json)"
    )
    args = parser.parse_args(argv)
    for flag in ("steps", "repeats", "routing_iterations"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.compile and args.compare_compile:
        parser.error("--compare-compile times eager and compiled side by side; leave out --compile")
    if args.warmup < 0 or min(args.batch_sizes) < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--warmup must be >= 0, --batch-sizes and --threads >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    retain_freed_memory()  # as `capsnets --retain-freed-memory` does; CAPSNETS_RETAIN_FREED_MEMORY=0 measures without
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    torch.backends.cudnn.benchmark = device.type == "cuda"  # fixed shapes: let cuDNN pick its kernels
    amp = torch.bfloat16 if args.amp == "bf16" else None
    unknown = sorted(set(args.models) - set(capsnets.list_models()))
    if unknown:
        raise SystemExit(f"unknown models {unknown}; registered: {capsnets.list_models()}")
    meta = environment(device, args)
    print(
        f"{meta['device_name']} | {meta['threads']} threads | torch {meta['torch']} | capsnets {meta['capsnets']} | "
        f"amp={args.amp} compile={args.compile} compare_compile={args.compare_compile}",
        flush=True,
    )
    print(_HEADER, flush=True)
    rows = []
    for name in args.models:
        for batch in sorted(args.batch_sizes):
            new_rows = bench_config(name, batch, args, device, amp)
            print("\n".join(map(format_row, new_rows)), flush=True)
            rows += new_rows
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or Path(__file__).parent / "results" / f"throughput_{device.type}_{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print("\n" + format_table(rows) + f"\n\nsaved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
