// The mixture of experts' maths that the CPU ops (kernels/cpu/moe.cpp) and the CUDA kernels
// (kernels/cuda/moe.cu) share, written once: the router's softmax and top-k on one token row, its
// gradient on one row with the load-balancing and z-loss terms, the routing statistics' sums and
// the plan's keep-and-place rule (kernels/op_table.def has the contracts). The backends differ in
// who runs these (a CPU thread per row, a device thread per row) and in everything around them.
//
// The rule a reader could get wrong: every function here is one fixed sequence of fp32 operations
// (the statistics' sums in double, in row order): the device's results match the CPU's because
// both run this sequence, so a change here changes both, and a "faster" reordering in one backend
// alone breaks the agreement the op harness checks.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace llmtrain::kernels {

// ---- router forward ----------------------------------------------------------------------------

// Softmax over the logits p[0, E) in place (p becomes the probs); returns the log-sum-exp.
LT_HOST_DEVICE float router_softmax(float* p, int64_t e_count) {
  float mx = -INFINITY;
  for (int64_t e = 0; e < e_count; ++e) mx = mx < p[e] ? p[e] : mx;  // a NaN never becomes the max
  float sum = 0.0f;
  for (int64_t e = 0; e < e_count; ++e) sum += expf(p[e] - mx);
  const float lse = mx + logf(sum);
  for (int64_t e = 0; e < e_count; ++e) p[e] = expf(p[e] - lse);
  return lse;
}

// The k largest of the probs p [E] into ex [k] (descending; the largest below the previous pick in
// (prob descending, expert ascending) order, so a tie goes to the lower expert first), their probs
// into w [k], divided by the sum of the k with `renormalize`. A row of NaNs (nothing compares) picks
// experts 0, 1, ... rather than an id outside [0, E).
LT_HOST_DEVICE void router_top_k(int32_t* ex, float* w, const float* p, int64_t e_count, int64_t k, bool renormalize) {
  int64_t prev = -1;
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < e_count; ++e) {
      const bool below = prev < 0 || p[e] < p[prev] || (p[e] == p[prev] && e > prev);
      if (below && (best < 0 || p[e] > p[best])) best = e;
    }
    if (best < 0) best = j;  // NaN probs: nothing compares
    ex[j] = int32_t(best);
    w[j] = p[best];
    sum += p[best];
    prev = best;
  }
  if (renormalize)
    for (int64_t j = 0; j < k; ++j) w[j] /= sum;
}

// ---- router backward ---------------------------------------------------------------------------

// The auxiliary losses' gradient factors of one micro-batch of n rows: d(aux)/dp[n, e] =
// aux · stats[e] and d(z)/dlogit[n, e] = z · lse[n] · p[n, e], each one float, times loss_scale.
struct RouterLossScales {
  float aux, z;
};

LT_HOST_DEVICE RouterLossScales router_loss_scales(int64_t e_count, int64_t n, int64_t k, float aux_coef, float z_coef,
                                                   float loss_scale) {
  return {loss_scale * aux_coef * float(e_count) / (float(n) * float(n * k)), loss_scale * z_coef * 2.0f / float(n)};
}

// One row's dlogits d [E] (overwritten) from its probs p [E], log-sum-exp lse, picks ex [k] and
// their weights' gradient dw [k]: the picks' gradient (through the renormalization when on) plus
// the load-balancing term on every prob, through the softmax, plus the z-loss's. stats [2E + 2]
// is moe_route_stats'.
LT_HOST_DEVICE void router_dlogit_row(float* d, const float* p, float lse, const int32_t* ex, const float* dw,
                                      const float* stats, int64_t e_count, int64_t k, bool renormalize,
                                      RouterLossScales scales) {
  for (int64_t e = 0; e < e_count; ++e) d[e] = scales.aux * stats[e];
  if (renormalize) {
    float sum = 0.0f, dot = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += p[ex[j]];
    for (int64_t j = 0; j < k; ++j) dot += dw[j] * (p[ex[j]] / sum);
    for (int64_t j = 0; j < k; ++j) d[ex[j]] += (dw[j] - dot) / sum;
  } else {
    for (int64_t j = 0; j < k; ++j) d[ex[j]] += dw[j];
  }
  float pd = 0.0f;
  for (int64_t e = 0; e < e_count; ++e) pd += p[e] * d[e];
  const float z = scales.z * lse;
  for (int64_t e = 0; e < e_count; ++e) d[e] = p[e] * (d[e] - pd) + z * p[e];
}

// ---- routing statistics and plan ---------------------------------------------------------------

// Σ_n probs[n, e] over the n rows of probs [n, E], in double in row order, rounded once.
LT_HOST_DEVICE float route_prob_sum(const float* probs, int64_t n, int64_t e_count, int64_t e) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(probs[i * e_count + e]);
  return float(s);
}

// Σ_n lse[n]², in double in row order, rounded once.
LT_HOST_DEVICE float route_lse_square_sum(const float* lse, int64_t n) {
  double z = 0;
  for (int64_t i = 0; i < n; ++i) z += double(lse[i]) * double(lse[i]);
  return float(z);
}

// How many of an expert's `assigned` assignments it keeps: all (capacity 0, dropless) or at most
// `capacity`.
LT_HOST_DEVICE int32_t route_kept(int32_t assigned, int64_t capacity) {
  return capacity > 0 && assigned > capacity ? int32_t(capacity) : assigned;
}

// Assignment a, the `rank`-th (from 0, in assignment order) of expert e: kept at plan row
// offsets[e] + rank if the expert keeps that many (order and pos name each other), else dropped
// (pos[a] = −1).
LT_HOST_DEVICE void route_place(int32_t* order, int32_t* pos, const int32_t* offsets, int32_t e, int32_t rank,
                                int64_t a) {
  if (rank < offsets[e + 1] - offsets[e]) {
    order[offsets[e] + rank] = int32_t(a);
    pos[a] = offsets[e] + rank;
  } else {
    pos[a] = -1;
  }
}

// ---- the shared expert's gate -------------------------------------------------------------------

// σ(logit), the shared expert's gate, written to stay finite for every logit: exp of the negative
// magnitude only (no overflow), 0 and 1 at the ends.
LT_HOST_DEVICE float shared_gate_sigmoid(float logit) {
  const float e = expf(-fabsf(logit));
  return logit >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

}  // namespace llmtrain::kernels
