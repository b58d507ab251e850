// The CPU's attainable matrix-multiply rate, measured: the fallback peak for MFU where the
// theoretical one cannot be derived (kernels/cpu/cpu_peak.cpp).
//
// The rule a reader could get wrong: a measurement is a lower bound of the peak, and load lowers
// it further (an OpenMP GEMM waits for its slowest thread, so one descheduled thread stalls them
// all). Only the best of several runs is reported, never a mean.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/backend_info.h"

namespace llmtrain::kernels {

namespace {
constexpr double kMaxFlopsPerProduct = 2e10;  // a product above this runs with fewer rows
}  // namespace

double sgemm_best_gflops(const std::vector<GemmShape>& shapes_in, int rounds) {
  std::vector<GemmShape> shapes;
  for (GemmShape s : shapes_in) {
    if (s.m <= 0 || s.n <= 0 || s.k <= 0) continue;
    const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
    if (flops > kMaxFlopsPerProduct) s.m = std::max<int64_t>(1, int64_t(double(s.m) * kMaxFlopsPerProduct / flops));
    shapes.push_back(s);
  }
  if (shapes.empty()) shapes.push_back({1024, 1024, 1024});
  size_t a_size = 0, b_size = 0, c_size = 0;
  for (const GemmShape& s : shapes) {
    a_size = std::max(a_size, size_t(s.m * s.k));
    b_size = std::max(b_size, size_t(s.k * s.n));
    c_size = std::max(c_size, size_t(s.m * s.n));
  }
  std::vector<float> a(a_size, 1.0f), b(b_size, 0.5f), c(c_size, 0.0f);
  double best = 0;
  for (const GemmShape& s : shapes) {
    for (int r = 0; r <= rounds; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(s.m), int(s.n), int(s.k), 1.0f, a.data(), int(s.k),
                  b.data(), int(s.n), 0.0f, c.data(), int(s.n));
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double gflops = 2.0 * double(s.m) * double(s.n) * double(s.k) / std::max(sec, 1e-9) / 1e9;
      if (r > 0) best = std::max(best, gflops);  // r = 0 warms up (page faults, OpenBLAS buffers)
    }
  }
  return best;
}

}  // namespace llmtrain::kernels
