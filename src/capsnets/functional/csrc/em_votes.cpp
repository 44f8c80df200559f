// Fused vote products of EM routing between matrix capsules, for the CPU.
//
// EM routing (capsnets.functional.em_routing) sees the votes V[n, i, j] = M[n, i] @ W[i, j] (+ coordinates)
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
//   m_product(pose, weight, coord, c, inv, w (N, J, I)) -> sum_i w [x, x^2]       (N, J, 32)
//   e_product(pose, weight, coord, c, inv, coef (N, J, 32)) -> [x, x^2] . coef    (N, J, I)
//   votes_backward(pose, weight, coord, c, inv, left (N, J, I, K), right (N, J, K, 32))
//       with d loss / d xx = left @ right: -> d pose (N, I, 16), d weight (Iw, J, 16)
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr int64_t kH = 16;  // pose components of a 4x4 matrix

template <typename T>
inline void vote(const T* __restrict m, const T* __restrict w, const T* __restrict coord, T* __restrict v) {
  for (int r = 0; r < 4; ++r) {
    const T m0 = m[r * 4], m1 = m[r * 4 + 1], m2 = m[r * 4 + 2], m3 = m[r * 4 + 3];
    for (int col = 0; col < 4; ++col) {
      v[r * 4 + col] = m0 * w[col] + m1 * w[4 + col] + m2 * w[8 + col] + m3 * w[12 + col];
    }
  }
  if (coord != nullptr) {
    v[0] += coord[0];
    v[1] += coord[1];
  }
}

struct Geometry {
  int64_t n, i, j, iw;
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

template <typename T>
const T* coord_ptr(const at::Tensor& coord) {
  return coord.numel() > 0 ? coord.data_ptr<T>() : nullptr;
}

template <typename T>
void stats_impl(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord, const at::Tensor& w0,
                at::Tensor& mean, at::Tensor& top, const Geometry& g) {
  const T* P = pose.data_ptr<T>();
  const T* W = weight.data_ptr<T>();
  const T* C = coord_ptr<T>(coord);
  const T* A = w0.data_ptr<T>();
  T* out = mean.data_ptr<T>();
  T* mx = top.data_ptr<T>();
  at::parallel_for(0, g.n, 1, [&](int64_t begin, int64_t end) {
    T v[kH];
    for (int64_t n = begin; n < end; ++n) {
      T biggest = 0;
      T* acc = out + n * g.j * kH;
      std::fill(acc, acc + g.j * kH, T(0));
      for (int64_t i = 0; i < g.i; ++i) {
        const T* m = P + (n * g.i + i) * kH;
        const T a = A[n * g.i + i];
        const T* wi = W + (i % g.iw) * g.j * kH;
        const T* ci = C ? C + i * 2 : nullptr;
        for (int64_t j = 0; j < g.j; ++j) {
          vote(m, wi + j * kH, ci, v);
          T* accj = acc + j * kH;
          for (int h = 0; h < kH; ++h) {
            accj[h] += a * v[h];
            const T size = std::abs(v[h]);
            biggest = (size > biggest || size != size) ? size : biggest;  // a NaN vote stays NaN
          }
        }
      }
      mx[n] = biggest;
    }
  });
}

template <typename T>
void m_impl(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord, const at::Tensor& c,
            const at::Tensor& inv, const at::Tensor& w, at::Tensor& out, const Geometry& g) {
  const T* P = pose.data_ptr<T>();
  const T* W = weight.data_ptr<T>();
  const T* C = coord_ptr<T>(coord);
  const T* S = c.data_ptr<T>();
  const T* U = inv.data_ptr<T>();
  const T* R = w.data_ptr<T>();
  T* O = out.data_ptr<T>();
  at::parallel_for(0, g.n * g.j, 1, [&](int64_t begin, int64_t end) {
    T v[kH];
    for (int64_t nj = begin; nj < end; ++nj) {
      const int64_t n = nj / g.j, j = nj % g.j;
      const T u = U[n];
      const T* cj = S + nj * kH;
      const T* r = R + nj * g.i;
      T s1[kH] = {0}, s2[kH] = {0};
      for (int64_t i = 0; i < g.i; ++i) {
        const T weight_i = r[i];
        vote(P + (n * g.i + i) * kH, W + ((i % g.iw) * g.j + j) * kH, C ? C + i * 2 : nullptr, v);
        for (int h = 0; h < kH; ++h) {
          const T x = v[h] * u - cj[h];
          const T wx = weight_i * x;
          s1[h] += wx;
          s2[h] += wx * x;
        }
      }
      T* o = O + nj * 2 * kH;
      for (int h = 0; h < kH; ++h) {
        o[h] = s1[h];
        o[kH + h] = s2[h];
      }
    }
  });
}

template <typename T>
void e_impl(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord, const at::Tensor& c,
            const at::Tensor& inv, const at::Tensor& coef, at::Tensor& out, const Geometry& g) {
  const T* P = pose.data_ptr<T>();
  const T* W = weight.data_ptr<T>();
  const T* C = coord_ptr<T>(coord);
  const T* S = c.data_ptr<T>();
  const T* U = inv.data_ptr<T>();
  const T* K = coef.data_ptr<T>();
  T* O = out.data_ptr<T>();
  at::parallel_for(0, g.n * g.j, 1, [&](int64_t begin, int64_t end) {
    T v[kH];
    for (int64_t nj = begin; nj < end; ++nj) {
      const int64_t n = nj / g.j, j = nj % g.j;
      const T u = U[n];
      const T* cj = S + nj * kH;
      const T* k1 = K + nj * 2 * kH;
      const T* k2 = k1 + kH;
      T* o = O + nj * g.i;
      for (int64_t i = 0; i < g.i; ++i) {
        vote(P + (n * g.i + i) * kH, W + ((i % g.iw) * g.j + j) * kH, C ? C + i * 2 : nullptr, v);
        T total = 0;
        for (int h = 0; h < kH; ++h) {
          const T x = v[h] * u - cj[h];
          total += x * (k1[h] + x * k2[h]);
        }
        o[i] = total;
      }
    }
  });
}

template <typename T>
void backward_impl(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord, const at::Tensor& c,
                   const at::Tensor& inv, const at::Tensor& left, const at::Tensor& right, at::Tensor& gpose,
                   at::Tensor& gweight, const Geometry& g) {
  const int64_t kk = left.size(3);
  const T* P = pose.data_ptr<T>();
  const T* W = weight.data_ptr<T>();
  const T* C = coord_ptr<T>(coord);
  const T* S = c.data_ptr<T>();
  const T* U = inv.data_ptr<T>();
  const T* L = left.data_ptr<T>();
  const T* Rt = right.data_ptr<T>();
  T* GP = gpose.data_ptr<T>();
  const int64_t wsize = g.iw * g.j * kH;
  const int threads = at::get_num_threads();
  std::vector<T> partial(static_cast<size_t>(threads) * wsize, T(0));  // d weight, one copy per thread
  at::parallel_for(0, g.n, 1, [&](int64_t begin, int64_t end) {
    T* gw = partial.data() + static_cast<int64_t>(at::get_thread_num()) * wsize;
    T v[kH], gv[kH];
    for (int64_t n = begin; n < end; ++n) {
      const T u = U[n];
      for (int64_t j = 0; j < g.j; ++j) {
        const int64_t nj = n * g.j + j;
        const T* cj = S + nj * kH;
        const T* rj = Rt + nj * kk * 2 * kH;  // (K, 32)
        for (int64_t i = 0; i < g.i; ++i) {
          const T* m = P + (n * g.i + i) * kH;
          const T* wij = W + ((i % g.iw) * g.j + j) * kH;
          vote(m, wij, C ? C + i * 2 : nullptr, v);
          const T* l = L + (nj * g.i + i) * kk;
          T g1[kH] = {0}, g2[kH] = {0};
          for (int64_t k = 0; k < kk; ++k) {
            const T lk = l[k];
            const T* rk = rj + k * 2 * kH;
            for (int h = 0; h < kH; ++h) {
              g1[h] += lk * rk[h];
              g2[h] += lk * rk[kH + h];
            }
          }
          for (int h = 0; h < kH; ++h) {
            const T x = v[h] * u - cj[h];
            gv[h] = (g1[h] + 2 * x * g2[h]) * u;  // d loss / d V through xx = [x, x^2]
          }
          // V = M W: d M = dV W^T, d W = M^T dV
          T* gm = GP + (n * g.i + i) * kH;
          T* gwij = gw + ((i % g.iw) * g.j + j) * kH;
          for (int r = 0; r < 4; ++r) {
            for (int k = 0; k < 4; ++k) {
              gm[r * 4 + k] += gv[r * 4] * wij[k * 4] + gv[r * 4 + 1] * wij[k * 4 + 1] +
                               gv[r * 4 + 2] * wij[k * 4 + 2] + gv[r * 4 + 3] * wij[k * 4 + 3];
            }
          }
          for (int k = 0; k < 4; ++k) {
            const T m0 = m[k], m1 = m[4 + k], m2 = m[8 + k], m3 = m[12 + k];
            for (int col = 0; col < 4; ++col) {
              gwij[k * 4 + col] += m0 * gv[col] + m1 * gv[4 + col] + m2 * gv[8 + col] + m3 * gv[12 + col];
            }
          }
        }
      }
    }
  });
  T* GW = gweight.data_ptr<T>();
  at::parallel_for(0, wsize, 256, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      T total = 0;
      for (int t = 0; t < threads; ++t) total += partial[static_cast<size_t>(t) * wsize + e];
      GW[e] = total;
    }
  });
}

void check_like(const at::Tensor& t, const at::Tensor& like, std::vector<int64_t> shape, const char* name) {
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.is_contiguous() && t.device().is_cpu(), name,
              " must be a contiguous CPU tensor of pose's dtype");
  TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), name, " has shape ", t.sizes(), ", expected ", shape);
}

}  // namespace

std::vector<at::Tensor> votes_stats(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord,
                                    const at::Tensor& w0) {
  const Geometry g = check(pose, weight, coord);
  check_like(w0, pose, {g.n, g.i}, "w0");
  auto mean = at::empty({g.n, g.j, kH}, pose.options());
  auto top = at::empty({g.n}, pose.options());
  AT_DISPATCH_FLOATING_TYPES(pose.scalar_type(), "votes_stats",
                             [&] { stats_impl<scalar_t>(pose, weight, coord, w0, mean, top, g); });
  return {mean, top};
}

at::Tensor m_product(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord, const at::Tensor& c,
                     const at::Tensor& inv, const at::Tensor& w) {
  const Geometry g = check(pose, weight, coord);
  check_like(c, pose, {g.n, g.j, kH}, "c");
  check_like(inv, pose, {g.n}, "inv");
  check_like(w, pose, {g.n, g.j, g.i}, "w");
  auto out = at::empty({g.n, g.j, 2 * kH}, pose.options());
  AT_DISPATCH_FLOATING_TYPES(pose.scalar_type(), "m_product",
                             [&] { m_impl<scalar_t>(pose, weight, coord, c, inv, w, out, g); });
  return out;
}

at::Tensor e_product(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord, const at::Tensor& c,
                     const at::Tensor& inv, const at::Tensor& coef) {
  const Geometry g = check(pose, weight, coord);
  check_like(c, pose, {g.n, g.j, kH}, "c");
  check_like(inv, pose, {g.n}, "inv");
  check_like(coef, pose, {g.n, g.j, 2 * kH}, "coef");
  auto out = at::empty({g.n, g.j, g.i}, pose.options());
  AT_DISPATCH_FLOATING_TYPES(pose.scalar_type(), "e_product",
                             [&] { e_impl<scalar_t>(pose, weight, coord, c, inv, coef, out, g); });
  return out;
}

std::vector<at::Tensor> votes_backward(const at::Tensor& pose, const at::Tensor& weight, const at::Tensor& coord,
                                       const at::Tensor& c, const at::Tensor& inv, const at::Tensor& left,
                                       const at::Tensor& right) {
  const Geometry g = check(pose, weight, coord);
  check_like(c, pose, {g.n, g.j, kH}, "c");
  check_like(inv, pose, {g.n}, "inv");
  TORCH_CHECK(left.dim() == 4, "left must be (N, J, I, K)");
  const int64_t kk = left.size(3);
  check_like(left, pose, {g.n, g.j, g.i, kk}, "left");
  check_like(right, pose, {g.n, g.j, kk, 2 * kH}, "right");
  auto gpose = at::zeros({g.n, g.i, kH}, pose.options());
  auto gweight = at::empty({g.iw, g.j, kH}, pose.options());
  AT_DISPATCH_FLOATING_TYPES(pose.scalar_type(), "votes_backward", [&] {
    backward_impl<scalar_t>(pose, weight, coord, c, inv, left, right, gpose, gweight, g);
  });
  return {gpose, gweight};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("votes_stats", &votes_stats, "activation-weighted mean vote and largest |vote| per problem");
  m.def("m_product", &m_product, "M-step product sum_i w [x, x^2]");
  m.def("e_product", &e_product, "E-step product [x, x^2] . coef");
  m.def("votes_backward", &votes_backward, "d pose, d weight from d xx = left @ right");
}
