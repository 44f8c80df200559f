"""The tasks whose models make images: reconstruction (a transforming auto-encoder) and synthesis (label maps to
images).

Their models are not trained by the :class:`~capsnets.engine.trainer.Trainer` nor scored by ``capsnets evaluate``
and ``predict``: the transforming auto-encoder learns from pairs of an image and its shifted copy (Hinton, Krizhevsky
& Wang 2011), in Python with its loss (``create_loss("transforming")``); the synthesis generators learn
adversarially from label maps and images (Bass et al. 2019; ``capsnets experiment synthesis``). Their tasks name
them, so that every registered model belongs to one task of :data:`~capsnets.engine.tasks.TASKS`, and refuse the
rest with a message that says so.
"""

from __future__ import annotations

from capsnets.engine.tasks.base import Task

__all__ = ["ReconstructionTask", "SynthesisTask"]


class ReconstructionTask(Task):
    """Images to transformed images (:class:`~capsnets.models.transforming.TransformingAutoencoder`); no labels."""

    name = "autoencoder"
    model_task = "autoencoder"
    best_metric = "test_loss"


class SynthesisTask(Task):
    """Label maps to images (:class:`~capsnets.models.capspix2pix.CapsPix2pixGenerator`, its pix2pix baseline)."""

    name = "synthesis"
    model_task = "synthesis"
    best_metric = "test_loss"
