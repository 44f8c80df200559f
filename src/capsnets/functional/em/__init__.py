"""EM routing between matrix capsules.

Hinton, Sabour & Frosst (2018), "Matrix capsules with EM routing", ICLR, Sec. 3, Procedure 1, in two
formulations (``docs/em_formulations.md`` compares them, with the IBM reproduction, line by line).

Dimension legend: ``B`` batch (for a convolutional capsule layer: batch * output positions, folded),
``I`` child capsules (the K*K*types capsules of a receptive field), ``J`` parent capsule types,
``H`` pose components (16 for a 4x4 pose matrix).

``formulation="paper"``, Procedure 1 as printed (one Gaussian cluster per parent over the H components):

- ``R = 1/J``; repeat ``iterations`` times:
  M-step: ``R' = R * a_i``; ``mu = sum_i R' V / sum_i R'``; ``sigma^2 = sum_i R' (V - mu)^2 / sum_i R'``;
  ``cost[j,h] = (beta_v[j] + log sigma[j,h]) * sum_i R'[i,j]``;
  ``a_j = logistic(lambda_t * (beta_a[j] - sum_h cost[j,h]))``.
  E-step (skipped after the last M-step): ``log p[i,j] = sum_h log N(V[i,j,h]; mu[j,h], sigma^2[j,h])``;
  ``R[i,:] = softmax_j(log a_j + log p[i,j])``.
- returns ``mu`` (the parents' poses) and ``a`` (their activations).

``formulation="official"``, the equations of the authors' released code (google-research/google-research,
``capsule_em/em_layers.py``, ``update_em_routing`` and ``update_conv_routing``). The same loop, except:

- the mass is guarded, ``m_j = sum_i R' + eps`` (1e-7 in convolutional layers, 1e-5 in the class layer),
  and used everywhere, the logit included;
- the centre keeps a tenth of the previous iteration's: ``mu = 0.9 sum_i R' V / m_j + 0.1 mu_prev``, with
  ``mu_prev = 0`` before the first iteration; the variance is taken about that centre, plus a floor 5e-4;
- the activation logit is ``lambda_t (m_j (-sum_h log sigma^2_h - beta_v H (1 + log 2 pi)) - 5000
  beta_a)``: the log variance is not halved, ``beta_v`` (the paper's ``beta_u``) scales the Gaussian's
  entropy constant, and ``beta_a`` enters with a factor -5000;
- ``lambda_t = final (1 - 0.95^(t+1))`` with ``final = 0.01``, divided by 4 in the class layer
  (:meth:`EMRouting.official`);
- in convolutional layers a child's assignments are normalised per parent type over the positions that
  see it (``assignment_scope="per_type"`` of :class:`~capsnets.layers.ConvMatrixCapsules`).

Inverse temperature (``inverse_temperature=None``): ``lambda_t = 0.01 (1 - 0.95^(t+1))`` for ``t = 0 ..
iterations-1`` in every layer, the schedule the authors gave on OpenReview
(https://openreview.net/forum?id=HJWLfGWRb) and the one the IBM reproduction uses
(github.com/IBM/matrix-capsules-with-em-routing, ``em_routing.py``, ``final_lambda=0.01``; that
reproduction also scales the cost by ``100 J / I``). Pass ``inverse_temperature`` for any other.

Numerical safety (everything that can be in log space is):

- a variance floor (``eps`` with the paper's formulation, 1e-6 by default; ``variance_floor`` with the
  official one) is added to every ``sigma^2``, so zero-variance clusters give a finite ``log sigma``;
- ``sum_i R'`` is guarded by ``eps`` in the denominators of ``mu`` and ``sigma^2``, so a parent that
  receives no mass (all activations zero) gets ``mu = 0``, not ``0/0``;
- ``log a_j`` is ``logsigmoid`` of the pre-activation and the assignments are a log-space softmax;
- half-precision inputs (and calls under ``torch.autocast``) are computed in float32 with autocast
  disabled inside; results are float32 for float16/bfloat16 inputs, the input dtype otherwise;
- (not in the paper) the votes of a routing problem whose largest ``|V|`` exceeds
  ``X = sqrt(finfo.max * floor / (32 H))`` (8e14 in float32 with the floor 1e-6 and H = 16), beyond which
  their squares over the floor would overflow the E-step, are divided by a power of two ``2^k`` that brings
  them within ``X``, and put back exactly (poses times ``2^k``, log variances plus ``2k log 2``); the floor
  stays the same in those units, so it is ``2^2k`` times larger in the votes' own (still a fixed fraction of
  ``X^2``). Every finite input then gives finite outputs, and votes up to ``X`` are routed unscaled;
- (not in the paper) float32 and half-precision votes whose largest ``|V|`` exceeds ``WIDE_VOTES``
  (``2^32``) are routed in float64 (where the device has it) and the results returned in float32: the
  backward multiplies a pose's gradient by the votes up to three times (through the assignments, their
  log-likelihoods and the variances), which overflows float32 for votes of 1e14 although the gradients are
  small; so the gradients stay finite for every finite vote. On CUDA, where reading ``|V|`` on the host
  would wait for the device, they are instead scaled on the device by a power of two to within ``WIDE_VOTES``
  (the floor then held in those units), which keeps the gradients finite in float32 too;
- (not in the paper) where a parent's mass ``sum_i R'`` is below ``1e-3``, ``mu`` and ``sigma^2`` are
  differentiated as if it were ``1e-3`` (the guarded equations' own slope there is ``1 / eps``), so the
  gradients of the activations stay bounded when they are all zero. Values are unchanged.

Convolutional layers fold output positions into ``B``, so by default each position's parents are routed
as their own problem. ``child_groups`` (:mod:`capsnets.functional.child_groups`) ties the copies of a
child seen by several positions together: its assignments are normalised over every parent of every
position that sees it (Gritzman 2019, arXiv 1907.00652, pitfall 3; the IBM reproduction), or per parent
type over those positions (the authors' code). The M-step is unchanged.

Deviations, off by default (paper formulation only): ``cost_normalization="mean_std"`` replaces ``sum_h
cost[j]`` by its standardisation across the J parents of each example, ``(c_j - mean_j c) / sqrt(var_j c
+ eps)``, as in Yang's reproduction (github.com/gyang274/capsulesEM); ``cost_normalization="mass"`` divides
the cost by ``I H / J``, a per-layer inverse temperature ``lambda J / (I H)`` (a reparameterisation:
tested as an identity). ``benchmarks/README.md`` records how fast each variant learns.

Gradients flow through every iteration (the procedure differentiated literally) unless
``detach_routing=True``, which computes the assignments of the non-final iterations without gradient.

Its iterations are written twice, once in PyTorch and once in C++:

- :mod:`capsnets.functional.em.procedure`, the PyTorch iterations, differentiated by autograd: the reference. They
  see the votes only through two products (``procedure.VoteProducts``), which come from stored votes
  (:func:`em_routing`; half precision, ``torch.compile`` and export; :func:`em_routing_poses` where no kernel
  applies) or, for matrix capsule layers on CUDA, from Triton kernels that recompute the votes from the poses,
  forward and backward (:mod:`capsnets.functional.em.triton_path`);
- :mod:`capsnets.functional.em.kernel`, the CPU kernel for matrix capsule layers (:func:`em_routing_poses`): the
  same iterations in C++, one routing problem at a time in cache, with the votes computed from the poses and
  never stored, and their derivative written by hand. The kernel does not supply only the two products to the
  PyTorch iterations, as the Triton kernels do, because the iterations' per-child algebra would then run as
  separate PyTorch operations over ``(B, J, I)`` tensors, which costs more than the products on the CPU
  (``docs/results/em-primitives/report.md``). It is compiled on first use into a build directory of its own
  per source, torch and Python (:mod:`capsnets.functional.em.build`).

Both kernels share the set-up of a routing from poses and transforms (the origin and scale of each problem, and
float64 for votes too large for float32 gradients: :mod:`capsnets.functional.em.recomputed`).

``CAPSNETS_EM_KERNEL`` chooses between the stored votes, the Triton kernels and the CPU kernel (``auto``,
``torch``, ``triton``, ``cpp``). All take the same :class:`~capsnets.functional.em.spec.EMSettings`, the resolved
settings of a call; the tests hold each to the float64 references of :mod:`capsnets.testing` and to each other.
"""

from capsnets.functional.em.routing import EMRouting, em_routing, em_routing_poses
from capsnets.functional.em.spec import OFFICIAL_MASS_EPS, OFFICIAL_VARIANCE_FLOOR, EMSettings, em_inverse_temperatures

__all__ = [
    "EMRouting",
    "EMSettings",
    "OFFICIAL_MASS_EPS",
    "OFFICIAL_VARIANCE_FLOOR",
    "em_inverse_temperatures",
    "em_routing",
    "em_routing_poses",
]
