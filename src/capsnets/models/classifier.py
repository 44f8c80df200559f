"""timm's classifier API for the classification models: ``get_classifier``, ``forward_features`` and
``reset_classifier``, as timm's models have them (e.g. ``timm/models/resnet.py``).

Each classification model derives from :class:`Classifier`, names its class layer in
:attr:`Classifier.classifier_name` and computes what feeds it in ``forward_features``.
:meth:`Classifier.reset_classifier` is written once for all of them: it rebuilds the model through the registry
with the new class count and keeps every tensor that does not depend on it, the start of a fine-tuning on other
classes.
"""

from __future__ import annotations

from torch import Tensor, nn

from capsnets.models import registry
from capsnets.models.hub import Transfer, transfer_weights
from capsnets.validation import ArgumentError, shown

#: What a module keeps of its own when :meth:`Classifier.reset_classifier` makes it another (its hooks and its mode);
#: the rest of ``vars(module)`` (parameters, buffers, submodules, plain attributes) is taken from the other.
_OWN = frozenset(vars(nn.Module())) - {"_parameters", "_buffers", "_non_persistent_buffers_set", "_modules"}


class Classifier(nn.Module):
    """The base of the classification models: timm's ``get_classifier``, ``forward_features`` and
    ``reset_classifier``. It holds no state of its own.

    A model sets :attr:`classifier_name` to its class layer and defines ``forward_features(images)``, the input of
    that layer as its ``forward`` computes it (the same checks and preprocessing of ``images``); each model's
    docstring of ``forward_features`` gives the structure and shapes.

    Examples::

        >>> model = capsnets.create_model("capsnet_small", pretrained=True)
        >>> model.get_classifier()
        LinearCapsules(in_capsules=288, in_dim=8, out_capsules=10, out_dim=16, routing=DynamicRouting(...))
        >>> model.forward_features(torch.rand(2, 1, 28, 28)).shape   # the primary capsules
        torch.Size([2, 288, 8])
        >>> print(model.reset_classifier(3))                         # fine-tune on 3 classes
        loaded 9 of 11; re-initialised class_capsules.weight, decoder.mlp.0.weight
        >>> model(torch.rand(2, 1, 28, 28)).scores.shape, model.class_names
        (torch.Size([2, 3]), ['0', '1', '2'])
    """

    #: The class layer's name in :meth:`~torch.nn.Module.get_submodule`'s dotted form.
    classifier_name: str = "class_capsules"

    def get_classifier(self) -> nn.Module:
        """The module that makes the class outputs: the class capsule layer, or a CNN's last linear layer."""
        return self.get_submodule(self.classifier_name)

    def forward_features(self, images: Tensor):
        """The input of :meth:`get_classifier` for ``images``, as ``forward`` computes it."""
        raise NotImplementedError(f"{type(self).__name__} does not define forward_features")

    def reset_classifier(self, num_classes: int) -> Transfer:
        """Re-initialise the class layer for ``num_classes`` classes, and with it every tensor whose shape depends
        on the class count (a decoder fed the class capsules), keeping every other tensor as it is: the model is
        rebuilt by its registered name (:func:`~capsnets.models.registry.create_model`) with the new count, and
        the tensors whose name and shape fit are copied into it (:func:`~capsnets.models.hub.transfer_weights`).

        The model stays the same object, on the device and in the dtype of its parameters, in its train or eval
        mode (each submodule's), with the hooks registered on it and on its submodules; its ``num_classes`` and
        ``model_args`` are the new ones, and ``class_names`` becomes ``"0"``, ``"1"``, ... when the count
        changes. The parameters are new tensors, those kept with their ``requires_grad`` (a frozen backbone stays
        frozen), the re-initialised ones requiring gradients: build the optimizer after. The same count as now
        gives a fresh class layer.

        Args:
            num_classes: the new number of classes, an ``int`` >= 1.

        Returns:
            a :class:`~capsnets.models.hub.Transfer`; ``str()`` of it says what was kept and what re-initialised.

        Raises:
            ArgumentError: ``num_classes`` is not an ``int`` >= 1 (a capsule model has no classifier-free mode:
                ``forward_features`` gives the features); the model was not built by
                :func:`~capsnets.models.create_model`, so that it cannot be rebuilt by name.

        Examples::

            >>> model = capsnets.create_model("capsnet_digits")
            >>> transfer = model.reset_classifier(4)
            >>> transfer.reinitialised, model.num_classes
            (['class_capsules.weight', 'decoder.mlp.0.weight'], 4)
        """
        num_classes = _class_count(num_classes)
        name, args = self._registration()
        same = num_classes == getattr(self, "num_classes", None)
        reference = next((p for p in self.parameters() if p.is_floating_point()), None)
        placement = {} if reference is None else {"device": reference.device, "dtype": reference.dtype}
        new = _build(name, {**args, "num_classes": num_classes}, placement)
        state = self.state_dict()
        other = state  # the tensors that depend on the class count are those whose shapes differ with another count
        if same:  # (a model with one class more, on the meta device: shapes without weights)
            other = _build(name, {**args, "num_classes": num_classes + 1}, {"device": "meta"}).state_dict()
        dependent = _class_dependent(new, other)
        transfer = transfer_weights(new, {key: value for key, value in state.items() if key not in dependent})
        self._become(new, set(transfer.loaded), keep_class_names=same)
        return transfer

    def _registration(self) -> tuple[str, dict]:
        """The model's registered name and recorded arguments; an :class:`ArgumentError` for a model built
        without the registry."""
        name, args = getattr(self, "model_name", None), getattr(self, "model_args", None)
        if not isinstance(name, str) or not isinstance(args, dict):
            raise ArgumentError(
                f"reset_classifier rebuilds the model by its registered name, and this {type(self).__name__} was "
                f"not built by capsnets.create_model (it has no model_name and model_args): build it with "
                f"capsnets.create_model(name, ...), or replace its {self.classifier_name} yourself"
            )
        return name, args

    def _become(self, new: nn.Module, kept: set[str], *, keep_class_names: bool) -> None:
        """Make this model ``new``: its parameters, buffers, submodules and plain attributes, with this model's
        hooks (its own and its submodules', by name) and modes, and the ``requires_grad`` of the ``kept``
        parameters."""
        modes = {key: module.training for key, module in self.named_modules()}
        hooks = {key: (type(module), _hooks(module)) for key, module in self.named_modules() if key}
        frozen = {key for key, parameter in self.named_parameters() if not parameter.requires_grad and key in kept}
        class_names = getattr(self, "class_names", None)
        self.__dict__.update({key: value for key, value in vars(new).items() if key not in _OWN})
        if keep_class_names:
            self.class_names = class_names
        for key, module in self.named_modules():
            module.training = modes.get(key, self.training)
            kind, own = hooks.get(key, (None, {}))
            if kind is type(module):  # the library registers no hooks: these are the user's
                module.__dict__.update(own)
        for key, parameter in self.named_parameters():
            parameter.requires_grad_(key not in frozen)


def _class_count(num_classes) -> int:
    """``num_classes`` if it is an ``int`` >= 1; else an :class:`ArgumentError` saying what to pass."""
    integer = isinstance(num_classes, int) and not isinstance(num_classes, bool)
    if not integer or num_classes < 1:
        features = (
            "; a capsule model has no classifier-free mode (timm's num_classes=0): use "
            "model.forward_features(images) for the features"
            if integer
            else ""
        )
        raise ArgumentError(
            f"reset_classifier: num_classes must be an integer >= 1, got {shown(num_classes)}{features}",
            "num_classes",
        )
    return num_classes


def _build(name: str, args: dict, placement: dict) -> nn.Module:
    """Model ``name`` built by the registry from ``args``, with the ``placement`` (``device``, ``dtype``) its
    builder takes."""
    schema = registry.model_schema(name)
    return registry.create_model(name, **args, **{key: value for key, value in placement.items() if key in schema})


def _class_dependent(model: Classifier, other: dict[str, Tensor]) -> set[str]:
    """The ``state_dict`` names of ``model`` that depend on its class count: those of its class layer, and those
    whose shape differs in ``other``, the ``state_dict`` of the same model with another class count."""
    prefix = f"{model.classifier_name}."
    return {
        key
        for key, tensor in model.state_dict().items()
        if key.startswith(prefix) or key not in other or other[key].shape != tensor.shape
    }


def _hooks(module: nn.Module) -> dict:
    """The hook tables of ``module``, the objects themselves (so that the handles the user holds still remove
    them)."""
    return {key: value for key, value in vars(module).items() if "hook" in key}
