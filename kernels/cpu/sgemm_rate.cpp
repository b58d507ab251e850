// The CPU's attainable matrix-multiply rate, measured: the honest peak for MFU on a CPU, whose
// nominal peak depends on which vector units OpenBLAS uses (OPENBLAS_CORETYPE) and on the clock.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/backend_info.h"

namespace llmtrain::kernels {

double measure_sgemm_gflops(int n, int reps) {
  std::vector<float> a(size_t(n) * n, 1.0f), b(size_t(n) * n, 0.5f), c(size_t(n) * n, 0.0f);
  double best = 0;
  for (int r = 0; r <= reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::max(best, 2.0 * n * n * double(n) / s / 1e9);  // r = 0 warms up
  }
  return best;
}

}  // namespace llmtrain::kernels
