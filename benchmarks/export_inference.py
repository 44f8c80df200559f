"""Inference images/s of an exported ONNX file in onnxruntime against the same model in eager PyTorch (CPU).

For each model (built with seed 0, in eval mode, float32, on the CPU) the script exports an ONNX file with
:func:`capsnets.export.export_model` (which checks it against PyTorch), then times, for each batch size, eager
PyTorch (``model(images)`` under ``torch.inference_mode()``) and onnxruntime (``InferenceSession.run``, the CPU
provider) on the same random images. The two are measured alternately (PyTorch first on even repeats,
onnxruntime first on odd ones), both with ``--threads`` intra-op threads, and each figure is the median over
``--repeats``; the ratio is the median of the per-repeat ratios onnxruntime / PyTorch, so it holds on a noisy
machine. Peak memory is the process's resident set size after each model (both runtimes share the process).

Run ``python benchmarks/export_inference.py --help``; ``benchmarks/README.md`` lists the recorded runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import capsnets
from capsnets.export import ExportableModel, export_model
from capsnets.files import atomic_write

from throughput import environment, max_rss_bytes  # benchmarks/throughput.py, beside this script

#: One model of each family: vector capsules, matrix capsules with EM routing, SegCaps, and a CNN baseline.
DEFAULT_MODELS = ["capsnet_small", "matrix_capsnet_small", "segcaps_small", "cnn_baseline_narrow"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, help="registered model names")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 64])
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of both runtimes")
    parser.add_argument(
        "--min-seconds", type=float, default=1.0, help="each timing runs whole batches until this much time has passed"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches of each runtime first")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--out", default=None, help="JSON file (default benchmarks/results/export_inference_<time>.json)"
    )
    return parser.parse_args(argv)


def images_per_s(run, images: torch.Tensor, min_seconds: float) -> float:
    """Batches of ``images`` through ``run`` until ``min_seconds`` have passed; images per second."""
    count, start = 0, time.perf_counter()
    while True:
        run(images)
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return count * images.shape[0] / elapsed


def bench_model(name: str, args: argparse.Namespace, folder: Path) -> list[dict]:
    import onnxruntime

    torch.manual_seed(0)
    model = capsnets.create_model(name).eval()
    report = export_model(model, folder / f"{name}.onnx")
    wrapped = ExportableModel(model).eval()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = args.threads, 1, 3
    session = onnxruntime.InferenceSession(report.path, options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name

    def eager(images):
        with torch.inference_mode():
            wrapped(images)

    def onnx(images):
        session.run(None, {input_name: images.numpy()})

    rows = []
    for batch in args.batch_sizes:
        images = torch.rand(batch, *model.input_size, generator=torch.Generator().manual_seed(batch))
        for run in (eager, onnx):
            for _ in range(args.warmup):
                run(images)
        runs = {"pytorch": [], "onnxruntime": []}
        for repeat in range(args.repeats):
            order = [("pytorch", eager), ("onnxruntime", onnx)]
            for path, run in order if repeat % 2 == 0 else order[::-1]:
                runs[path].append(images_per_s(run, images, args.min_seconds))
        ratios = [o / p for o, p in zip(runs["onnxruntime"], runs["pytorch"])]
        rows.append(
            {
                "model": name,
                "batch": batch,
                "parameters": sum(p.numel() for p in model.parameters()),
                "outputs": report.output_names,
                "max_abs_difference": report.max_abs_difference,
                "onnx_bytes": report.bytes,
                "pytorch_images_per_s": statistics.median(runs["pytorch"]),
                "onnxruntime_images_per_s": statistics.median(runs["onnxruntime"]),
                "onnxruntime_over_pytorch": statistics.median(ratios),
                "pytorch_images_per_s_runs": runs["pytorch"],
                "onnxruntime_images_per_s_runs": runs["onnxruntime"],
                "peak_rss_bytes": max_rss_bytes(),
            }
        )
        print(
            f"{name:24s} batch {batch:3d}: PyTorch {rows[-1]['pytorch_images_per_s']:9.1f}  onnxruntime "
            f"{rows[-1]['onnxruntime_images_per_s']:9.1f} images/s  ratio {rows[-1]['onnxruntime_over_pytorch']:.2f}",
            flush=True,
        )
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    meta = environment(torch.device("cpu"), args)
    import onnxruntime

    meta["onnxruntime"] = onnxruntime.__version__
    with tempfile.TemporaryDirectory() as folder:
        rows = [row for name in args.models for row in bench_model(name, args, Path(folder))]
    out = Path(args.out or Path(__file__).parent / "results" / f"export_inference_{int(time.time())}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"meta": meta, "rows": rows}, indent=1)
    atomic_write(out, lambda tmp: Path(tmp).write_text(text))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
