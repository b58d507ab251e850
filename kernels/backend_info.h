// What the compute backends of this build and machine offer, for `llmtrain env` and for
// pre-flight checks (enough devices for the local ranks, BLAS threading).
#pragma once

#include <string>
#include <vector>

namespace llmtrain::kernels {

struct BlasInfo {
  std::string name;       // "OpenBLAS 0.3.21"
  std::string config;     // openblas_get_config()
  std::string threading;  // "OpenMP", "pthreads", "serial"
  int threads = 1;
  std::string coretype;  // the kernel OpenBLAS picked (openblas_get_corename)
};

struct CudaDevice {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  size_t memory_total = 0;
  int multiprocessors = 0;
};

struct CudaInfo {
  bool built = false;       // this binary has the CUDA backend
  std::string built_archs;  // "80-real 90-real"
  int runtime_version = 0;  // e.g. 13000
  int driver_version = 0;   // 0 when no driver
  std::vector<CudaDevice> devices;
  std::string unavailable_reason;  // why devices is empty, when it is
};

BlasInfo blas_info();
// The threads this process's CPU ops use, OpenMP and BLAS together (kernels/cpu/threads.cpp).
// Called once per rank before training; per-thread callers (tests running ranks as threads) call it
// on each thread.
void set_cpu_threads(int threads);
// This process's sgemm rate in GFLOP/s with its current thread count (a square product of side
// `n`, best of `reps` after a warm-up): the CPU "peak" that MFU is measured against.
double measure_sgemm_gflops(int n = 1024, int reps = 4);
CudaInfo cuda_info();

}  // namespace llmtrain::kernels
