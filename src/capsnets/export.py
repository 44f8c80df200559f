"""Export a trained model for deployment: ONNX (run by onnxruntime) or a ``torch.export`` program.

The model is traced with :func:`torch.export.export` on an example batch, with the batch dimension dynamic;
routing iterations are unrolled, and the routings take their traced branches (``torch.compiler.is_exporting``),
which compute the same values. :func:`export_model` then checks the exported file against eager PyTorch on
random inputs of two batch sizes and reports the largest difference, so that a model that exports but computes
something else is caught at export time.

Outputs, by the model's task:

- classification: ``scores`` ``(B, num_classes)`` (capsule lengths, matrix capsule activations, or logits);
  for capsule models, ``capsules`` ``(B, num_classes, D)``; for models with a decoder, ``reconstruction``
  ``(B, C, H, W)``, the image redrawn from the winning capsule (which :func:`capsnets.predict` holds to the limits
  in the file's metadata);
- segmentation: ``probabilities`` ``(B, K, H, W)`` (K = 1 for a binary model).

:class:`OnnxModel` runs an exported ONNX file in place of the model: :func:`capsnets.predict` (and
:func:`capsnets.inference.segment`) take it, and ``capsnets predict --checkpoint model.onnx`` uses it.

Examples::

    >>> model = load_model("runs/quickstart")                            # doctest: +SKIP
    >>> report = export_model(model, "capsnet.onnx")                      # doctest: +SKIP
    >>> report.max_abs_difference < 1e-4                                  # doctest: +SKIP
    True
    >>> capsnets.predict(OnnxModel("capsnet.onnx"), "seven.png")[0].label  # doctest: +SKIP
    '7'

ONNX export needs the ``export`` extra: ``pip install -e '.[export]'`` (onnx, onnxscript, onnxruntime).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from capsnets._version import __version__ as capsnets_version
from capsnets.files import atomic_write
from capsnets.images import DARK_BACKGROUND, NORB_CROP, NORB_LIKE, NORB_SIZE
from capsnets.models import model_task
from capsnets.models.output import ModelOutput
from capsnets.models.segcaps import SegmentationOutput
from capsnets.outputs import MARK, check_output
from capsnets.validation import ArgumentError

__all__ = [
    "EXPORT_FORMATS",
    "ExportReport",
    "ExportableModel",
    "OnnxModel",
    "export_model",
    "onnx_metadata",
    "run_onnx",
]

#: The formats :func:`export_model` writes, with their file suffixes.
EXPORT_FORMATS = {"onnx": ".onnx", "torch_export": ".pt2"}
#: The outputs of an exported classifier: ``scores`` first, then ``capsules`` and ``reconstruction`` where it has them.
CLASSIFIER_OUTPUTS = {"scores", "capsules", "reconstruction"}


class ExportableModel(nn.Module):
    """A model whose forward returns a tuple of tensors (named in :attr:`output_names`), as exporters need.

    Args:
        model: a registered classification or segmentation model (in eval mode).

    Attributes:
        output_names: the names of the outputs, in order.
        score_kind: what a classifier's ``scores`` are (:attr:`~capsnets.models.output.ModelOutput.score_kind`);
            None for a segmentation model.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        task = model_task(getattr(model, "model_name", "")) if getattr(model, "model_name", None) else None
        if task not in (None, "classification", "segmentation"):
            raise ArgumentError(
                f"{model.model_name!r} is registered for {task}; only classification and segmentation models "
                "can be exported"
            )
        with torch.no_grad():
            probe = model(torch.zeros(1, *model.input_size, device=_device(model)))
        self.score_kind = getattr(probe, "score_kind", None)
        if hasattr(probe, "probabilities"):
            self.output_names = ["probabilities"]
        elif hasattr(probe, "scores"):
            self.output_names = ["scores"] + (["capsules"] if probe.capsules is not None else [])
            self.output_names += ["reconstruction"] if probe.reconstruction is not None else []
        else:
            raise ArgumentError(
                f"{type(model).__name__} returns {type(probe).__name__}; only classification and "
                "segmentation models can be exported"
            )

    def forward(self, images: Tensor) -> tuple[Tensor, ...]:
        output = self.model(images)
        return tuple(getattr(output, name) for name in self.output_names)


@dataclass
class ExportReport:
    """What :func:`export_model` wrote and how well it agrees with eager PyTorch.

    Attributes:
        path: the file written.
        format: ``"onnx"`` or ``"torch_export"``.
        output_names: the outputs, in order.
        max_abs_difference: the largest absolute difference of any output from eager PyTorch, over the checked
            batches (float32).
        checked_batches: the batch sizes checked (two, to show the batch dimension is dynamic).
        seconds: the time the export took.
        bytes: the file's size.
    """

    path: str
    format: str
    output_names: list[str]
    max_abs_difference: float
    checked_batches: list[int] = field(default_factory=list)
    seconds: float = 0.0
    bytes: int = 0


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def export_model(
    model: nn.Module,
    path: str | os.PathLike,
    format: str = "onnx",
    *,
    check: bool = True,
    check_batches: tuple[int, ...] = (1, 5),
    seed: int = 0,
    overwrite: bool = False,
) -> ExportReport:
    """Export ``model`` (on the CPU, float32) to ``path`` and check the file against eager PyTorch.

    Args:
        model: a registered classification or segmentation model.
        path: the file to write (created atomically: a failed export leaves no file).
        format: ``"onnx"`` (needs onnx, onnxscript and onnxruntime) or ``"torch_export"`` (``torch.export.save``).
        check: run the exported file on random inputs of ``check_batches`` sizes and compare.
        seed: of the random check inputs.
        overwrite: replace an existing ``path`` whatever it holds; without it, only a file capsnets exported in
            the same format is replaced (:func:`~capsnets.outputs.check_output`).

    Raises:
        ValueError: an unknown format, a model that cannot be exported (the reason is given), or an exported
            file that disagrees with eager PyTorch by more than 1e-4.
        OutputExistsError: ``path`` holds a file capsnets did not export as ``format``, and not ``overwrite``.
        ImportError: the ONNX packages are missing (the message says how to install them).
    """
    if format not in EXPORT_FORMATS:
        raise ArgumentError(f"format must be one of {', '.join(EXPORT_FORMATS)}, got {format!r}")
    if format == "onnx":
        _require_onnx()
    path = check_output(path, format, overwrite=overwrite)
    model = model.to("cpu", torch.float32).eval()
    wrapped = ExportableModel(model).eval()
    example = torch.rand(2, *model.input_size, generator=torch.Generator().manual_seed(seed))
    batch = torch.export.Dim("batch", min=1, max=65536)
    start = time.perf_counter()
    try:
        with _quiet():
            program = torch.export.export(wrapped, (example,), dynamic_shapes=({0: batch},), strict=False)
    except Exception as err:  # torch.export raises many kinds; the user gets the first line and the model
        raise ValueError(
            f"{getattr(model, 'model_name', type(model).__name__)} cannot be traced by "
            f"torch.export: {type(err).__name__}: {_first_line(err)}"
        ) from err
    if format == "onnx":

        def write(tmp):
            with _quiet():
                onnx_program = torch.onnx.export(
                    program,
                    (example,),
                    dynamo=True,
                    optimize=False,
                    verbose=False,
                    input_names=["images"],
                    output_names=wrapped.output_names,
                )
                onnx_program.model.metadata_props[MARK] = "onnx"  # capsnets.outputs.written_for reads it
                onnx_program.model.metadata_props.update(onnx_metadata(model, score_kind=wrapped.score_kind))
                _name_batch_axis(onnx_program.model.graph)
                onnx_program.save(tmp)
    else:

        def write(tmp):
            with open(tmp, "wb") as file:
                torch.export.save(program, file, extra_files={MARK: "torch_export"})

    try:
        atomic_write(path, write)
    except (OSError, ValueError, ImportError):
        raise
    except Exception as err:
        raise ValueError(
            f"{getattr(model, 'model_name', type(model).__name__)} cannot be converted to {format}: "
            f"{type(err).__name__}: {_first_line(err)}"
        ) from err
    report = ExportReport(
        str(path), format, list(wrapped.output_names), 0.0, [], time.perf_counter() - start, path.stat().st_size
    )
    if check:
        generator = torch.Generator().manual_seed(seed + 1)
        run = _onnx_runner(path) if format == "onnx" else _program_runner(path)
        for size in check_batches:
            images = torch.rand(size, *model.input_size, generator=generator)
            with torch.no_grad():
                expected = wrapped(images)
            got = run(images)
            difference = max(float((g - e).abs().max()) for g, e in zip(got, expected))
            report.max_abs_difference = max(report.max_abs_difference, difference)
            report.checked_batches.append(size)
        if not report.max_abs_difference <= 1e-4:  # NaN too
            raise ValueError(
                f"the exported {format} file '{path}' disagrees with PyTorch by "
                f"{report.max_abs_difference:.3g} (more than 1e-4); it was written but should not "
                "be used"
            )
    return report


def onnx_metadata(model: nn.Module, *, score_kind: str | None = None) -> dict[str, str]:
    """What an exported ONNX file says about its model (``metadata_props``, strings; lists and sizes as JSON): the
    capsnets version, the model's name, task, class names, input size, the data set it was trained on (where its
    checkpoint records one) and how an image becomes its input (``preprocessing``); a classifier's ``score_kind``;
    where its checkpoint records them, a multi-label model's ``multilabel`` (``"true"``) and ``thresholds``, a
    segmentation model's ``mask_format``, and the limits of a good reconstruction (``reconstruction_limits``, by
    which :func:`~capsnets.inference.predict` judges the answers of a model with a decoder). :class:`OnnxModel` reads them back.

    Args:
        model: the exported model.
        score_kind: what its ``scores`` are (:attr:`ExportableModel.score_kind`; :func:`export_model` gives it);
            None: not recorded.
    """
    checkpoint = getattr(model, "checkpoint_meta", None) or {}
    dataset = checkpoint.get("dataset")
    size = [int(v) for v in model.input_size]
    names = getattr(model, "class_names", None)
    steps = [f"{'RGB' if size[0] == 3 else 'greyscale'}, resized to {size[1]}x{size[2]}, values in [0, 1]"]
    if dataset in NORB_LIKE:
        steps = [
            f"greyscale, resized to {NORB_SIZE}x{NORB_SIZE}, the centre {NORB_CROP}x{NORB_CROP}, standardised per image"
        ]
    elif dataset in DARK_BACKGROUND:
        steps.append("light strokes on a dark background (invert a dark-on-light image)")
    meta = {
        "capsnets_version": capsnets_version,
        "model": str(getattr(model, "model_name", type(model).__name__)),
        "task": model_task(model.model_name) if hasattr(model, "model_name") else "",
        "input_size": json.dumps(size),
        "preprocessing": "; ".join(steps),
    }
    if names is not None:
        meta["class_names"] = json.dumps([str(n) for n in names])
    if dataset is not None:
        meta["dataset"] = str(dataset)
    if score_kind is not None:
        meta["score_kind"] = score_kind
    if checkpoint.get("multilabel"):
        meta["multilabel"] = "true"
        if checkpoint.get("thresholds") is not None:
            meta["thresholds"] = json.dumps([float(t) for t in checkpoint["thresholds"]])
    if checkpoint.get("mask_format") is not None:
        meta["mask_format"] = json.dumps(checkpoint["mask_format"])
    if checkpoint.get("reconstruction_limits") is not None:
        meta["reconstruction_limits"] = json.dumps(checkpoint["reconstruction_limits"])
    return meta


def _name_batch_axis(graph) -> None:
    """Name the batch axis ``batch`` in every shape of the exported graph (the exporter names it ``s<N>``)."""
    import onnx_ir as ir  # noqa: PLC0415  (installed with onnxscript, the export extra)

    first = graph.inputs[0].shape[0] if graph.inputs and graph.inputs[0].shape else None
    if not isinstance(first, ir.SymbolicDim) or not first.value:
        return
    token = re.compile(rf"\b{re.escape(first.value)}\b")

    def rename(value) -> None:
        if value.shape is not None and any(isinstance(d, ir.SymbolicDim) and d.value for d in value.shape):
            value.shape = ir.Shape(
                [
                    ir.SymbolicDim(token.sub("batch", d.value)) if isinstance(d, ir.SymbolicDim) and d.value else d
                    for d in value.shape
                ]
            )

    for value in (*graph.inputs, *graph.outputs):
        rename(value)
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for value in node.outputs:
            rename(value)


def run_onnx(path: str | os.PathLike, images: Tensor, *, threads: int | None = None) -> list[Tensor]:
    """Run an exported ONNX file on ``images`` with onnxruntime (CPU); returns its outputs as tensors.

    ``threads``: onnxruntime's intra-op threads; None: PyTorch's (``torch.get_num_threads()``), so that
    ``OMP_NUM_THREADS`` and ``--threads`` govern both runtimes."""
    return _onnx_runner(path, threads)(images)


class OnnxModel(nn.Module):
    """An ONNX file written by :func:`export_model`, run by onnxruntime on the CPU in place of its model.

    :func:`capsnets.predict` takes it as it takes the model (and :func:`capsnets.inference.segment` a segmentation
    model's file), and ``capsnets predict --checkpoint model.onnx`` uses it. What they read of a model comes from
    the file's metadata (:func:`onnx_metadata`): ``input_size``, ``class_names``, ``model_name`` and a
    ``checkpoint_meta`` with the ``model``, its ``task``, the ``dataset`` it was trained on (which decides how
    images are prepared), its ``classes``, a multi-label model's ``multilabel`` and ``thresholds`` and a
    segmentation model's ``mask_format``. It has no parameters: its inputs are CPU tensors.

    Args:
        path: the ONNX file.
        threads: onnxruntime's intra-op threads; None: PyTorch's (``torch.get_num_threads()``), as
            :func:`run_onnx`.

    Attributes:
        path: the file.
        output_names: the file's outputs, in order (``scores`` [``capsules``] [``reconstruction``], or
            ``probabilities``).
        num_classes: the classes (a segmentation model's maps: 1 for a binary model).
        score_kind: what a classifier's scores are (``"length"``, ``"activation"``, ``"logits"``); None for a
            segmentation model.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        ImportError: onnxruntime is missing (the message says how to install it).
        ArgumentError: the file lacks the metadata capsnets needs to run it (it was exported by an older capsnets,
            or not by capsnets; the message names what is missing and says to export it again), or its outputs are
            not a classifier's or a segmentation model's.
        ValueError: onnxruntime cannot load the file.

    Shape:
        - images: ``(B, C, H, W)`` of ``input_size``, float32 in ``[0, 1]`` as :func:`capsnets.predict` prepares
          them.
        - output: :class:`~capsnets.models.output.ModelOutput` with ``scores`` ``(B, num_classes)`` (and
          ``capsules`` ``(B, num_classes, D)`` for a capsule model, ``reconstruction`` ``(B, C, H, W)`` for a
          model with a decoder), or
          :class:`~capsnets.models.segcaps.SegmentationOutput` with ``probabilities`` ``(B, num_classes, H, W)``.

    Examples::

        >>> export_model(capsnets.create_model("capsnet_small", pretrained="mnist"), "mnist.onnx")  # doctest: +SKIP
        >>> model = OnnxModel("mnist.onnx")                                   # doctest: +SKIP
        >>> model.input_size, model.checkpoint_meta["dataset"]                # doctest: +SKIP
        ((1, 28, 28), 'mnist')
        >>> capsnets.predict(model, "seven.png")[0].label                     # doctest: +SKIP
        '7'
    """

    def __init__(self, path: str | os.PathLike, *, threads: int | None = None) -> None:
        super().__init__()
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no ONNX file at '{self.path}'")
        _require_onnx(("onnxruntime",), "Running an ONNX file")
        try:
            session = _onnx_session(self.path, threads)
        except Exception as err:  # onnxruntime's own exception types (InvalidProtobuf, Fail...)
            raise ValueError(f"onnxruntime cannot load '{self.path}': {_first_line(err)}") from err
        self._run = _session_runner(session)
        self.output_names = [output.name for output in session.get_outputs()]
        classifier = self.output_names[:1] == ["scores"] and len(set(self.output_names)) == len(self.output_names)
        if not (self.output_names == ["probabilities"] or classifier and set(self.output_names) <= CLASSIFIER_OUTPUTS):
            raise ArgumentError(
                f"'{self.path}' has outputs {', '.join(self.output_names)}; capsnets runs the ONNX files it exports "
                "of classification models (scores, capsules, reconstruction) and segmentation models (probabilities)"
            )
        props = session.get_modelmeta().custom_metadata_map
        needed = ["model", "task", "input_size"] + (["score_kind"] if self.output_names[0] == "scores" else [])
        missing = [key for key in needed if key not in props]
        if missing:
            version = f" ({props['capsnets_version']})" if props.get("capsnets_version") else ""
            by = f"an earlier capsnets{version}" if props.get(MARK) else "another tool than capsnets"
            raise ArgumentError(
                f"'{self.path}' does not record {', '.join(missing)} in its metadata, which capsnets needs to run it "
                f"(it was exported by {by}); export the model again with this capsnets ({capsnets_version}): "
                f"capsnets export --checkpoint RUN --out {self.path.name}"
            )
        count = session.get_outputs()[0].shape[1]
        input_size = _metadata_json(props, "input_size", self.path)
        if not isinstance(count, int) or not (
            isinstance(input_size, list) and len(input_size) == 3 and all(isinstance(v, int) for v in input_size)
        ):
            raise ArgumentError(f"'{self.path}' has a damaged input_size or output shape; export the model again")
        self.input_size = tuple(input_size)
        self.num_classes = count
        self.model_name = props["model"]
        self.score_kind = props.get("score_kind") if self.output_names[0] == "scores" else None
        names = _metadata_json(props, "class_names", self.path)
        self.class_names = [str(n) for n in names] if names is not None else [str(k) for k in range(count)]
        meta = {"model": self.model_name, "task": props["task"], "dataset": props.get("dataset")}
        meta["classes"] = self.class_names
        if props.get("multilabel") == "true":
            meta.update(multilabel=True, thresholds=_metadata_json(props, "thresholds", self.path))
        if props.get("mask_format"):
            meta["mask_format"] = _metadata_json(props, "mask_format", self.path)
        if props.get("reconstruction_limits"):
            meta["reconstruction_limits"] = _metadata_json(props, "reconstruction_limits", self.path)
        self.checkpoint_meta = meta

    def forward(self, images: Tensor) -> ModelOutput | SegmentationOutput:
        outputs = dict(zip(self.output_names, self._run(images)))
        if self.score_kind is None:
            return SegmentationOutput(outputs["probabilities"])
        return ModelOutput(outputs["scores"], self.score_kind, outputs.get("capsules"), outputs.get("reconstruction"))

    def extra_repr(self) -> str:
        return f"'{self.path}', model={self.model_name!r}"


def _metadata_json(props: dict[str, str], key: str, path: Path):
    """The JSON value of the metadata property ``key`` of the ONNX file ``path`` (None where it has none)."""
    try:
        return json.loads(props[key]) if key in props else None
    except json.JSONDecodeError:
        raise ArgumentError(f"'{path}' has a damaged {key} in its metadata; export the model again") from None


def _onnx_session(path, threads: int | None = None):
    # optional dependency (the export extra)
    import onnxruntime  # noqa: PLC0415

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only
    options.intra_op_num_threads = torch.get_num_threads() if threads is None else threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _session_runner(session):
    name = session.get_inputs()[0].name

    def run(images: Tensor) -> list[Tensor]:
        return [torch.from_numpy(out) for out in session.run(None, {name: images.detach().cpu().float().numpy()})]

    return run


def _onnx_runner(path, threads: int | None = None):
    return _session_runner(_onnx_session(path, threads))


def _program_runner(path):
    module = torch.export.load(str(path)).module()

    def run(images: Tensor) -> list[Tensor]:
        with torch.no_grad():
            return list(module(images))

    return run


def _require_onnx(names: tuple[str, ...] = ("onnx", "onnxscript", "onnxruntime"), purpose: str = "ONNX export") -> None:
    missing = []
    for name in names:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ImportError(
            f"{purpose} needs {', '.join(missing)}: pip install 'capsnets[export]' (or, in a "
            "clone, pip install -e '.[export]')"
        )


@contextlib.contextmanager
def _quiet():
    """The exporter's progress prints and warnings, silenced (errors still raise)."""
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)  # the exporters' INFO/WARNING logs (e.g. "Removed 28 unused nodes")
        try:
            yield
        finally:
            logging.disable(previous)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "no message"
