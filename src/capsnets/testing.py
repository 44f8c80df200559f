"""Reference implementations and assertion helpers shared by the tests, the benchmarks and users.

- :func:`reference_dynamic_routing`: Procedure 1 of Sabour et al. (2017) written literally, one example,
  child and parent at a time, in Python loops. Slow; the oracle the fast path must agree with.
- :class:`NaiveDynamicRouting`: the common vectorised-but-naive way (broadcast ``(B, I, J, D)``
  products every iteration, gradients through every iteration); the baseline the benchmarks time.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def _squash_vector(s: list[float]) -> list[float]:
    sq = sum(x * x for x in s)
    if sq == 0.0:
        return [0.0 for _ in s]
    scale = sq / (1.0 + sq) / math.sqrt(sq)
    return [scale * x for x in s]


def reference_dynamic_routing(u_hat: Tensor, iterations: int) -> tuple[Tensor, Tensor]:
    """Procedure 1, literally: returns ``(v (B, J, D), couplings (B, I, J))`` as float64."""
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


class NaiveDynamicRouting:
    """Dynamic routing as public implementations usually write it (the benchmarks' baseline).

    Shape:
        ``(B, I, J, D) -> (B, J, D)``
    """

    def __init__(self, iterations: int = 3) -> None:
        self.iterations = iterations

    def __call__(self, u_hat: Tensor, *, return_couplings: bool = False):
        b = torch.zeros(*u_hat.shape[:3], 1, device=u_hat.device, dtype=u_hat.dtype)  # (B, I, J, 1)
        for r in range(self.iterations):
            c = torch.softmax(b, dim=2)
            s = (c * u_hat).sum(dim=1, keepdim=True)  # (B, 1, J, D)
            sq = (s * s).sum(dim=-1, keepdim=True)
            v = sq / (1.0 + sq) * s / torch.sqrt(sq + 1e-8)
            if r < self.iterations - 1:
                b = b + (u_hat * v).sum(dim=-1, keepdim=True)
        v = v.squeeze(1)
        return (v, c.squeeze(-1)) if return_couplings else v

    def __repr__(self) -> str:
        return f"NaiveDynamicRouting(iterations={self.iterations})"


def assert_finite(tensor: Tensor, what: str = "tensor") -> None:
    """Raise AssertionError naming ``what`` if ``tensor`` holds NaN or inf."""
    bad = ~torch.isfinite(tensor)
    if bad.any():
        raise AssertionError(f"{what} has {int(bad.sum())} non-finite values of {tensor.numel()}")
