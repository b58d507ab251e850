// Softmax cross-entropy over the real vocabulary columns of (padded) logits, forward and
// backward, one row per token, parallel over rows; and the masked mean that makes the loss.
//
// Rules a reader could get wrong: padding columns [vocab, Vpad) take no part in the softmax and
// get zero gradient; a row whose target is ignore_index has loss 0 and zero gradient; a row with
// a NaN or infinite logit gets a NaN loss (the training loop's non-finite check relies on it,
// and the max/exp below would otherwise hide a NaN). The mean is summed in double in the op
// table's fixed order (kLossLanes lanes of rows in row order, then a binary tree of the lanes,
// which the device computes with a thread per lane), and the backward's per-row gradient is
// loss_scale / float(count): both are part of the numbers a run reproduces bitwise on either
// device, so neither may take another order or become a float reduction.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"

namespace llmtrain::kernels::cpu {

namespace {

// Σ exp(x[j] − mx) over [0, v): fp32 sums of 1024 terms added in double, so long rows keep full
// precision (every sum of the loss takes this order).
double sum_exp(const float* x, int64_t v, float mx) {
  double sum = 0;
  for (int64_t j0 = 0; j0 < v; j0 += 1024) {
    const int64_t j1 = std::min(v, j0 + 1024);
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = j0; j < j1; ++j) s += exp_approx(x[j] - mx);
    sum += s;
  }
  return sum;
}

// log Σ exp(x[j]) over j < v, and whether every x[j] is finite.
double row_logsumexp(const float* x, int64_t v, bool* finite) {
  float mx = -std::numeric_limits<float>::infinity(), probe = 0;
#pragma omp simd reduction(max : mx) reduction(+ : probe)
  for (int64_t j = 0; j < v; ++j) {
    mx = std::max(mx, x[j]);
    probe += x[j] * 0.0f;  // NaN if any x is NaN or ±inf
  }
  *finite = probe == 0.0f;
  return double(mx) + std::log(sum_exp(x, v, mx));
}

// Row i's lse (its log-sum-exp l) and loss, l minus the target's logit (0 for an ignored target;
// a target outside the vocabulary is a broken invariant).
template <class Logit>
void finish_row(float* lse, float* loss, int64_t i, double l, int32_t t, int64_t vocab, int32_t ignore_index,
                Logit target_logit) {
  lse[i] = float(l);
  if (t == ignore_index) {
    loss[i] = 0.0f;
    return;
  }
  LT_CHECK(t >= 0 && t < vocab, "target {} at position {} is outside the vocabulary [0, {})", t, i, vocab);
  loss[i] = float(l - double(target_logit(t)));
}

}  // namespace

void cross_entropy_forward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, int64_t vocab,
                           int32_t ignore_index) {
  const int64_t vp = logits.shape[logits.shape.rank() - 1], n = logits.numel() / vp;
  const float* x = logits.ptr<float>();
  const int32_t* tgt = targets.ptr<int32_t>();
  float *loss = losses.ptr<float>(), *ls = lse.ptr<float>();
#pragma omp parallel for schedule(static) if (n * vp > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * vp;
    bool finite = true;
    const double l = row_logsumexp(xi, vocab, &finite);
    finish_row(ls, loss, i, l, tgt[i], vocab, ignore_index,
               [&](int32_t t) { return finite ? xi[t] : std::numeric_limits<float>::quiet_NaN(); });
  }
}

namespace {

// dlogits of rows whose logits hold the global columns [col_begin, col_begin + Vl): the softmax
// over the real columns (those < vocab) minus the one-hot target where this rank holds its
// column, times loss_scale / count; 0 for padding columns and ignored rows. With col_begin 0 and
// every column present it is the whole-vocabulary backward.
void ce_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, int64_t col_begin, int64_t vocab,
                 int32_t ignore_index, float loss_scale, Tensor count) {
  const int64_t vp = logits.shape[logits.shape.rank() - 1], n = logits.numel() / vp;
  const int64_t real = std::clamp<int64_t>(vocab - col_begin, 0, vp);
  const int32_t counted = *count.ptr<int32_t>();
  // No counted row: the micro-batch contributes nothing (zero gradient).
  const float dloss = counted > 0 ? loss_scale / float(counted) : 0.0f;
  const float* x = logits.ptr<float>();
  const int32_t* tgt = targets.ptr<int32_t>();
  const float* ls = lse.ptr<float>();
  float* dx = dlogits.ptr<float>();
#pragma omp parallel for schedule(static) if (n * vp > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * vp;
    float* di = dx + i * vp;
    const int32_t t = tgt[i];
    if (t == ignore_index) {
      std::fill(di, di + vp, 0.0f);
      continue;
    }
    LT_CHECK(t >= 0 && t < vocab, "target {} at position {} is outside the vocabulary [0, {})", t, i, vocab);
    const float l = ls[i];
#pragma omp simd
    for (int64_t j = 0; j < real; ++j) di[j] = dloss * exp_approx(xi[j] - l);
    for (int64_t j = real; j < vp; ++j) di[j] = 0.0f;
    if (t >= col_begin && t < col_begin + real) di[t - col_begin] -= dloss;
  }
}

}  // namespace

void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, int64_t vocab,
                            int32_t ignore_index, float loss_scale, Tensor count) {
  ce_backward(dlogits, logits, lse, targets, 0, vocab, ignore_index, loss_scale, count);
}

void cross_entropy_shard_max(Tensor row_max, Tensor logits, int64_t col_begin, int64_t vocab) {
  const int64_t vp = logits.shape[logits.shape.rank() - 1], n = logits.numel() / vp;
  const int64_t real = std::clamp<int64_t>(vocab - col_begin, 0, vp);
  const float* x = logits.ptr<float>();
  float* mx = row_max.ptr<float>();
#pragma omp parallel for schedule(static) if (n * vp > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * vp;
    float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < real; ++j) m = std::max(m, xi[j]);
    mx[i] = m;
  }
}

void cross_entropy_shard_sums(Tensor stats, Tensor logits, Tensor row_max, Tensor targets, int64_t col_begin,
                              int64_t vocab, int32_t ignore_index) {
  const int64_t vp = logits.shape[logits.shape.rank() - 1], n = logits.numel() / vp;
  const int64_t real = std::clamp<int64_t>(vocab - col_begin, 0, vp);
  const float* x = logits.ptr<float>();
  const float* mx = row_max.ptr<float>();
  const int32_t* tgt = targets.ptr<int32_t>();
  float *sum = stats.ptr<float>(), *picked = sum + n;
#pragma omp parallel for schedule(static) if (n * vp > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * vp;
    const float m = mx[i];
    float probe = 0;
#pragma omp simd reduction(+ : probe)
    for (int64_t j = 0; j < real; ++j) probe += xi[j] * 0.0f;  // NaN if any x is NaN or ±inf
    const double s = sum_exp(xi, real, m);
    sum[i] = probe == 0.0f ? float(s) : std::numeric_limits<float>::quiet_NaN();
    const int32_t t = tgt[i];
    picked[i] = t != ignore_index && t >= col_begin && t < col_begin + real ? xi[t - col_begin] : 0.0f;
  }
}

void cross_entropy_combine(Tensor losses, Tensor lse, Tensor row_max, Tensor stats, Tensor targets, int64_t vocab,
                           int32_t ignore_index) {
  const int64_t n = losses.numel();
  const float *mx = row_max.ptr<float>(), *sum = stats.ptr<float>(), *picked = sum + n;
  const int32_t* tgt = targets.ptr<int32_t>();
  float *loss = losses.ptr<float>(), *ls = lse.ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    // NaN where a logit was not finite (the sum is NaN).
    finish_row(ls, loss, i, double(mx[i]) + std::log(double(sum[i])), tgt[i], vocab, ignore_index,
               [&](int32_t) { return picked[i]; });
  }
}

void cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, int64_t col_begin,
                                  int64_t vocab, int32_t ignore_index, float loss_scale, Tensor count) {
  ce_backward(dlogits, logits, lse, targets, col_begin, vocab, ignore_index, loss_scale, count);
}

void loss_mean_forward(Tensor mean, Tensor count, Tensor losses, Tensor targets, int32_t ignore_index) {
  const int64_t n = losses.numel();
  const float* l = losses.ptr<float>();
  const int32_t* tg = targets.ptr<int32_t>();
  double lane[kLossLanes] = {};
  int64_t counted = 0;
  for (int64_t i = 0; i < n; ++i)
    if (tg[i] != ignore_index) {
      lane[i % kLossLanes] += l[i];
      ++counted;
    }
  for (int64_t h = kLossLanes / 2; h > 0; h /= 2)
    for (int64_t j = 0; j < h; ++j) lane[j] += lane[j + h];
  const double sum = lane[0];
  LT_CHECK(counted <= INT32_MAX, "loss_mean_forward: {} counted rows", counted);
  *count.ptr<int32_t>() = int32_t(counted);
  *mean.ptr<float>() = counted ? float(sum / double(counted)) : 0.0f;
}

// Soft-capping, cap · tanh(x / cap), and its gradient from the capped value.
void softcap_forward(Tensor x, float cap) {
  const int64_t n = x.numel();
  float* v = x.ptr<float>();
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) v[i] = cap * std::tanh(v[i] / cap);
}

void softcap_backward(Tensor dx, Tensor dy, Tensor y, float cap) {
  const int64_t n = y.numel();
  const float *g = dy.ptr<float>(), *v = y.ptr<float>();
  float* out = dx.ptr<float>();
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float t = v[i] / cap;  // read first: dx may alias dy or y
    out[i] = g[i] * (1.0f - t * t);
  }
}

}  // namespace llmtrain::kernels::cpu
