// One element of AdamW's update, written once for both backends (kernels/cpu/adamw.cpp and
// kernels/cuda/adamw.cu; kernels/op_table.def states the update).
//
// The rule a reader could get wrong: every multiply-add is an explicit fmaf and nothing else is
// left as a·b + c, so no compiler may fuse it another way (the CPU ops build with
// -ffp-contract=fast, nvcc contracts by default, and the device's grouped loop and the CPU's loop
// would pick different pairs). fmaf, the division and sqrtf are correctly rounded on the CPU, in
// the simulator and on a GPU (nvcc's default -prec-div, -prec-sqrt), so the update is the same bits
// on every device.
#pragma once

#include <cmath>

#include "kernels/host_device.h"

namespace llmtrain::kernels {

// The step's constants: grad_scale, β1, β2, eps, the decay factor of this element's row (1 or
// 1 − lr·wd), lr / (1 − β1^t) and 1 / √(1 − β2^t).
struct AdamWConstants {
  float grad_scale, b1, b2, eps, step_size, inv_sqrt_bc2;
};

// p, m, v updated in place from the gradient g as stored (read as fp32).
LT_HOST_DEVICE void adamw_element(const AdamWConstants& c, float decay, float g, float& p, float& m, float& v) {
  const float gi = g * c.grad_scale;
  m = fmaf(c.b1, m, (1.0f - c.b1) * gi);
  v = fmaf(c.b2, v, ((1.0f - c.b2) * gi) * gi);
  const float step = c.step_size * m / fmaf(sqrtf(v), c.inv_sqrt_bc2, c.eps);
  p = fmaf(p, decay, -step);
}

}  // namespace llmtrain::kernels
