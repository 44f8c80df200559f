"""What the demo page shows of a trained capsule classifier: class capsules, reconstructions, routing.

:class:`DemoModel` wraps a vector capsule network (:class:`~capsnets.models.capsnet.CapsNet`, Sabour, Frosst &
Hinton 2017) or a matrix capsule network (:class:`~capsnets.models.matrix_capsnet.MatrixCapsNet`, Hinton, Sabour
& Frosst 2018) and answers the page's questions about one input: the class capsules and their lengths (or
activations), the reconstruction from one capsule, a capsule vector decoded as the user moves its dimensions,
the paper's perturbation grid (Fig. 4, computed by :func:`capsnets.plots.perturbation_grid`), and what the
routing sent to each class capsule.

The routing picture is the ``dimensions`` experiment's routing map, for every class: each child
capsule's final coupling to the class times the child's length (vector capsules) or activation (matrix
capsules), summed over capsule types, on the child capsules' grid; the class capsule layer returns its couplings
(EM routing's assignments) with ``return_couplings=True``. Matrix capsule networks have no decoder: no
reconstruction, sliders or perturbation grid for them.

Whether an answer is uncertain, and why, is judged as :func:`capsnets.predict` judges it
(:func:`~capsnets.inference.doubts`): the score rule, and for a model whose checkpoint records the limits of its
reconstructions, the winning capsule's reconstruction of the input.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from capsnets.data import load_dataset
from capsnets.functional import capsule_length
from capsnets.functional.em import kernel as em_kernel
from capsnets.inference import doubts, reconstruction_errors
from capsnets.models.capsnet import CapsNet
from capsnets.models.matrix_capsnet import MatrixCapsNet
from capsnets.validation import ArgumentError

__all__ = ["MAX_CAPSULE_VALUE", "Analysis", "DemoModel"]

#: :meth:`DemoModel.reconstruct` decodes capsule vectors whose values lie in ``[-MAX_CAPSULE_VALUE,
#: MAX_CAPSULE_VALUE]``. A squashed class capsule is shorter than 1, so each of its values lies in ``(-1, 1)``
#: (the page's sliders move them by at most 0.25); far past that the decoder meets values it was never trained on,
#: and near float32's maximum its products overflow to NaN.
MAX_CAPSULE_VALUE = 100.0


@dataclass
class Analysis:
    """One input as the page shows it.

    Attributes:
        scores: ``(K,)`` class capsule lengths (vector capsules) or activations (matrix capsules).
        capsules: ``(K, D)`` class capsule vectors, or flattened ``P x P`` poses.
        prediction: the class with the highest score.
        shown: the capsule the reconstruction and the sliders are of.
        reconstruction: ``(C, H, W)`` decoded from capsule ``shown`` alone; None without a decoder.
        couplings: ``(K, h, w)`` what the routing sent to each class capsule, on the child capsules' grid.
        doubts: why the prediction is uncertain, in words (:func:`~capsnets.inference.doubts`); empty when it is
            not.
    """

    scores: Tensor
    capsules: Tensor
    prediction: int
    shown: int
    reconstruction: Tensor | None
    couplings: Tensor
    doubts: list[str]


class DemoModel:
    """A trained capsule classifier, evaluated one input at a time (thread-safe: one call at a time).

    Args:
        model: a :class:`CapsNet` or a :class:`MatrixCapsNet` (put in eval mode).
        classes: the class names (default ``"0"``, ``"1"``...).
        dataset: the data set it was trained on (how inputs are prepared; its test images are offered).
        source: where the model comes from, in words (shown on the page).
        name: the registered model name.
        data_dir, image_size: how to load ``dataset``'s test images (as recorded in the training's config).

    Raises:
        ArgumentError: another kind of model.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        classes: Sequence[str] | None = None,
        dataset: str | None = None,
        source: str = "",
        name: str | None = None,
        data_dir: str | None = None,
        image_size=None,
    ) -> None:
        if isinstance(model, CapsNet):
            self.kind = "vector"
        elif isinstance(model, MatrixCapsNet):
            self.kind = "matrix"
        else:
            raise ArgumentError(
                f"the demo shows capsule classifiers (CapsNet and matrix capsule models), not "
                f"{name or type(model).__name__} ({type(model).__name__})"
            )
        self.model = model.eval()
        self.num_classes = int(model.num_classes)
        self.classes = [str(c) for c in classes] if classes is not None else [str(k) for k in range(self.num_classes)]
        if len(self.classes) != self.num_classes:
            raise ArgumentError(f"classes must name the model's {self.num_classes} classes, got {len(self.classes)}")
        self.input_size = tuple(int(s) for s in model.input_size)
        self.dataset, self.source, self.name = dataset, source, name or type(model).__name__
        self.data_dir, self.image_size = data_dir, image_size
        self.decoder = getattr(model, "decoder", None)
        self.capsule_dim = self.decoder.capsule_dim if self.decoder is not None else None
        limits = (getattr(model, "checkpoint_meta", None) or {}).get("reconstruction_limits")
        self.limits = limits if self.decoder is not None else None
        self.unsure_rule = "score" if self.limits is None else "score and reconstruction"
        self._lock = threading.Lock()
        self._samples: tuple[Tensor, Tensor] | None = None
        self.samples_note = ""

    def info(self) -> dict:
        """What the page needs to lay itself out (JSON-able)."""
        matrix = self.kind == "matrix"
        return {
            "model": self.name,
            "kind": self.kind,
            "source": self.source,
            "dataset": self.dataset,
            "classes": self.classes,
            "input_size": list(self.input_size),
            "score": "activation" if matrix else "length",
            "decoder": self.decoder is not None,
            "capsule_dim": self.capsule_dim,
            "pose_size": int(self.model.class_capsules.pose_size) if matrix else None,
            "note": self._note(),
            "kernel_note": self.kernel_note(),
            "unsure_rule": self.unsure_rule,
        }

    def kernel_note(self) -> str | None:
        """What the first prediction of a matrix capsule model does first when the fused EM routing kernel is not
        built for this environment yet (:func:`capsnets.functional.em.kernel.build_needed`); else None."""
        try:
            needed = self.kind == "matrix" and em_kernel.build_needed()
        except ValueError:  # a wrong CAPSNETS_EM_KERNEL: the routing itself says so
            needed = False
        if not needed:
            return None
        return (
            "compiling the fused EM routing kernel once for this environment (a minute or less); the first prediction "
            "waits for it, later ones and later starts do not"
        )

    def _note(self) -> str:
        if self.kind == "matrix":
            return (
                "Matrix capsules: each class capsule is a 4x4 pose matrix and an activation. This model has "
                "no decoder, so there is no reconstruction, no slider and no perturbation grid; the poses are "
                "shown instead."
            )
        if self.decoder is None:
            return "This model was built without a decoder: no reconstruction, slider or perturbation grid."
        return ""

    @torch.no_grad()
    def analyse(self, image: Tensor, capsule: int | None = None) -> Analysis:
        """Class capsules, the reconstruction from capsule ``capsule`` (default: the winner) and the routing
        picture of one ``(C, H, W)`` input."""
        self._check_image(image)
        if capsule is not None:
            self._check_class(capsule)
        with self._lock:
            if self.kind == "vector":
                capsules, couplings = self._vector(image)
                scores = capsule_length(capsules)
            else:
                scores, capsules, couplings = self._matrix(image)
            prediction = int(scores.argmax())
            shown = prediction if capsule is None else capsule
            reconstruction = errors = None
            if self.decoder is not None:
                reconstruction = self.decoder(capsules[None], torch.tensor([shown]))[0]
            if self.limits is not None:  # the winner's reconstruction says whether the answer is unsure
                winner = (
                    reconstruction
                    if shown == prediction
                    else self.decoder(capsules[None], torch.tensor([prediction]))[0]
                )
                pixel, relative = reconstruction_errors(winner[None], image[None])[0].tolist()
                errors = {"pixel": pixel, "relative": relative}
        _require_finite("the class capsules", scores, capsules)
        _require_finite("the routing picture", couplings)
        _require_finite("the reconstruction", reconstruction)
        found = doubts(scores.clamp(0.0, 1.0), self.classes, errors=errors, limits=self.limits)
        return Analysis(scores, capsules, prediction, shown, reconstruction, couplings, found)

    def _vector(self, image: Tensor) -> tuple[Tensor, Tensor]:
        """Class capsules ``(K, D)`` and coupling maps ``(K, H', W')`` (routing_map's, for every class)."""
        model = self.model
        primary = model.primary_capsules(image[None])  # (1, T*H'*W', D_p), ordered (type, row, col)
        capsules, couplings = model.class_capsules(primary, return_couplings=True)  # (1, K, D), (1, I, K)
        grid = model.primary_grid()  # (H', W')
        routed = couplings[0] * capsule_length(primary[0])[:, None]  # (I, K): c[i, j] |u_i|
        return capsules[0], routed.T.reshape(self.num_classes, -1, *grid).sum(dim=1)

    def _matrix(self, image: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Activations ``(K,)``, flattened poses ``(K, P*P)`` and assignment maps ``(K, h, w)``."""
        children = self.model.conv_capsules(image[None])  # (1, T, h, w) capsules
        classes, assignments = self.model.class_capsules(children, return_couplings=True)  # (1, T, h, w, K)
        routed = assignments[0] * children.activation[0, ..., None]  # (T, h, w, K): R[i, j] a_i
        poses = classes.pose.reshape(self.num_classes, -1)  # (K, P*P)
        return classes.activation.reshape(self.num_classes), poses, routed.sum(dim=0).permute(2, 0, 1)

    @torch.no_grad()
    def reconstruct(self, vector: Tensor, index: int) -> Tensor:
        """Decode class capsule ``index`` set to ``vector`` ``(D,)``, the others masked: ``(C, H, W)``.

        Raises:
            ArgumentError: no decoder, a wrong class, ``vector`` not ``D`` finite numbers in
                ``[-MAX_CAPSULE_VALUE, MAX_CAPSULE_VALUE]``, or a decoding that is not finite.
        """
        self._require_decoder()
        self._check_class(index)
        values = torch.as_tensor(vector, dtype=torch.float64)  # checked before float32 turns large values to inf
        if values.shape != (self.capsule_dim,) or not bool(values.isfinite().all()):
            raise ArgumentError(f"capsule must be {self.capsule_dim} finite numbers, got shape {tuple(values.shape)}")
        largest = float(values.abs().max())
        if largest > MAX_CAPSULE_VALUE:
            raise ArgumentError(
                f"capsule values must lie in [-{MAX_CAPSULE_VALUE:g}, {MAX_CAPSULE_VALUE:g}], got one of magnitude "
                f"{largest:.3g}: a class capsule is shorter than 1, so its values lie in (-1, 1)"
            )
        capsules = torch.zeros(1, self.num_classes, self.capsule_dim)
        capsules[0, index] = values.float()
        with self._lock:
            decoded = self.decoder(capsules, torch.tensor([index]))[0]
        _require_finite("the reconstruction", decoded)
        return decoded

    @torch.no_grad()
    def perturbations(self, image: Tensor, capsule: int | None = None) -> tuple[Tensor, int, list[float]]:
        """The perturbation grid (paper Fig. 4, :func:`~capsnets.plots.perturbation_grid`) of class capsule
        ``capsule`` (default: the winner): ``(D, S, C, H, W)`` decodings, the class, and the ``S`` steps."""
        from capsnets.plots import PERTURBATIONS, perturbation_grid  # noqa: PLC0415 - matplotlib is slow to import

        self._require_decoder()
        self._check_image(image)
        if capsule is not None:
            self._check_class(capsule)
        with self._lock:
            grid, shown = perturbation_grid(self.model, image, PERTURBATIONS, capsule=capsule)
        _require_finite("the perturbation grid", grid)
        return grid, shown, [round(step, 4) for step in PERTURBATIONS.tolist()]

    def samples(self, per_class: int = 2) -> tuple[Tensor, Tensor]:
        """The first ``per_class`` test images of each class, ``(N, C, H, W)``, and their labels ``(N,)``; empty
        (with :attr:`samples_note` saying why) when the data set cannot be read here."""
        if self._samples is None:
            self._samples = self._load_samples(per_class)
        return self._samples

    def _load_samples(self, per_class: int) -> tuple[Tensor, Tensor]:
        empty = (torch.zeros(0, *self.input_size), torch.zeros(0, dtype=torch.long))
        if self.dataset is None:
            self.samples_note = "the model does not record its data set: draw, or send your own images"
            return empty
        try:
            data = load_dataset(self.dataset, root=self.data_dir, train=False, image_size=self.image_size)
        except (OSError, ValueError, KeyError) as err:  # DatasetError, missing files...
            self.samples_note = (
                f"the test images of {self.dataset} cannot be read here "
                f"({str(err).splitlines()[0] if str(err) else type(err).__name__}); start the demo with "
                f"--data-dir DIR, where DIR holds the {self.dataset} folder"
            )
            return empty
        if tuple(data.images.shape[1:]) != self.input_size:
            self.samples_note = f"the test images of {self.dataset} do not fit the model's input {self.input_size}"
            return empty
        chosen = [i for k in range(self.num_classes) for i in (data.labels == k).nonzero()[:per_class, 0].tolist()]
        return data.images[chosen].float(), data.labels[chosen]

    def _check_image(self, image: Tensor) -> None:
        if not isinstance(image, Tensor) or tuple(image.shape) != self.input_size:
            shape = tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__
            raise ArgumentError(f"image must have the model's input size {self.input_size}, got {shape}")

    def _check_class(self, index) -> None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.num_classes:
            raise ArgumentError(f"class must be an integer in [0, {self.num_classes - 1}], got {index!r}")

    def _require_decoder(self) -> None:
        if self.decoder is None:
            raise ArgumentError(f"model {self.name} has no decoder, so it cannot reconstruct: {self._note()}")


def _require_finite(what: str, *tensors: Tensor | None) -> None:
    """Refuse an answer holding NaN or infinite values (a model that overflows on this input), which JSON cannot
    carry and the page cannot draw."""
    if any(t is not None and not bool(t.isfinite().all()) for t in tensors):
        raise ArgumentError(
            f"{what} of this input hold non-finite values (the model overflows on it); send values nearer those "
            "of the training data"
        )
