// AdamW in one pass over the rows of a table of ranges of the flat buffers (PyTorch's torch.optim.AdamW arithmetic,
// formula in kernels/op_table.def). Memory-bound: one read of p, g, m, v and one write of p, m, v per
// element, all threads.
#include <cmath>

#include "common/error.h"
#include "kernels/adamw_math.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/stored.h"
#include "kernels/dtype_convert.h"

namespace llmtrain::kernels::cpu {
namespace {

// The step's constants, computed once (kernels/cuda/adamw.cu computes them the same way); the
// update of an element is kernels/adamw_math.h's, as on the device.
AdamWConstants constants(const AdamWStep& s) {
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  return {.grad_scale = s.grad_scale,
          .b1 = s.beta1,
          .b2 = s.beta2,
          .eps = s.eps,
          .step_size = float(double(s.lr) / bc1),
          .inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2))};
}

// bf16 parameters without a master (optimizer.master false): each read into fp32, updated there
// with its moments (fp32, or bf16 rounded to nearest even) and stored rounded stochastically with
// the row's rounding index (column 3) plus its place in the row.
void bf16_params(Tensor params, Tensor grads, Tensor m, Tensor v, const int64_t* t, int64_t r, int64_t total,
                 const AdamWConstants& c, const float (&decays)[2], uint64_t key) {
  uint16_t* p = static_cast<uint16_t*>(params.data);
  const bool bf16_state = m.dtype == DType::bf16;
  uint16_t *m16 = static_cast<uint16_t*>(m.data), *v16 = static_cast<uint16_t*>(v.data);
  float *m32 = static_cast<float*>(m.data), *v32 = static_cast<float*>(v.data);
  with_stored(grads, [&](auto g) {
#pragma omp parallel for schedule(static) if (total > 65536)
    for (int64_t i = 0; i < r; ++i) {
      const int64_t* row = t + 6 * i;
      const int64_t po = row[0], go = row[1], so = row[2], n = row[4];
      for (int64_t j = 0; j < n; ++j) {
        float pj = bf16_bits_to_float(p[po + j]);
        float mj = bf16_state ? bf16_to_fp32(m16[so + j]) : m32[so + j];
        float vj = bf16_state ? bf16_to_fp32(v16[so + j]) : v32[so + j];
        adamw_element(c, decays[row[5]], g(go + j), pj, mj, vj);
        p[po + j] = fp32_to_bf16_stochastic(pj, key, row[3] + j);
        if (bf16_state) {
          m16[so + j] = fp32_to_bf16(mj);
          v16[so + j] = fp32_to_bf16(vj);
        } else {
          m32[so + j] = mj;
          v32[so + j] = vj;
        }
      }
    }
  });
}

}  // namespace

void adamw_rows(Tensor params, Tensor grads, Tensor m, Tensor v, Tensor rounded, Tensor rows, const AdamWStep& s) {
  const int64_t r = rows.shape[0];
  const int64_t* t = rows.ptr<int64_t>();
  int64_t total = 0;
  for (int64_t i = 0; i < r; ++i) {
    const int64_t* row = t + 6 * i;
    const int64_t count = row[4];
    LT_CHECK(count >= 0 && row[0] >= 0 && row[0] + count <= params.numel() && row[1] >= 0 &&
                 row[1] + count <= grads.numel() && row[2] >= 0 && row[2] + count <= m.numel() &&
                 row[2] + count <= v.numel() && (row[5] == 0 || row[5] == 1) &&
                 (!rounded.defined() || (row[3] >= 0 && row[3] + count <= rounded.numel())),
             "adamw_rows: row {} = ({}, {}, {}, {}, {}, {}) outside its tensors", i, row[0], row[1], row[2], row[3],
             count, row[5]);
    total += count;
  }
  const AdamWConstants c = constants(s);
  const float decays[2] = {1.0f, 1.0f - s.lr * s.weight_decay};
  const bool bf16_state = m.dtype == DType::bf16;
  if (params.dtype == DType::bf16) return bf16_params(params, grads, m, v, t, r, total, c, decays, s.rounding_key);
  float* p = params.ptr<float>();
  with_stored(grads, [&](auto g) {
#pragma omp parallel for schedule(static) if (total > 65536)
    for (int64_t i = 0; i < r; ++i) {
      const int64_t* row = t + 6 * i;
      const int64_t po = row[0], go = row[1], so = row[2], n = row[4];
      const float decay = decays[row[5]];
      if (bf16_state) {  // read into fp32, updated there, stored rounded to nearest even
        uint16_t *pm = static_cast<uint16_t*>(m.data) + so, *pv = static_cast<uint16_t*>(v.data) + so;
        for (int64_t j = 0; j < n; ++j) {
          float mj = bf16_to_fp32(pm[j]), vj = bf16_to_fp32(pv[j]);
          adamw_element(c, decay, g(go + j), p[po + j], mj, vj);
          pm[j] = fp32_to_bf16(mj);
          pv[j] = fp32_to_bf16(vj);
        }
      } else {
        float *pm = m.ptr<float>() + so, *pv = v.ptr<float>() + so;
        for (int64_t j = 0; j < n; ++j) adamw_element(c, decay, g(go + j), p[po + j], pm[j], pv[j]);
      }
      if (rounded.defined()) cpu::convert(rounded.flat(row[3], n), host_tensor(p + po, {n}));
    }
  });
}

}  // namespace llmtrain::kernels::cpu
