"""Literal float64 reference implementations of the routing procedures: oracles for tests.

Each function follows its source procedure loop by loop (one example, child and parent at a time, in plain
Python floats) and returns float64 tensors. They are slow and meant for small inputs: the library's fast
routings are tested against them, and users can test their own routings or layers the same way, e.g.
``torch.testing.assert_close(my_routing(u_hat.double()), reference_dynamic_routing(u_hat, 3)[0])``.

- :func:`reference_dynamic_routing`: routing by agreement, Sabour, Frosst & Hinton (2017), "Dynamic
  Routing Between Capsules", Procedure 1.
- :func:`reference_local_dynamic_routing`: the same procedure run independently at every position of a
  convolutional capsule grid (LaLonde & Bagci (2018), "Capsules for Object Segmentation", Sec. 3.1).
- :func:`reference_em_routing`: EM routing, Hinton, Sabour & Frosst (2018), "Matrix capsules with EM
  routing", Procedure 1; with ``variance_floor`` set, the equations of the authors' released code instead
  (google-research/google-research, ``capsule_em/em_layers.py``, ``update_em_routing``).
- :func:`reference_conv_em_routing`: a convolutional matrix capsule layer with EM routing over the capsule
  grid, with each of the ways to normalise a child's assignments (per position, over all the parents whose
  receptive fields hold it, or per parent type as in the released code).

The EM references use the safety floors of :func:`capsnets.functional.em_routing`: in the paper's
procedure ``eps`` is added to every variance and to every ``sum_i R'`` denominator; ``log a_j`` is the
log-sigmoid of the pre-activation.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["reference_dynamic_routing", "reference_local_dynamic_routing", "reference_em_routing",
           "reference_conv_em_routing"]


def _squash_vector(s: list[float]) -> list[float]:
    sq = sum(x * x for x in s)
    if sq == 0.0:
        return [0.0 for _ in s]
    scale = sq / (1.0 + sq) / math.sqrt(sq)
    return [scale * x for x in s]


def reference_dynamic_routing(u_hat: Tensor, iterations: int) -> tuple[Tensor, Tensor]:
    """Dynamic routing (Sabour et al. 2017, Procedure 1), literally.

    Shape:
        ``u_hat (B, I, J, D)``, each child's prediction for each parent -> ``v (B, J, D)``, the parent
        capsules, and ``couplings (B, I, J)`` of the last iteration, both float64.
    """
    u = u_hat.detach().double().tolist()
    out_v, out_c = [], []
    for ub in u:  # one example at a time; logits reset per example
        children, parents, dim = len(ub), len(ub[0]), len(ub[0][0])
        b = [[0.0] * parents for _ in range(children)]
        for _ in range(iterations):
            c = []
            for i in range(children):
                exps = [math.exp(b[i][j] - max(b[i])) for j in range(parents)]
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
        out_v.append([[[[v[j][h][w][d] for w in range(width)] for h in range(height)] for d in range(dim)]
                      for j in range(parents)])
        out_c.append([[[[c[i][h][w][j] for w in range(width)] for h in range(height)] for j in range(parents)]
                      for i in range(children)])
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
    code's equations with that floor and mass guard ``eps`` (see :func:`_em_m_step`).
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
            stats = [_em_m_step({i: vb[i][j] for i in range(children)}, ab, {i: R[i][j] for i in range(children)},
                                bv[j], ba[j], inverse_temperatures[t], eps,
                                None if variance_floor is None else (mu[j], variance_floor)) for j in range(parents)]
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


def reference_conv_em_routing(pose: Tensor, activation: Tensor, weight: Tensor, beta_v: Tensor, beta_a: Tensor, *,
                              stride: int, padding: int, inverse_temperatures: list[float], eps: float,
                              scope: str, variance_floor: float | None = None) -> tuple[Tensor, Tensor]:
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
        R = {child: {p: 1.0 / (len(ps) if scope == "all_parents" else parents_per_position) for p in ps}
             for child, ps in of_child.items()}
        dim = pose.shape[-1] * pose.shape[-2]
        stats = {p: ([0.0] * dim, None, None) for p in votes}  # the official centres start at 0
        for t, lam in enumerate(inverse_temperatures):
            stats = {p: _em_m_step(vp, acts, {c: R[c][p] for c in vp}, bv[p[2]], ba[p[2]], lam, eps,
                                   None if variance_floor is None else (stats[p][0], variance_floor))
                     for p, vp in votes.items()}
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
        out_mu.append([[[stats[(oy, ox, u)][0] for ox in range(out_w)] for oy in range(out_h)]
                       for u in range(parents_per_position)])
        out_a.append([[[_sigmoid(stats[(oy, ox, u)][2]) for ox in range(out_w)] for oy in range(out_h)]
                      for u in range(parents_per_position)])
    return torch.tensor(out_mu, dtype=torch.float64), torch.tensor(out_a, dtype=torch.float64)
