"""Learning speed of a capsule model under different settings: test accuracy against training steps.

Each ``--variant NAME JSON`` builds the model with the JSON object as extra ``create_model`` arguments (for
example ``'{"formulation": "paper", "cost_normalization": "mass", "inverse_temperature": 1.0}'`` for matrix
capsules) and trains it from the same initial seed on the same batches: Adam at ``--lr``, the model's default loss
(its margin, for the spread loss, growing over the first half of ``--steps``), batch ``--batch-size``,
on the first ``--train-size`` images of the training split. An ``"init"`` key in the JSON refills
parameters once the model is built, e.g. ``{"init": {"beta_a": [-0.6, 0.3]}}`` (:func:`initialise`), and
a ``"layer_routing"`` key gives single layers a routing of their own (:func:`set_layer_routing`).
Every ``--eval-every`` steps it records the accuracy on the first ``--test-size`` test images and, for
matrix capsule models, each capsule layer's activation statistics on the first 256 of them
(:func:`activation_stats`). Variants run one after the other in one process, so their curves are
comparable; the JSON also records the environment and each variant's training images/s.

Run ``python benchmarks/em_learning.py --help``; ``benchmarks/README.md`` lists the recorded runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path

import torch

import capsnets
from capsnets.data import DeviceLoader, load_dataset
from capsnets.engine.runtime import resolve_device, retain_freed_memory
from capsnets.files import atomic_write
from capsnets.losses import create_loss

from throughput import environment


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--model", default="matrix_capsnet_small")
    parser.add_argument(
        "--variant",
        nargs=2,
        action="append",
        metavar=("NAME", "JSON"),
        default=None,
        help="a named set of create_model arguments (repeatable); default: one variant "
        "'default' with no extra arguments",
    )
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--data-dir", default=None, help="data root (default: $CAPSNETS_DATA)")
    parser.add_argument("--train-size", type=int, default=20000)
    parser.add_argument("--test-size", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="JSON file (default benchmarks/results/em_learning_<time>.json)")
    args = parser.parse_args(argv)
    args.variant = [(name, json.loads(spec)) for name, spec in (args.variant or [("default", "{}")])]
    for name, spec in args.variant:
        if not isinstance(spec, dict):
            parser.error(f"--variant {name}: the JSON must be an object of create_model arguments, got {spec!r}")
    for key in ("train_size", "test_size", "steps", "eval_every", "batch_size"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1")
    return args


def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 500) -> float:
    model.eval()
    with torch.no_grad():
        correct = sum(
            int((model(x).scores.argmax(1) == y).sum())
            for x, y in zip(images.split(batch_size), labels.split(batch_size))
        )
    model.train()
    return correct / len(labels)


def activation_stats(model: torch.nn.Module, images: torch.Tensor) -> dict:
    """Per capsule layer (modules returning :class:`~capsnets.layers.MatrixCapsules`), on ``images`` in
    eval mode: the mean and standard deviation of the activations over the batch, types and positions, and
    ``spread``: the mean over examples of (largest - smallest activation) across the layer's capsules. A
    layer whose activations hardly vary passes no information through them."""
    from capsnets.layers import MatrixCapsules

    stats, handles = {}, []

    def hook(name):
        def record(module, inputs, output):
            if isinstance(output, MatrixCapsules):
                a = output.activation.detach().float().flatten(1)  # (B, T*H*W)
                stats[name] = {
                    "mean": a.mean().item(),
                    "std": a.std().item(),
                    "spread": (a.amax(1) - a.amin(1)).mean().item(),
                }

        return record

    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_hook(hook(name)))
    model.eval()
    try:
        with torch.no_grad():
            model(images)
    finally:
        for h in handles:
            h.remove()
        model.train()
    return stats


def initialise(model: torch.nn.Module, init: dict) -> None:
    """Refill parameters after the model is built: ``{"beta_a": [mean, std]}`` draws every parameter whose
    name is ``beta_a`` or ends with ``.beta_a`` (``"class_capsules.beta_a"``: that layer's only) from a normal
    distribution truncated at two standard deviations (a number instead of ``[mean, std]`` sets them to
    it). Raises if a name matches no parameter."""
    for suffix, value in init.items():
        mean, std = (float(value), 0.0) if isinstance(value, (int, float)) else map(float, value)
        params = [p for name, p in model.named_parameters() if name == suffix or name.endswith("." + suffix)]
        if not params:
            raise ValueError(f"init: no parameter of {type(model).__name__} is named {suffix!r}")
        with torch.no_grad():
            for param in params:
                if std > 0:
                    torch.nn.init.trunc_normal_(param, mean, std, mean - 2 * std, mean + 2 * std)
                else:
                    param.fill_(mean)


def set_layer_routing(model: torch.nn.Module, layer_routing: dict) -> None:
    """Give single layers routings of their own: ``{"class_capsules": {"cost_normalization": "mean_std",
    "inverse_temperature": 1.0}}`` replaces ``model.class_capsules.routing`` by ``EMRouting(**that)`` (EMRouting's
    defaults for what is not given), so that a setting can be tried in one layer while the others keep the
    variant's. Raises if a name is not a submodule with a ``routing``."""
    from capsnets.functional import EMRouting

    for name, kwargs in layer_routing.items():
        layer = dict(model.named_modules()).get(name)
        if layer is None or not hasattr(layer, "routing"):
            raise ValueError(f"layer_routing: {type(model).__name__} has no routed layer named {name!r}")
        layer.routing = EMRouting(**kwargs)


def learning_curve(args, extra: dict, train, test, device) -> dict:
    """Train one variant for ``args.steps`` steps; accuracy every ``args.eval_every`` steps."""
    torch.manual_seed(args.seed)
    extra = dict(extra)
    init, layer_routing = extra.pop("init", {}), extra.pop("layer_routing", {})
    model = capsnets.create_model(
        args.model, num_classes=train.num_classes, input_size=train.input_shape, device=device, **extra
    )
    initialise(model, init)
    set_layer_routing(model, layer_routing)
    criterion = create_loss(model.default_loss)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = DeviceLoader(train, args.batch_size, seed=args.seed)
    curve, train_seconds, step, epoch = [], 0.0, 0, 0
    initial = activation_stats(model, test.images[:256])
    while step < args.steps:
        loader.set_epoch(epoch)
        epoch += 1
        for images, labels in loader:
            start = time.perf_counter()
            if hasattr(criterion, "set_progress"):
                criterion.set_progress(step / args.steps, 1)
            loss, _ = criterion(model(images, labels), images, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            train_seconds += time.perf_counter() - start
            step += 1
            if step % args.eval_every == 0 or step == args.steps:
                acc = accuracy(model, test.images, test.labels)
                curve.append(
                    {
                        "step": step,
                        "images": step * args.batch_size,
                        "test_accuracy": acc,
                        "train_loss": loss.item(),
                        "activations": activation_stats(model, test.images[:256]),
                    }
                )
                print(f"{step:6d} steps  test accuracy {acc:.4f}  loss {loss.item():.3f}", flush=True)
            if step >= args.steps:
                break
    return {
        "model_args": extra,
        "init": init,
        "layer_routing": layer_routing,
        "initial_activations": initial,
        "curve": curve,
        "train_images_per_s": step * args.batch_size / train_seconds,
        "final_test_accuracy": curve[-1]["test_accuracy"],
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    retain_freed_memory()  # as `capsnets --retain-freed-memory` does
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    train = load_dataset(args.dataset, root=args.data_dir, train=True, device=device).subset(args.train_size)
    test = load_dataset(args.dataset, root=args.data_dir, train=False, device=device).subset(args.test_size)
    result = {
        "meta": environment(device, args),
        "model": args.model,
        "dataset": args.dataset,
        "batch_size": args.batch_size,
        "variants": {},
    }
    for name, extra in args.variant:
        print(f"== {name}: {args.model} {json.dumps(extra)}", flush=True)
        result["variants"][name] = learning_curve(args, extra, train, test, device)
    stamp = dt.datetime.now().strftime("%Y%m%d_%H%M%S")
    out = Path(args.out or Path(__file__).parent / "results" / f"em_learning_{stamp}.json")
    atomic_write(out, lambda tmp: Path(tmp).write_text(json.dumps(result, indent=2) + "\n"))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
