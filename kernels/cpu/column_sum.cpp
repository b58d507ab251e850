#include "kernels/cpu/column_sum.h"

#include <algorithm>

namespace llmtrain::kernels::cpu {

void column_sum_add(float* dst, const float* src, int64_t rows, int64_t cols) {
  constexpr int64_t kBlock = 64;  // columns per task: one accumulator block kept in registers/L1
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = std::min(cols, j0 + kBlock);
    float acc[kBlock] = {};
    for (int64_t i = 0; i < rows; ++i) {
      const float* row = src + i * cols;
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) acc[j - j0] += row[j];
    }
    for (int64_t j = j0; j < j1; ++j) dst[j] += acc[j - j0];
  }
}

}  // namespace llmtrain::kernels::cpu
