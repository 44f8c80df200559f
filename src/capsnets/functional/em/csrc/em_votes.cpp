// Fused vote products of EM routing between matrix capsules, for the CPU.
//
// EM routing (capsnets.functional.em) sees the votes V[n, i, j] = M[n, i] @ W[i, j] (+ coordinates)
// only through products with xx = [x, x^2], x = V * inv[n] - c[n, j]. These functions compute those
// products from the child poses M and the transforms W directly, one (problem, parent) block at a time in
// cache, so the vote tensor (N, J, I, 16) is never written to memory, forward or backward.
//
// Layout (all contiguous; T is float or double):
//   pose   (N, I, 16)   child poses, 4x4 row-major
//   weight (Iw, J, 16)  transforms; child i uses weight[i % Iw] (Iw == I for a convolutional layer, the
//                       child types for a class layer whose children are (position, type) with type last)
//   coord  (I, 2) or empty: added to the vote components 0 and 1 (coordinate addition)
//   c      (N, J, 16)   per-parent origin, in scaled units; inv (N,): 1 / the problem's power-of-two scale
//
//   votes_stats(pose, weight, coord, w0 (N, I)) -> (sum_i w0 V  (N, J, 16), max |V| (N,))
//   votes_backward(pose, weight, coord, c, inv, left (K, N, J, I), right (N, J, K, 32))
//       with d loss / d xx = left @ right: -> d pose (N, I, 16), d weight (Iw, J, 16)
//   route(...): the whole procedure (M-step, E-step, child-group normalisation; the last iteration an M-step
//       only) -> the assignments (N, J, I) of the last M-step, its centre (N, J, 16) and activation logit
//       (N, J), and what the backward needs of every iteration (keep 2), of the last one (keep 1) or none;
//       without child groups, one problem's iterations in turn, its children's x made once and kept in cache
//   mstep_back(...), estep_back(...): the hand-written backward's per-child work for one M-step and one
//       E-step (capsnets.functional.em.kernel), each with the product that needs the votes, per problem
//   group_sum(x (N, J, I), index, groups, per_type, blocks): each slot's sum over its child group (that backward's
//       normaliser of the child groups' softmax)
//   mstep_parents(...), estep_parents(...): that backward's per-parent algebra before each M-step and after
//       each E-step, element-wise over (N, J, 16)
//   backward_fused(...): without child groups, that whole backward and votes_backward in one pass over the
//       problems, each problem's votes made once and its rows of every intermediate in cache
//   gather_rows(values (B, R, F), index), scatter_rows(grad (B, P, F), index, R): a conv capsule layer's
//       receptive fields gathered from its children's grid, and their gradient summed back onto it
// The ATen and pybind11 headers the kernel uses, not <torch/extension.h>: that one brings the whole C++ frontend and
// more than doubles the compile time. New tensors come from ATen/EmptyTensor.h's CPU allocator, whose header takes a
// fraction of <ATen/ops/empty.h>'s time to compile.
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <limits>
#include <vector>

namespace {

// An uninitialised CPU tensor of ``size`` with ``options``' dtype (every input here is on the CPU).
at::Tensor new_tensor(at::IntArrayRef size, const at::TensorOptions& options) {
  return at::Tensor(at::detail::empty_cpu(size, options));
}

constexpr int64_t kH = 16;  // pose components of a 4x4 matrix

// Inside the kernels, one child's votes for all J parents are held as a (4, 4J) block, row r of the pose
// matrix by (parent, column): V[r][4j + col] = sum_k M[r][k] Wt[k][4j + col], with the transforms laid out
// as Wt (Iw, 4, 4J). Every loop over that block runs over 4J contiguous values, which the compiler
// vectorises; per-parent quantities are spread to (4, 4J) blocks once per routing problem.

struct Geometry {
  int64_t n, i, j, iw;
  int64_t q() const { return 4 * j; }  // the length of one row of a block
};

Geometry check(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord) {
  TORCH_CHECK(pose.dim() == 3 && pose.size(2) == kH, "pose must be (N, I, 16), got ", pose.sizes());
  TORCH_CHECK(weight.dim() == 3 && weight.size(2) == kH, "weight must be (Iw, J, 16), got ", weight.sizes());
  TORCH_CHECK(pose.is_contiguous() && weight.is_contiguous(), "pose and weight must be contiguous");
  TORCH_CHECK(pose.scalar_type() == weight.scalar_type(), "pose and weight must have one dtype");
  TORCH_CHECK(pose.device().is_cpu() && weight.device().is_cpu(), "the fused EM kernel runs on the CPU");
  const int64_t children = pose.size(1), iw = weight.size(0);
  TORCH_CHECK(iw > 0 && children % iw == 0, "pose's I = ", children, " must be a multiple of weight's Iw = ", iw);
  if (coord.numel() > 0) {
    TORCH_CHECK(coord.dim() == 2 && coord.size(0) == children && coord.size(1) == 2 && coord.is_contiguous() &&
                    coord.scalar_type() == pose.scalar_type(),
                "coord must be a contiguous (I, 2) tensor of pose's dtype, got ", coord.sizes());
  }
  return {pose.size(0), children, weight.size(1), iw};
}

// Wt[i][k][4j + col] = W[i][j][4k + col]
template <typename T>
std::vector<T> transpose_weight(const at::Tensor& weight, const Geometry& g) {
  const T* W = weight.data_ptr<T>();
  std::vector<T> wt(static_cast<size_t>(g.iw * kH * g.j));
  for (int64_t i = 0; i < g.iw; ++i)
    for (int64_t j = 0; j < g.j; ++j)
      for (int k = 0; k < 4; ++k)
        for (int col = 0; col < 4; ++col)
          wt[(i * 4 + k) * g.q() + 4 * j + col] = W[(i * g.j + j) * kH + 4 * k + col];
  return wt;
}

// block[r][4j + col] = per_parent[j * stride + 4r + col]: a (J, 16) slice spread to a (4, 4J) block
template <typename T>
inline void spread(const T* per_parent, int64_t stride, int64_t parents, T* block) {
  const int64_t q = 4 * parents;
  for (int64_t j = 0; j < parents; ++j)
    for (int r = 0; r < 4; ++r)
      for (int col = 0; col < 4; ++col) block[r * q + 4 * j + col] = per_parent[j * stride + 4 * r + col];
}

// out[j * stride + 4r + col] = block[r][4j + col]
template <typename T>
inline void gather(const T* block, int64_t parents, int64_t stride, T* out) {
  const int64_t q = 4 * parents;
  for (int64_t j = 0; j < parents; ++j)
    for (int r = 0; r < 4; ++r)
      for (int col = 0; col < 4; ++col) out[j * stride + 4 * r + col] = block[r * q + 4 * j + col];
}

// sum_e a[e] b[e] in 8 independent partial sums: the compiler does not reorder a floating-point sum by
// itself, so a plain loop runs one dependent add after another; these vectorise.
template <typename T>
inline T dot(const T* __restrict a, const T* __restrict b, int64_t q) {
  T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t e = 0;
  for (; e + 8 <= q; e += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[e + l] * b[e + l];
  T total = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; e < q; ++e) total += a[e] * b[e];
  return total;
}

// sum_e a[e] (b[e] c[e]), the same way
template <typename T>
inline T dot3(const T* __restrict a, const T* __restrict b, const T* __restrict c, int64_t q) {
  T acc[8] = {};
  int64_t e = 0;
  for (; e + 8 <= q; e += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[e + l] * (b[e + l] * c[e + l]);
  T total = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; e < q; ++e) total += a[e] * (b[e] * c[e]);
  return total;
}

// sum_e a[e], the same way
template <typename T>
inline T sum8(const T* __restrict a, int64_t q) {
  T acc[8] = {};
  int64_t e = 0;
  for (; e + 8 <= q; e += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[e + l];
  T total = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; e < q; ++e) total += a[e];
  return total;
}

template <typename T>
const T* coord_ptr(const at::Tensor& coord) {
  return coord.numel() > 0 ? coord.data_ptr<T>() : nullptr;
}

// The votes of one call: the poses, the transforms laid out as (Iw, 4, 4J), the coordinates, and (except for
// votes_stats) the origin c and the scale inv of each routing problem.
template <typename T>
struct Votes {
  Geometry g;
  std::vector<T> wt;
  const T* pose;
  const T* coord;
  const T* c;
  const T* inv;

  Votes(const at::Tensor& pose_t, const at::Tensor& weight, const at::Tensor& coord_t, const at::Tensor* c_t,
        const at::Tensor* inv_t, const Geometry& geometry)
      : g(geometry),
        wt(transpose_weight<T>(weight, geometry)),
        pose(pose_t.data_ptr<T>()),
        coord(coord_ptr<T>(coord_t)),
        c(c_t ? c_t->data_ptr<T>() : nullptr),
        inv(inv_t ? inv_t->data_ptr<T>() : nullptr) {}

  const T* transform(int64_t i) const { return wt.data() + (i % g.iw) * 4 * g.q(); }
  const T* child(int64_t n, int64_t i) const { return pose + (n * g.i + i) * kH; }
  // the origin of problem n as a (4, 4J) block
  void origin(int64_t n, T* block) const { spread(c + n * g.j * kH, kH, g.j, block); }
};

// W lanes of T as one value (GCC and Clang vector extensions; the build flags are theirs too), for the loops
// whose accumulators the compiler would otherwise keep in memory.
template <typename T, int W>
struct Lanes {
  typedef T type __attribute__((vector_size(W * sizeof(T))));
};
template <typename T, int W>
using vec = typename Lanes<T, W>::type;

template <typename V, typename T>
inline V vload(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename V, typename T>
inline void vstore(T* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

// lanes l of a W-lane value = p[(l / 4) step]: four values, each spread to four lanes (one parent's columns)
template <int W, typename T>
inline vec<T, W> expand4(const T* p, int64_t step) {
  vec<T, W> out;
#if defined(__clang__)
  for (int l = 0; l < W; ++l) out[l] = p[(l / 4) * step];
#else
  using Index = vec<typename std::conditional<sizeof(T) == 4, int32_t, int64_t>::type, W>;
  vec<T, W> t = {};
  for (int k = 0; k < W / 4; ++k) t[k] = p[k * step];
  Index mask;
  for (int l = 0; l < W; ++l) mask[l] = l / 4;
  out = __builtin_shuffle(t, mask);
#endif
  return out;
}

// The register-blocked form of the loops over a problem's children: lanes [c0, c0 + W) of the (4, 4J) blocks
// (W = 16 for whole chunks, 4 for the rest; 4J is a multiple of 4) with the child loop inside, so that the
// chunk's vote rows, origin and accumulators stay in vector registers instead of passing through memory for
// every child. x[r][l] = (V[r][c0 + l] (+ coordinates)) inv - c[r][c0 + l] of child i, with the origin's row r at
// c + r c_stride; w[k] = Wt[k][c0 .. c0 + W) of child i, kept for the caller.
template <int W, typename T>
inline void vote_rows(const Votes<T>& votes, int64_t n, int64_t i, int64_t c0, T u, const T* c, int64_t c_stride,
                      vec<T, W> (&w)[4], vec<T, W> (&x)[4]) {
  using V = vec<T, W>;
  const int64_t q = votes.g.q();
  const T* __restrict m = votes.child(n, i);
  const T* __restrict wt = votes.transform(i) + c0;
  for (int k = 0; k < 4; ++k) w[k] = vload<V>(wt + k * q);
  for (int r = 0; r < 4; ++r) x[r] = m[4 * r] * w[0] + m[4 * r + 1] * w[1] + m[4 * r + 2] * w[2] + m[4 * r + 3] * w[3];
  if (votes.coord != nullptr) {  // components 0 and 1 of every parent: row 0, lanes 4j and 4j + 1
    const T a = votes.coord[2 * i], b = votes.coord[2 * i + 1];
    V add = {};
    for (int l = 0; l < W; ++l) add[l] = l % 4 == 0 ? a : (l % 4 == 1 ? b : T(0));
    x[0] += add;
  }
  for (int r = 0; r < 4; ++r) x[r] = x[r] * u - vload<V>(c + r * c_stride);
}

// vote_rows with the origin chunk c and x as arrays, and the transforms' rows not kept
template <int W, typename T>
inline void vote_chunk(const Votes<T>& votes, int64_t n, int64_t i, int64_t c0, T u, const T (&c)[4][W],
                       T (&x)[4][W]) {
  vec<T, W> w[4], xv[4];
  vote_rows<W>(votes, n, i, c0, u, c[0], W, w, xv);
  for (int r = 0; r < 4; ++r) vstore(x[r], xv[r]);
}

template <int W, typename T>
inline void load_chunk(const T* block, int64_t q, int64_t c0, T (&out)[4][W]) {
  for (int r = 0; r < 4; ++r)
    for (int l = 0; l < W; ++l) out[r][l] = block[r * q + c0 + l];
}

// votes_stats over lanes [c0, c0 + W) of problem n: acc = sum_i a[i] V, big = max_i |V| (elementwise, (4, 4J)
// blocks), V the plain votes (+ coordinates).
template <int W, typename T>
inline void stats_chunk(const Votes<T>& votes, int64_t n, int64_t c0, const T* a, T* acc, T* big) {
  const int64_t q = votes.g.q();
  const T zero[4][W] = {};
  T s[4][W] = {}, m[4][W] = {}, x[4][W];
  for (int64_t i = 0; i < votes.g.i; ++i) {
    vote_chunk(votes, n, i, c0, T(1), zero, x);
    const T ai = a[i];
    for (int r = 0; r < 4; ++r)
      for (int l = 0; l < W; ++l) {
        s[r][l] += ai * x[r][l];
        const T size = std::abs(x[r][l]);
        m[r][l] = size > m[r][l] ? size : m[r][l];
      }
  }
  for (int r = 0; r < 4; ++r)
    for (int l = 0; l < W; ++l) {
      acc[r * q + c0 + l] = s[r][l];
      big[r * q + c0 + l] = m[r][l];
    }
}

template <typename T>
void stats_impl(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord, const at::Tensor& w0,
                at::Tensor& mean, at::Tensor& top, const Geometry& g) {
  const Votes<T> votes(pose, weight, coord, nullptr, nullptr, g);
  const T* A = w0.data_ptr<T>();
  T* out = mean.data_ptr<T>();
  T* mx = top.data_ptr<T>();
  const int64_t q = g.q();
  at::parallel_for(0, g.n, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> acc(4 * q), big(4 * q);
    for (int64_t n = begin; n < end; ++n) {
      int64_t c0 = 0;
      for (; c0 + 16 <= q; c0 += 16) stats_chunk<16>(votes, n, c0, A + n * g.i, acc.data(), big.data());
      for (; c0 < q; c0 += 4) stats_chunk<4>(votes, n, c0, A + n * g.i, acc.data(), big.data());
      gather(acc.data(), g.j, kH, out + n * g.j * kH);
      // a NaN vote makes its parent's sum NaN (a * NaN is NaN for every a): the largest |V| is then NaN too
      bool nan = false;
      for (int64_t e = 0; e < 4 * q; ++e) nan |= acc[e] != acc[e];
      mx[n] = nan ? std::numeric_limits<T>::quiet_NaN() : *std::max_element(big.begin(), big.end());
    }
  });
}

// M-step product over lanes [c0, c0 + W): s1 = sum_i w[j, i] x, s2 = sum_i w[j, i] x^2, with w (J, I) the weights
// (j the lane's parent); with xs, each child's x is also stored there ((I, 4, 4J), for an E-step).
template <int W, typename T>
inline void m_chunk(const Votes<T>& votes, int64_t n, int64_t c0, const T* cb, const T* w, T* s1, T* s2, T* xs) {
  const int64_t q = votes.g.q();
  const T u = votes.inv[n];
  T c[4][W], a1[4][W] = {}, a2[4][W] = {}, x[4][W];
  load_chunk(cb, q, c0, c);
  for (int64_t i = 0; i < votes.g.i; ++i) {
    vote_chunk(votes, n, i, c0, u, c, x);
    const vec<T, W> wv = expand4<W>(w + (c0 / 4) * votes.g.i + i, votes.g.i);
    T wi[W];
    vstore(wi, wv);
    for (int r = 0; r < 4; ++r)
      for (int l = 0; l < W; ++l) {
        const T wx = wi[l] * x[r][l];
        a1[r][l] += wx;
        a2[r][l] += wx * x[r][l];
      }
    if (xs != nullptr)
      for (int r = 0; r < 4; ++r)
        for (int l = 0; l < W; ++l) xs[(i * 4 + r) * q + c0 + l] = x[r][l];
  }
  for (int r = 0; r < 4; ++r)
    for (int l = 0; l < W; ++l) {
      s1[r * q + c0 + l] = a1[r][l];
      s2[r * q + c0 + l] = a2[r][l];
    }
}

// The M-step products of problem n as blocks: s1 = sum_i w[j, i] x, s2 = sum_i w[j, i] x^2 (4, 4J), with w (J, I)
// the weights; xs (I, 4, 4J) or null: each child's x block.
template <typename T>
inline void m_blocks(const Votes<T>& votes, int64_t n, const T* cb, const T* w, T* s1, T* s2, T* xs) {
  const int64_t q = votes.g.q();
  int64_t c0 = 0;
  for (; c0 + 16 <= q; c0 += 16) m_chunk<16>(votes, n, c0, cb, w, s1, s2, xs);
  for (; c0 < q; c0 += 4) m_chunk<4>(votes, n, c0, cb, w, s1, s2, xs);
}

// m_chunk from the children's x blocks xs (I, 4, 4J) that an earlier M-step of the same problem stored, in the
// same order of operations
template <int W, typename T>
inline void m_chunk_stored(const T* xs, int64_t children, int64_t q, int64_t c0, const T* w, T* s1, T* s2) {
  using V = vec<T, W>;
  V a1[4] = {}, a2[4] = {};
  for (int64_t i = 0; i < children; ++i) {
    const V wv = expand4<W>(w + (c0 / 4) * children + i, children);
    const T* x = xs + i * 4 * q + c0;
    for (int r = 0; r < 4; ++r) {
      const V xr = vload<V>(x + r * q);
      const V wx = wv * xr;
      a1[r] += wx;
      a2[r] += wx * xr;
    }
  }
  for (int r = 0; r < 4; ++r) {
    vstore(s1 + r * q + c0, a1[r]);
    vstore(s2 + r * q + c0, a2[r]);
  }
}

// m_blocks from the stored x blocks xs (I, 4, 4J)
template <typename T>
inline void m_blocks_stored(const T* xs, int64_t children, int64_t q, const T* w, T* s1, T* s2) {
  int64_t c0 = 0;
  for (; c0 + 16 <= q; c0 += 16) m_chunk_stored<16>(xs, children, q, c0, w, s1, s2);
  for (; c0 < q; c0 += 4) m_chunk_stored<4>(xs, children, q, c0, w, s1, s2);
}

// The x blocks of problem n's children over lanes [c0, c0 + W), stored in xs (I, 4, 4J) as m_chunk stores them
template <int W, typename T>
inline void x_chunk(const Votes<T>& votes, int64_t n, int64_t c0, const T* cb, T* xs) {
  const int64_t q = votes.g.q();
  T c[4][W], x[4][W];
  load_chunk(cb, q, c0, c);
  for (int64_t i = 0; i < votes.g.i; ++i) {
    vote_chunk(votes, n, i, c0, votes.inv[n], c, x);
    for (int r = 0; r < 4; ++r)
      for (int l = 0; l < W; ++l) xs[(i * 4 + r) * q + c0 + l] = x[r][l];
  }
}

// The x blocks (I, 4, 4J) of problem n's children, with cb its origin block
template <typename T>
inline void x_blocks(const Votes<T>& votes, int64_t n, const T* cb, T* xs) {
  const int64_t q = votes.g.q();
  int64_t c0 = 0;
  for (; c0 + 16 <= q; c0 += 16) x_chunk<16>(votes, n, c0, cb, xs);
  for (; c0 < q; c0 += 4) x_chunk<4>(votes, n, c0, cb, xs);
}

// sum_i w[j, i] [x, x^2] of problem n, with w its (J, I) weights: -> out (J, 32). cb: the origin block of
// problem n; s1, s2 (4 * 4J): scratch; xs (I * 4 * 4J) or null: each child's x block, stored there, or with
// stored, read from there instead of computed.
template <typename T>
inline void m_problem(const Votes<T>& votes, int64_t n, const T* cb, const T* w, T* s1, T* s2, T* out,
                      T* xs = nullptr, bool stored = false) {
  const Geometry& g = votes.g;
  const int64_t q = g.q();
  if (stored) {
    m_blocks_stored(xs, g.i, q, w, s1, s2);
  } else {
    m_blocks(votes, n, cb, w, s1, s2, xs);
  }
  gather(s1, g.j, 2 * kH, out);
  gather(s2, g.j, 2 * kH, out + kH);
}

// Sums of 4 lanes: lanes 4p .. 4p + 3 of the result are, for every block p of 4 lanes, [a0 + a1, a2 + a3, b0 + b1,
// b2 + b3] of that block of a and b. Applied to (a, b), (c, d) and then to the two results, each block holds the
// sums of a, b, c and d over it.
template <int W, typename T>
inline vec<T, W> pair_sums(const vec<T, W>& a, const vec<T, W>& b) {
  vec<T, W> lo, hi;
#if defined(__clang__)
  for (int l = 0; l < W; ++l) {
    const int block = l / 4 * 4, pos = l % 4;
    lo[l] = (pos < 2 ? a : b)[block + 2 * (pos % 2)];
    hi[l] = (pos < 2 ? a : b)[block + 2 * (pos % 2) + 1];
  }
#else
  using Index = vec<typename std::conditional<sizeof(T) == 4, int32_t, int64_t>::type, W>;
  Index il, ih;
  for (int l = 0; l < W; ++l) {
    const int block = l / 4 * 4, pos = l % 4;
    il[l] = (pos < 2 ? 0 : W) + block + 2 * (pos % 2);
    ih[l] = il[l] + 1;
  }
  lo = __builtin_shuffle(a, b, il);
  hi = __builtin_shuffle(a, b, ih);
#endif
  return lo + hi;
}

// Per-child values summed over each parent's 4 lanes, for 4 children at once: t[c] (W lanes, the parents c0 / 4 ...)
// of children i .. i + 3 -> out[p * children + i + c] = the sum of lanes 4p .. 4p + 3 of t[c], times scale, plus
// add[p] (when given), four children's values stored at once for each parent.
template <int W, typename T>
inline void store_parent_sums(const vec<T, W> (&t)[4], T scale, const T* add, int64_t children, int64_t i, T* out) {
  using V = vec<T, W>;
  V v = pair_sums<W, T>(pair_sums<W, T>(t[0], t[1]), pair_sums<W, T>(t[2], t[3])) * scale;
  if (add != nullptr) v += expand4<W>(add, 1);
  T lanes[W];
  vstore(lanes, v);
  for (int p = 0; p < W / 4; ++p) std::memcpy(out + p * children + i, lanes + 4 * p, 4 * sizeof(T));
}

// E-step product over lanes [c0, c0 + W) (the parents c0 / 4 ...): o[j, i] = [x, x^2] . coef[j] of every
// child i, with coef spread to the blocks k1, k2.
template <int W, typename T>
inline void e_chunk(const Votes<T>& votes, int64_t n, int64_t c0, const T* cb, const T* k1, const T* k2, T* o,
                    const T* xs) {
  using V = vec<T, W>;
  const int64_t q = votes.g.q(), children = votes.g.i;
  const T u = votes.inv[n];
  T c[4][W], a[4][W], b[4][W], x[4][W];
  load_chunk(cb, q, c0, c);
  load_chunk(k1, q, c0, a);
  load_chunk(k2, q, c0, b);
  T* oc = o + (c0 / 4) * children;
  auto value = [&](int64_t i) {  // sum_r x (a + x b) of child i, per lane
    if (xs != nullptr) {
      load_chunk(xs + i * 4 * q, q, c0, x);
    } else {
      vote_chunk(votes, n, i, c0, u, c, x);
    }
    V t = {};
    for (int r = 0; r < 4; ++r) {
      const V xr = vload<V>(x[r]);
      t += xr * (vload<V>(a[r]) + xr * vload<V>(b[r]));
    }
    return t;
  };
  int64_t i = 0;
  for (; i + 4 <= children; i += 4) {
    const V t[4] = {value(i), value(i + 1), value(i + 2), value(i + 3)};
    store_parent_sums<W, T>(t, T(1), nullptr, children, i, oc);
  }
  for (; i < children; ++i) {
    T t[W];
    vstore(t, value(i));
    for (int p = 0; p < W / 4; ++p) oc[p * children + i] = (t[4 * p] + t[4 * p + 1]) + (t[4 * p + 2] + t[4 * p + 3]);
  }
}

// [x, x^2] . coef[j] for every child i of problem n, with coef spread to the blocks k1, k2: -> o (J, I). x from
// the problem's stored blocks xs (I, 4, 4J) when given, else computed.
template <typename T>
inline void e_problem(const Votes<T>& votes, int64_t n, const T* cb, const T* k1, const T* k2, T* o,
                      const T* xs = nullptr) {
  const int64_t q = votes.g.q();
  int64_t c0 = 0;
  for (; c0 + 16 <= q; c0 += 16) e_chunk<16>(votes, n, c0, cb, k1, k2, o, xs);
  for (; c0 < q; c0 += 4) e_chunk<4>(votes, n, c0, cb, k1, k2, o, xs);
}

// The E-step's log densities over lanes [c0, c0 + W): o[j, i] = base[j] - 0.5 sum_h (x - d)^2 p of every child
// i, from the children's x blocks xs (I, 4, 4J), the centre block d and the precision block p.
template <int W, typename T>
inline void quad_chunk(const T* xs, int64_t children, int64_t q, int64_t c0, const T* d, const T* p, const T* base,
                       T* o) {
  using V = vec<T, W>;
  T dc[4][W], pc[4][W];
  load_chunk(d, q, c0, dc);
  load_chunk(p, q, c0, pc);
  const T* bc = base + c0 / 4;
  T* oc = o + (c0 / 4) * children;
  auto value = [&](int64_t i) {  // sum_r (x - d)^2 p of child i, per lane
    const T* x = xs + i * 4 * q + c0;
    V t = {};
    for (int r = 0; r < 4; ++r) {
      const V diff = vload<V>(x + r * q) - vload<V>(dc[r]);
      t += diff * diff * vload<V>(pc[r]);
    }
    return t;
  };
  int64_t i = 0;
  for (; i + 4 <= children; i += 4) {
    const V t[4] = {value(i), value(i + 1), value(i + 2), value(i + 3)};
    store_parent_sums<W, T>(t, T(-0.5), bc, children, i, oc);
  }
  for (; i < children; ++i) {
    T t[W];
    vstore(t, value(i));
    for (int k = 0; k < W / 4; ++k)
      oc[k * children + i] = bc[k] - T(0.5) * ((t[4 * k] + t[4 * k + 1]) + (t[4 * k + 2] + t[4 * k + 3]));
  }
}

// d loss / d V of child i over lanes [c0, c0 + W), from d loss / d xx = left @ right through xx = [x, x^2]:
// gv[r][e] = inv sum_k le_k[e] (r1[k][r][e] + 2 x[r][e] r2[k][r][e]), with le_k the child's left factors
// left[k][n][j][i] expanded to the lanes of parent j; and at once what it gives through V = M Wt, while in
// registers: each lane's part of d M[r][k] = sum_e gv[r][e] Wt[k][e] (added to gm[4r + k], summed across the
// lanes later), and d Wt[k][e] += sum_r M[r][k] gv[r][e] (added to gwi, the child's (4, 4J) block of it). left
// points at left[0][n] and stride separates its columns k; x from the problem's stored blocks xs when given.
template <int W, typename T>
inline void grad_chunk(const Votes<T>& votes, int64_t n, int64_t i, int64_t c0, T u, int64_t kk, const T* cb,
                       const T* r1, const T* r2, const T* left, int64_t stride, T* __restrict gwi,
                       vec<T, W> (&gm)[kH], const T* xs) {
  using V = vec<T, W>;
  const int64_t q = votes.g.q(), children = votes.g.i;
  V w[4], x[4];
  if (xs != nullptr) {  // the problem's stored x blocks (I, 4, 4J)
    const T* wt = votes.transform(i) + c0;
    for (int k = 0; k < 4; ++k) w[k] = vload<V>(wt + k * q);
    for (int r = 0; r < 4; ++r) x[r] = vload<V>(xs + (i * 4 + r) * q + c0);
  } else {
    vote_rows<W>(votes, n, i, c0, u, cb + c0, q, w, x);
  }
  V g0 = {}, g1 = {}, g2 = {}, g3 = {};
  const T* lc = left + (c0 / 4) * children + i;  // left[k][n][j][i] = lc[k * stride + (j - c0/4) I]
  for (int64_t k = 0; k < kk; ++k) {
    const V le = expand4<W>(lc + k * stride, children);
    const T* a = r1 + k * 4 * q + c0;
    const T* b = r2 + k * 4 * q + c0;
    g0 += le * (vload<V>(a) + 2 * x[0] * vload<V>(b));
    g1 += le * (vload<V>(a + q) + 2 * x[1] * vload<V>(b + q));
    g2 += le * (vload<V>(a + 2 * q) + 2 * x[2] * vload<V>(b + 2 * q));
    g3 += le * (vload<V>(a + 3 * q) + 2 * x[3] * vload<V>(b + 3 * q));
  }
  g0 *= u;
  g1 *= u;
  g2 *= u;
  g3 *= u;
  const T* __restrict m = votes.child(n, i);
  for (int k = 0; k < 4; ++k) {
    gm[k] += g0 * w[k];
    gm[4 + k] += g1 * w[k];
    gm[8 + k] += g2 * w[k];
    gm[12 + k] += g3 * w[k];
    T* gk = gwi + k * q + c0;
    vstore(gk, vload<V>(gk) + m[k] * g0 + m[4 + k] * g1 + m[8 + k] * g2 + m[12 + k] * g3);
  }
}

// the sum of a W-lane value's lanes, pairwise
template <int W, typename T>
inline T lane_sum(const vec<T, W>& v) {
  T t[W];
  vstore(t, v);
  for (int width = W / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) t[l] += t[l + width];
  return t[0];
}

// out[e] = the sum of v[e]'s lanes, for 16 values of 16 lanes: a tree of two-input shuffles that halves the lanes
// of each value while merging pairs of values, 15 shuffle pairs and adds in all.
template <typename T>
inline void lane_sums16(const vec<T, 16> (&v)[kH], T* out) {
#if defined(__clang__)
  for (int e = 0; e < kH; ++e) out[e] = lane_sum<16, T>(v[e]);
#else
  using V = vec<T, 16>;
  using Index = vec<typename std::conditional<sizeof(T) == 4, int32_t, int64_t>::type, 16>;
  // one level: lanes [0, 8) of the result from a, [8, 16) from b, each the sum of the two halves (half lanes
  // each) of one of their blocks of 2 half lanes
  auto merge = [](const V& a, const V& b, int half) {
    Index lo, hi;
    for (int l = 0; l < 16; ++l) {
      const int src = l < 8 ? 0 : 16;
      const int pos = (l % 8) / half * 2 * half + (l % half);
      lo[l] = src + pos;
      hi[l] = src + pos + half;
    }
    return __builtin_shuffle(a, b, lo) + __builtin_shuffle(a, b, hi);
  };
  V l1[8], l2[4], l3[2];
  for (int p = 0; p < 8; ++p) l1[p] = merge(v[2 * p], v[2 * p + 1], 8);
  for (int p = 0; p < 4; ++p) l2[p] = merge(l1[2 * p], l1[2 * p + 1], 4);
  for (int p = 0; p < 2; ++p) l3[p] = merge(l2[2 * p], l2[2 * p + 1], 2);
  vstore(out, merge(l3[0], l3[1], 1));
#endif
}

// One thread's scratch for the backward's per-problem work (MStepBack, EStepBack, VotesBackward): blocks of 4 x 4J,
// the (J, I) and (I,) rows of one problem, right's two (K, 4, 4J) blocks, and the children's x blocks (I, 4, 4J).
template <typename T>
struct BackScratch {
  std::vector<T> cb, k1, k2, s1, s2, gw, ga, zsum, r1, r2, xs;
  BackScratch(const Geometry& g, int64_t kk)
      : cb(4 * g.q()), k1(4 * g.q()), k2(4 * g.q()), s1(4 * g.q()), s2(4 * g.q()), gw(g.j * g.i), ga(g.i),
        zsum(g.j), r1(kk * 4 * g.q()), r2(kk * 4 * g.q()), xs(g.i * 4 * g.q()) {}
};

// votes_backward's work for problem n: d pose of its children (every entry written) and d Wt added to gw, the
// thread's (Iw, 4, 4J) copy; x from the problem's stored blocks xs when given (sc.cb then unused), else computed.
template <typename T>
struct VotesBackward {
  const Votes<T>& votes;
  const T *L, *Rt;
  T* GP;
  int64_t kk;
  bool local;  // left holds one problem's rows (K, 1, J, I), whichever it is (the same for N = 1)

  VotesBackward(const Votes<T>& v, const at::Tensor& left, const at::Tensor& right, at::Tensor& gpose)
      : votes(v),
        L(left.data_ptr<T>()),
        Rt(right.data_ptr<T>()),
        GP(gpose.data_ptr<T>()),
        kk(left.size(0)),
        local(left.size(1) == 1) {}

  void operator()(int64_t n, BackScratch<T>& sc, T* gw, const T* xs) const {
    const Geometry& g = votes.g;
    const int64_t q = g.q();
    const T u = votes.inv[n];
    if (xs == nullptr) votes.origin(n, sc.cb.data());
    for (int64_t k = 0; k < kk; ++k) {  // right (J, K, 32) -> two (K, 4, 4J) blocks
      spread(Rt + (n * g.j * kk + k) * 2 * kH, kk * 2 * kH, g.j, sc.r1.data() + k * 4 * q);
      spread(Rt + (n * g.j * kk + k) * 2 * kH + kH, kk * 2 * kH, g.j, sc.r2.data() + k * 4 * q);
    }
    const T *cb = sc.cb.data(), *r1 = sc.r1.data(), *r2 = sc.r2.data();
    const T* left = L + (local ? 0 : n * g.j * g.i);  // left[0][n]
    const int64_t stride = (local ? 1 : g.n) * g.j * g.i;  // between left's columns
    for (int64_t i = 0; i < g.i; ++i) {
      T* gwi = gw + (i % g.iw) * 4 * q;
      T* gm = GP + (n * g.i + i) * kH;  // V = M Wt: d M[r][k] = sum_e dV[r][e] Wt[k][e]
      vec<T, 16> wide[kH] = {};
      int64_t c0 = 0;
      for (; c0 + 16 <= q; c0 += 16) grad_chunk<16>(votes, n, i, c0, u, kk, cb, r1, r2, left, stride, gwi, wide, xs);
      lane_sums16(wide, gm);
      if (c0 < q) {
        vec<T, 4> narrow[kH] = {};
        for (; c0 < q; c0 += 4) grad_chunk<4>(votes, n, i, c0, u, kk, cb, r1, r2, left, stride, gwi, narrow, xs);
        for (int e = 0; e < kH; ++e) gm[e] += lane_sum<4, T>(narrow[e]);
      }
    }
  }
};

// d W (Iw, J, 16) from the threads' copies of d Wt (threads x (Iw, 4, 4J))
template <typename T>
void sum_weight_gradients(const std::vector<T>& partial, int threads, const Geometry& g, at::Tensor& gweight) {
  const int64_t q = g.q(), wsize = g.iw * 4 * q;
  T* GW = gweight.data_ptr<T>();
  at::parallel_for(0, g.iw, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> total(4 * q);
    for (int64_t i = begin; i < end; ++i) {
      std::fill(total.begin(), total.end(), T(0));
      for (int t = 0; t < threads; ++t) {
        const T* part = partial.data() + static_cast<size_t>(t) * wsize + i * 4 * q;
        for (int64_t e = 0; e < 4 * q; ++e) total[e] += part[e];
      }
      // Wt (4 = k, 4J) -> W (J, 16 = 4k + col): the block's rows are k here, so gather matches
      gather(total.data(), g.j, kH, GW + i * g.j * kH);
    }
  });
}

template <typename T>
void backward_impl(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord, const at::Tensor& c,
                   const at::Tensor& inv, const at::Tensor& left, const at::Tensor& right, at::Tensor& gpose,
                   at::Tensor& gweight, const Geometry& g) {
  const Votes<T> votes(pose, weight, coord, &c, &inv, g);
  const VotesBackward<T> step(votes, left, right, gpose);
  const int64_t wsize = g.iw * 4 * g.q();
  const int threads = at::get_num_threads();
  std::vector<T> partial(static_cast<size_t>(threads) * wsize, T(0));  // d Wt, one copy per thread
  at::parallel_for(0, g.n, 1, [&](int64_t begin, int64_t end) {
    T* gw = partial.data() + static_cast<int64_t>(at::get_thread_num()) * wsize;
    BackScratch<T> sc(g, step.kk);
    for (int64_t n = begin; n < end; ++n) step(n, sc, gw, nullptr);
  });
  sum_weight_gradients(partial, threads, g, gweight);
}

// EM routing without gradients (capsnets.functional.em.procedure): from the initial assignments r,
// `lambdas.size()` iterations, the last one an M-step only; returns the assignments of the last M-step, its
// centre (d = mu - c, scaled units) and activation logit, and keeps what the backward needs.
struct RouteSettings {
  std::vector<double> lambdas;
  double eps;
  bool official;
  int cost_normalization;  // 0 none, 1 mean_std, 2 mass (paper formulation only)
  int normalize;           // groups: 0 all parents, 1 per type
  int64_t groups;          // 0: no child groups (softmax over the parents of each slot)
  bool keep_all;           // keep every iteration (else, where anything is kept, the last one only)
  int64_t blocks;          // > 1: the groups fall into this many runs of problems (check_groups)
};

// What the hand-written backward needs of each iteration t (null pointers: not kept): the assignments of its
// M-step (T, N, J, I), the M-step product [sum w x, sum w x^2] (T, N, J, 32), the centre, variance and log
// variance (T, N, J, 16), the activation logit and the mass sum_i r a (T, N, J).
template <typename T>
struct Kept {
  T* r = nullptr;
  T* m = nullptr;
  T* d = nullptr;
  T* var = nullptr;
  T* log_var = nullptr;
  T* pre = nullptr;
  T* mass = nullptr;
};

// z[i] = exp(z[i]) for z[i] <= 0 (also -inf and NaN), 16 values at a time (std::exp is a call per value).
// Float: z = k ln 2 + r by Cody and Waite's two-part ln 2, exp(r) by the degree-6 polynomial of Cephes' expf
// (within 2 ulp of the exact value); z < -87.33 gives 0 instead of a subnormal, which only drops terms that
// vanish against the sum of at least 1 they are added to (after subtracting each group's largest logit).
// Double: std::exp.
template <typename T>
inline void exp_nonpositive(T* z, int64_t count) {
  for (int64_t i = 0; i < count; ++i) z[i] = std::exp(z[i]);
}

template <>
inline void exp_nonpositive<float>(float* z, int64_t count) {
  using V = vec<float, 16>;
  using Vi = vec<int32_t, 16>;
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const V x = vload<V>(z + i);
    const V xc = x < -87.33f ? V{} - 87.33f : x;  // NaN: the comparison is false and stays NaN
    V k = xc * 1.44269504088896341f + 0.5f;
    for (int l = 0; l < 16; ++l) k[l] = std::floor(k[l]);
    V r = xc - k * 0.693359375f;
    r = r + k * 2.12194440e-4f;
    V p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const Vi bits = (__builtin_convertvector(k, Vi) + 127) << 23;  // 2^k for k in [-126, 0]
    V scale;
    std::memcpy(&scale, &bits, sizeof scale);
    vstore(z + i, x < -87.33f ? V{} : p * scale);
  }
  for (; i < count; ++i) z[i] = std::exp(z[i]);
}

// out[k] = log(x[k]) + add, 16 values at a time where all 16 are positive normal numbers (the variances here,
// at least the floor), else by std::log. Float: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log m by the
// polynomial of Cephes' logf (within 2 ulp of the exact value), e ln 2 in Cody and Waite's two parts. Double:
// std::log.
template <typename T>
inline void log_plus(const T* x, T add, int64_t count, T* out) {
  for (int64_t k = 0; k < count; ++k) out[k] = std::log(x[k]) + add;
}

template <>
inline void log_plus<float>(const float* x, float add, int64_t count, float* out) {
  using V = vec<float, 16>;
  using Vi = vec<int32_t, 16>;
  int64_t k = 0;
  for (; k + 16 <= count; k += 16) {
    Vi bits;
    std::memcpy(&bits, x + k, sizeof bits);
    bool normal = true;  // 2^-126 <= x < inf
    for (int l = 0; l < 16; ++l) normal &= bits[l] >= 0x00800000 && bits[l] < 0x7f800000;
    if (!normal) {
      for (int l = 0; l < 16; ++l) out[k + l] = std::log(x[k + l]) + add;
      continue;
    }
    Vi e = (bits >> 23) - 127;
    const Vi mbits = (bits & 0x007fffff) | 0x3f800000;  // m in [1, 2)
    V m;
    std::memcpy(&m, &mbits, sizeof m);
    const auto big = m > 1.41421356237309505f;
    m = big ? m * 0.5f : m;
    e = big ? e + 1 : e;
    const V f = m - 1.0f, z = f * f, ef = __builtin_convertvector(e, V);
    V y = f * 7.0376836292e-2f - 1.1514610310e-1f;
    y = y * f + 1.1676998740e-1f;
    y = y * f - 1.2420140846e-1f;
    y = y * f + 1.4249322787e-1f;
    y = y * f - 1.6668057665e-1f;
    y = y * f + 2.0000714765e-1f;
    y = y * f - 2.4999993993e-1f;
    y = y * f + 3.3333331174e-1f;
    y = y * f * z;
    y = y - 2.12194440e-4f * ef;
    y = y - 0.5f * z;
    vstore(out + k, (f + y) + 0.693359375f * ef + add);
  }
  for (; k < count; ++k) out[k] = std::log(x[k]) + add;
}

template <typename T>
inline T log_sigmoid(T x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}

// The child groups' softmax over the slots of problems [n0, n1) and parents [j0, j1), whose groups are
// g0 .. g0 + top.size() - 1: z = exp(z - the group's largest) / the group's sum, in three passes (each group's
// largest logit, the exponentials and their sums, the products with the sums' reciprocals); the exponentials
// run over contiguous rows of I.
template <typename T>
void normalise_groups(T* R, const int64_t* G, int64_t n0, int64_t n1, int64_t j0, int64_t j1, int64_t parents,
                      int64_t children, int64_t g0, std::vector<T>& top, std::vector<T>& total) {
  std::fill(top.begin(), top.end(), -std::numeric_limits<T>::infinity());
  std::fill(total.begin(), total.end(), T(0));
  T* tp = top.data();
  T* tt = total.data();
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t* gn = G + n * children;
    for (int64_t j = j0; j < j1; ++j) {
      const T* z = R + (n * parents + j) * children;
      for (int64_t i = 0; i < children; ++i) tp[gn[i] - g0] = std::max(tp[gn[i] - g0], z[i]);
    }
  }
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t* gn = G + n * children;
    for (int64_t j = j0; j < j1; ++j) {
      T* z = R + (n * parents + j) * children;
      for (int64_t i = 0; i < children; ++i) z[i] -= tp[gn[i] - g0];
      exp_nonpositive(z, children);
      for (int64_t i = 0; i < children; ++i) tt[gn[i] - g0] += z[i];
    }
  }
  for (auto& x : total) x = T(1) / x;
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t* gn = G + n * children;
    for (int64_t j = j0; j < j1; ++j) {
      T* z = R + (n * parents + j) * children;
      for (int64_t i = 0; i < children; ++i) z[i] *= tt[gn[i] - g0];
    }
  }
}

// One thread's scratch for route_impl's problems. xs: the problem's (4, 4J) blocks x of every child, made by
// the M-step and read again by the E-step; top, total: each child's largest logit and sum of exponentials.
template <typename T>
struct RouteScratch {
  std::vector<T> cb, xs, s1, s2, wm, sq, db, var, lv, mass, sj, pre, sumlog, logsig, top, total;
  explicit RouteScratch(const Geometry& g)
      : cb(4 * g.q()), xs(g.i * 4 * g.q()), s1(4 * g.q()), s2(4 * g.q()), wm(g.j * g.i), sq(g.q()), db(4 * g.q()),
        var(4 * g.q()), lv(4 * g.q()), mass(g.j), sj(g.j), pre(g.j), sumlog(g.j), logsig(g.j), top(g.i), total(g.i) {}
};

template <typename T>
void route_impl(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord, const at::Tensor& c,
               const at::Tensor& inv, const at::Tensor& a_in, const at::Tensor& beta_v, const at::Tensor& beta_a,
               const at::Tensor& floor, const at::Tensor& log_var_offset, const at::Tensor& index,
                const RouteSettings& hs, at::Tensor& r, at::Tensor& d_out, at::Tensor& pre_out, const Kept<T>& kept,
                const Geometry& g) {
  const Votes<T> votes(pose, weight, coord, &c, &inv, g);
  const T* A = a_in.data_ptr<T>();
  const T* BV = beta_v.data_ptr<T>();
  const T* BA = beta_a.data_ptr<T>();
  const T* F = floor.data_ptr<T>();
  const T* LV = log_var_offset.data_ptr<T>();
  const int64_t* G = hs.groups ? index.data_ptr<int64_t>() : nullptr;
  T* R = r.data_ptr<T>();  // (N, J, I): the assignments, updated in place; logits between the two phases
  T* D = d_out.data_ptr<T>();  // (N, J, 16)
  T* P = pre_out.data_ptr<T>();  // (N, J)
  const int64_t q = g.q();
  const T log2pi = static_cast<T>(std::log(2.0 * M_PI));
  const T blend = static_cast<T>(0.9);
  const T eps = static_cast<T>(hs.eps);
  // problem n's M-step and E-step logits of iteration t (without child groups, its softmax too); with stored, the
  // children's x blocks in sc.xs are this problem's, made by its previous M-step, and not computed again
  auto problem = [&](int64_t n, RouteScratch<T>& sc, size_t t, bool stored) {
    const T lam = static_cast<T>(hs.lambdas[t]);
    const bool last = t + 1 == hs.lambdas.size();
    const bool keeping = kept.r != nullptr && (hs.keep_all || last);
    const int64_t at_t = hs.keep_all ? static_cast<int64_t>(t) * g.n : 0;  // the (t, n = 0) row of the kept tensors
    auto &cb = sc.cb, &xs = sc.xs, &s1 = sc.s1, &s2 = sc.s2, &wm = sc.wm, &sq = sc.sq, &db = sc.db, &var = sc.var,
         &lv = sc.lv, &mass = sc.mass, &sj = sc.sj, &pre = sc.pre, &sumlog = sc.sumlog, &logsig = sc.logsig;
    T* rn = R + n * g.j * g.i;  // (J, I)
    if (!stored) votes.origin(n, cb.data());
    if (keeping) std::copy(rn, rn + g.j * g.i, kept.r + (at_t + n) * g.j * g.i);
    // M-step: weights R a / (mass + eps)
    for (int64_t j = 0; j < g.j; ++j) {
      const T total = dot(rn + j * g.i, A + n * g.i, g.i);
      mass[j] = total;
      sj[j] = total / (total + eps);
      sq[4 * j] = sq[4 * j + 1] = sq[4 * j + 2] = sq[4 * j + 3] = sj[j];
    }
    for (int64_t j = 0; j < g.j; ++j) {
      const T* __restrict rj = rn + j * g.i;
      const T* __restrict an = A + n * g.i;
      T* __restrict wj = wm.data() + j * g.i;
      const T scale = T(1) / (mass[j] + eps);
      for (int64_t i = 0; i < g.i; ++i) wj[i] = rj[i] * an[i] * scale;
    }
    if (stored) {
      m_blocks_stored(xs.data(), g.i, q, wm.data(), s1.data(), s2.data());
    } else {
      m_blocks(votes, n, cb.data(), wm.data(), s1.data(), s2.data(), xs.data());
    }
    // centres, variances (about the centre, by exact algebra), log variances in real units
    if (hs.official && t > 0) spread(D + n * g.j * kH, kH, g.j, db.data());  // the previous centre
    for (int row = 0; row < 4; ++row) {
      for (int64_t e = 0; e < q; ++e) {
        const int64_t k = row * q + e;
        const T s = sq[e];
        T d = s1[k] + (s - 1) * cb[k];
        if (hs.official) d = blend * d + (1 - blend) * (t > 0 ? db[k] : -cb[k]);
        db[k] = d;
        var[k] = std::max(s2[k] - 2 * d * s1[k] + s * d * d, T(0)) + F[n];
      }
    }
    log_plus(var.data(), LV[n], 4 * q, lv.data());
    gather(db.data(), g.j, kH, D + n * g.j * kH);
    if (keeping) {
      gather(s1.data(), g.j, 2 * kH, kept.m + (at_t + n) * g.j * 2 * kH);
      gather(s2.data(), g.j, 2 * kH, kept.m + (at_t + n) * g.j * 2 * kH + kH);
      gather(db.data(), g.j, kH, kept.d + (at_t + n) * g.j * kH);
      gather(var.data(), g.j, kH, kept.var + (at_t + n) * g.j * kH);
      gather(lv.data(), g.j, kH, kept.log_var + (at_t + n) * g.j * kH);
    }
    std::fill(sumlog.begin(), sumlog.end(), T(0));
    for (int row = 0; row < 4; ++row)
      for (int64_t e = 0; e < q; ++e) sumlog[e / 4] += lv[row * q + e];
    for (int64_t j = 0; j < g.j; ++j) {
      const T bv = BV[j], ba = BA[j];
      if (hs.official) {
        pre[j] = lam * ((mass[j] + eps) * (-sumlog[j] - bv * kH * (1 + log2pi)) - T(5000) * ba);
      } else {
        pre[j] = (kH * bv + T(0.5) * sumlog[j]) * mass[j];  // the cost, before normalisation
      }
    }
    if (!hs.official) {
      if (hs.cost_normalization == 2) {
        for (int64_t j = 0; j < g.j; ++j) pre[j] *= static_cast<T>(g.j) / static_cast<T>(g.i * kH);
      } else if (hs.cost_normalization == 1) {
        T mean = 0, spread2 = 0;
        for (int64_t j = 0; j < g.j; ++j) mean += pre[j];
        mean /= static_cast<T>(g.j);
        for (int64_t j = 0; j < g.j; ++j) spread2 += (pre[j] - mean) * (pre[j] - mean);
        const T scale = T(1) / std::sqrt(spread2 / static_cast<T>(g.j) + eps);
        for (int64_t j = 0; j < g.j; ++j) pre[j] = (pre[j] - mean) * scale;
      }
      for (int64_t j = 0; j < g.j; ++j) pre[j] = lam * (BA[j] - pre[j]);
    }
    if (keeping) {
      std::copy(pre.begin(), pre.end(), kept.pre + (at_t + n) * g.j);
      std::copy(mass.begin(), mass.end(), kept.mass + (at_t + n) * g.j);
    }
    if (last) {  // no E-step after the last M-step
      std::copy(pre.begin(), pre.end(), P + n * g.j);
      return;
    }
    for (int64_t j = 0; j < g.j; ++j) logsig[j] = log_sigmoid(pre[j]) - T(0.5) * (sumlog[j] + kH * log2pi);
    for (int64_t k = 0; k < 4 * q; ++k) var[k] = T(1) / var[k];  // now the precisions
    // E-step logits log a_j + log p[i, j]; without child groups, the softmax over j of each slot
    int64_t c0 = 0;
    for (; c0 + 16 <= q; c0 += 16) quad_chunk<16>(xs.data(), g.i, q, c0, db.data(), var.data(), logsig.data(), rn);
    for (; c0 < q; c0 += 4) quad_chunk<4>(xs.data(), g.i, q, c0, db.data(), var.data(), logsig.data(), rn);
    if (G != nullptr) return;
    // over rows of I: each child's largest logit, the exponentials (vectorised) and their sums, the products
    // with the sums' reciprocals
    T* __restrict top = sc.top.data();
    T* __restrict total = sc.total.data();
    std::fill(sc.top.begin(), sc.top.end(), -std::numeric_limits<T>::infinity());
    std::fill(sc.total.begin(), sc.total.end(), T(0));
    for (int64_t j = 0; j < g.j; ++j) {
      const T* __restrict z = rn + j * g.i;
      for (int64_t i = 0; i < g.i; ++i) top[i] = std::max(top[i], z[i]);
    }
    for (int64_t j = 0; j < g.j; ++j) {
      T* __restrict z = rn + j * g.i;
      for (int64_t i = 0; i < g.i; ++i) z[i] -= top[i];
      exp_nonpositive(z, g.i);
      for (int64_t i = 0; i < g.i; ++i) total[i] += z[i];
    }
    for (int64_t i = 0; i < g.i; ++i) total[i] = T(1) / total[i];
    for (int64_t j = 0; j < g.j; ++j) {
      T* __restrict z = rn + j * g.i;
      for (int64_t i = 0; i < g.i; ++i) z[i] *= total[i];
    }
  };
  if (G == nullptr) {  // no child groups: each problem's iterations in turn, its children's x made once
    at::parallel_for(0, g.n, 1, [&](int64_t begin, int64_t end) {
      RouteScratch<T> sc(g);
      for (int64_t n = begin; n < end; ++n)
        for (size_t t = 0; t < hs.lambdas.size(); ++t) problem(n, sc, t, t > 0);
    });
    return;
  }
  for (size_t t = 0; t < hs.lambdas.size(); ++t) {
    const bool last = t + 1 == hs.lambdas.size();
    const bool grouped = !last;
    const int64_t lanes = hs.normalize == 1 ? g.j : 1;  // per type: one independent problem per parent type
    if (grouped && hs.blocks > 1) {
      // groups confined to runs of problems (one example each): each run routed and normalised in cache
      const int64_t run = g.n / hs.blocks, run_groups = hs.groups / hs.blocks;
      at::parallel_for(0, hs.blocks, 1, [&](int64_t begin, int64_t end) {
        RouteScratch<T> sc(g);
        std::vector<T> top(run_groups), total(run_groups);
        for (int64_t b = begin; b < end; ++b) {
          for (int64_t n = b * run; n < (b + 1) * run; ++n) problem(n, sc, t, false);
          for (int64_t lane = 0; lane < lanes; ++lane)
            normalise_groups(R, G, b * run, (b + 1) * run, lanes > 1 ? lane : 0, lanes > 1 ? lane + 1 : g.j, g.j,
                             g.i, b * run_groups, top, total);
        }
      });
      continue;
    }
    at::parallel_for(0, g.n, 1, [&](int64_t begin, int64_t end) {
      RouteScratch<T> sc(g);
      for (int64_t n = begin; n < end; ++n) problem(n, sc, t, false);
    });
    if (!grouped) continue;
    // child groups: normalise each child's logits over its slots (and every parent, or one parent type)
    at::parallel_for(0, lanes, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> top(hs.groups), total(hs.groups);
      for (int64_t lane = begin; lane < end; ++lane)
        normalise_groups(R, G, 0, g.n, lanes > 1 ? lane : 0, lanes > 1 ? lane + 1 : g.j, g.j, g.i, 0, top, total);
    });
  }
}

// The hand-written backward's per-child work for one M-step (capsnets.functional.em.kernel), per problem n:
// from coef (J, 32) = [d loss / d sum_i w x, d loss / d sum_i w x^2] and the per-parent factors,
//   g_w[j, i] = [x, x^2] . coef[j]                              (the E-step product)
//   g_mass[j] = base[j] - slope[j] * sum_i g_w r a / floored[j]^2
//   g_r'[j, i] = g_w / floored[j] + g_mass[j];   d a[i] += sum_j g_r' r
//   left_w[j, i] = r a / guard[j]                                 (the M-step's weights, an outer-product factor)
//   with want_next: g_r[j, i] = g_r' a (+ g_r_extra), y = r g_r   (for the E-step before it)
template <typename T>
struct MStepBack {
  const Votes<T>& votes;
  const T *K, *R, *A, *GU, *FL, *SL, *BA, *GX;
  T *LW, *GA, *GR, *Y;
  bool want_next;
  bool local;  // left_w, g_r and y hold one problem's rows (1, J, I), whichever it is (the same for N = 1)

  MStepBack(const Votes<T>& v, const at::Tensor& coef, const at::Tensor& r, const at::Tensor& a_in,
            const at::Tensor& guard, const at::Tensor& floored, const at::Tensor& slope, const at::Tensor& base,
            const at::Tensor& g_r_extra, at::Tensor& left_w, at::Tensor& g_a_in, at::Tensor& g_r, at::Tensor& y,
            bool next)
      : votes(v),
        K(coef.data_ptr<T>()),
        R(r.data_ptr<T>()),
        A(a_in.data_ptr<T>()),
        GU(guard.data_ptr<T>()),
        FL(floored.data_ptr<T>()),
        SL(slope.data_ptr<T>()),
        BA(base.data_ptr<T>()),
        GX(g_r_extra.numel() > 0 ? g_r_extra.data_ptr<T>() : nullptr),
        LW(left_w.data_ptr<T>()),
        GA(g_a_in.data_ptr<T>()),
        GR(next ? g_r.data_ptr<T>() : nullptr),
        Y(next ? y.data_ptr<T>() : nullptr),
        want_next(next),
        local(left_w.size(0) == 1) {}

  // problem n; x from its stored blocks xs when given (sc.cb then unused), else computed
  void operator()(int64_t n, BackScratch<T>& sc, const T* xs) const {
    const Geometry& g = votes.g;
    const int64_t ji = g.j * g.i;
    if (xs == nullptr) votes.origin(n, sc.cb.data());
    spread(K + n * g.j * 2 * kH, 2 * kH, g.j, sc.k1.data());
    spread(K + n * g.j * 2 * kH + kH, 2 * kH, g.j, sc.k2.data());
    e_problem(votes, n, sc.cb.data(), sc.k1.data(), sc.k2.data(), sc.gw.data(), xs);
    const T* __restrict rn = R + n * ji;
    const T* __restrict an = A + n * g.i;
    const T* __restrict gwn = sc.gw.data();
    T* __restrict gan = sc.ga.data();
    std::fill(sc.ga.begin(), sc.ga.end(), T(0));
    for (int64_t j = 0; j < g.j; ++j) {
      const T* __restrict rj = rn + j * g.i;
      const T* __restrict gj = gwn + j * g.i;
      const T fl = FL[n * g.j + j];
      const T gm = BA[n * g.j + j] - SL[n * g.j + j] * dot3(gj, rj, an, g.i) / (fl * fl);
      const T rfl = T(1) / fl, rgu = T(1) / GU[n * g.j + j];
      const int64_t row = n * ji + j * g.i, out = (local ? 0 : n * ji) + j * g.i;
      T* __restrict lw = LW + out;
      for (int64_t i = 0; i < g.i; ++i) {
        gan[i] += (gj[i] * rfl + gm) * rj[i];
        lw[i] = rj[i] * an[i] * rgu;
      }
      if (want_next) {
        T* __restrict gr = GR + out;
        T* __restrict y = Y + out;
        for (int64_t i = 0; i < g.i; ++i) gr[i] = (gj[i] * rfl + gm) * an[i];
        if (GX != nullptr)
          for (int64_t i = 0; i < g.i; ++i) gr[i] += GX[row + i];
        for (int64_t i = 0; i < g.i; ++i) y[i] = rj[i] * gr[i];
      }
    }
    for (int64_t i = 0; i < g.i; ++i) GA[n * g.i + i] += gan[i];
  }
};

template <typename T>
void mstep_back_impl(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord, const at::Tensor& c,
                     const at::Tensor& inv, const at::Tensor& coef, const at::Tensor& r, const at::Tensor& a_in,
                     const at::Tensor& guard, const at::Tensor& floored, const at::Tensor& slope,
                     const at::Tensor& base, const at::Tensor& g_r_extra, at::Tensor& left_w, at::Tensor& g_a_in,
                     at::Tensor& g_r, at::Tensor& y, bool want_next, const Geometry& g) {
  const Votes<T> votes(pose, weight, coord, &c, &inv, g);
  const MStepBack<T> step(votes, coef, r, a_in, guard, floored, slope, base, g_r_extra, left_w, g_a_in, g_r, y,
                          want_next);
  at::parallel_for(0, g.n, 1, [&](int64_t begin, int64_t end) {
    BackScratch<T> sc(g, 0);
    for (int64_t n = begin; n < end; ++n) step(n, sc, nullptr);
  });
}

// The E-step's part of the same backward, per problem n: gz[j, i] = r (g_r - group_sum) (written to left_gz, an
// outer-product factor), and its M-step-like products sum_i gz [x, x^2] (J, 32) and sum_i gz (J).
template <typename T>
struct EStepBack {
  const Votes<T>& votes;
  const T *R, *GR, *TT;
  bool shared;  // one sum per child slot for every parent (all_parents, or no groups)
  bool local;  // g_r, total and left_gz hold one problem's rows, whichever it is (the same for N = 1)
  T *LZ, *O, *S0;

  EStepBack(const Votes<T>& v, const at::Tensor& r, const at::Tensor& g_r, const at::Tensor& total,
            at::Tensor& left_gz, at::Tensor& out, at::Tensor& s0)
      : votes(v),
        R(r.data_ptr<T>()),
        GR(g_r.data_ptr<T>()),
        TT(total.data_ptr<T>()),
        shared(total.size(1) == 1),
        local(g_r.size(0) == 1),
        LZ(left_gz.data_ptr<T>()),
        O(out.data_ptr<T>()),
        S0(s0.data_ptr<T>()) {}

  // problem n; x from its stored blocks xs when given (sc.cb then unused), else computed
  void operator()(int64_t n, BackScratch<T>& sc, T* xs) const {
    const Geometry& g = votes.g;
    const int64_t ji = g.j * g.i, base = local ? 0 : n * ji;  // of the rows of g_r, total and left_gz
    for (int64_t j = 0; j < g.j; ++j) {
      const int64_t row = base + j * g.i;
      const T* __restrict r = R + n * ji + j * g.i;
      const T* __restrict gr = GR + row;
      const T* __restrict tt = shared ? TT + (local ? 0 : n * g.i) : TT + row;
      T* __restrict lz = LZ + row;
      for (int64_t i = 0; i < g.i; ++i) lz[i] = r[i] * (gr[i] - tt[i]);
      sc.zsum[j] = sum8(lz, g.i);
    }
    if (xs == nullptr) votes.origin(n, sc.cb.data());
    m_problem(votes, n, sc.cb.data(), LZ + base, sc.s1.data(), sc.s2.data(), O + n * g.j * 2 * kH, xs,
              xs != nullptr);
    for (int64_t j = 0; j < g.j; ++j) S0[n * g.j + j] = sc.zsum[j];
  }
};

template <typename T>
void estep_back_impl(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord, const at::Tensor& c,
                     const at::Tensor& inv, const at::Tensor& r, const at::Tensor& g_r, const at::Tensor& total,
                     at::Tensor& left_gz, at::Tensor& out, at::Tensor& s0, const Geometry& g) {
  const Votes<T> votes(pose, weight, coord, &c, &inv, g);
  const EStepBack<T> step(votes, r, g_r, total, left_gz, out, s0);
  at::parallel_for(0, g.n, 1, [&](int64_t begin, int64_t end) {
    BackScratch<T> sc(g, 0);
    for (int64_t n = begin; n < end; ++n) step(n, sc, nullptr);
  });
}

// The hand-written backward's per-parent algebra (capsnets.functional.em.kernel), for every problem n and parent
// j, before the per-child work of one M-step (mstep_parents) and after that of the E-step before it
// (estep_parents). The state carried between them, updated in place, per (n, j): g_d, g_var (16 each), g_pre,
// g_sum_log, and the accumulated gradients of beta_v and beta_a.
struct ParentSettings {
  double lam, eps, mass_floor, blend, beta_a_scale;
  bool official;
};

// From M-step t's kept m = [m1, m2] (32), centre d, variance var, log variance lv (16 each) and mass: the
// products' gradients coef = [g_m1, g_m2] (written to coef and to right[n, j, col]), and per parent the
// guards mass + eps, floored = max(mass, floor) + eps, slope = [mass >= floor] and the per-child constant
// base of mstep_back. g_d becomes what the previous centre receives (official: (1 - blend) g_d; else 0).
template <typename T>
void mstep_parents_impl(const at::Tensor& m, const at::Tensor& d, const at::Tensor& var, const at::Tensor& lv,
                        const at::Tensor& mass, const at::Tensor& c, const at::Tensor& beta_v, const at::Tensor& g_cost,
                        const ParentSettings& ps, at::Tensor& g_d, at::Tensor& g_var, at::Tensor& g_pre, at::Tensor& g_sum_log, at::Tensor& g_bv,
                        at::Tensor& g_ba, at::Tensor& coef, at::Tensor& right, int64_t col, at::Tensor& guard,
                        at::Tensor& floored, at::Tensor& slope, at::Tensor& base, int64_t p0 = 0, int64_t p1 = -1) {
  const int64_t n_ = d.size(0), parents = d.size(1), kk = right.size(2);
  const T *M = m.data_ptr<T>(), *D = d.data_ptr<T>(), *V = var.data_ptr<T>(), *LV = lv.data_ptr<T>();
  const T *MS = mass.data_ptr<T>(), *C = c.data_ptr<T>(), *BV = beta_v.data_ptr<T>();
  const T* GC = g_cost.numel() > 0 ? g_cost.data_ptr<T>() : nullptr;
  T *GD = g_d.data_ptr<T>(), *GV = g_var.data_ptr<T>(), *GP = g_pre.data_ptr<T>(), *GS = g_sum_log.data_ptr<T>();
  T *GBV = g_bv.data_ptr<T>(), *GBA = g_ba.data_ptr<T>(), *K = coef.data_ptr<T>(), *RT = right.data_ptr<T>();
  T *GU = guard.data_ptr<T>(), *FL = floored.data_ptr<T>(), *SL = slope.data_ptr<T>(), *BS = base.data_ptr<T>();
  const T lam = static_cast<T>(ps.lam), eps = static_cast<T>(ps.eps), floor_ = static_cast<T>(ps.mass_floor);
  const T blend = static_cast<T>(ps.blend), entropy = static_cast<T>(kH * (1.0 + std::log(2.0 * M_PI)));
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t j = p % parents;
      const T ms = MS[p], gu = ms + eps, sv = ms / gu, fl = std::max(ms, floor_) + eps;
      const T sl = ms >= floor_ ? T(1) : T(0);
      T sum_log = 0;
      for (int h = 0; h < kH; ++h) sum_log += LV[p * kH + h];
      // the activation logit: official lam ((mass + eps) (-sum_h log_var - beta_v H (1 + log 2 pi)) - 5000
      // beta_a); paper lam (beta_a - cost), cost = (H beta_v + 0.5 sum_h log_var) mass
      const T gp = GP[p];
      T g_mass;
      if (ps.official) {
        g_mass = gp * lam * (-sum_log - BV[j] * entropy);
        GS[p] -= gp * lam * gu;
        GBV[p] -= gp * lam * gu * entropy;
        GBA[p] -= gp * lam * static_cast<T>(ps.beta_a_scale);
      } else {
        const T g_cost = GC != nullptr ? GC[p] : -lam * gp;  // given: through a cost normalisation
        GBA[p] += lam * gp;
        GBV[p] += g_cost * kH * ms;
        GS[p] += T(0.5) * g_cost * ms;
        g_mass = g_cost * (kH * BV[j] + T(0.5) * sum_log);
      }
      // var = max(m2 - 2 d m1 + s d^2, 0) + floor, log_var = log var + offset; m = sum_i w [x, x^2] with
      // w = R' / (mass + eps) and s = mass / (mass + eps)
      const T gsl = GS[p];
      T g_s = 0;
      T* k = K + p * 2 * kH;
      for (int h = 0; h < kH; ++h) {
        const int64_t e = p * kH + h;
        const T dd = D[e], m1 = M[p * 2 * kH + h], m2 = M[p * 2 * kH + kH + h];
        const T raw = m2 - 2 * dd * m1 + sv * dd * dd;  // the variance about the centre, before the floor
        const T g_raw = raw >= 0 ? GV[e] + gsl / V[e] : T(0);
        const T gd = GD[e] + g_raw * (2 * sv * dd - 2 * m1);
        const T g_e = ps.official ? blend * gd : gd;  // the centre d = m1 + (s - 1) c (blended: official)
        g_s += g_raw * dd * dd + g_e * C[e];
        k[h] = g_e - 2 * dd * g_raw;
        k[kH + h] = g_raw;
        GD[e] = ps.official ? (1 - blend) * gd : T(0);
      }
      std::copy(k, k + 2 * kH, RT + (p * kk + col) * 2 * kH);
      GU[p] = gu;
      FL[p] = fl;
      SL[p] = sl;
      BS[p] = g_mass + g_s * (T(1) / fl - sl * ms / (fl * fl));  // through s and the floored mass
    }
  };
  if (p1 >= 0) {  // rows [p0, p1) in this thread
    rows(p0, p1);
    return;
  }
  at::parallel_for(0, n_ * parents, 64, rows);
}

// From the E-step products s12 = [sum_i gz x, sum_i gz x^2] (32) and s0 = sum_i gz of the E-step that used
// iteration t's parameters d, var, pre: the state for iteration t's M-step, and right[n, j, col] = [d / var,
// -0.5 / var].
template <typename T>
void estep_parents_impl(const at::Tensor& s12, const at::Tensor& s0, const at::Tensor& d, const at::Tensor& var,
                        const at::Tensor& pre, at::Tensor& g_d, at::Tensor& g_var, at::Tensor& g_pre,
                        at::Tensor& g_sum_log, at::Tensor& right, int64_t col, int64_t p0 = 0,
                        int64_t p1 = -1) {
  const int64_t n_ = d.size(0), parents = d.size(1), kk = right.size(2);
  const T *S12 = s12.data_ptr<T>(), *S0 = s0.data_ptr<T>(), *D = d.data_ptr<T>(), *V = var.data_ptr<T>();
  const T* PRE = pre.data_ptr<T>();
  T *GD = g_d.data_ptr<T>(), *GV = g_var.data_ptr<T>(), *GP = g_pre.data_ptr<T>(), *GS = g_sum_log.data_ptr<T>();
  T* RT = right.data_ptr<T>();
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T z = S0[p];
      GP[p] = z / (T(1) + std::exp(PRE[p]));  // z sigmoid(-pre)
      GS[p] = T(-0.5) * z;
      T* rt = RT + (p * kk + col) * 2 * kH;
      for (int h = 0; h < kH; ++h) {
        const int64_t e = p * kH + h;
        const T s1 = S12[p * 2 * kH + h], s2 = S12[p * 2 * kH + kH + h], dd = D[e], v = V[e];
        GD[e] += (s1 - dd * z) / v;
        GV[e] = T(0.5) * (s2 - 2 * dd * s1 + dd * dd * z) / (v * v);
        rt[h] = dd / v;
        rt[kH + h] = T(-0.5) / v;
      }
    }
  };
  if (p1 >= 0) {  // rows [p0, p1) in this thread
    rows(p0, p1);
    return;
  }
  at::parallel_for(0, n_ * parents, 64, rows);
}

// For each slot (n, j, i) of x, the sum of x over its child group (index (N, I) of groups children): over the
// slots of that child and one parent type (per_type: out (N, J, I)) or every parent type (out (N, 1, I)).
template <typename T>
void group_sum_impl(const at::Tensor& x, const at::Tensor& index, int64_t groups, bool per_type, int64_t blocks,
                    at::Tensor& out) {
  const int64_t n_ = x.size(0), parents = x.size(1), children = x.size(2);
  const T* X = x.data_ptr<T>();
  const int64_t* G = index.data_ptr<int64_t>();
  T* O = out.data_ptr<T>();
  const int64_t lanes = per_type ? parents : 1;
  // the sums of the slots of problems [n0, n1) in one lane, whose groups are g0 .. g0 + total.size() - 1
  auto sum_run = [&](int64_t n0, int64_t n1, int64_t lane, int64_t g0, std::vector<T>& total) {
    const int64_t j0 = per_type ? lane : 0, j1 = per_type ? lane + 1 : parents;
    std::fill(total.begin(), total.end(), T(0));
    T* tt = total.data();
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t* gn = G + n * children;
      for (int64_t j = j0; j < j1; ++j) {
        const T* xr = X + (n * parents + j) * children;
        for (int64_t i = 0; i < children; ++i) tt[gn[i] - g0] += xr[i];
      }
    }
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t* gn = G + n * children;
      T* o = O + (n * lanes + lane) * children;
      for (int64_t i = 0; i < children; ++i) o[i] = tt[gn[i] - g0];
    }
  };
  if (blocks > 1) {  // groups confined to runs of problems: each run's sums in cache
    const int64_t run = n_ / blocks, run_groups = groups / blocks;
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> total(run_groups);
      for (int64_t b = begin; b < end; ++b)
        for (int64_t lane = 0; lane < lanes; ++lane) sum_run(b * run, (b + 1) * run, lane, b * run_groups, total);
    });
    return;
  }
  at::parallel_for(0, lanes, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> total(groups);
    for (int64_t lane = begin; lane < end; ++lane) sum_run(0, n_, lane, 0, total);
  });
}

// The child groups' index (N, I): every entry in [0, groups); with blocks > 1, the slots of the problems
// [b N / blocks, (b + 1) N / blocks) only in the groups [b G / blocks, (b + 1) G / blocks) (ChildGroups.blocks).
void check_groups(const at::Tensor& index, int64_t n, int64_t children, int64_t groups, int64_t blocks) {
  TORCH_CHECK(index.scalar_type() == at::kLong && index.is_contiguous() && index.device().is_cpu() &&
                  index.sizes() == at::IntArrayRef({n, children}),
              "index must be a contiguous (N, I) int64 CPU tensor");
  TORCH_CHECK(blocks >= 1 && n % blocks == 0 && groups % blocks == 0, "blocks = ", blocks,
              " must divide the problems N = ", n, " and the groups ", groups);
  const int64_t* G = index.data_ptr<int64_t>();
  const int64_t run = std::max<int64_t>(n / blocks, 1), run_groups = groups / blocks;
  bool ok = true;
  for (int64_t p = 0; p < n; ++p) {
    const int64_t lo = (p / run) * run_groups, hi = lo + run_groups;
    for (int64_t k = 0; k < children; ++k) ok &= G[p * children + k] >= lo && G[p * children + k] < hi;
  }
  TORCH_CHECK(ok, blocks > 1 ? "a group index outside its run of problems' range (ChildGroups.blocks)"
                             : "group index out of range [0, groups)");
}

void check_like(const at::Tensor& t, const at::Tensor& like, std::vector<int64_t> shape, const char* name) {
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.is_contiguous() && t.device().is_cpu(), name,
              " must be a contiguous CPU tensor of pose's dtype");
  TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), name, " has shape ", t.sizes(), ", expected ",
              at::IntArrayRef(shape));
}

// The whole hand-written backward of routing without child groups (capsnets.functional.em.kernel), one problem at
// a time: for each kept iteration from the last, the per-parent algebra before its M-step (with the mass
// normalisation's cost gradient, when cost_scale > 0), its M-step's per-child work and, but for the first kept
// iteration, the E-step before it (the sum over parents, its per-child work, the per-parent algebra after it); then
// votes_backward. Each problem's children's x are made once, and its rows of every intermediate stay in cache: the
// same operations as those functions called in turn over all problems, without a vote computed again.
template <typename T>
void backward_fused_impl(const Votes<T>& votes, const at::Tensor& c, const std::vector<at::Tensor>& kept,
                         const at::Tensor& a_in, const at::Tensor& beta_v, const at::Tensor& g_r_extra,
                         const std::vector<double>& lambdas, const ParentSettings& settings, double cost_scale,
                         const std::vector<at::Tensor>& state, const std::vector<at::Tensor>& work, at::Tensor& gpose,
                         at::Tensor& gweight) {
  const Geometry& g = votes.g;
  const int64_t steps = kept[0].size(0), kk = 2 * steps - 1;
  // the state carried from step to step (g_d, g_var, g_pre, g_sum_log, g_bv, g_ba, g_a_in) and the intermediates
  // (right, coef, guard, floored, slope, base, g_cost, s12, s0), every problem's rows
  at::Tensor g_d = state[0], g_var = state[1], g_pre = state[2], g_sum_log = state[3], g_bv = state[4];
  at::Tensor g_ba = state[5], g_a_in = state[6];
  at::Tensor right = work[0], coef = work[1], guard = work[2], floored = work[3], slope = work[4], base = work[5];
  at::Tensor g_cost = work[6], s12 = work[7], s0 = work[8];
  const at::Tensor none = g_r_extra.new_empty({0});
  std::vector<std::vector<at::Tensor>> at_t(steps);  // kept[k][t]: r, m, d, var, lv, pre, mass of iteration t
  for (int64_t t = 0; t < steps; ++t)
    for (const auto& k : kept) at_t[t].push_back(k.select(0, t));
  std::vector<ParentSettings> ps(steps, settings);
  for (int64_t t = 0; t < steps; ++t) ps[t].lam = lambdas[t];
  const bool scaled = cost_scale > 0;
  T* GC = scaled ? g_cost.data_ptr<T>() : nullptr;
  const T* GP = g_pre.data_ptr<T>();
  const int64_t wsize = g.iw * 4 * g.q();
  const int threads = at::get_num_threads();
  std::vector<T> partial(static_cast<size_t>(threads) * wsize, T(0));  // d Wt, one copy per thread
  at::parallel_for(0, g.n, 1, [&](int64_t begin, int64_t end) {
    T* gw = partial.data() + static_cast<int64_t>(at::get_thread_num()) * wsize;
    BackScratch<T> sc(g, kk);
    T* xs = sc.xs.data();
    // the rows of one problem at a time: the outer-product factors left (K, 1, J, I), g_r and y (1, J, I), and
    // each child's sum of y over the parents (1, 1, I)
    at::Tensor left = new_tensor({kk, 1, g.j, g.i}, a_in.options()), g_r = new_tensor({1, g.j, g.i}, a_in.options());
    at::Tensor y = new_tensor({1, g.j, g.i}, a_in.options()), total = new_tensor({1, 1, g.i}, a_in.options());
    std::vector<at::Tensor> columns;
    for (int64_t col = 0; col < kk; ++col) columns.push_back(left.select(0, col));
    std::vector<MStepBack<T>> mstep;  // iteration t's M-step, at column 2 (steps - 1 - t)
    for (int64_t t = 0; t < steps; ++t)
      mstep.emplace_back(votes, coef, at_t[t][0], a_in, guard, floored, slope, base,
                         t == steps - 1 ? g_r_extra : none, columns[2 * (steps - 1 - t)], g_a_in, g_r, y, t > 0);
    std::vector<EStepBack<T>> estep;  // the E-step before iteration t's M-step (t >= 1), at the column after it
    for (int64_t t = 1; t < steps; ++t)
      estep.emplace_back(votes, at_t[t][0], g_r, total, columns[2 * (steps - 1 - t) + 1], s12, s0);
    const VotesBackward<T> vb(votes, left, right, gpose);
    const T* Y = y.data_ptr<T>();
    T* TT = total.data_ptr<T>();
    for (int64_t n = begin; n < end; ++n) {
      const int64_t p0 = n * g.j, p1 = p0 + g.j;
      votes.origin(n, sc.cb.data());
      x_blocks(votes, n, sc.cb.data(), xs);
      int64_t col = 0;
      for (int64_t t = steps - 1; t >= 0; --t) {
        const auto& it = at_t[t];
        if (scaled) {  // the mass normalisation: the cost's gradient -lambda g_pre J / (I H)
          const T lam = static_cast<T>(ps[t].lam), scale = static_cast<T>(cost_scale);
          for (int64_t p = p0; p < p1; ++p) GC[p] = -lam * GP[p] * scale;
        }
        mstep_parents_impl<T>(it[1], it[2], it[3], it[4], it[6], c, beta_v, scaled ? g_cost : none, ps[t], g_d, g_var,
                              g_pre, g_sum_log, g_bv, g_ba, coef, right, col, guard, floored, slope, base, p0, p1);
        mstep[t](n, sc, xs);
        ++col;
        if (t == 0) break;
        for (int64_t i = 0; i < g.i; ++i) TT[i] = T(0);  // each child's sum over the parents of y
        for (int64_t j = 0; j < g.j; ++j)
          for (int64_t i = 0; i < g.i; ++i) TT[i] += Y[j * g.i + i];
        estep[t - 1](n, sc, xs);
        const auto& prev = at_t[t - 1];
        estep_parents_impl<T>(s12, s0, prev[2], prev[3], prev[5], g_d, g_var, g_pre, g_sum_log, right, col, p0, p1);
        ++col;
      }
      vb(n, sc, gw, xs);
    }
  });
  sum_weight_gradients(partial, threads, g, gweight);
}

}  // namespace

std::vector<at::Tensor> votes_stats(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord,
                                    const at::Tensor& w0) {
  const Geometry g = check(pose, weight, coord);
  check_like(w0, pose, {g.n, g.i}, "w0");
  auto mean = new_tensor({g.n, g.j, kH}, pose.options());
  auto top = new_tensor({g.n}, pose.options());
  AT_DISPATCH_FLOATING_TYPES(pose.scalar_type(), "votes_stats",
                             [&] { stats_impl<scalar_t>(pose, weight, coord, w0, mean, top, g); });
  return {mean, top};
}

std::vector<at::Tensor> votes_backward(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord,
                                       const at::Tensor& c, const at::Tensor& inv, const at::Tensor& left,
                                       const at::Tensor& right) {
  const Geometry g = check(pose, weight, coord);
  check_like(c, pose, {g.n, g.j, kH}, "c");
  check_like(inv, pose, {g.n}, "inv");
  TORCH_CHECK(left.dim() == 4, "left must be (K, N, J, I)");
  const int64_t kk = left.size(0);
  check_like(left, pose, {kk, g.n, g.j, g.i}, "left");
  check_like(right, pose, {g.n, g.j, kk, 2 * kH}, "right");
  auto gpose = new_tensor({g.n, g.i, kH}, pose.options());  // every entry written once
  auto gweight = new_tensor({g.iw, g.j, kH}, pose.options());
  AT_DISPATCH_FLOATING_TYPES(pose.scalar_type(), "votes_backward", [&] {
    backward_impl<scalar_t>(pose, weight, coord, c, inv, left, right, gpose, gweight, g);
  });
  return {gpose, gweight};
}

// mstep_back(pose, weight, coord, c, inv, coef (N, J, 32), r (N, J, I), a_in (N, I), guard, floored, slope,
//            base (N, J), g_r_extra (N, J, I) or empty, left_w (N, J, I) out, g_a_in (N, I) accumulated,
//            want_next) -> [g_r (N, J, I), y (N, J, I)] (empty without want_next)
std::vector<at::Tensor> mstep_back(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord,
                                   const at::Tensor& c, const at::Tensor& inv, const at::Tensor& coef,
                                   const at::Tensor& r, const at::Tensor& a_in, const at::Tensor& guard,
                                   const at::Tensor& floored, const at::Tensor& slope, const at::Tensor& base,
                                   const at::Tensor& g_r_extra, at::Tensor left_w, at::Tensor g_a_in, bool want_next) {
  const Geometry g = check(pose, weight, coord);
  check_like(c, pose, {g.n, g.j, kH}, "c");
  check_like(inv, pose, {g.n}, "inv");
  check_like(coef, pose, {g.n, g.j, 2 * kH}, "coef");
  check_like(r, pose, {g.n, g.j, g.i}, "r");
  check_like(a_in, pose, {g.n, g.i}, "a_in");
  check_like(guard, pose, {g.n, g.j}, "guard");
  check_like(floored, pose, {g.n, g.j}, "floored");
  check_like(slope, pose, {g.n, g.j}, "slope");
  check_like(base, pose, {g.n, g.j}, "base");
  if (g_r_extra.numel() > 0) check_like(g_r_extra, pose, {g.n, g.j, g.i}, "g_r_extra");
  check_like(left_w, pose, {g.n, g.j, g.i}, "left_w");
  check_like(g_a_in, pose, {g.n, g.i}, "g_a_in");
  const int64_t size = want_next ? g.n : 0;
  auto g_r = new_tensor({size, g.j, g.i}, pose.options());
  auto y = new_tensor({size, g.j, g.i}, pose.options());
  AT_DISPATCH_FLOATING_TYPES(pose.scalar_type(), "mstep_back", [&] {
    mstep_back_impl<scalar_t>(pose, weight, coord, c, inv, coef, r, a_in, guard, floored, slope, base, g_r_extra,
                              left_w, g_a_in, g_r, y, want_next, g);
  });
  return {g_r, y};
}

// estep_back(pose, weight, coord, c, inv, r (N, J, I), g_r (N, J, I), total (N, J, I) or (N, 1, I),
//            left_gz (N, J, I) out) -> [sum_i gz [x, x^2] (N, J, 32), sum_i gz (N, J)]
std::vector<at::Tensor> estep_back(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord,
                                   const at::Tensor& c, const at::Tensor& inv, const at::Tensor& r,
                                   const at::Tensor& g_r, const at::Tensor& total, at::Tensor left_gz) {
  const Geometry g = check(pose, weight, coord);
  check_like(c, pose, {g.n, g.j, kH}, "c");
  check_like(inv, pose, {g.n}, "inv");
  check_like(r, pose, {g.n, g.j, g.i}, "r");
  check_like(g_r, pose, {g.n, g.j, g.i}, "g_r");
  check_like(total, pose, {g.n, total.size(1) == 1 ? 1 : g.j, g.i}, "total");
  check_like(left_gz, pose, {g.n, g.j, g.i}, "left_gz");
  auto out = new_tensor({g.n, g.j, 2 * kH}, pose.options());
  auto s0 = new_tensor({g.n, g.j}, pose.options());
  AT_DISPATCH_FLOATING_TYPES(pose.scalar_type(), "estep_back", [&] {
    estep_back_impl<scalar_t>(pose, weight, coord, c, inv, r, g_r, total, left_gz, out, s0, g);
  });
  return {out, s0};
}

// mstep_parents(m (N, J, 32), d, var, log_var (N, J, 16), mass (N, J), c (N, J, 16), beta_v (J), g_cost (N, J) or
// empty (the paper's cost's gradient where a normalisation stands between it and the logit), the state g_d,
// g_var (N, J, 16), g_pre, g_sum_log, g_bv, g_ba (N, J) (updated in place), right (N, J, K, 32), col, lam, eps,
// official, mass_floor, blend, beta_a_scale) -> coef (N, J, 32), guard, floored, slope, base (N, J)
std::vector<at::Tensor> mstep_parents(const at::Tensor& m, const at::Tensor& d, const at::Tensor& var,
                                      const at::Tensor& log_var, const at::Tensor& mass, const at::Tensor& c,
                                      const at::Tensor& beta_v, const at::Tensor& g_cost, at::Tensor g_d,
                                      at::Tensor g_var, at::Tensor g_pre,
                                      at::Tensor g_sum_log, at::Tensor g_bv, at::Tensor g_ba, at::Tensor right,
                                      int64_t col, double lam, double eps, bool official, double mass_floor,
                                      double blend, double beta_a_scale) {
  TORCH_CHECK(d.dim() == 3 && d.size(2) == kH, "d must be (N, J, 16)");
  const int64_t n = d.size(0), j = d.size(1);
  check_like(d, d, {n, j, kH}, "d");
  check_like(m, d, {n, j, 2 * kH}, "m");
  for (auto* t : {&var, &log_var, &c, &static_cast<const at::Tensor&>(g_d), &static_cast<const at::Tensor&>(g_var)})
    check_like(*t, d, {n, j, kH}, "a (N, J, 16) operand");
  for (auto* t : {&mass, &static_cast<const at::Tensor&>(g_pre), &static_cast<const at::Tensor&>(g_sum_log),
                  &static_cast<const at::Tensor&>(g_bv), &static_cast<const at::Tensor&>(g_ba)})
    check_like(*t, d, {n, j}, "an (N, J) operand");
  check_like(beta_v, d, {j}, "beta_v");
  if (g_cost.numel() > 0) check_like(g_cost, d, {n, j}, "g_cost");
  TORCH_CHECK(right.dim() == 4 && col >= 0 && col < right.size(2), "col out of right's range");
  check_like(right, d, {n, j, right.size(2), 2 * kH}, "right");
  auto coef = new_tensor({n, j, 2 * kH}, d.options());
  auto guard = new_tensor({n, j}, d.options()), floored = new_tensor({n, j}, d.options());
  auto slope = new_tensor({n, j}, d.options()), base = new_tensor({n, j}, d.options());
  const ParentSettings ps{lam, eps, mass_floor, blend, beta_a_scale, official};
  AT_DISPATCH_FLOATING_TYPES(d.scalar_type(), "mstep_parents", [&] {
    mstep_parents_impl<scalar_t>(m, d, var, log_var, mass, c, beta_v, g_cost, ps, g_d, g_var, g_pre, g_sum_log, g_bv, g_ba,
                                 coef, right, col, guard, floored, slope, base);
  });
  return {coef, guard, floored, slope, base};
}

// estep_parents(s12 (N, J, 32), s0 (N, J), d, var (N, J, 16), pre (N, J), the state g_d, g_var, g_pre,
// g_sum_log (updated in place), right (N, J, K, 32), col)
void estep_parents(const at::Tensor& s12, const at::Tensor& s0, const at::Tensor& d, const at::Tensor& var,
                   const at::Tensor& pre, at::Tensor g_d, at::Tensor g_var, at::Tensor g_pre, at::Tensor g_sum_log,
                   at::Tensor right, int64_t col) {
  TORCH_CHECK(d.dim() == 3 && d.size(2) == kH, "d must be (N, J, 16)");
  const int64_t n = d.size(0), j = d.size(1);
  check_like(d, d, {n, j, kH}, "d");
  check_like(s12, d, {n, j, 2 * kH}, "s12");
  for (auto* t : {&var, &static_cast<const at::Tensor&>(g_d), &static_cast<const at::Tensor&>(g_var)})
    check_like(*t, d, {n, j, kH}, "a (N, J, 16) operand");
  for (auto* t : {&s0, &pre, &static_cast<const at::Tensor&>(g_pre), &static_cast<const at::Tensor&>(g_sum_log)})
    check_like(*t, d, {n, j}, "an (N, J) operand");
  TORCH_CHECK(right.dim() == 4 && col >= 0 && col < right.size(2), "col out of right's range");
  check_like(right, d, {n, j, right.size(2), 2 * kH}, "right");
  AT_DISPATCH_FLOATING_TYPES(d.scalar_type(), "estep_parents", [&] {
    estep_parents_impl<scalar_t>(s12, s0, d, var, pre, g_d, g_var, g_pre, g_sum_log, right, col);
  });
}

// group_sum(x (N, J, I), index (N, I) int64, groups, per_type, blocks) -> (N, J, I) (per_type) or (N, 1, I)
at::Tensor group_sum(const at::Tensor& x, const at::Tensor& index, int64_t groups, bool per_type, int64_t blocks) {
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous() && x.device().is_cpu(), "x must be a contiguous (N, J, I) CPU tensor");
  check_groups(index, x.size(0), x.size(2), groups, blocks);
  auto out = new_tensor({x.size(0), per_type ? x.size(1) : 1, x.size(2)}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "group_sum",
                             [&] { group_sum_impl<scalar_t>(x, index, groups, per_type, blocks, out); });
  return out;
}

// route(pose, weight, coord, c, inv, a_in (N, I), beta_v, beta_a (J), floor, log_var_offset (N), r0 (N, J, I),
//       index (N, I) int64 or empty, lambdas, eps, official, cost_normalization (0 none, 1 mean_std, 2 mass),
//       normalize (0 all parents, 1 per type), groups, blocks, keep (0 nothing, 1 the last iteration, 2 every one))
//   -> [r (N, J, I), d (N, J, 16), pre (N, J), then per kept iteration r, m (32), d, var, log_var (16), pre, mass]
// r0 is routed in place: the r returned is r0, holding the last E-step's assignments
std::vector<at::Tensor> route(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord,
                              const at::Tensor& c, const at::Tensor& inv, const at::Tensor& a_in,
                              const at::Tensor& beta_v, const at::Tensor& beta_a, const at::Tensor& floor,
                              const at::Tensor& log_var_offset, const at::Tensor& r0, const at::Tensor& index,
                              std::vector<double> lambdas, double eps, bool official, int64_t cost_normalization,
                              int64_t normalize, int64_t groups, int64_t blocks, int64_t keep) {
  const Geometry g = check(pose, weight, coord);
  check_like(c, pose, {g.n, g.j, kH}, "c");
  check_like(inv, pose, {g.n}, "inv");
  check_like(a_in, pose, {g.n, g.i}, "a_in");
  check_like(beta_v, pose, {g.j}, "beta_v");
  check_like(beta_a, pose, {g.j}, "beta_a");
  check_like(floor, pose, {g.n}, "floor");
  check_like(log_var_offset, pose, {g.n}, "log_var_offset");
  check_like(r0, pose, {g.n, g.j, g.i}, "r0");
  if (groups > 0) check_groups(index, g.n, g.i, groups, blocks);
  TORCH_CHECK(cost_normalization >= 0 && cost_normalization <= 2 && normalize >= 0 && normalize <= 1 && keep >= 0 &&
                  keep <= 2 && !lambdas.empty(),
              "bad cost_normalization, normalize, keep or lambdas");
  const int64_t steps = static_cast<int64_t>(lambdas.size());
  RouteSettings hs{std::move(lambdas), eps, official, static_cast<int>(cost_normalization), static_cast<int>(normalize),
                   groups, keep == 2, groups > 0 ? blocks : 1};
  auto r = r0;
  auto d = new_tensor({g.n, g.j, kH}, pose.options());
  d.zero_();
  auto pre = new_tensor({g.n, g.j}, pose.options());
  const int64_t t_kept = keep == 2 ? steps : keep;
  auto kr = new_tensor({t_kept, g.n, g.j, g.i}, pose.options());
  auto km = new_tensor({t_kept, g.n, g.j, 2 * kH}, pose.options());
  auto kd = new_tensor({t_kept, g.n, g.j, kH}, pose.options());
  auto kvar = new_tensor({t_kept, g.n, g.j, kH}, pose.options());
  auto klv = new_tensor({t_kept, g.n, g.j, kH}, pose.options());
  auto kpre = new_tensor({t_kept, g.n, g.j}, pose.options());
  auto kmass = new_tensor({t_kept, g.n, g.j}, pose.options());
  AT_DISPATCH_FLOATING_TYPES(pose.scalar_type(), "route", [&] {
    Kept<scalar_t> kept;
    if (keep > 0) {
      kept = {kr.data_ptr<scalar_t>(), km.data_ptr<scalar_t>(), kd.data_ptr<scalar_t>(), kvar.data_ptr<scalar_t>(),
              klv.data_ptr<scalar_t>(), kpre.data_ptr<scalar_t>(), kmass.data_ptr<scalar_t>()};
    }
    route_impl<scalar_t>(pose, weight, coord, c, inv, a_in, beta_v, beta_a, floor, log_var_offset, index, hs, r, d, pre,
                         kept, g);
  });
  return {r, d, pre, kr, km, kd, kvar, klv, kpre, kmass};
}

// gather_rows(values (B, R, F), index (P,)) -> (B, P, F): out[b, p] = values[b, index[p]], zeros where index[p] == R
// (a receptive field's slot in the zero padding); scatter_rows(grad (B, P, F), index (P,), R) -> (B, R, F): its
// backward, each row the sum of the slots that read it. Parallel over the batch, so no two threads write one row.
static void check_rows(const at::Tensor& x, const at::Tensor& index, int64_t rows) {
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous() && x.device().is_cpu() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble),
              "values and grad must be contiguous (B, rows, F) float32 or float64 CPU tensors");
  TORCH_CHECK(index.dim() == 1 && index.scalar_type() == at::kLong && index.is_contiguous() && index.device().is_cpu(),
              "index must be a contiguous int64 CPU vector");
  const int64_t* ix = index.data_ptr<int64_t>();
  bool ok = true;
  for (int64_t k = 0; k < index.numel(); ++k) ok &= ix[k] >= 0 && ix[k] <= rows;
  TORCH_CHECK(ok, "index out of range [0, ", rows, "]");
}

at::Tensor gather_rows(const at::Tensor& values, const at::Tensor& index) {
  const int64_t rows = values.size(1);
  check_rows(values, index, rows);
  const int64_t batch = values.size(0), slots = index.numel(), f = values.size(2);
  auto out = new_tensor({batch, slots, f}, values.options());
  AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "gather_rows", [&] {
    const scalar_t* V = values.data_ptr<scalar_t>();
    const int64_t* ix = index.data_ptr<int64_t>();
    scalar_t* O = out.data_ptr<scalar_t>();
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b)
        for (int64_t k = 0; k < slots; ++k) {
          scalar_t* o = O + (b * slots + k) * f;
          if (ix[k] == rows) {
            std::fill(o, o + f, scalar_t(0));
          } else {
            std::copy(V + (b * rows + ix[k]) * f, V + (b * rows + ix[k] + 1) * f, o);
          }
        }
    });
  });
  return out;
}

at::Tensor scatter_rows(const at::Tensor& grad, const at::Tensor& index, int64_t rows) {
  check_rows(grad, index, rows);
  TORCH_CHECK(grad.size(1) == index.numel(), "grad must have one slot per index entry");
  const int64_t batch = grad.size(0), slots = index.numel(), f = grad.size(2);
  auto out = new_tensor({batch, rows, f}, grad.options());
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "scatter_rows", [&] {
    const scalar_t* G = grad.data_ptr<scalar_t>();
    const int64_t* ix = index.data_ptr<int64_t>();
    scalar_t* O = out.data_ptr<scalar_t>();
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        scalar_t* ob = O + b * rows * f;
        std::fill(ob, ob + rows * f, scalar_t(0));
        for (int64_t k = 0; k < slots; ++k) {
          if (ix[k] == rows) continue;
          const scalar_t* __restrict g = G + (b * slots + k) * f;
          scalar_t* __restrict o = ob + ix[k] * f;
          for (int64_t e = 0; e < f; ++e) o[e] += g[e];
        }
      }
    });
  });
  return out;
}

// backward_fused(pose, weight, coord, c, inv, kept [r (T, N, J, I), m (T, N, J, 32), d, var, log_var (T, N, J, 16),
//                pre, mass (T, N, J)], a_in (N, I), beta_v (J), g_d (N, J, 16), g_pre (N, J), g_r_extra (N, J, I) or
//                empty, lambdas (T), eps, official, cost_scale, mass_floor, blend, beta_a_scale)
//   -> [d pose (N, I, 16), d weight (Iw, J, 16), d a_in (N, I), d beta_v, d beta_a (N, J)]
// The backward of routing without child groups in one pass over the problems (backward_fused_impl): g_d and g_pre,
// the gradients of the last centre (scaled units) and activation logit, are the state it starts from (updated in
// place); cost_scale is 0 without a cost normalisation, J / (I H) with the mass normalisation.
std::vector<at::Tensor> backward_fused(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord,
                                       const at::Tensor& c, const at::Tensor& inv, const std::vector<at::Tensor>& kept,
                                       const at::Tensor& a_in, const at::Tensor& beta_v, at::Tensor g_d,
                                       at::Tensor g_pre, const at::Tensor& g_r_extra, std::vector<double> lambdas,
                                       double eps, bool official, double cost_scale, double mass_floor, double blend,
                                       double beta_a_scale) {
  const Geometry g = check(pose, weight, coord);
  check_like(c, pose, {g.n, g.j, kH}, "c");
  check_like(inv, pose, {g.n}, "inv");
  TORCH_CHECK(kept.size() == 7 && kept[0].dim() == 4 && kept[0].size(0) >= 1, "kept must be the 7 kept tensors");
  const int64_t steps = kept[0].size(0), kk = 2 * steps - 1;
  TORCH_CHECK(static_cast<int64_t>(lambdas.size()) == steps, "one lambda per kept iteration");
  TORCH_CHECK(cost_scale >= 0, "cost_scale must be at least 0");
  check_like(kept[0], pose, {steps, g.n, g.j, g.i}, "kept r");
  check_like(kept[1], pose, {steps, g.n, g.j, 2 * kH}, "kept m");
  for (int k = 2; k < 5; ++k) check_like(kept[k], pose, {steps, g.n, g.j, kH}, "kept d, var or log_var");
  for (int k = 5; k < 7; ++k) check_like(kept[k], pose, {steps, g.n, g.j}, "kept pre or mass");
  check_like(a_in, pose, {g.n, g.i}, "a_in");
  check_like(beta_v, pose, {g.j}, "beta_v");
  check_like(g_d, pose, {g.n, g.j, kH}, "g_d");
  check_like(g_pre, pose, {g.n, g.j}, "g_pre");
  if (g_r_extra.numel() > 0) check_like(g_r_extra, pose, {g.n, g.j, g.i}, "g_r_extra");
  const auto o = pose.options();
  auto zeros = [&](at::IntArrayRef size) {
    auto t = new_tensor(size, o);
    t.zero_();
    return t;
  };
  const std::vector<at::Tensor> state{g_d,
                                      zeros({g.n, g.j, kH}),  // g_var
                                      g_pre,
                                      zeros({g.n, g.j}),  // g_sum_log
                                      zeros({g.n, g.j}),  // g_bv
                                      zeros({g.n, g.j}),  // g_ba
                                      zeros({g.n, g.i})};  // g_a_in
  const std::vector<at::Tensor> work{new_tensor({g.n, g.j, kk, 2 * kH}, o),  // right
                                     new_tensor({g.n, g.j, 2 * kH}, o),  // coef
                                     new_tensor({g.n, g.j}, o),  // guard
                                     new_tensor({g.n, g.j}, o),  // floored
                                     new_tensor({g.n, g.j}, o),  // slope
                                     new_tensor({g.n, g.j}, o),  // base
                                     new_tensor({cost_scale > 0 ? g.n : 0, g.j}, o),  // g_cost
                                     new_tensor({g.n, g.j, 2 * kH}, o),  // s12
                                     new_tensor({g.n, g.j}, o)};  // s0
  auto gpose = new_tensor({g.n, g.i, kH}, o);  // every entry written once
  auto gweight = new_tensor({g.iw, g.j, kH}, o);
  const ParentSettings ps{0.0, eps, mass_floor, blend, beta_a_scale, official};
  AT_DISPATCH_FLOATING_TYPES(pose.scalar_type(), "backward_fused", [&] {
    const Votes<scalar_t> votes(pose, weight, coord, &c, &inv, g);
    backward_fused_impl<scalar_t>(votes, c, kept, a_in, beta_v, g_r_extra, lambdas, ps, cost_scale, state, work,
                                  gpose, gweight);
  });
  return {gpose, gweight, state[6], state[4], state[5]};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("votes_stats", &votes_stats, "activation-weighted mean vote and largest |vote| per problem");
  m.def("votes_backward", &votes_backward, "d pose, d weight from d xx = left @ right");
  m.def("route", &route, "EM routing without gradients, keeping what the backward needs");
  m.def("mstep_back", &mstep_back, "the hand-written backward's per-child work for one M-step");
  m.def("estep_back", &estep_back, "the hand-written backward's per-child work for one E-step");
  m.def("group_sum", &group_sum, "each slot's sum over its child group");
  m.def("mstep_parents", &mstep_parents, "the hand-written backward's per-parent algebra before one M-step");
  m.def("estep_parents", &estep_parents, "the hand-written backward's per-parent algebra after one E-step");
  m.def("backward_fused", &backward_fused, "the whole backward of routing without child groups, problem by problem");
  m.def("gather_rows", &gather_rows, "the rows of (B, R, F) values an index reads, zeros for index R");
  m.def("scatter_rows", &scatter_rows, "gather_rows' backward: each row's sum of the slots that read it");
}
