"""The settings of EM routing: constants of both formulations, the inverse temperature schedule,
:class:`EMSettings`, the resolved and checked settings that both execution paths take, and the layers of a
network's EM routing spec (:func:`layer_spec`)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from capsnets.functional.child_groups import ChildGroups
from capsnets.validation import ArgumentError, routing_iterations, shown

LOG_2PI = math.log(2.0 * math.pi)
COST_NORMALIZATIONS = (None, "mean_std", "mass")
FORMULATIONS = ("paper", "official")
BLEND = 0.9  # official: the weight of the new mean in the centre update
BETA_A_SCALE = 5000.0  # official: beta_a's factor in the activation logit
GRADIENT_MASS_FLOOR = 1e-3  # below this mass, mu and sigma^2 are differentiated as if at it (em.procedure)
#: Float32 (and half-precision) votes with a larger magnitude are routed in float64 (:mod:`capsnets.functional.em`).
WIDE_VOTES = 2.0**32
#: The range of the children's activations (probabilities).
ACTIVATION_RANGE = (0.0, 1.0)
#: The released code's settings: variance floor, and mass guards of convolutional and class capsule layers.
OFFICIAL_VARIANCE_FLOOR = 5e-4
OFFICIAL_MASS_EPS = {"conv": 1e-7, "class": 1e-5}
#: The key of a matrix capsule network's EM routing spec that holds the settings of its class capsule layer
#: (:func:`layer_spec`).
CLASS_LAYER = "class_layer"
#: The layers of a matrix capsule network whose EM routing may differ: convolutional and class capsule layers.
LAYERS = ("conv", "class")


def em_inverse_temperatures(iterations: int, final: float = 0.01, decay: float = 0.95) -> list[float]:
    """Default schedule ``lambda_t = final * (1 - decay ** (t + 1))``, ``t = 0 .. iterations - 1``
    (:mod:`capsnets.functional.em`).

    Examples::

        >>> [round(x, 6) for x in em_inverse_temperatures(3)]
        [0.0005, 0.000975, 0.001426]
    """
    return [final * (1.0 - decay ** (t + 1)) for t in range(iterations)]


@dataclass(frozen=True)
class EMSettings:
    """The resolved settings of one EM routing call, as both execution paths take them.

    Args:
        inverse_temperatures: ``lambda_t``, one per iteration (their number is the number of iterations).
        eps: the mass guard, and with the paper's formulation the variance floor.
        cost_normalization: ``None``, ``"mean_std"`` or ``"mass"`` (paper formulation only).
        detach_routing: the assignments of the non-final iterations act as constants.
        variance_floor: None for the paper's formulation; the floor of the released code's formulation.

    Examples::

        >>> s = EMSettings.resolve(2, 0.5, formulation="official")
        >>> s.inverse_temperatures, s.eps, s.variance_floor, s.official
        ((0.5, 0.5), 1e-05, 0.0005, True)
    """

    inverse_temperatures: tuple[float, ...]
    eps: float
    cost_normalization: str | None = None
    detach_routing: bool = False
    variance_floor: float | None = None

    @property
    def iterations(self) -> int:
        return len(self.inverse_temperatures)

    @property
    def official(self) -> bool:
        """The released code's formulation (else the paper's)."""
        return self.variance_floor is not None

    @classmethod
    def resolve(
        cls,
        iterations: int,
        inverse_temperature: float | Sequence[float] | None = None,
        *,
        eps: float | None = None,
        cost_normalization: str | None = None,
        detach_routing: bool = False,
        formulation: str = "paper",
        variance_floor: float | None = None,
    ) -> EMSettings:
        """The settings of :func:`~capsnets.functional.em_routing`'s arguments, checked, with the formulation's
        defaults filled in; a ``ValueError`` names the argument that is wrong."""
        eps, variance_floor = resolve_formulation(formulation, eps, variance_floor)
        check_settings(iterations, eps, cost_normalization, formulation, variance_floor)
        if not isinstance(detach_routing, bool):
            raise ArgumentError(f"detach_routing must be True or False, got {detach_routing!r}")
        lambdas = tuple(resolve_lambdas(inverse_temperature, int(iterations)))
        return cls(lambdas, float(eps), cost_normalization, detach_routing, variance_floor)


def resolve_lambdas(inverse_temperature, iterations: int) -> list[float]:
    """One ``lambda`` per iteration from None (the default schedule), a number or a sequence."""
    if inverse_temperature is None:
        return em_inverse_temperatures(iterations)
    if isinstance(inverse_temperature, Tensor) and inverse_temperature.dim() == 0:
        inverse_temperature = float(inverse_temperature)
    if isinstance(inverse_temperature, (int, float)):
        return [float(inverse_temperature)] * iterations
    lambdas = [float(x) for x in inverse_temperature]
    if len(lambdas) != iterations:
        raise ArgumentError(
            f"inverse_temperature must be None, a number or a sequence of length iterations={iterations}; "
            f"got a sequence of length {len(lambdas)}"
        )
    return lambdas


def resolve_formulation(formulation, eps, variance_floor):
    """``(eps, variance_floor)`` with the defaults of ``formulation`` filled in (floor None for the paper)."""
    if formulation == "official":
        return (
            OFFICIAL_MASS_EPS["class"] if eps is None else eps,
            OFFICIAL_VARIANCE_FLOOR if variance_floor is None else variance_floor,
        )
    return (1e-6 if eps is None else eps), variance_floor


def check_settings(iterations, eps, cost_normalization, formulation="paper", variance_floor=None) -> None:
    routing_iterations("iterations", iterations)
    if not isinstance(eps, (int, float)) or not eps > 0:
        raise ArgumentError(f"eps must be a number > 0, got {eps!r}")
    if cost_normalization not in COST_NORMALIZATIONS:
        raise ArgumentError(f"cost_normalization must be one of {COST_NORMALIZATIONS}, got {cost_normalization!r}")
    if formulation not in FORMULATIONS:
        raise ArgumentError(f"formulation must be one of {FORMULATIONS}, got {formulation!r}")
    if formulation == "official" and cost_normalization is not None:
        raise ArgumentError(
            f"cost_normalization applies to the paper's cost; formulation='official' has its own "
            f"activation logit, so cost_normalization must be None (got {cost_normalization!r})"
        )
    if variance_floor is not None and (
        formulation != "official" or not isinstance(variance_floor, (int, float)) or not variance_floor > 0
    ):
        raise ArgumentError(
            f"variance_floor must be None (paper: eps is the floor) or, with formulation='official', "
            f"a number > 0; got {variance_floor!r} with formulation={formulation!r}"
        )


def layer_spec(spec: Mapping, layer: str) -> dict:
    """The settings one layer of a matrix capsule network takes from the network's EM routing spec: for the
    convolutional capsule layers (``"conv"``) the spec less its :data:`CLASS_LAYER`; for the class capsule layer
    (``"class"``) the spec with the settings of its :data:`CLASS_LAYER` over it. Settings that neither gives are
    left out (the formulation's defaults for that layer fill them:
    :func:`~capsnets.functional.layerwise_em_routing`).

    Examples::

        >>> spec = {"type": "em", "iterations": 3, "class_layer": {"iterations": 1}}
        >>> layer_spec(spec, "conv"), layer_spec(spec, "class")
        ({'type': 'em', 'iterations': 3}, {'type': 'em', 'iterations': 1})
    """
    if layer not in LAYERS:
        raise ArgumentError(f"layer must be one of {LAYERS}, got {shown(layer)}", "layer")
    own = spec.get(CLASS_LAYER) or {}
    if not isinstance(own, Mapping) or own.get("type", "em") != "em":
        raise ArgumentError(
            f"{CLASS_LAYER} must be a mapping of EM settings (the class capsule layer routes by EM too), e.g. "
            f"{{'iterations': 1}}; got {shown(own)}",
            CLASS_LAYER,
        )
    shared = {key: value for key, value in spec.items() if key != CLASS_LAYER}
    return {**shared, **own} if layer == "class" else shared


def check_beta(beta, name: str, parents: int, like: Tensor) -> Tensor:
    """``beta`` as a ``(J,)`` or ``(1,)`` tensor of ``like``'s dtype and device."""
    # Python numbers straight to the votes' dtype (via float32 they would lose digits that 5000 * beta_a shows)
    beta = torch.as_tensor(beta, device=like.device, dtype=None if isinstance(beta, Tensor) else like.dtype)
    if beta.numel() == 1:
        return beta.reshape(1).to(like.dtype)
    if beta.shape != (parents,):
        raise ArgumentError(
            f"{name} must have shape (J,) = ({parents},) (one per parent type) or be a scalar; "
            f"got shape {tuple(beta.shape)}"
        )
    return beta.to(like.dtype)


def routing_dtype(dtype: torch.dtype, top: float, device: torch.device) -> torch.dtype:
    """The dtype votes of ``dtype`` whose largest magnitude is ``top`` are routed in: float32 for half
    precision, float64 for float32 and half-precision votes beyond :data:`WIDE_VOTES` (on devices with
    float64), the votes' own otherwise."""
    dtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    if dtype == torch.float32 and top > WIDE_VOTES and device.type != "mps":
        return torch.float64
    return dtype


def host_reads(device: torch.device) -> bool:
    """Whether a check or decision on a tensor's values reads them on the host: everywhere but on CUDA, where a
    read would wait for the device to finish its queued work, so there the checks are device-side assertions and
    the decisions are made on the device (:mod:`capsnets.functional.em`)."""
    return device.type != "cuda"


def device_scale_limit(dtype: torch.dtype) -> float | None:
    """Where the device decides (:func:`host_reads` false): the largest ``|V|`` routed unscaled, so that the
    scale stands in for routing float32 votes beyond :data:`WIDE_VOTES` in float64 (``scale_from_top``'s
    ``wide``); None for float64 votes."""
    return WIDE_VOTES if dtype == torch.float32 else None


def without_autocast(device_type: str):
    """A block that computes in the inputs' dtypes: ``torch.autocast(device_type, enabled=False)`` where autocast is
    on, else nothing, so that a graph traced without autocast (``torch.export``) holds no autocast region, which
    ``torch.export.save`` cannot write."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


def checking() -> bool:
    """Whether the host checks of the inputs' values run (not while tracing, scripting or compiling)."""
    return not (torch.jit.is_tracing() or torch.jit.is_scripting() or torch.compiler.is_compiling())


def check_activations(activations: Tensor) -> None:
    """Raise a ``ValueError`` unless every activation lies in :data:`ACTIVATION_RANGE` (NaN does not). On CUDA
    the check is a device-side assertion (``torch._assert_async``), which fails at the next synchronisation."""
    if activations.numel() == 0:
        return
    expected = (
        f"EM routing takes child activations in [{ACTIVATION_RANGE[0]:g}, {ACTIVATION_RANGE[1]:g}] (probabilities)"
    )
    fix = "pass probabilities, e.g. torch.sigmoid(logits)"
    with torch.no_grad():
        if not host_reads(activations.device):
            a = activations.detach()
            torch._assert_async(((a >= ACTIVATION_RANGE[0]) & (a <= ACTIVATION_RANGE[1])).all(), f"{expected}: {fix}")
            return
        low, high = (float(x) for x in torch.aminmax(activations.detach()))
    if not ACTIVATION_RANGE[0] <= low <= high <= ACTIVATION_RANGE[1]:
        raise ArgumentError(f"{expected}; got values from {low:g} to {high:g}: {fix}")


def check_child_groups(child_groups, shape: tuple, of: str) -> None:
    if child_groups is not None and (
        not isinstance(child_groups, ChildGroups) or tuple(child_groups.index.shape) != shape
    ):
        got = tuple(child_groups.index.shape) if isinstance(child_groups, ChildGroups) else type(child_groups).__name__
        raise ArgumentError(f"child_groups must be a ChildGroups whose index has the {of}' (B, I) = {shape}; got {got}")
