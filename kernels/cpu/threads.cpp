// How many threads the CPU backend computes with: OpenMP's team size for our own ops and OpenBLAS's
// thread count for matrix products, set together (with Debian's OpenMP build of OpenBLAS they are
// one pool; with another build they must still agree, or BLAS threads fight ours for the cores).
#include <omp.h>

#include "common/error.h"
#include "kernels/backend_info.h"

extern "C" void openblas_set_num_threads(int);

namespace llmtrain::kernels {

void set_cpu_threads(int threads) {
  LT_CHECK(threads >= 1, "CPU threads {}", threads);
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

int cpu_threads() { return omp_get_max_threads(); }

}  // namespace llmtrain::kernels
