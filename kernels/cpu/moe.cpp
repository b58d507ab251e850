// Mixture of experts on the CPU: the router (softmax gate, top-k, its gradient with the
// load-balancing and z losses), the token permutation (plan, stats), gather and combine, and the
// experts' grouped product (kernels/op_table.def has the contracts). The per-row maths the device
// must reproduce (the softmax and top-k, the router's gradient, the stats' sums, the plan's
// keep-and-place rule) is kernels/moe_math.h's, shared with kernels/cuda/moe.cu.
//
// The rule a reader could get wrong: every result is independent of the thread count: the
// router's logits are one dot product per (row, expert) on one thread, the plan is one serial
// counting sort, the stats sum in double in row order, and a thread owns every row or column it
// writes (scatters go through the plan's one-to-one pos, never two writers to one row).
#include <cblas.h>

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/scratch.h"
#include "kernels/moe_math.h"

namespace llmtrain::kernels::cpu {

namespace {

int blas_dim(int64_t v) {
  LT_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "matrix dimension {} exceeds BLAS's int", v);
  return int(v);
}

// The offsets [groups + 1] of grouped_linear, checked: non-decreasing, within [0, rows].
void check_expert_offsets(const int32_t* off, int64_t groups, int64_t rows) {
  LT_CHECK(off[0] >= 0, "expert offsets[0] = {} is negative", off[0]);
  for (int64_t e = 0; e < groups; ++e)
    LT_CHECK(off[e] <= off[e + 1] && off[e + 1] <= rows,
             "expert offsets[{}] = {} after offsets[{}] = {}: offsets must not decrease and stay within the {} rows",
             e + 1, off[e + 1], e, off[e], rows);
}

// dy[0, c) = w · dout[0, c); returns ⟨dout, y⟩ (the weight's gradient of combine and of the
// shared expert's gate).
float scale_row_and_dot(float* dy, const float* dout, const float* y, float w, int64_t c) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t t = 0; t < c; ++t) {
    dy[t] = w * dout[t];
    s += dout[t] * y[t];
  }
  return s;
}

void zero_rows(float* p, int64_t begin, int64_t end, int64_t cols) {
  if (end > begin) std::fill(p + begin * cols, p + end * cols, 0.0f);
}

// sums [cols] += Σ rows [begin, end) of x [·, cols], in row order (a bias's gradient).
void add_column_sums(float* sums, const float* x, int64_t begin, int64_t end, int64_t cols) {
  for (int64_t r = begin; r < end; ++r)
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) sums[c] += x[r * cols + c];
}

}  // namespace

void moe_router_forward(Tensor probs, Tensor lse, Tensor expert, Tensor weight, Tensor in, Tensor router, Tensor bias,
                        int64_t k, bool renormalize) {
  const int64_t e_count = router.shape[0], c = router.shape[1], n = lse.numel();
  const float *x = in.ptr<float>(), *w = router.ptr<float>(), *b = bias.defined() ? bias.ptr<float>() : nullptr;
  float *p = probs.ptr<float>(), *l = lse.ptr<float>(), *wt = weight.ptr<float>();
  int32_t* ex = expert.ptr<int32_t>();
#pragma omp parallel for schedule(static) if (n * e_count * c > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * c;
    float* pi = p + i * e_count;
    for (int64_t e = 0; e < e_count; ++e) {
      const float* we = w + e * c;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < c; ++j) s += xi[j] * we[j];
      pi[e] = b ? s + b[e] : s;
    }
    l[i] = router_softmax(pi, e_count);
    router_top_k(ex + i * k, wt + i * k, pi, e_count, k, renormalize);
  }
}

void moe_router_backward(Tensor din, Tensor drouter, Tensor dbias, Tensor dweight, Tensor probs, Tensor lse,
                         Tensor expert, Tensor stats, Tensor in, Tensor router, int64_t k, bool renormalize,
                         float aux_coef, float z_coef, float loss_scale) {
  const int64_t e_count = router.shape[0], c = router.shape[1], n = lse.numel();
  if (n == 0) return;
  const RouterLossScales scales = router_loss_scales(e_count, n, k, aux_coef, z_coef, loss_scale);
  const float *p = probs.ptr<float>(), *l = lse.ptr<float>(), *dw = dweight.ptr<float>(), *st = stats.ptr<float>();
  const int32_t* ex = expert.ptr<int32_t>();
  float* dlogit = thread_scratch(0, size_t(n * e_count));
#pragma omp parallel for schedule(static) if (n * e_count > 32768)
  for (int64_t i = 0; i < n; ++i)
    router_dlogit_row(dlogit + i * e_count, p + i * e_count, l[i], ex + i * k, dw + i * k, st, e_count, k, renormalize,
                      scales);
  // din [n, c] += dlogit [n, E] · router [E, c];  drouter [E, c] += dlogitᵀ · in [n, c]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_dim(n), blas_dim(c), blas_dim(e_count), 1.0f, dlogit,
              blas_dim(e_count), router.ptr<float>(), blas_dim(c), 1.0f, din.ptr<float>(), blas_dim(c));
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_dim(e_count), blas_dim(c), blas_dim(n), 1.0f, dlogit,
              blas_dim(e_count), in.ptr<float>(), blas_dim(c), 1.0f, drouter.ptr<float>(), blas_dim(c));
  if (dbias.defined()) add_column_sums(dbias.ptr<float>(), dlogit, 0, n, e_count);
}

void moe_route_plan(Tensor order, Tensor pos, Tensor offsets, Tensor expert, int64_t experts, int64_t capacity) {
  const int64_t m = expert.numel();
  LT_CHECK(m <= std::numeric_limits<int32_t>::max(), "moe_route_plan: {} assignments exceed int32", m);
  const int32_t* ex = expert.ptr<int32_t>();
  int32_t *ord = order.ptr<int32_t>(), *ps = pos.ptr<int32_t>(), *off = offsets.ptr<int32_t>();
  int32_t* seen = reinterpret_cast<int32_t*>(thread_scratch(0, size_t(experts)));
  std::fill(seen, seen + experts, 0);
  for (int64_t a = 0; a < m; ++a) {
    LT_CHECK(ex[a] >= 0 && ex[a] < experts, "expert id {} at position {} is outside the experts [0, {})", ex[a], a,
             experts);
    ++seen[ex[a]];
  }
  off[0] = 0;
  for (int64_t e = 0; e < experts; ++e) off[e + 1] = off[e] + route_kept(seen[e], capacity);
  std::fill(seen, seen + experts, 0);
  for (int64_t a = 0; a < m; ++a) {
    const int32_t e = ex[a];
    route_place(ord, ps, off, e, seen[e]++, a);
  }
  std::fill(ord + off[experts], ord + m, -1);
}

void moe_route_stats(Tensor stats, Tensor probs, Tensor lse, Tensor expert, Tensor offsets) {
  const int64_t e_count = probs.shape[1], n = probs.shape[0], m = expert.numel();
  const float *p = probs.ptr<float>(), *l = lse.ptr<float>();
  const int32_t *ex = expert.ptr<int32_t>(), *off = offsets.ptr<int32_t>();
  float* st = stats.ptr<float>();
  std::fill(st, st + e_count, 0.0f);  // counts below 2^24 are exact in fp32
  for (int64_t a = 0; a < m; ++a) {
    LT_CHECK(ex[a] >= 0 && ex[a] < e_count, "expert id {} at position {} is outside the experts [0, {})", ex[a], a,
             e_count);
    st[ex[a]] += 1.0f;
  }
#pragma omp parallel for schedule(static) if (n * e_count > 32768)
  for (int64_t e = 0; e < e_count; ++e) st[e_count + e] = route_prob_sum(p, n, e_count, e);
  st[2 * e_count] = route_lse_square_sum(l, n);
  st[2 * e_count + 1] = float(m - off[e_count]);
}

void moe_gather_forward(Tensor out, Tensor in, Tensor order, int64_t k) {
  const int64_t c = in.shape[in.shape.rank() - 1], n = c ? in.numel() / c : 0, m = order.numel();
  const float* x = in.ptr<float>();
  const int32_t* ord = order.ptr<int32_t>();
  float* y = out.ptr<float>();
#pragma omp parallel for schedule(static) if (m * c > 32768)
  for (int64_t q = 0; q < m; ++q) {
    LT_CHECK(ord[q] >= -1 && ord[q] < n * k, "moe order {} at row {} is outside [-1, {})", ord[q], q, n * k);
    if (ord[q] >= 0)
      std::copy(x + ord[q] / k * c, x + ord[q] / k * c + c, y + q * c);
    else
      std::fill(y + q * c, y + q * c + c, 0.0f);
  }
}

void moe_gather_backward(Tensor din, Tensor dout, Tensor pos) {
  const int64_t c = din.shape[din.shape.rank() - 1], n = din.numel() / c, k = pos.numel() / n,
                m = c ? dout.numel() / c : 0;
  const int32_t* ps = pos.ptr<int32_t>();
  const float* dy = dout.ptr<float>();
  float* dx = din.ptr<float>();
#pragma omp parallel for schedule(static) if (n * k * c > 32768)
  for (int64_t i = 0; i < n; ++i) {
    float* row = dx + i * c;
    std::fill(row, row + c, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t q = ps[i * k + j];
      LT_CHECK(q >= -1 && q < m, "moe pos {} at position {} is outside [-1, {})", q, i * k + j, m);
      if (q < 0) continue;
      const float* src = dy + q * c;
#pragma omp simd
      for (int64_t t = 0; t < c; ++t) row[t] += src[t];
    }
  }
}

void moe_combine_forward(Tensor out, Tensor y, Tensor weight, Tensor pos) {
  const int64_t c = out.shape[out.shape.rank() - 1], n = out.numel() / c, k = weight.numel() / n,
                m = c ? y.numel() / c : 0;
  const int32_t* ps = pos.ptr<int32_t>();
  const float *src = y.ptr<float>(), *w = weight.ptr<float>();
  float* o = out.ptr<float>();
#pragma omp parallel for schedule(static) if (n * k * c > 32768)
  for (int64_t i = 0; i < n; ++i) {
    float* row = o + i * c;
    std::fill(row, row + c, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t q = ps[i * k + j];
      LT_CHECK(q >= -1 && q < m, "moe pos {} at position {} is outside [-1, {})", q, i * k + j, m);
      if (q < 0) continue;
      const float wj = w[i * k + j], *yq = src + q * c;
#pragma omp simd
      for (int64_t t = 0; t < c; ++t) row[t] += wj * yq[t];
    }
  }
}

void moe_combine_backward(Tensor dy, Tensor dweight, Tensor dout, Tensor y, Tensor weight, Tensor pos) {
  const int64_t c = dout.shape[dout.shape.rank() - 1], n = dout.numel() / c, k = weight.numel() / n,
                m = c ? y.numel() / c : 0;
  const int32_t* ps = pos.ptr<int32_t>();
  const float *d = dout.ptr<float>(), *src = y.ptr<float>(), *w = weight.ptr<float>();
  float *dyp = dy.ptr<float>(), *dw = dweight.ptr<float>();
  std::fill(dyp, dyp + m * c, 0.0f);
#pragma omp parallel for schedule(static) if (n * k * c > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float* di = d + i * c;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t q = ps[i * k + j];
      LT_CHECK(q >= -1 && q < m, "moe pos {} at position {} is outside [-1, {})", q, i * k + j, m);
      if (q < 0) {
        dw[i * k + j] = 0.0f;
        continue;
      }
      dw[i * k + j] = scale_row_and_dot(dyp + q * c, di, src + q * c, w[i * k + j], c);
    }
  }
}

void moe_shared_gate_forward(Tensor out, Tensor gate, Tensor y, Tensor in, Tensor gate_w) {
  const int64_t n = gate.numel(), c = gate_w.numel(), d = n ? y.numel() / n : 0;
  const float *x = in.ptr<float>(), *w = gate_w.ptr<float>(), *src = y.ptr<float>();
  float *g = gate.ptr<float>(), *o = out.defined() ? out.ptr<float>() : nullptr;
#pragma omp parallel for schedule(static) if (n * (c + d) > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * c;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < c; ++j) s += xi[j] * w[j];
    const float gi = shared_gate_sigmoid(s);
    g[i] = gi;
    if (!o) continue;
    float* oi = o + i * d;
    const float* yi = src + i * d;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) oi[j] += gi * yi[j];
  }
}

void moe_shared_gate_backward(Tensor dy, Tensor dlogit, Tensor dout, Tensor y, Tensor gate) {
  const int64_t n = gate.numel(), d = n ? y.numel() / n : 0;
  const float *dd = dout.ptr<float>(), *src = y.ptr<float>(), *g = gate.ptr<float>();
  float *dyp = dy.ptr<float>(), *dl = dlogit.ptr<float>();
#pragma omp parallel for schedule(static) if (n * d > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    dl[i] = gi * (1.0f - gi) * scale_row_and_dot(dyp + i * d, dd + i * d, src + i * d, gi, d);
  }
}

void moe_shared_gate_weight_backward(Tensor din, Tensor dgate_w, Tensor dlogit, Tensor in, Tensor gate_w) {
  const int64_t n = dlogit.numel(), c = gate_w.numel();
  if (n == 0) return;
  // din [n, c] += dlogit [n, 1] · gate_w [1, c];  dgate_w [1, c] += dlogitᵀ [1, n] · in [n, c]
  if (din.defined())
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_dim(n), blas_dim(c), 1, 1.0f, dlogit.ptr<float>(), 1,
                gate_w.ptr<float>(), blas_dim(c), 1.0f, din.ptr<float>(), blas_dim(c));
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, 1, blas_dim(c), blas_dim(n), 1.0f, dlogit.ptr<float>(), 1,
              in.ptr<float>(), blas_dim(c), 1.0f, dgate_w.ptr<float>(), blas_dim(c));
}

void grouped_linear_forward(Tensor out, Tensor in, Tensor weight, Tensor bias, Tensor offsets) {
  const int64_t groups = weight.shape[0], o = weight.shape[1], i_dim = weight.shape[2],
                rows = i_dim ? in.numel() / i_dim : out.numel() / std::max<int64_t>(o, 1);
  const int32_t* off = offsets.ptr<int32_t>();
  check_expert_offsets(off, groups, rows);
  const float *x = in.ptr<float>(), *w = weight.ptr<float>();
  float* y = out.ptr<float>();
  zero_rows(y, 0, off[0], o);
  zero_rows(y, off[groups], rows, o);
  for (int64_t e = 0; e < groups; ++e) {
    const int64_t r0 = off[e], r = off[e + 1] - r0;
    if (r == 0 || o == 0) continue;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_dim(r), blas_dim(o), blas_dim(i_dim), 1.0f,
                x + r0 * i_dim, blas_dim(i_dim), w + e * o * i_dim, blas_dim(i_dim), 0.0f, y + r0 * o, blas_dim(o));
    if (!bias.defined()) continue;
    const float* b = bias.ptr<float>() + e * o;
    for (int64_t row = r0; row < r0 + r; ++row)
#pragma omp simd
      for (int64_t c = 0; c < o; ++c) y[row * o + c] += b[c];
  }
}

void grouped_linear_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight,
                             Tensor offsets) {
  const int64_t groups = weight.shape[0], o = weight.shape[1], i_dim = weight.shape[2],
                rows = i_dim ? in.numel() / i_dim : dout.numel() / std::max<int64_t>(o, 1);
  const int32_t* off = offsets.ptr<int32_t>();
  check_expert_offsets(off, groups, rows);
  const float *dy = dout.ptr<float>(), *x = in.ptr<float>(), *w = weight.ptr<float>();
  float* dw = dweight.ptr<float>();
  if (din.defined()) {
    float* dx = din.ptr<float>();
    zero_rows(dx, 0, off[0], i_dim);
    zero_rows(dx, off[groups], rows, i_dim);
    for (int64_t e = 0; e < groups; ++e) {
      const int64_t r0 = off[e], r = off[e + 1] - r0;
      if (r == 0 || i_dim == 0) continue;
      if (o == 0) {
        zero_rows(dx, r0, r0 + r, i_dim);
        continue;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_dim(r), blas_dim(i_dim), blas_dim(o), 1.0f,
                  dy + r0 * o, blas_dim(o), w + e * o * i_dim, blas_dim(i_dim), 0.0f, dx + r0 * i_dim, blas_dim(i_dim));
    }
  }
  for (int64_t e = 0; e < groups; ++e) {
    const int64_t r0 = off[e], r = off[e + 1] - r0;
    if (dbias.defined()) add_column_sums(dbias.ptr<float>() + e * o, dy, r0, r0 + r, o);
    if (r == 0 || o == 0 || i_dim == 0) continue;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_dim(o), blas_dim(i_dim), blas_dim(r), 1.0f, dy + r0 * o,
                blas_dim(o), x + r0 * i_dim, blas_dim(i_dim), 1.0f, dw + e * o * i_dim, blas_dim(i_dim));
  }
}

}  // namespace llmtrain::kernels::cpu
