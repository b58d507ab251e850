// AdamW on the device (kernels/cpu/adamw.cpp is the reference): fp32 master weights (or bf16
// parameters without one, rounded stochastically: optimizer.master false), fp32 or bf16 moments
// (bf16: each read into fp32 and stored rounded to nearest even, as the CPU does),
// gradients in any storage dtype, the step's constants computed once on the host exactly as the
// CPU computes them, each element updated by the CPU's own function (kernels/adamw_math.h: the
// same bits). Memory-bound: 16 bytes read and 12 written per element with fp32 gradients and no
// rounded copy (docs/cuda.md, "The step's memory-bound kernels").
#include <cmath>

#include "kernels/adamw_math.h"
#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

// adamw_rows: block b updates row b (offsets, count and decay from the table); with R the rounded
// parameters' storage type, each updated value is also rounded into them. Where every array's
// start has the same alignment (the common case: offsets equal, or equal modulo 4), the row is
// walked in groups of 4 (16-byte fp32 accesses) after a scalar head and before a scalar tail;
// otherwise element by element. The arithmetic per element is the same either way.
template <class G, class R, class M>
__global__ void adamw_rows_kernel(float* __restrict__ p, const G* __restrict__ g, M* __restrict__ m, M* __restrict__ v,
                                  R* __restrict__ rounded, const int64_t* __restrict__ rows, AdamWConstants c,
                                  float decay) {
  const int64_t* row = rows + 6 * int64_t(blockIdx.x);
  const int64_t n = row[4];
  const float d = row[5] != 0 ? decay : 1.0f;
  p += row[0];
  g += row[1];
  m += row[2];
  v += row[2];
  if (rounded) rounded += row[3];
  int64_t head = unaligned_head(p);
  head = head < n ? head : n;
  const bool grouped = aligned4(p + head) && aligned4(g + head) && aligned4(m + head) && aligned4(v + head) &&
                       (!rounded || aligned4(rounded + head));
  if (!grouped) head = n;
  const int64_t groups = (n - head) / 4, tail = head + 4 * groups;
  for (int64_t i = threadIdx.x; i < head; i += blockDim.x) {
    float pi = p[i], mi = load(m, i), vi = load(v, i);
    adamw_element(c, d, load(g, i), pi, mi, vi);
    store(m, i, mi);
    store(v, i, vi);
    p[i] = pi;
    if (rounded) store(rounded, i, pi);
  }
  for (int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
    const int64_t i = head + 4 * k;
    float gi[4], pi[4], mi[4], vi[4];
    load4(g, i, gi);
    load4(p, i, pi);
    load4(m, i, mi);
    load4(v, i, vi);
    LT_UNROLL
    for (int e = 0; e < 4; ++e) adamw_element(c, d, gi[e], pi[e], mi[e], vi[e]);
    store4(m, i, mi);
    store4(v, i, vi);
    store4(p, i, pi);
    if (rounded) store4(rounded, i, pi);
  }
  for (int64_t i = tail + threadIdx.x; i < n; i += blockDim.x) {
    float pi = p[i], mi = load(m, i), vi = load(v, i);
    adamw_element(c, d, load(g, i), pi, mi, vi);
    store(m, i, mi);
    store(v, i, vi);
    p[i] = pi;
    if (rounded) store(rounded, i, pi);
  }
}

// bf16 parameters without a master (optimizer.master false): block b updates row b element by
// element, each parameter read into fp32 and stored rounded stochastically (kernels/adamw_math.h:
// the CPU's bits).
template <class G, class M>
__global__ void adamw_bf16_params_kernel(uint16_t* __restrict__ p, const G* __restrict__ g, M* __restrict__ m,
                                         M* __restrict__ v, const int64_t* __restrict__ rows, AdamWConstants c,
                                         float decay, uint64_t key) {
  const int64_t* row = rows + 6 * int64_t(blockIdx.x);
  const int64_t po = row[0], index = row[3], n = row[4];
  const float d = row[5] != 0 ? decay : 1.0f;
  g += row[1];
  m += row[2];
  v += row[2];
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float pi = bf16_bits_to_float(p[po + i]), mi = load(m, i), vi = load(v, i);
    adamw_element(c, d, load(g, i), pi, mi, vi);
    store(m, i, mi);
    store(v, i, vi);
    p[po + i] = fp32_to_bf16_stochastic(pi, key, index + i);
  }
}

}  // namespace

void adamw_rows(Tensor params, Tensor grads, Tensor m, Tensor v, Tensor rounded, Tensor rows, const AdamWStep& s) {
  const int64_t r = rows.shape[0];
  if (r == 0) return;
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  const AdamWConstants c{.grad_scale = s.grad_scale,
                         .b1 = s.beta1,
                         .b2 = s.beta2,
                         .eps = s.eps,
                         .step_size = float(double(s.lr) / bc1),
                         .inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2))};
  const float decay = 1.0f - s.lr * s.weight_decay;
  if (params.dtype == DType::bf16) {
    with_storage(grads, [&](auto gtag) {
      using G = decltype(gtag);
      with_storage(m, [&](auto mtag) {
        using M = decltype(mtag);
        LT_LAUNCH(unsigned(r), 256, 0, compute_stream(), adamw_bf16_params_kernel<G, M>)
        (static_cast<uint16_t*>(params.data), data<const G>(grads), data<M>(m), data<M>(v), rows.ptr<int64_t>(), c,
         decay, s.rounding_key);
      });
    });
    LT_CUDA_LAUNCHED("adamw_bf16_params_kernel");
    return;
  }
  // Without rounded parameters the kernel's R is float and its pointer null.
  const Tensor out = rounded.defined() ? rounded : params;
  with_storage(grads, [&](auto gtag) {
    using G = decltype(gtag);
    with_storage(out, [&](auto rtag) {
      using R = decltype(rtag);
      with_storage(m, [&](auto mtag) {  // fp32, or bf16 (optimizer.state_dtype)
        using M = decltype(mtag);
        LT_LAUNCH(unsigned(r), 256, 0, compute_stream(), adamw_rows_kernel<G, R, M>)
        (params.ptr<float>(), data<const G>(grads), data<M>(m), data<M>(v),
         rounded.defined() ? data<R>(rounded) : nullptr, rows.ptr<int64_t>(), c, decay);
      });
    });
  });
  LT_CUDA_LAUNCHED("adamw_rows_kernel");
}

}  // namespace llmtrain::kernels::cuda
