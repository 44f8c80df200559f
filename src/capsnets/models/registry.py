"""Models by name (timm's ``create_model`` / torchvision's ``get_model``).

Builders are small functions registered with :func:`register_model` for one of the :data:`MODEL_TASKS`; their
keyword-only arguments, with their defaults, are the overrides :func:`create_model` accepts
(:func:`model_schema`). A builder and the model it builds check their own arguments (with
:mod:`capsnets.validation`); :func:`create_model` refuses names a builder does not take. A ``routing`` given
as its settings alone (``{"iterations": 2}``, ``--model-arg routing.iterations=2``) updates the builder's
default routing spec. :func:`create_model` records the overrides in ``model.model_args`` (JSON values only, a
``routing`` as its complete spec) so that a checkpoint can rebuild the model by name, and gives a model with
``num_classes`` the ``class_names`` ``["0", "1", ...]`` (a model loaded from a file gets the names its checkpoint
records: :mod:`capsnets.models.hub`).
"""

from __future__ import annotations

import copy
import difflib
import fnmatch
from collections.abc import Callable, Mapping, Sequence

from torch import nn

from capsnets.functional import routing_config, routing_from_config
from capsnets.validation import Argument, ArgumentError, flag, keyword_arguments, reject_unknown, shown

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}
_MODEL_TASK: dict[str, str] = {}  # the task of each registered model, by name
_RECIPES: dict[str, dict[str, object]] = {}
#: The tasks a model is registered for (each the ``model_task`` of a task of :data:`capsnets.engine.tasks.TASKS`,
#: which owns how such models train, are scored and answer), by what their forward pass returns:
#: ``"classification"`` models return a
#: :class:`~capsnets.models.output.ModelOutput` (class scores); ``"segmentation"`` models a
#: :class:`~capsnets.models.segcaps.SegmentationOutput` (per-pixel probabilities); ``"autoencoder"``
#: models an :class:`~capsnets.models.transforming.AutoencoderOutput` (a transformed image, no labels);
#: ``"synthesis"`` generators a :class:`~capsnets.models.capspix2pix.SynthesisOutput` (images from label maps).
MODEL_TASKS: tuple[str, ...] = ("classification", "segmentation", "autoencoder", "synthesis")


def register_model(
    name: str, *, task: str = "classification", recipe: Mapping[str, object] | None = None
) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator registering a model builder under ``name`` for ``task`` (one of :data:`MODEL_TASKS`).

    Args:
        name: the model's name.
        task: one of :data:`MODEL_TASKS`.
        recipe: the model's default training settings, as :class:`~capsnets.engine.TrainConfig` fields (timm's
            ``pretrained_cfg``): they fill the fields a training leaves unset (:func:`training_recipe`).
    """
    if task not in MODEL_TASKS:
        raise ArgumentError(f"task must be one of {', '.join(MODEL_TASKS)}, got {task!r}")

    def decorate(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in _REGISTRY:
            raise ArgumentError(f"model {name!r} is already registered")
        _REGISTRY[name] = builder
        _MODEL_TASK[name] = task
        _RECIPES[name] = copy.deepcopy(dict(recipe or {}))
        return builder

    return decorate


def training_recipe(name: str) -> dict[str, object]:
    """The training settings model ``name`` was registered with, as :class:`~capsnets.engine.TrainConfig` fields
    (empty for a model that trains with the config's defaults). A field the user sets, in a config file or a flag,
    wins over the recipe.

    Examples::

        >>> training_recipe("matrix_capsnet_small")["lr"]
        0.006
        >>> training_recipe("capsnet_small")
        {}
    """
    _builder(name)
    return copy.deepcopy(_RECIPES[name])


def list_models(
    pattern: str | Sequence[str] | None = None,
    *,
    pretrained: bool = False,
    task: str | None = None,
    include_tags: bool = False,
) -> list[str]:
    """Names of the registered models, sorted (timm's ``list_models``).

    Args:
        pattern: an fnmatch pattern (``"capsnet*"``, ``"*matrix*"``), or a list of them (a name matching any is
            listed); None lists every model. With ``include_tags``, a pattern may name weights too
            (``"*.fashion_mnist"``); one that matches a model lists all its weights.
        pretrained: list only the models with a shipped weight (:func:`capsnets.models.get_model_weights`).
        task: list only the models for this task (one of :data:`MODEL_TASKS`).
        include_tags: list the shipped weights as timm names them, ``"<model>.<tag>"`` (the tag is the weight's
            data set), each model's default weight first, in place of the model's name; a model without a shipped
            weight keeps its name (use ``pretrained=True`` to leave it out). Every function that takes a weight's
            name takes these.

    Raises:
        ArgumentError: a pattern that is not a string (or a list of them), or a task's name given as the pattern;
            an unknown ``task``; ``pretrained`` or ``include_tags`` not a bool.

    Examples::

        >>> list_models("efficient*")
        ['efficient_capsnet', 'efficient_capsnet_smallnorb']
        >>> list_models(pretrained=True)
        ['capsnet_small', 'efficient_capsnet', 'matrix_capsnet_small']
        >>> list_models("capsnet*", pretrained=True, include_tags=True)
        ['capsnet_small.mnist', 'capsnet_small.fashion_mnist']
        >>> list_models(task="autoencoder")
        ['transforming_autoencoder']
    """
    pretrained, include_tags = flag("pretrained", pretrained), flag("include_tags", include_tags)
    if task is not None and task not in MODEL_TASKS:
        raise ArgumentError(f"task must be one of {', '.join(MODEL_TASKS)}, got {shown(task)}", "task")
    if pattern is None or isinstance(pattern, str):
        patterns = [] if pattern is None else [pattern]
    elif isinstance(pattern, (list, tuple)) and all(isinstance(p, str) for p in pattern):
        patterns = list(pattern)
    else:
        raise ArgumentError(f"pattern must be a string or a list of strings, got {shown(pattern, 60)}", "pattern")
    names = sorted(name for name in _REGISTRY if task is None or _MODEL_TASK[name] == task)
    tasks_given = [p for p in patterns if p in MODEL_TASKS and p not in _REGISTRY]
    if tasks_given:
        raise ArgumentError(
            f"list_models takes a name pattern first; {tasks_given[0]!r} is a task: pass task={tasks_given[0]!r}",
            "pattern",
        )
    tags = _PRETRAINED_SOURCE() if pretrained or include_tags else {}
    if pretrained:
        names = [name for name in names if name in tags]
    listed = [  # (the model, what is listed: its weights' names with include_tags, else its own)
        (name, entry)
        for name in names
        for entry in ([f"{name}.{tag}" for tag in tags.get(name, ())] if include_tags else []) or [name]
    ]
    if patterns:
        listed = [
            (name, entry)
            for name, entry in listed
            if any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(entry, p) for p in patterns)
        ]
    return [entry for _, entry in listed]


def set_pretrained_source(source: Callable[[], Mapping[str, Sequence[str]]]) -> None:
    """Set where :func:`list_models` learns which models have a shipped weight and their tags: a function returning
    ``{model: [tag, ...]}``, each model's default tag first (:mod:`capsnets.models.pretrained` sets it; the
    registry itself knows nothing of weight files)."""
    global _PRETRAINED_SOURCE  # noqa: PLW0603
    _PRETRAINED_SOURCE = source


def _no_weights() -> Mapping[str, Sequence[str]]:
    return {}


_PRETRAINED_SOURCE: Callable[[], Mapping[str, Sequence[str]]] = _no_weights


def model_task(name: str) -> str:
    """The task model ``name`` was registered for (one of :data:`MODEL_TASKS`)."""
    _builder(name)
    return _MODEL_TASK[name]


def model_schema(name: str) -> dict[str, Argument]:
    """The overrides model ``name`` accepts: for each, its default, its annotation and ``expects``, the values it
    takes in words (from the builder's signature: :func:`~capsnets.validation.keyword_arguments`).

    Examples::

        >>> model_schema("capsnet_small")["num_classes"].expects
        'a positive integer'
    """
    return keyword_arguments(_builder(name))


def model_arguments(name: str) -> dict[str, object]:
    """The overrides a model accepts, with their defaults."""
    return {key: argument.default for key, argument in model_schema(name).items()}


def default_routing(name: str) -> dict | None:
    """The default ``routing`` of model ``name``'s builder as a spec (settings it leaves out take the routing's
    defaults), or None for a model without a routing argument or whose routing depends on other arguments.

    Examples::

        >>> default_routing("capsnet_cifar10")
        {'type': 'dynamic', 'none_of_the_above': True}
    """
    default = model_arguments(name).get("routing")
    if isinstance(default, str):
        return {"type": default}
    return dict(default) if isinstance(default, Mapping) else None


def routing_keys(name: str) -> dict[str, object]:
    """The settings of the routing model ``name`` builds by default (``--model-arg routing.KEY=VALUE`` changes
    one), with their values: its complete spec less the ``type``; empty for a model without routing.

    Examples::

        >>> routing_keys("capsnet_small")
        {'iterations': 3, 'detach_routing': True, 'none_of_the_above': False}
    """
    spec = getattr(create_model(name, device="meta"), "routing_spec", None)
    return {key: value for key, value in (spec or {}).items() if key != "type"}


def _reject_routing_settings(name: str, overrides: dict, schema: dict) -> None:
    """An :class:`ArgumentError` for a setting of the model's routing given as an argument of its own, saying
    where it goes (``routing={"iterations": 2}``)."""
    unknown = [key for key in overrides if key not in schema]
    if not unknown or "routing" not in schema:
        return
    keys = routing_keys(name)
    for key in unknown:
        setting = key.removeprefix("routing_") if key.removeprefix("routing_") in keys else key
        if setting in keys:
            value = overrides[key]
            raise ArgumentError(
                f"model {name!r} does not take {key}: its routing does; pass "
                f"routing={{{setting!r}: {shown(value)}}} (--model-arg routing.{setting}={shown(value)})",
                key,
            )


def _with_default_routing(name: str, routing):
    """``routing`` given as its settings alone (a mapping without a ``type``) over the model's default spec."""
    if isinstance(routing, Mapping) and "type" not in routing:
        default = default_routing(name)
        if default is not None:
            reject_unknown(f"model {name!r}", routing, routing_keys(name), prefix="routing.")
            return {**default, **routing}
    return routing


def _builder(name: str) -> Callable[..., nn.Module]:
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ArgumentError(f"unknown model {name!r}.{hint} Known models: {', '.join(list_models())}")
    return _REGISTRY[name]


def create_model(name: str, **overrides) -> nn.Module:
    """Build a registered model from its builder's arguments (:func:`capsnets.models.create_model` adds
    ``pretrained=``: :mod:`capsnets.models.hub`).

    Args:
        name: a name from :func:`list_models`.
        **overrides: keyword arguments of the model's builder (e.g. ``num_classes``, ``input_size``,
            ``routing`` (a routing object, its spec, its type name, or its settings alone, which update the
            model's default routing), ``device``); see :func:`model_schema`. The builder checks them: an
            :class:`~capsnets.validation.ArgumentError` (a ``ValueError`` and a ``TypeError``) names the
            argument, the value and what it takes; lists are taken for tuples, ints for floats.

    Examples:
        >>> model = create_model("capsnet_small", num_classes=10)
        >>> model = create_model("capsnet_digits", routing=DynamicRouting(2))
        >>> model.model_args
        {'routing': {'type': 'dynamic', 'iterations': 2, 'detach_routing': True, 'none_of_the_above': False}}
        >>> create_model("capsnet_digits", routing={"iterations": 1}).class_capsules.routing
        DynamicRouting(iterations=1, detach_routing=True, none_of_the_above=False)
        >>> create_model("capsnet_digits").class_names
        ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']
    """
    builder, schema = _builder(name), model_schema(name)
    _reject_routing_settings(name, overrides, schema)
    reject_unknown(f"model {name!r}", overrides, schema)
    if "routing" in overrides:
        overrides["routing"] = _with_default_routing(name, overrides["routing"])
    try:
        model = builder(**overrides)
    except ArgumentError as err:
        argument = schema.get(err.argument)
        default = (
            f"; leave it out to use its default, {_plain_default(argument.default)!r}"
            if argument is not None and err.argument in overrides
            else ""
        )
        raise ArgumentError(
            f"model {name!r}: {err}{default}; `capsnets list-models {name}` lists its arguments", err.argument
        ) from None
    except (RuntimeError, MemoryError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        if not isinstance(err, MemoryError) and not any(word in reason.lower() for word in _SIZE_ERRORS):
            raise
        given = ", ".join(f"{key}={shown(value, 60)}" for key, value in overrides.items()) or "its defaults"
        raise ArgumentError(
            f"model {name!r} cannot be built with {given}: its tensors are too large ({reason}); use smaller sizes"
        ) from None
    model.model_name = name
    model.model_args = _json_safe_args(overrides, getattr(model, "routing_spec", None))
    num_classes = getattr(model, "num_classes", None)
    model.class_names = [str(k) for k in range(num_classes)] if isinstance(num_classes, int) else None
    return model


def _plain_default(value):
    """A default as the user would write it (a read-only mapping as a dict)."""
    return dict(value) if isinstance(value, Mapping) else value


def complete_model_args(model: nn.Module) -> dict:
    """Every argument of the builder of ``model`` (built by :func:`create_model`): its recorded overrides over the
    builder's defaults, the routing as its complete spec, JSON values only. A file that records them rebuilds the
    same model whatever a later version makes the defaults."""
    defaults = {key: argument.default for key, argument in model_schema(model.model_name).items()}
    return _json_safe_args({**defaults, **model.model_args}, getattr(model, "routing_spec", None))


_SIZE_ERRORS = ("overflow", "allocate", "out of memory", "invalid argument 2: size")


def _json_safe_args(overrides: dict, routing_spec: dict | None = None) -> dict:
    """The builder arguments a checkpoint records to rebuild the model: JSON values (tuples as lists; dicts
    with string keys), without placement (``device``, ``dtype``). A routing (an object or a spec) is recorded as
    its complete spec: ``routing_spec``, the model's own record of it, where the model has one; one the library
    cannot describe as ``{"type": "opaque", "repr": ...}``, which refuses to be rebuilt
    (:func:`~capsnets.functional.routing_config`)."""

    def plain(value) -> bool:
        if isinstance(value, (tuple, list)):
            return all(plain(v) for v in value)
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        return value is None or isinstance(value, (bool, int, float, str))

    def record(key: str, value):
        if key == "routing" and routing_spec is not None:
            return routing_spec
        if key == "routing" and isinstance(value, str):
            value = {"type": value}
        if key == "routing" and isinstance(value, Mapping):
            return routing_config(routing_from_config(value))  # a spec, completed
        if callable(value):
            return routing_config(value, strict=False)
        return list(value) if isinstance(value, tuple) else value

    recorded = {key: record(key, value) for key, value in overrides.items() if key not in ("device", "dtype")}
    return {key: value for key, value in recorded.items() if plain(value)}


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
