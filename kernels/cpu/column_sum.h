// dst[j] += Σ_i src[i, j] over a row-major [rows, cols] matrix: the bias gradients of linear and
// residual ops. Parallel over column blocks, each summed in row order, so the result does not
// depend on the thread count.
#pragma once

#include <cstdint>

namespace llmtrain::kernels::cpu {

void column_sum_add(float* dst, const float* src, int64_t rows, int64_t cols);

}  // namespace llmtrain::kernels::cpu
