"""Literal float64 reference implementations of the routing procedures: oracles for tests.

Each function follows its source procedure loop by loop (one example, child and parent at a time, in plain
Python floats) and returns float64 tensors. They are slow and meant for small inputs: the library's fast
routings are tested against them, and users can test their own routings or layers the same way, e.g.
``torch.testing.assert_close(my_routing(u_hat.double()), reference_dynamic_routing(u_hat, 3)[0])``.

- :func:`reference_dynamic_routing`: routing by agreement, Sabour, Frosst & Hinton (2017), "Dynamic
  Routing Between Capsules", Procedure 1, optionally with the "none-of-the-above" parent of its Sec. 7.
- :func:`reference_local_dynamic_routing`: the same procedure run independently at every position of a
  convolutional capsule grid (LaLonde & Bagci (2018), "Capsules for Object Segmentation", Sec. 3.1).
- :func:`reference_em_routing`: EM routing, Hinton, Sabour & Frosst (2018), "Matrix capsules with EM
  routing", Procedure 1; with ``variance_floor`` set, the equations of the authors' released code instead
  (google-research/google-research, ``capsule_em/em_layers.py``, ``update_em_routing``).
- :func:`reference_conv_em_routing`: a convolutional matrix capsule layer with EM routing over the capsule
  grid, with each of the ways to normalise a child's assignments (per position, over all the parents whose
  receptive fields hold it, or per parent type as in the released code).
- :func:`reference_uniform_routing`, :func:`reference_self_attention_routing` (Mazzia, Salvetti & Chiaberge
  (2021), "Efficient-CapsNet"), :func:`reference_inverted_attention_routing` (Tsai et al. (2020),
  "Capsules with Inverted Dot-Product Attention Routing", Procedure 1), :func:`reference_self_routing` (Hahn,
  Pyeon & Kim (2019), "Self-Routing Capsule Networks"): the non-iterative and attention routings.
- :func:`reference_heinsen_routing`: Heinsen (2019), "An Algorithm for Routing Capsules in All Domains",
  Algorithm 1 (D-, M- and E-steps with the net benefit of using or ignoring each child).
- :func:`reference_homogeneous_vector_capsules`: Byerly, Kalganova & Dear (2021), "No Routing Needed Between
  Capsules", Sec. 3: each parent the sum of the element-wise products of the children with their weights.

The EM references use the safety floors of :func:`capsnets.functional.em_routing`: in the paper's
procedure ``eps`` is added to every variance and to every ``sum_i R'`` denominator; ``log a_j`` is the
log-sigmoid of the pre-activation.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "reference_heinsen_routing",
    "reference_homogeneous_vector_capsules",
    "reference_dynamic_routing",
    "reference_local_dynamic_routing",
    "reference_em_routing",
    "reference_conv_em_routing",
    "reference_uniform_routing",
    "reference_self_attention_routing",
    "reference_inverted_attention_routing",
    "reference_self_routing",
]


def _squash_vector(s: list[float]) -> list[float]:
    sq = sum(x * x for x in s)
    if sq == 0.0:
        return [0.0 for _ in s]
    scale = sq / (1.0 + sq) / math.sqrt(sq)
    return [scale * x for x in s]


def reference_dynamic_routing(
    u_hat: Tensor, iterations: int, *, none_of_the_above: bool = False
) -> tuple[Tensor, Tensor]:
    """Dynamic routing (Sabour et al. 2017, Procedure 1), literally.

    With ``none_of_the_above`` (Sec. 7) every child's logits have one more entry, ``b[i][J]``, which starts at
    0 and is never updated (the extra parent has no capsule to agree with), and each softmax runs over all
    ``J + 1`` (the authors' released code, Sarasra/models ``research/capsules/models/layers/layers.py``,
    ``_leaky_routing``).

    Shape:
        ``u_hat (B, I, J, D)``, each child's prediction for each parent -> ``v (B, J, D)``, the parent
        capsules, and ``couplings (B, I, J)`` of the last iteration (``(B, I, J + 1)`` with
        ``none_of_the_above``, the extra parent last), both float64.
    """
    u = u_hat.detach().double().tolist()
    out_v, out_c = [], []
    for ub in u:  # one example at a time; logits reset per example
        children, parents, dim = len(ub), len(ub[0]), len(ub[0][0])
        routes = parents + 1 if none_of_the_above else parents  # softmax entries per child
        b = [[0.0] * routes for _ in range(children)]
        for _ in range(iterations):
            c = []
            for i in range(children):
                exps = [math.exp(b[i][j] - max(b[i])) for j in range(routes)]
                c.append([e / sum(exps) for e in exps])
            v = []
            for j in range(parents):
                s = [sum(c[i][j] * ub[i][j][d] for i in range(children)) for d in range(dim)]
                v.append(_squash_vector(s))
            for i in range(children):
                for j in range(parents):
                    b[i][j] += sum(ub[i][j][d] * v[j][d] for d in range(dim))
        out_v.append(v)
        out_c.append(c)
    return torch.tensor(out_v, dtype=torch.float64), torch.tensor(out_c, dtype=torch.float64)


def reference_local_dynamic_routing(u_hat: Tensor, iterations: int) -> tuple[Tensor, Tensor]:
    """Local dynamic routing (LaLonde & Bagci 2018, Sec. 3.1), literally.

    Per example, logits ``b[i][h][w][j]`` start at zero; each iteration takes the softmax over parents at
    every ``(i, h, w)``, sums and squashes per position, and adds the agreement.

    Shape:
        ``u_hat (B, I, J, D, H, W)`` -> ``v (B, J, D, H, W)`` and ``couplings (B, I, J, H, W)``, both float64.
    """
    u = u_hat.detach().double().tolist()  # [b][i][j][d][h][w]
    out_v, out_c = [], []
    for ub in u:
        children, parents, dim = len(ub), len(ub[0]), len(ub[0][0])
        height, width = len(ub[0][0][0]), len(ub[0][0][0][0])
        b = [[[[0.0] * parents for _ in range(width)] for _ in range(height)] for _ in range(children)]
        for _ in range(iterations):
            c = [[[None] * width for _ in range(height)] for _ in range(children)]
            for i in range(children):
                for h in range(height):
                    for w in range(width):
                        top = max(b[i][h][w])
                        exps = [math.exp(x - top) for x in b[i][h][w]]
                        c[i][h][w] = [e / sum(exps) for e in exps]
            v = [[[None] * width for _ in range(height)] for _ in range(parents)]
            for j in range(parents):
                for h in range(height):
                    for w in range(width):
                        s = [sum(c[i][h][w][j] * ub[i][j][d][h][w] for i in range(children)) for d in range(dim)]
                        v[j][h][w] = _squash_vector(s)
            for i in range(children):
                for h in range(height):
                    for w in range(width):
                        for j in range(parents):
                            b[i][h][w][j] += sum(ub[i][j][d][h][w] * v[j][h][w][d] for d in range(dim))
        out_v.append(
            [
                [[[v[j][h][w][d] for w in range(width)] for h in range(height)] for d in range(dim)]
                for j in range(parents)
            ]
        )
        out_c.append(
            [
                [[[c[i][h][w][j] for w in range(width)] for h in range(height)] for j in range(parents)]
                for i in range(children)
            ]
        )
    return torch.tensor(out_v, dtype=torch.float64), torch.tensor(out_c, dtype=torch.float64)


def _log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _sigmoid(x: float) -> float:
    return math.exp(_log_sigmoid(x))


def _em_m_step(votes: dict, acts, R: dict, bv: float, ba: float, lam: float, eps: float, official=None):
    """The M-step of one parent over its children (the keys of ``votes`` and ``R``; ``acts[i]`` is child
    ``i``'s activation): its ``mu``, ``sigma^2`` (with the floor) and pre-activation.

    ``official=(mu_prev, floor)``: the released code's equations (google-research ``capsule_em/em_layers.py``,
    ``update_em_routing``): mass ``sum_i R' + eps``, centre ``0.9 mean + 0.1 mu_prev``, variance about that
    centre plus ``floor``, logit ``lam (mass (-sum_h log var_h - bv H (1 + log 2 pi)) - 5000 ba)``."""
    rp = {i: R[i] * acts[i] for i in votes}
    dim = len(next(iter(votes.values())))
    if official is not None:
        mu_prev, floor = official
        mass = sum(rp.values()) + eps
        mu = [0.9 * sum(rp[i] * votes[i][h] for i in votes) / mass + 0.1 * mu_prev[h] for h in range(dim)]
        var = [floor + sum(rp[i] * (votes[i][h] - mu[h]) ** 2 for i in votes) / mass for h in range(dim)]
        win = mass * (-sum(math.log(v) for v in var) - bv * dim * (1.0 + math.log(2 * math.pi)))
        return mu, var, lam * (win - 5000.0 * ba)
    mass = sum(rp.values())
    mu = [sum(rp[i] * votes[i][h] for i in votes) / (mass + eps) for h in range(dim)]
    var = [sum(rp[i] * (votes[i][h] - mu[h]) ** 2 for i in votes) / (mass + eps) + eps for h in range(dim)]
    cost = sum((bv + math.log(math.sqrt(var[h]))) * mass for h in range(dim))
    return mu, var, lam * (ba - cost)


def _em_log_p(x: list[float], mu: list[float], var: list[float]) -> float:
    """``log prod_h N(x_h; mu_h, var_h)``."""
    return sum(-0.5 * math.log(2 * math.pi * v) - (xh - m) ** 2 / (2 * v) for xh, m, v in zip(x, mu, var))


def reference_em_routing(
    votes: Tensor,
    activations: Tensor,
    beta_v: Tensor,
    beta_a: Tensor,
    iterations: int,
    inverse_temperatures: list[float],
    eps: float,
    variance_floor: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Procedure 1, literally: returns ``(mu (B, J, H), a (B, J), R (B, I, J))`` as float64.

    ``votes`` ``(B, I, J, H)``, ``activations`` ``(B, I)``, ``beta_v``/``beta_a`` ``(J,)`` or scalars,
    ``inverse_temperatures`` one lambda per iteration; ``R`` is the assignment used by the final M-step.
    ``variance_floor`` None: the paper's procedure (``eps`` is floor and guard); a number: the released
    code's equations with that floor and mass guard ``eps`` (see ``_em_m_step``).
    """
    V = votes.detach().double().tolist()
    A = activations.detach().double().tolist()
    parents = len(V[0][0])
    dim = len(V[0][0][0])
    bv = [float(x) for x in torch.as_tensor(beta_v).double().flatten().expand(parents)]
    ba = [float(x) for x in torch.as_tensor(beta_a).double().flatten().expand(parents)]
    out_mu, out_a, out_r = [], [], []
    for vb, ab in zip(V, A):  # one example at a time
        children = len(vb)
        R = [[1.0 / parents] * parents for _ in range(children)]
        mu = [[0.0] * dim for _ in range(parents)]  # the official formulation's centres start at 0
        for t in range(iterations):
            # M-step, for each parent j
            stats = [
                _em_m_step(
                    {i: vb[i][j] for i in range(children)},
                    ab,
                    {i: R[i][j] for i in range(children)},
                    bv[j],
                    ba[j],
                    inverse_temperatures[t],
                    eps,
                    None if variance_floor is None else (mu[j], variance_floor),
                )
                for j in range(parents)
            ]
            mu, var = [m for m, _, _ in stats], [v for _, v, _ in stats]
            act = [_sigmoid(pre) for _, _, pre in stats]
            if t == iterations - 1:
                break
            # E-step, for each child i
            for i in range(children):
                logits = [_log_sigmoid(stats[j][2]) + _em_log_p(vb[i][j], mu[j], var[j]) for j in range(parents)]
                top = max(logits)
                exps = [math.exp(z - top) for z in logits]
                R[i] = [e / sum(exps) for e in exps]
        out_mu.append(mu)
        out_a.append(act)
        out_r.append(R)
    as64 = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return as64(out_mu), as64(out_a), as64(out_r)


def reference_conv_em_routing(
    pose: Tensor,
    activation: Tensor,
    weight: Tensor,
    beta_v: Tensor,
    beta_a: Tensor,
    *,
    stride: int,
    padding: int,
    inverse_temperatures: list[float],
    eps: float,
    scope: str,
    variance_floor: float | None = None,
) -> tuple[Tensor, Tensor]:
    """A convolutional matrix capsule layer with EM routing, literally, one example and capsule at a time.

    Children are the capsules ``(t, y, x)`` of the input grid, parents the capsules ``(y', x', u)`` of the
    output grid; a child belongs to every parent whose ``K x K`` receptive field (zero padding, stride)
    holds it, with the vote ``M[t, y, x] @ W[t, ky, kx, u]``. ``scope="position"``: the child's assignments
    to the parents of each output position are normalised there, starting at ``1 / U``;
    ``scope="all_parents"``: they are normalised over all its parents, starting uniform over them;
    ``scope="per_type"``: for each parent type, they are normalised over the positions that see the child,
    starting at ``1 / U`` (the released code's normalisation). ``variance_floor``: the released code's
    equations with that floor (see :func:`reference_em_routing`).

    Shape:
        pose ``(B, T, H, W, P, P)``, activation ``(B, T, H, W)``, weight ``(T, K, K, U, P, P)``,
        beta_v / beta_a ``(U,)`` -> poses ``(B, U, H', W', P*P)`` and activations ``(B, U, H', W')`` (float64).
    """
    types, height, width = activation.shape[1:]
    kernel, parents_per_position = weight.shape[1], weight.shape[3]
    out_h = (height + 2 * padding - kernel) // stride + 1
    out_w = (width + 2 * padding - kernel) // stride + 1
    bv, ba = beta_v.double().tolist(), beta_a.double().tolist()
    out_mu, out_a = [], []
    for b in range(activation.shape[0]):
        # the parents of each child, and each parent's children with their votes
        votes, acts, of_child = {}, {}, {}
        for oy in range(out_h):
            for ox in range(out_w):
                for t in range(types):
                    for ky in range(kernel):
                        for kx in range(kernel):
                            y, x = oy * stride + ky - padding, ox * stride + kx - padding
                            if not (0 <= y < height and 0 <= x < width):
                                continue  # a padding child: activation 0, no part in routing
                            child = (t, y, x)
                            acts[child] = float(activation[b, t, y, x])
                            for u in range(parents_per_position):
                                vote = (pose[b, t, y, x].double() @ weight[t, ky, kx, u].double()).flatten()
                                votes.setdefault((oy, ox, u), {})[child] = vote.tolist()
                                of_child.setdefault(child, []).append((oy, ox, u))
        R = {
            child: {p: 1.0 / (len(ps) if scope == "all_parents" else parents_per_position) for p in ps}
            for child, ps in of_child.items()
        }
        dim = pose.shape[-1] * pose.shape[-2]
        stats = {p: ([0.0] * dim, None, None) for p in votes}  # the official centres start at 0
        for t, lam in enumerate(inverse_temperatures):
            stats = {
                p: _em_m_step(
                    vp,
                    acts,
                    {c: R[c][p] for c in vp},
                    bv[p[2]],
                    ba[p[2]],
                    lam,
                    eps,
                    None if variance_floor is None else (stats[p][0], variance_floor),
                )
                for p, vp in votes.items()
            }
            if t == len(inverse_temperatures) - 1:
                break
            for child, ps in of_child.items():
                logits = {p: _log_sigmoid(stats[p][2]) + _em_log_p(votes[p][child], *stats[p][:2]) for p in ps}
                if scope == "all_parents":
                    groups = [ps]
                elif scope == "per_type":
                    groups = [[p for p in ps if p[2] == q[2]] for q in ps]
                else:
                    groups = [[p for p in ps if p[:2] == q[:2]] for q in ps]
                for group in groups:
                    top = max(logits[p] for p in group)
                    total = sum(math.exp(logits[p] - top) for p in group)
                    for p in group:
                        R[child][p] = math.exp(logits[p] - top) / total
        out_mu.append(
            [
                [[stats[(oy, ox, u)][0] for ox in range(out_w)] for oy in range(out_h)]
                for u in range(parents_per_position)
            ]
        )
        out_a.append(
            [
                [[_sigmoid(stats[(oy, ox, u)][2]) for ox in range(out_w)] for oy in range(out_h)]
                for u in range(parents_per_position)
            ]
        )
    return torch.tensor(out_mu, dtype=torch.float64), torch.tensor(out_a, dtype=torch.float64)


def _efficient_squash_vector(s: list[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in s))
    if n == 0.0:
        return [0.0 for _ in s]
    return [(1.0 - 1.0 / math.exp(n)) * x / n for x in s]


def _squash_by_name(kind: str, s: list[float]) -> list[float]:
    return _squash_vector(s) if kind == "sabour" else _efficient_squash_vector(s)


def _softmax(x: list[float]) -> list[float]:
    exps = [math.exp(value - max(x)) for value in x]
    return [e / sum(exps) for e in exps]


def reference_uniform_routing(u_hat: Tensor, *, mean: bool = False, squash: str = "sabour") -> tuple[Tensor, Tensor]:
    """Uniform coupling (no routing), literally: ``v_j = squash(sum_i c u_hat[j|i])`` with ``c = 1/J``
    (``1/I`` with ``mean``); ``squash`` is ``"sabour"`` or ``"efficient"``.

    Shape:
        ``u_hat (B, I, J, D)`` -> ``v (B, J, D)`` and ``couplings (B, I, J)``, both float64.
    """
    out_v, out_c = [], []
    for ub in u_hat.detach().double().tolist():
        children, parents, dim = len(ub), len(ub[0]), len(ub[0][0])
        c = 1.0 / (children if mean else parents)
        out_v.append(
            [
                _squash_by_name(squash, [sum(c * ub[i][j][d] for i in range(children)) for d in range(dim)])
                for j in range(parents)
            ]
        )
        out_c.append([[c] * parents for _ in range(children)])
    return torch.tensor(out_v, dtype=torch.float64), torch.tensor(out_c, dtype=torch.float64)


def reference_self_attention_routing(
    u_hat: Tensor, bias: Tensor | None = None, *, squash: str = "efficient"
) -> tuple[Tensor, Tensor]:
    """Self-attention routing (Mazzia et al. 2021, Efficient-CapsNet), literally: per example and
    parent ``j``, ``A_ij = sum_k u_hat[j|i] . u_hat[j|k]``; ``c_ij = softmax_j(A_ij / sqrt(D))``;
    ``v_j = squash(sum_i (c_ij + b_ij) u_hat[j|i])``.

    Shape:
        ``u_hat (B, I, J, D)``, ``bias (I, J)`` -> ``v (B, J, D)`` and the couplings ``c + b`` ``(B, I, J)``.
    """
    b = bias.detach().double().tolist() if bias is not None else None
    out_v, out_c = [], []
    for ub in u_hat.detach().double().tolist():
        children, parents, dim = len(ub), len(ub[0]), len(ub[0][0])
        logits = [
            [
                sum(sum(ub[i][j][d] * ub[k][j][d] for d in range(dim)) for k in range(children)) / math.sqrt(dim)
                for j in range(parents)
            ]
            for i in range(children)
        ]
        c = [_softmax(logits[i]) for i in range(children)]
        if b is not None:
            c = [[c[i][j] + b[i][j] for j in range(parents)] for i in range(children)]
        out_v.append(
            [
                _squash_by_name(squash, [sum(c[i][j] * ub[i][j][d] for i in range(children)) for d in range(dim)])
                for j in range(parents)
            ]
        )
        out_c.append(c)
    return torch.tensor(out_v, dtype=torch.float64), torch.tensor(out_c, dtype=torch.float64)


def reference_inverted_attention_routing(
    u_hat: Tensor,
    iterations: int,
    *,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    parents: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Inverted dot-product attention routing (Tsai et al. 2020, Procedure 1), literally: poses ``v`` start at
    ``parents`` or zero; each iteration ``c_ij = softmax_j(u_hat[j|i] . v_j / sqrt(D))``,
    ``v_j = LayerNorm(sum_i c_ij u_hat[j|i])`` (biased variance, ``eps``, then ``* weight + bias``); the
    ``1/sqrt(D)`` is the authors' code's (``src/layers.py``, ``CapsuleFC``).

    Shape:
        ``u_hat (B, I, J, D)``, ``weight``/``bias (D,)``, ``parents (B, J, D)`` -> ``v (B, J, D)`` and the
        couplings of the last iteration ``(B, I, J)``.
    """
    out_v, out_c = [], []
    for example, ub in enumerate(u_hat.detach().double().tolist()):
        children, num_parents, dim = len(ub), len(ub[0]), len(ub[0][0])
        g = weight.detach().double().tolist() if weight is not None else [1.0] * dim
        h = bias.detach().double().tolist() if bias is not None else [0.0] * dim
        v = parents[example].detach().double().tolist() if parents is not None else [[0.0] * dim] * num_parents
        for _ in range(iterations):
            c = [
                _softmax([sum(ub[i][j][d] * v[j][d] for d in range(dim)) / math.sqrt(dim) for j in range(num_parents)])
                for i in range(children)
            ]
            v = []
            for j in range(num_parents):
                s = [sum(c[i][j] * ub[i][j][d] for i in range(children)) for d in range(dim)]
                mu = sum(s) / dim
                var = sum((x - mu) ** 2 for x in s) / dim
                v.append([(s[d] - mu) / math.sqrt(var + eps) * g[d] + h[d] for d in range(dim)])
        out_v.append(v)
        out_c.append(c)
    return torch.tensor(out_v, dtype=torch.float64), torch.tensor(out_c, dtype=torch.float64)


def reference_self_routing(
    u_hat: Tensor, poses: Tensor, weight: Tensor, bias: Tensor, activations: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Self-routing (Hahn et al. 2019), literally, for vector capsules: ``c_ij = softmax_j(W_ij . u_i +
    beta_ij)``; ``a_i = |u_i|`` unless given; ``a_j = sum_i c_ij a_i / sum_i a_i``; ``p_j = sum_i c_ij a_i
    u_hat[j|i] / sum_i c_ij a_i``; ``v_j = a_j p_j / |p_j|`` (zero for a zero denominator or pose).

    Shape:
        ``u_hat (B, I, J, D)``, ``poses (B, I, D_in)``, ``weight (I, J, D_in)``, ``bias (I, J)``,
        ``activations (B, I)`` -> ``v (B, J, D)`` and the couplings ``(B, I, J)``.
    """
    w, beta = weight.detach().double().tolist(), bias.detach().double().tolist()
    out_v, out_c = [], []
    for example, ub in enumerate(u_hat.detach().double().tolist()):
        children, parents, dim = len(ub), len(ub[0]), len(ub[0][0])
        u = poses[example].detach().double().tolist()
        a = (
            activations[example].detach().double().tolist()
            if activations is not None
            else [math.sqrt(sum(x * x for x in u[i])) for i in range(children)]
        )
        c = [
            _softmax([sum(w[i][j][k] * u[i][k] for k in range(len(u[i]))) + beta[i][j] for j in range(parents)])
            for i in range(children)
        ]
        total = sum(a)
        v = []
        for j in range(parents):
            mass = sum(c[i][j] * a[i] for i in range(children))
            a_j = mass / total if total != 0 else 0.0
            p = [
                sum(c[i][j] * a[i] * ub[i][j][d] for i in range(children)) / mass if mass != 0 else 0.0
                for d in range(dim)
            ]
            length = math.sqrt(sum(x * x for x in p))
            v.append([a_j * x / length if length != 0 else 0.0 for x in p])
        out_v.append(v)
        out_c.append(c)
    return torch.tensor(out_v, dtype=torch.float64), torch.tensor(out_c, dtype=torch.float64)


def reference_heinsen_routing(
    u_hat: Tensor, activations: Tensor, beta_use: Tensor, beta_ign: Tensor, iterations: int = 3, eps: float = 1e-5
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Heinsen's routing (2019, Algorithm 1), literally: ``R_ij = 1/J`` at the start; each iteration
    ``D_use_ij = f(a_i) R_ij``, ``D_ign_ij = f(a_i) - D_use_ij`` (``f`` the sigmoid), ``a_j = sum_i beta_use_ij
    D_use_ij - sum_i beta_ign_ij D_ign_ij``, ``mu_j`` and ``sigma2_j`` the ``D_use``-weighted mean and variance
    of the votes (``eps`` added to the weights' sum and to the variance); between iterations ``R_ij =
    softmax_j(log f(a_j) + sum_d [-(V_ijd - mu_jd)^2 / (2 sigma2_jd) - log sqrt(sigma2_jd)])``.

    Shape:
        ``u_hat (B, I, J, D)``, ``activations (B, I)``, ``beta_use``, ``beta_ign`` ``(I, J)`` or ``(1, J)`` ->
        scores ``(B, J)``, mu and sigma2 ``(B, J, D)``, the couplings of the last M-step ``(B, I, J)``.
    """
    use_b, ign_b = beta_use.detach().double().tolist(), beta_ign.detach().double().tolist()
    out = {"scores": [], "mu": [], "sigma2": [], "R": []}
    for example, votes in enumerate(u_hat.detach().double().tolist()):
        children, parents, dim = len(votes), len(votes[0]), len(votes[0][0])
        f = [_sigmoid(x) for x in activations[example].detach().double().tolist()]
        R = [[1.0 / parents] * parents for _ in range(children)]
        scores: list[float] = []
        mu: list[list[float]] = []
        sigma2: list[list[float]] = []
        for iteration in range(iterations):
            if iteration:
                R = []
                for i in range(children):
                    logits = []
                    for j in range(parents):
                        log_p = sum(
                            -((votes[i][j][d] - mu[j][d]) ** 2) / (2 * sigma2[j][d]) - math.log(math.sqrt(sigma2[j][d]))
                            for d in range(dim)
                        )
                        logits.append(_log_sigmoid(scores[j]) + log_p)
                    R.append(_softmax(logits))
            scores, mu, sigma2 = [], [], []
            for j in range(parents):
                use = [f[i] * R[i][j] for i in range(children)]
                ignore = [f[i] - use[i] for i in range(children)]
                rows = [i if len(use_b) > 1 else 0 for i in range(children)]  # (1, J): shared by the children
                scores.append(
                    sum(use_b[rows[i]][j] * use[i] for i in range(children))
                    - sum(ign_b[rows[i]][j] * ignore[i] for i in range(children))
                )
                total = sum(use) + eps
                m = [sum(use[i] * votes[i][j][d] for i in range(children)) / total for d in range(dim)]
                mu.append(m)
                sigma2.append(
                    [
                        sum(use[i] * (votes[i][j][d] - m[d]) ** 2 for i in range(children)) / total + eps
                        for d in range(dim)
                    ]
                )
        for key, value in zip(out, (scores, mu, sigma2, R)):
            out[key].append(value)
    return tuple(torch.tensor(out[key], dtype=torch.float64) for key in out)


def reference_homogeneous_vector_capsules(u: Tensor, weight: Tensor) -> Tensor:
    """Homogeneous vector capsules (Byerly et al. 2021), literally: ``s_jd = sum_i weight_jid u_id``.

    Shape:
        ``u (B, I, D)``, ``weight (J, I, D)`` -> ``(B, J, D)``.
    """
    w = weight.detach().double().tolist()
    out = []
    for example in u.detach().double().tolist():
        out.append(
            [
                [sum(w[j][i][d] * example[i][d] for i in range(len(example))) for d in range(len(example[0]))]
                for j in range(len(w))
            ]
        )
    return torch.tensor(out, dtype=torch.float64)
