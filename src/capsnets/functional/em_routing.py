"""EM routing between matrix capsules.

Hinton, Sabour & Frosst (2018), "Matrix capsules with EM routing", ICLR, Procedure 1 (SPEC §2).

Dimension legend: ``B`` batch (for a convolutional capsule layer: batch * output positions, folded),
``I`` child capsules (the K*K*types capsules of a receptive field), ``J`` parent capsule types,
``H`` pose components (16 for a 4x4 pose matrix).

The procedure, as implemented (one Gaussian cluster per parent over the H vote components):

- ``R = 1/J``; repeat ``iterations`` times:
  M-step: ``R' = R * a_i``; ``mu = sum_i R' V / sum_i R'``; ``sigma^2 = sum_i R' (V - mu)^2 / sum_i R'``;
  ``cost[j,h] = (beta_v[j] + log sigma[j,h]) * sum_i R'[i,j]``;
  ``a_j = logistic(lambda_t * (beta_a[j] - sum_h cost[j,h]))``.
  E-step (skipped after the last M-step): ``log p[i,j] = sum_h log N(V[i,j,h]; mu[j,h], sigma^2[j,h])``;
  ``R[i,:] = softmax_j(log a_j + log p[i,j])``.
- returns ``mu`` (the parents' poses) and ``a`` (their activations).

Inverse temperature schedule (the paper gives none). The default is
``lambda_t = 0.01 * (1 - 0.95 ** (t + 1))`` for iteration ``t = 0 .. iterations-1``, the formula Hinton
gave on OpenReview (https://openreview.net/forum?id=HJWLfGWRb) and the one used by Gritzman's IBM
reproduction (github.com/IBM/matrix-capsules-with-em-routing, ``em_routing.py``, ``final_lambda=0.01``),
the only public reproduction we know of that reports the paper's smallNORB accuracy without changing the
cost. Other reproductions differ: Yang (github.com/gyang274/capsulesEM) ramps lambda linearly from 1 to
``min(iterations, 3)`` but also normalises the cost across parents (see ``cost_normalization``);
Lei Yang's PyTorch port (github.com/yl-1993/Matrix-Capsules-EM-PyTorch) uses a constant 1e-3.
Pass ``inverse_temperature`` to use any of them.

Numerical safety (everything that can be in log space is):
- a variance floor ``eps`` is added to every ``sigma^2`` (cost and E-step), so zero-variance clusters
  (identical votes, a single active child) give ``log sigma`` of ``0.5 log eps`` instead of ``-inf``;
  ``eps=1e-6`` is below the spread of unit-scale poses yet far above float32 rounding of squared
  differences of such poses, and bounds ``d log sigma / d sigma^2`` by ``1 / (2 eps)``;
- ``sum_i R'`` is guarded by the same ``eps`` in the denominators of ``mu`` and ``sigma^2``, so a parent
  that receives no mass (all activations zero) gets ``mu = 0`` with zero cost, not ``0/0``;
- ``log a_j`` is ``logsigmoid`` of the pre-activation (exact when ``a_j`` underflows to 0) and the
  assignments are a log-space softmax;
- half-precision inputs (and calls under ``torch.autocast``) are computed in float32 with autocast
  disabled inside; results are float32 for float16/bfloat16 inputs, the input dtype otherwise.

Convolutional layers fold output positions into ``B``, so by default each position's parents are routed
as their own problem and a child seen by several overlapping receptive fields has one set of assignments
per position (SPEC's reading). ``child_groups`` (:mod:`capsnets.functional.child_groups`) ties those
copies together: the E-step then normalises a child's assignments over every parent of every position
that sees it, and they start uniform over them (Gritzman 2019, arXiv 1907.00652, pitfall 3; the IBM
reproduction does this). The M-step is unchanged; with it, each child hands out its activation once in
all, not once per position.

Known scale issue (a deviation, off by default): ``sum_h cost`` grows with the number of children
mass ``sum_i R'``, so the same beta and lambda saturate a class-capsule layer (hundreds of children)
while a 3x3 convolutional one (tens) stays near 0.5. ``cost_normalization="mean_std"`` replaces
``sum_h cost[j]`` by its standardisation across the J parents of each example, ``(c_j - mean_j c) /
sqrt(var_j c + eps)``, as in Yang's reproduction. ``cost_normalization="mass"`` divides the cost by
``I H / J``, the mass a parent receives under the uniform start from fully active children times the
pose components, so that ``sum_h cost[j] / (I H / J)`` is an activation-weighted mean of
``beta_v + log sigma`` whatever the layer's size; ``inverse_temperature`` of order 1 then suits every
layer. This is the paper's procedure with a per-layer inverse temperature ``lambda J / (I H)`` and
``beta_a`` measured in units of ``J / (I H)`` (a reparameterisation of a learned parameter; tested as an
identity): the E-step, poses and activations are those equations' values for that choice. The default
``None`` follows the equations with the given ``lambda`` exactly.

Learning speed (``benchmarks/em_learning.py``; ``matrix_capsnet_small`` on MNIST, batch 32, Adam 3e-3,
detached assignments, test accuracy after 100 / 200 / 300 / 400 steps on a 2-core CPU):
the default, 15.7 / 24.3 / 32.4 / 38.7%; ``"mean_std"`` with ``inverse_temperature=1``, 19.2 / 61.4 /
67.8 / 73.8%, at the same images/s. In probes of the same kind (other seed, margin grown over 500 steps)
``"mass"`` at 1 was only a few points ahead of the default (52.3% and 56.6% after 400 and 500 steps,
against 49.4% and 40.8%), and ``"mass"`` or ``"mean_std"`` at 3 stayed near chance (saturated
activations). The standardised cost learns fastest, at the price of activations that are relative to the
other parents of the same position rather than absolute. With the default inverse temperatures ``lambda
(beta_a - cost)`` moves little in the convolutional layers: ``matrix_capsnet_small``'s first convolutional
capsule layer is at 0.531 +- 0.011 at the start and 0.552 +- 0.019 after 400 steps (first 256 test digits,
mean +- standard deviation over examples, types and positions); with ``"mean_std"`` every routed layer is
at about 0.49 +- 0.21 throughout. That is not what makes the default slow: the ``"mass"`` cost with
inverse temperatures 0.8, 1.56, 2.28 and ``beta_a`` started near -1.5 spreads every layer's activations as
widely (0.36 +- 0.24 in the first) and reaches only 44.8% after 400 steps. What matters is the class
capsule layer: ``"mean_std"`` there alone reaches 65.6% (68.7% on a second seed; in the convolutional
layers alone 39.5% and 47.5%), and so does ``"mass"`` there alone with those inverse temperatures and that
``beta_a`` start (58.1%); both spread the class activations (0.49 +- 0.21 and 0.64 +- 0.34 at the start),
which the default keeps bunched (0.76 +- 0.09): with lambda 0.0014 in the last iteration the class scores
can hardly separate. With exact gradients (``detach_assignments=False``) the default and ``"mean_std"``
reach 36.7 / 45.0 / 51.8 / 43.1% (faster at first, then stalling) and 24.2 / 54.1 / 73.0 / 81.3%. After
one epoch of MNIST (1,875 steps, detached): 44.95% against 91.65% (``benchmarks/README.md``).

Implementation (same values as the equations; float32 error no larger than the direct form's):
votes are laid out once as ``(B, J, I, H)`` and shifted by a per-parent origin ``c`` (the
activation-weighted mean vote, a constant: the procedure is shift invariant), then stored once as
``xx = [V - c, (V - c)^2]`` ``(B, J, I, 2H)``. Each M-step is one batched product ``w @ xx`` giving
``sum_i w x`` and ``sum_i w x^2`` (the variance follows by exact algebra, clamped at 0 against rounding),
each E-step one product ``xx @ [-2 d / sigma^2, 1 / sigma^2]`` (computed as a row times ``xx^T``, which
PyTorch's CPU kernels do 3x faster than a matrix times a column): no ``(B, J, I, H)`` temporary per
iteration. Gradients flow through every iteration (the procedure differentiated literally). In eager
training :class:`_EMFunction` supplies the backward: ``d loss / d xx`` is a sum of outer products, formed
by one product of inner size ``2 * iterations - 1`` instead of one full-size tensor per use; under
``torch.compile`` (and without gradients) plain autograd runs through the same code.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from capsnets.functional.child_groups import ChildGroups, group_softmax
from capsnets.functional.products import matvec

_LOG_2PI = math.log(2.0 * math.pi)
_COST_NORMALIZATIONS = (None, "mean_std", "mass")


def em_inverse_temperatures(iterations: int, final: float = 0.01, decay: float = 0.95) -> list[float]:
    """Default schedule ``lambda_t = final * (1 - decay ** (t + 1))`` (see the module docstring)."""
    return [final * (1.0 - decay ** (t + 1)) for t in range(iterations)]


def _resolve_lambdas(inverse_temperature, iterations: int) -> list[float]:
    if inverse_temperature is None:
        return em_inverse_temperatures(iterations)
    if isinstance(inverse_temperature, Tensor) and inverse_temperature.dim() == 0:
        inverse_temperature = float(inverse_temperature)
    if isinstance(inverse_temperature, (int, float)):
        return [float(inverse_temperature)] * iterations
    lambdas = [float(x) for x in inverse_temperature]
    if len(lambdas) != iterations:
        raise ValueError(
            f"inverse_temperature must be None, a number or a sequence of length iterations={iterations}; "
            f"got a sequence of length {len(lambdas)}"
        )
    return lambdas


def _check_beta(beta, name: str, parents: int, like: Tensor) -> Tensor:
    beta = torch.as_tensor(beta, device=like.device)
    if beta.numel() == 1:
        return beta.reshape(1).to(like.dtype)
    if beta.shape != (parents,):
        raise ValueError(
            f"{name} must have shape (J,) = ({parents},) (one per parent type) or be a scalar; "
            f"got shape {tuple(beta.shape)}"
        )
    return beta.to(like.dtype)


def _check_settings(iterations, eps, cost_normalization) -> None:
    if int(iterations) != iterations or iterations < 1:
        raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    if cost_normalization not in _COST_NORMALIZATIONS:
        raise ValueError(
            f"cost_normalization must be one of {_COST_NORMALIZATIONS}, got {cost_normalization!r}"
        )


def _check_inputs(votes: Tensor, activations: Tensor, iterations, eps, cost_normalization) -> None:
    if not isinstance(votes, Tensor) or votes.dim() != 4:
        shape = tuple(votes.shape) if isinstance(votes, Tensor) else type(votes).__name__
        raise ValueError(
            f"votes must be a 4-D tensor (B, I, J, H) (batch, children, parents, pose); got {shape}"
        )
    if not isinstance(activations, Tensor) or activations.shape != votes.shape[:2]:
        shape = tuple(activations.shape) if isinstance(activations, Tensor) else type(activations).__name__
        raise ValueError(
            f"activations must have shape (B, I) = {tuple(votes.shape[:2])} to match votes; got {shape}"
        )
    _check_settings(iterations, eps, cost_normalization)


def _shifted_votes(v: Tensor, a_in: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Votes about a per-parent origin, and their squares, side by side.

    The origin ``c`` is the activation-weighted mean vote (the first M-step's ``mu`` up to the mass
    guard), taken as a constant: the procedure is invariant to the shift, so its gradient is exact.
    Returns ``c`` (B, J, 1, H) and ``xx = [V - c, (V - c)^2]`` (B, J, I, 2H).
    """
    with torch.no_grad():
        w0 = (a_in / (a_in.sum(dim=-1, keepdim=True) + eps)).unsqueeze(2)  # (B, 1, 1, I)
        c = torch.matmul(w0, v)  # (B, J, 1, H)
    if (torch.is_grad_enabled() and v.requires_grad) or torch.compiler.is_compiling():
        x = v - c
        return c, torch.cat([x, x * x], dim=-1)
    # Untracked (inference, or _EMFunction's forward): write both halves in place, no temporaries or cat.
    h = v.shape[-1]
    xx = v.new_empty(*v.shape[:-1], 2 * h)
    x = torch.sub(v, c, out=xx[..., :h])
    torch.mul(x, x, out=xx[..., h:])
    return c, xx


def _m_step(r_prime, c, contract, beta_v, beta_a, lam, eps, cost_normalization):
    """One M-step. r_prime (B, J, I), c (B, J, 1, H) -> mu - c, var, log_var (B, J, H), pre (B, J).

    With ``x = V - c`` and normalised weights ``w`` (summing to ``s = mass / (mass + eps)``):
    ``mu = m1 + s c`` and ``sum_i w (V - mu)^2 = m2 - 2 d m1 + s d^2`` where ``m1 = sum_i w x``,
    ``m2 = sum_i w x^2`` and ``d = mu - c`` (exact algebra; rounding can only make it slightly negative).
    """
    mass = r_prime.sum(dim=2, keepdim=True)  # (B, J, 1): sum_i R'
    w = (r_prime / (mass + eps)).unsqueeze(2)  # (B, J, 1, I): normalised weights, guarded
    m1, m2 = contract("m", w).squeeze(2).chunk(2, dim=-1)  # (B, J, H) each
    s = mass * (mass + eps).reciprocal()  # (B, J, 1): sum_i w
    d = m1 + (s - 1.0) * c.squeeze(2)  # (B, J, H): mu - c
    var = (m2 - 2.0 * d * m1 + s * d.square()).clamp_min(0.0) + eps  # sigma^2 with its floor
    log_var = var.log()
    cost = ((beta_v.unsqueeze(-1) + 0.5 * log_var) * mass).sum(dim=-1)  # (B, J)
    if cost_normalization == "mass":  # per child and pose component of a uniform assignment: J / (I H)
        cost = cost * (cost.shape[1] / (r_prime.shape[-1] * d.shape[-1]))
    elif cost_normalization == "mean_std":
        mean = cost.mean(dim=1, keepdim=True)
        cost = (cost - mean) * torch.rsqrt((cost - mean).square().mean(dim=1, keepdim=True) + eps)
    pre = lam * (beta_a - cost)  # (B, J): a_j = sigmoid(pre)
    return d, var, log_var, pre


def _e_step(contract, d, var, log_var, pre, groups):
    """One E-step: new assignments (B, J, I), a softmax over J of log a_j + log p[i, j] (with ``groups``:
    over every parent of every copy of the child, :func:`~capsnets.functional.child_groups.group_softmax`).

    ``sum_h (V - mu)^2 / sigma^2 = sum_h x^2 / sigma^2 - 2 x d / sigma^2 + d^2 / sigma^2``: one matrix
    product with the stored ``[x, x^2]``, no (B, J, I, H) temporary.
    """
    inv = var.reciprocal()  # (B, J, H)
    coef = torch.cat([-2.0 * d * inv, inv], dim=-1).unsqueeze(-1)  # (B, J, 2H, 1)
    quad = contract("e", coef).squeeze(-1) + (d.square() * inv).sum(dim=-1, keepdim=True)  # (B, J, I)
    log_norm = log_var.sum(dim=-1, keepdim=True) + var.shape[-1] * _LOG_2PI  # (B, J, 1)
    logits = F.logsigmoid(pre).unsqueeze(-1) - 0.5 * (quad + log_norm)  # (B, J, I)
    return torch.softmax(logits, dim=1) if groups is None else group_softmax(logits, groups)


def _matmul_contract(xx: Tensor):
    """``contract(kind, operand)``: the two products of the procedure with ``xx`` (B, J, I, 2H).

    ``"m"``: weights (B, J, 1, I) -> (B, J, 1, 2H); ``"e"``: coefficients (B, J, 2H, 1) -> (B, J, I, 1).
    """
    return lambda kind, operand: torch.matmul(operand, xx) if kind == "m" else matvec(xx, operand)


def _initial_assignments(c, a_in, groups):
    """Uniform over each child's parents: ``1 / J``, or ``1 / (J * copies)`` with ``groups``. (B, J, I)."""
    r = a_in.new_full((c.shape[0], c.shape[1], a_in.shape[-1]), 1.0 / c.shape[1])
    return r if groups is None else r / groups.copies().unsqueeze(1).to(r.dtype)


def _route(c, contract, a_in, beta_v, beta_a, lambdas, eps, cost_normalization, detach_assignments, groups):
    """The procedure on shifted votes, seen only through ``contract``: poses, activations, assignments."""
    r = _initial_assignments(c, a_in, groups)  # (B, J, I)
    if detach_assignments and len(lambdas) > 1:
        with torch.no_grad():  # the assignments become constants: no graph for these iterations
            for lam in lambdas[:-1]:
                d, var, log_var, pre = _m_step(r * a_in, c, contract, beta_v, beta_a, lam, eps, cost_normalization)
                r = _e_step(contract, d, var, log_var, pre, groups)
        lambdas = lambdas[-1:]
    for t, lam in enumerate(lambdas):
        d, var, log_var, pre = _m_step(r * a_in, c, contract, beta_v, beta_a, lam, eps, cost_normalization)
        if t < len(lambdas) - 1:
            r = _e_step(contract, d, var, log_var, pre, groups)
    return d + c.squeeze(2), torch.sigmoid(pre), r


class _Replay(torch.autograd.Function):
    """A product with ``xx`` replayed from its forward value; its gradient for ``xx`` goes to ``sink``."""

    @staticmethod
    def forward(ctx, operand, value, xx, kind, sink):
        ctx.save_for_backward(operand)
        ctx.xx, ctx.kind, ctx.sink = xx, kind, sink
        return value.clone()

    @staticmethod
    def backward(ctx, grad):
        # Detached: the saved operand carries this node in its graph, and ``sink`` is reachable from this
        # node's ctx, so keeping the attached tensor would make a cycle through the autograd graph that
        # Python's garbage collector cannot see (every training step's graph would stay in memory).
        operand = ctx.saved_tensors[0].detach()
        xx = ctx.xx
        if ctx.kind == "m":  # value = operand @ xx: d xx = operand^T grad, an outer product (I) x (2H)
            ctx.sink.append((operand.transpose(-1, -2), grad))
            return torch.matmul(grad, xx.transpose(-1, -2)), None, None, None, None
        ctx.sink.append((grad, operand.transpose(-1, -2)))  # value = xx @ operand: d xx = grad operand^T
        return matvec(xx.transpose(-1, -2), grad), None, None, None, None


class _EMFunction(torch.autograd.Function):
    """EM routing with a lean backward (same values and gradients as autograd through :func:`_route`).

    Every use of the votes is a product with ``xx``, so ``d loss / d xx`` is a sum of 2 * iterations - 1
    outer products. Autograd would materialise and add a full (B, J, I, 2H) tensor for each; here the
    backward replays the small-tensor part of the procedure from the saved product values, collects the
    outer-product factors and forms ``d xx`` with one matrix product of inner size 2 * iterations - 1.
    """

    @staticmethod
    def forward(ctx, v, a_in, beta_v, beta_a, lambdas, eps, cost_normalization, detach_assignments, groups):
        c, xx = _shifted_votes(v, a_in, eps)
        values, plain = [], _matmul_contract(xx)

        def record(kind, operand):
            values.append(plain(kind, operand))
            return values[-1]

        ctx.settings = (lambdas, eps, cost_normalization, detach_assignments, groups)
        ctx.values = values
        out = _route(c, record, a_in, beta_v, beta_a, *ctx.settings)
        ctx.save_for_backward(c, xx, a_in, beta_v, beta_a)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_mu, g_a, g_r):
        c, xx, a_in, beta_v, beta_a = ctx.saved_tensors
        replayed, sink = iter(ctx.values), []
        leaves = [t.detach().requires_grad_() for t in (a_in, beta_v, beta_a)]
        with torch.enable_grad():
            out = _route(c, lambda kind, op: _Replay.apply(op, next(replayed), xx, kind, sink), *leaves,
                         *ctx.settings)
            pairs = [(o, g) for o, g in zip(out, (g_mu, g_a, g_r)) if g is not None and o.requires_grad]
            grads = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
        grad_v = None
        if sink and ctx.needs_input_grad[0]:
            left = torch.cat([lhs for lhs, _ in sink], dim=-1)  # (B, J, I, K)
            g1, g2 = torch.matmul(left, torch.cat([rhs for _, rhs in sink], dim=-2)).chunk(2, dim=-1)
            h = g1.shape[-1]
            grad_v = torch.addcmul(g1, xx[..., :h], g2, value=2.0)  # through xx = [x, x^2], x = v - c
        return (grad_v, *grads, None, None, None, None, None)


def em_routing(
    votes: Tensor,
    activations: Tensor,
    beta_v: Tensor | float,
    beta_a: Tensor | float,
    iterations: int = 3,
    *,
    inverse_temperature: float | Sequence[float] | None = None,
    return_assignments: bool = False,
    eps: float = 1e-6,
    cost_normalization: str | None = None,
    detach_assignments: bool = False,
    child_groups: ChildGroups | None = None,
) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """Route child votes to parent matrix capsules by EM (Procedure 1 of Hinton et al. 2018).

    Args:
        votes: votes ``V[i, j] = M_i W_ij`` of every child for every parent, pose flattened to ``H``.
        activations: child activations ``a_i`` in ``[0, 1]``.
        beta_v: per-parent cost of describing a pose component by its variance, shape ``(J,)`` or scalar.
        beta_a: per-parent activation offset, shape ``(J,)`` or scalar.
        iterations: EM iterations (>= 1; the paper uses 3). The last one is an M-step only.
        inverse_temperature: ``lambda``: ``None`` for the default schedule (module docstring), a number
            for every iteration, or a sequence of ``iterations`` numbers.
        return_assignments: also return the assignments ``R`` used by the final M-step.
        eps: variance floor added to ``sigma^2`` and guard on ``sum_i R'`` (module docstring).
        cost_normalization: ``None`` (the paper), ``"mean_std"`` (standardise the cost across parents) or
            ``"mass"`` (divide it by ``I H / J``: a per-layer inverse temperature; module docstring).
        detach_assignments: compute the assignments of the non-final iterations without gradient, so
            gradients flow only through the final M-step (the assignments act as constants, as the
            couplings do in dynamic routing's ``detach`` mode). Same forward values; a cheaper backward
            and no stored intermediates for those iterations. Off by default (exact gradients).
        child_groups: for the routing problems of a convolutional capsule layer (batch and output
            positions folded into ``B``), which child slots are copies of one child
            (:func:`~capsnets.functional.child_groups.grid_child_groups`): each child's assignments are
            then normalised over every parent of every problem that holds it, and start uniform over
            them (Gritzman 2019, pitfall 3). ``None``: each slot is its own child (the softmax over ``J``).

    Shape:
        - votes: ``(B, I, J, H)``; activations: ``(B, I)``; beta_v, beta_a: ``(J,)`` or ``()``.
        - output: poses ``(B, J, H)``, activations ``(B, J)`` in ``(0, 1)``; assignments ``(B, I, J)``,
          summing to 1 over ``J`` (with ``child_groups``: over the parents of all the child's slots).
          float32 for half-precision inputs, the input dtype otherwise.
    """
    _check_inputs(votes, activations, iterations, eps, cost_normalization)
    if child_groups is not None and (not isinstance(child_groups, ChildGroups)
                                     or tuple(child_groups.index.shape) != tuple(votes.shape[:2])):
        got = tuple(child_groups.index.shape) if isinstance(child_groups, ChildGroups) else type(child_groups).__name__
        raise ValueError(f"child_groups must be a ChildGroups whose index has the votes' (B, I) = "
                         f"{tuple(votes.shape[:2])}; got {got}")
    lambdas = _resolve_lambdas(inverse_temperature, int(iterations))
    dtype = votes.dtype if votes.dtype in (torch.float32, torch.float64) else torch.float32
    with torch.autocast(device_type=votes.device.type, enabled=False):
        v = votes.to(dtype).permute(0, 2, 1, 3).contiguous()  # (B, J, I, H)
        a_in = activations.to(dtype).unsqueeze(1)  # (B, 1, I)
        beta_v = _check_beta(beta_v, "beta_v", v.shape[1], v)  # (J,) or (1,)
        beta_a = _check_beta(beta_a, "beta_a", v.shape[1], v)
        lean = torch.is_grad_enabled() and not torch.compiler.is_compiling() and any(
            t.requires_grad for t in (v, a_in, beta_v, beta_a))
        if lean:  # eager training: the lean backward of _EMFunction
            mu, a_out, r = _EMFunction.apply(v, a_in, beta_v, beta_a, lambdas, eps, cost_normalization,
                                             detach_assignments, child_groups)
        else:  # inference, or traced by torch.compile: plain autograd through the same procedure
            c, xx = _shifted_votes(v, a_in, eps)  # (B, J, 1, H), (B, J, I, 2H)
            mu, a_out, r = _route(c, _matmul_contract(xx), a_in, beta_v, beta_a, lambdas, eps,
                                  cost_normalization, detach_assignments, child_groups)
    if return_assignments:
        return mu, a_out, r.transpose(1, 2)
    return mu, a_out


class EMRouting:
    """EM routing as a value to pass to a matrix capsule layer.

    Args:
        iterations: EM iterations (>= 1).
        inverse_temperature: ``lambda`` schedule (see :func:`em_routing`).
        eps: variance floor and mass guard (see :func:`em_routing`).
        cost_normalization: ``None``, ``"mean_std"`` or ``"mass"`` (see :func:`em_routing`).
        detach_assignments: gradients only through the final M-step (see :func:`em_routing`).

    Shape:
        ``votes (B, I, J, H), activations (B, I), beta_v (J,), beta_a (J,) -> (B, J, H), (B, J)``
    """

    #: takes ``child_groups`` (a convolutional layer's ``assignment_scope="all_parents"`` needs it)
    supports_child_groups = True

    def __init__(
        self,
        iterations: int = 3,
        inverse_temperature: float | Sequence[float] | None = None,
        *,
        eps: float = 1e-6,
        cost_normalization: str | None = None,
        detach_assignments: bool = False,
    ) -> None:
        _check_settings(iterations, eps, cost_normalization)
        self.iterations = int(iterations)
        self.inverse_temperatures = _resolve_lambdas(inverse_temperature, self.iterations)
        self.eps = eps
        self.cost_normalization = cost_normalization
        self.detach_assignments = bool(detach_assignments)

    def __call__(self, votes, activations, beta_v, beta_a, return_assignments: bool = False,
                 child_groups: ChildGroups | None = None):
        return em_routing(
            votes, activations, beta_v, beta_a, self.iterations,
            inverse_temperature=self.inverse_temperatures, return_assignments=return_assignments,
            eps=self.eps, cost_normalization=self.cost_normalization,
            detach_assignments=self.detach_assignments, child_groups=child_groups,
        )

    def __repr__(self) -> str:
        lams = ", ".join(f"{x:.3g}" for x in self.inverse_temperatures)
        return (
            f"EMRouting(iterations={self.iterations}, inverse_temperature=[{lams}], eps={self.eps}, "
            f"cost_normalization={self.cost_normalization!r}, detach_assignments={self.detach_assignments})"
        )
