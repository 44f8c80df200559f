"""``viewpoints``: generalisation to novel viewpoints (Hinton, Sabour & Frosst 2018, Sec. 5.2, Table 2).

Paper: on smallNORB, models are trained on a third of the training images and tested on the test toys
seen from viewpoints never trained on. Azimuth split: train on azimuths 300, 320, 340, 0, 20, 40 degrees
(smallNORB field values 30, 32, 34, 0, 2, 4: the third of the circle centred on 0 degrees, the set the
paper names), test on azimuths 60..280 (novel).
Elevation split: train on the 3 lowest elevations (30..40 degrees, field 0..2), test on the 6 higher
ones. Both are compared on the test toys at the familiar views too. "We stopped training the capsule
model when its performance on the familiar viewpoints matched the baseline CNN": Table 2 gives novel /
familiar test error, azimuth CNN 20% / 3.7%, capsules 13.5% / 3.7%; elevation CNN 17.8% / 4.3%,
capsules 12.3% / 4.3%.

Here:

- data: smallNORB when :func:`~capsnets.data.load_dataset` finds its files under ``data_dir``, else the
  offline rendered viewpoint set (:mod:`capsnets.data.viewpoints`, same fields and split by toy);
  ``render_instances`` / ``render_lightings`` (smoke) render a smaller grid of it, uncached.
  Training images come from the TRAIN split at familiar views, test sets from the TEST split.
- matching (:mod:`.matching`, :func:`~capsnets.experiments.views.fit_matched`, through the engine's trainer): both models are
  evaluated on the familiar-view test images after every epoch, the validation data that chooses (novel-view
  error is recorded for the curves with ``novel_each_epoch``, and at the chosen epoch; never used to choose). The
  CNN is trained for
  ``epochs`` and kept at its lowest familiar-view error, which becomes the target; the capsule model stops at
  the first epoch whose familiar-view error is at or below the target, or, if it never gets there, is kept at
  the epoch nearest to it. In that last case (a CNN that learns faster, as in short runs) the models are
  matched the other way round, unless ``rematch_cnn=False``: the CNN is trained again and stopped at the first
  epoch at or below the capsule model's familiar-view error (role "CNN, stopped"). With ``target_error`` set, both models follow the capsule model's rule towards the given
  error instead. Like the paper, this selects on the familiar part of the test set.
- models: ``matrix_capsnet`` (A=B=C=D=32, exact routing gradients) against the paper's smallNORB
  baseline CNN (Sec. 5: two 5x5 convolutions of 32 and 64 channels each followed by 2x2 max pooling,
  1024 hidden units with dropout; 4.25M parameters, the paper's "4.2M"), the registered ``cnn_smallnorb``.
  ``cnn_model`` may name any registered model instead; the smoke run uses ``cnn_smallnorb_narrow``, the
  same design narrowed to the size of ``matrix_capsnet_small`` (69K vs 67K parameters), beside that
  model (with detached routing gradients).
- training: the CNN with Adam at ``lr``, per-epoch decay ``lr_decay`` and cross-entropy; the capsule model
  with its training recipe (:func:`~capsnets.models.training_recipe`: learning rate, decay, weight decay, loss
  and loss arguments, e.g. the spread loss's margin schedule), where ``capsule_recipe`` overrides it field by
  field, and ``lr`` / ``lr_decay`` / no weight decay / its ``default_loss`` for what neither gives (a spread
  loss without a ramp grows its margin over the first half of ``epochs``; the paper gives no schedule). A
  recipe's cosine schedule needs a planned length, which a training to a matched error has not: such a model
  decays per epoch from ``matching.MATCHED_LR`` (3e-3) instead. The
  recipe's ``max_shift`` does not apply: both models see the smallNORB protocol's random 32x32 crop and
  brightness/contrast jitter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from capsnets.engine.runtime import seed_everything
from capsnets.experiments.common import ExperimentSettings, register_experiment
from capsnets.experiments.report import write_report
from capsnets.experiments.report.viewpoints import STOPPED, matched_role, viewpoint_sections
from capsnets.experiments.report.viewpoints_figures import plot_error_curves, plot_examples
from capsnets.experiments.viewpoints.matching import (
    CAPSULE_RECIPE_FIELDS,
    build_model,
    capsule_training,
    compare,
)
from capsnets.experiments.views import (
    AZIMUTH_FAMILIAR,
    ELEVATION_FAMILIAR,
    SPLITS,
    familiar_mask,
    load_norb_like,
    viewpoint_split,
)

__all__ = [
    "AZIMUTH_FAMILIAR",
    "CAPSULE_RECIPE_FIELDS",
    "ELEVATION_FAMILIAR",
    "Settings",
    "build_model",
    "familiar_mask",
    "run",
    "viewpoint_split",
]


@dataclass(frozen=True)
class Settings(ExperimentSettings):
    """The splits, the two models (``capsule_args``: builder arguments), training (``capsule_recipe``: fields of
    :data:`CAPSULE_RECIPE_FIELDS` over the capsule model's training recipe), matching (``target_error``: both
    models' target instead of the CNN's error; ``rematch_cnn``), data sizes (None:
    all; ``render_instances`` / ``render_lightings``: a smaller rendered grid), ``novel_each_epoch`` and ``compile``
    (train through ``torch.compile``; evaluation stays eager)."""

    splits: list[str] = field(default_factory=lambda: list(SPLITS))
    capsule_model: str = "matrix_capsnet"
    capsule_args: dict = field(default_factory=dict)
    cnn_model: str = "cnn_smallnorb"
    epochs: int = 50
    capsule_batch_size: int = 64
    cnn_batch_size: int = 128
    lr: float = 1e-3
    capsule_recipe: dict = field(default_factory=dict)
    lr_decay: float = 0.96
    target_error: float | None = None
    rematch_cnn: bool = True
    train_size: int | None = None
    test_size: int | None = None
    render_instances: int | None = None
    render_lightings: list[int] | None = None
    train_minutes: float | None = None
    novel_each_epoch: bool = True
    compile: bool = False
    SMOKE: ClassVar[dict] = {
        "capsule_model": "matrix_capsnet_small",
        "capsule_args": {"routing": {"detach_routing": True}},
        "cnn_model": "cnn_smallnorb_narrow",
        "epochs": 1,
        "capsule_batch_size": 32,
        "cnn_batch_size": 32,
        "lr": 2e-3,
        "train_size": 192,
        "test_size": 64,
        "render_instances": 1,
        "render_lightings": [0],
    }

    def __post_init__(self) -> None:
        if not self.splits or any(split not in SPLITS for split in self.splits):
            raise ValueError(f"splits must be a non-empty list from {list(SPLITS)}, got {list(self.splits)!r}")
        unknown = sorted(set(self.capsule_recipe) - set(CAPSULE_RECIPE_FIELDS))
        if unknown:
            raise ValueError(
                f"capsule_recipe takes the fields {list(CAPSULE_RECIPE_FIELDS)}, got {unknown}: "
                "e.g. --set 'capsule_recipe={\"lr\":0.003}'"
            )


def _contrasts(metrics: dict) -> list[tuple[str, str, str]]:
    """Capsules minus the matched CNN, novel- and familiar-view error per split (multi-seed summaries)."""
    splits = [key[: -len("_matched_CNN_novel_error")] for key in metrics if key.endswith("_matched_CNN_novel_error")]
    return [
        (
            f"capsules - matched CNN, {split} {view}-view error",
            f"{split}_capsules_{view}_error",
            f"{split}_matched_CNN_{view}_error",
        )
        for split in splits
        for view in ("novel", "familiar")
    ]


@register_experiment(
    "viewpoints",
    Settings,
    "novel viewpoints of toys: matrix capsules against a CNN at equal "
    "familiar-view error (Hinton et al. 2018, Sec. 5.2)",
    contrasts=_contrasts,
)
def run(out: Path, s: Settings, *, smoke: bool, device: str, seed: int, data_dir, runs):
    """Train (or load) a CNN and a matrix capsule network per split, write ``report.md`` and two PNGs."""
    train, test, source = load_norb_like(
        data_dir, device, render_instances=s.render_instances, render_lightings=s.render_lightings
    )
    tag = f"viewpoints_{'smallnorb' if source == 'smallNORB' else 'rendered'}"
    results = {}
    for split in s.splits:
        # Each split starts from the same random state and its own data seed, whatever ran before it: a
        # one-split run trains what a two-split run does.
        seed_everything(seed)
        results[split] = compare(
            split, train, test, s, tag=tag, device=device, seed=seed + 10 * SPLITS.index(split), runs=runs
        )
    records = {split: r["records"] for split, r in results.items()}
    figures = [
        plot_examples(test, out / "examples.png"),
        plot_error_curves(records, {split: r["target"] for split, r in results.items()}, out / "error_curves.png"),
    ]
    names = {"CNN": s.cnn_model, "capsules": s.capsule_model, STOPPED: s.cnn_model}
    sections = viewpoint_sections(
        source,
        results,
        s,
        names,
        {"seed": seed, "device": device, "smoke": smoke, "capsule training": capsule_training(s)},
        familiar={"azimuth": AZIMUTH_FAMILIAR, "elevation": ELEVATION_FAMILIAR},
    )
    metrics = {
        f"{split}_{role.replace(', ', '_')}_{k}": rec[k]
        for split, recs in records.items()
        for role, rec in recs.items()
        for k in ("novel_error", "familiar_error")
    }
    for split, recs in records.items():  # the CNN matched with the capsules, whichever way they were matched
        role = matched_role(recs, s.target_error is not None)
        metrics.update(
            {f"{split}_matched_CNN_{k}": recs[role][k] for k in ("novel_error", "familiar_error") if role is not None}
        )
    metrics["data_source"] = "smallnorb" if source == "smallNORB" else "viewpoints"
    return write_report(
        out,
        "Generalisation to novel viewpoints: matrix capsules vs CNN",
        sections,
        figures=figures,
        metrics=metrics,
        name="viewpoints",
    )
