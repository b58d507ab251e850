// What the compute backends of this build and machine offer, for `llmtrain env` and for
// pre-flight checks (enough devices for the local ranks, BLAS threading); and the peak rate MFU is
// measured against (docs/metrics.md, "MFU").
//
// The rule a reader could get wrong: a peak must be an upper bound of what the machine can do,
// never a measurement of what it did. Where the derivation is unsure (two parts of one family, a
// base clock that turbo exceeds), it takes the larger value: an over-estimate lowers MFU, an
// under-estimate shows utilizations above 100%.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/tensor.h"

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
  bool simulator = false;   // ... built against the SIMT simulator (LLMTRAIN_CUDA=SIM): no GPU is used
  std::string built_archs;  // "80-real 90-real"
  int runtime_version = 0;  // e.g. 13000
  int driver_version = 0;   // 0 when no driver
  std::vector<CudaDevice> devices;
  std::string unavailable_reason;  // why devices is empty, when it is
  std::string gemm;                // what takes the matrix products: cuBLASLt, or our tiled GEMM
};

BlasInfo blas_info();
// Whether CUDA attention at this storage dtype and head dim runs on the tensor cores
// (kernels/cuda/attention_tc.cu: bf16 or fp16, head dims that are multiples of 16 from 16 to 256)
// rather than the CUDA cores (kernels/cuda/attention.cu); the planner's rates follow the same rule.
inline bool cuda_attention_on_tensor_cores(DType storage, int64_t head_dim) {
  return (storage == DType::bf16 || storage == DType::fp16) && head_dim % 16 == 0 && head_dim >= 16 && head_dim <= 256;
}
// Which CUDA kernel takes attention at this storage dtype and head dim, in words (the run's header,
// `llmtrain env`).
std::string cuda_attention_kernel(DType storage, int64_t head_dim);
// The threads this process's CPU ops use, OpenMP and BLAS together (kernels/cpu/threads.cpp).
// Called once per rank before training; per-thread callers (tests running ranks as threads) call it
// on each thread.
void set_cpu_threads(int threads);
int cpu_threads();  // the calling thread's (set_cpu_threads, else OpenMP's default)
CudaInfo cuda_info();

// ---- the CPU's peak (kernels/cpu/cpu_peak.cpp) ------------------------------------------------

// What a CPU's theoretical fp32 peak is derived from: read from this machine by cpu_facts_read, or
// given by a test. A zero or empty field could not be read.
struct CpuFacts {
  std::string vendor;  // /proc/cpuinfo vendor_id: "GenuineIntel", "AuthenticAMD", "HygonGenuine"
  int family = -1;     // cpuid's (extended) family and model, as /proc/cpuinfo prints them
  int model = -1;
  std::string model_name;  // "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz"
  // Clock readings in MHz, all of them kept: the peak takes the highest.
  double cpufreq_max_mhz = 0;  // cpufreq's cpuinfo_max_freq (acpi-cpufreq leaves boost out)
  double cpuid_max_mhz = 0;    // cpuid leaf 0x16 EBX (Intel; zero on AMD and most VMs)
  double name_mhz = 0;         // the model name's "@ 2.40GHz": Intel's base clock
  double cpuinfo_mhz = 0;      // the highest "cpu MHz" line: the clock now (in a VM, nominal)
  double measured_mhz = 0;     // dependent adds on one core, best of many short bursts
  int threads = 1;             // the CPU threads this rank computes with
  std::string blas_core;       // openblas_get_corename(): the GEMMs' kernel
  bool avx512 = false;         // the AVX-512 dispatch (cpuid and the OS's XSAVE state): attention uses it
};

// One microarchitecture's vector FMA throughput per core: full-width FMA instructions per cycle.
struct CpuCoreSpec {
  std::string name;  // "AMD Zen 4"
  int fma256 = 0;    // 256-bit FMAs per cycle (AVX2)
  int fma512 = 0;    // 512-bit FMAs per cycle; 0: no AVX-512 in this table row
};

// The table (sources in docs/metrics.md): nullopt for a CPU it does not know.
std::optional<CpuCoreSpec> cpu_core_lookup(std::string_view vendor, int family, int model, std::string_view model_name);
// The vector width in bits an OpenBLAS core name's sgemm kernel uses ("Haswell" 256, "SkylakeX"
// 512); 128 for older or unknown cores.
int blas_core_vector_bits(std::string_view corename);
// /proc/cpuinfo's text: vendor, family, model, model name, the highest "cpu MHz", and name_mhz.
CpuFacts cpuinfo_parse(std::string_view text);
// The model name's "@ 2.40GHz" in MHz; 0 without one.
double model_name_mhz(std::string_view model_name);
// A cpufreq file's kHz ("3700000\n") in MHz; 0 when it is not a positive number.
double cpufreq_khz_to_mhz(std::string_view text);

// This machine's facts for a rank computing with `threads` threads (capped at the CPUs it may
// run on). Measures the clock: about 30 ms on one core.
CpuFacts cpu_facts_read(int threads);

struct CpuPeak {
  double flops = 0;       // FLOP/s of one rank; 0 from cpu_peak_derive when it cannot derive one
  std::string how;        // "2 cores × 32 FLOP/cycle × 3.7 GHz = 237 GFLOP/s (AMD Zen 4, ...)", or why not
  bool measured = false;  // true: the sgemm fallback, which load can lower
};
// The theoretical peak from `facts` (a pure function): threads × FLOPs per cycle (the widest
// vector the kernels use × its FMAs per cycle × 2) × the highest clock reading. flops = 0 when the
// CPU is not in the table, the kernels use a width its row lacks, or no clock was read.
CpuPeak cpu_peak_derive(const CpuFacts& facts);
// "131 GFLOP/s", "1.2 TFLOP/s": a rate as the peaks' lines write it.
std::string format_rate(double flops);

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;  // C[m, n] = A[m, k] · B[k, n]
};
// The best sgemm rate in GFLOP/s over `rounds` runs of each shape (after one warm-up each), with
// this process's current thread count. Load can only lower it; shapes above 20 GFLOP per product
// run with fewer rows. Empty shapes: one square product of side 1024.
double sgemm_best_gflops(const std::vector<GemmShape>& shapes, int rounds);
// This rank's peak: cpu_peak_derive on this machine's facts, else (the how says so) the best
// sgemm rate at `shapes`, the model's matrix products.
CpuPeak cpu_peak(int threads, const std::vector<GemmShape>& shapes);
// The same from given facts: cpu_peak_derive, else the measurement (measured = true).
CpuPeak cpu_peak_or_measure(const CpuFacts& facts, const std::vector<GemmShape>& shapes);

// ---- GPUs' rated peaks (kernels/gpu_peak.cpp) --------------------------------------------------

// A device's rated dense peaks from its data sheet (sources in docs/metrics.md).
struct GpuPeak {
  std::string model;      // the table's row: "H100 SXM"
  double bf16_dense = 0;  // FLOP/s, tensor cores, without structured sparsity; 0: no bf16
  double fp32 = 0;        // FLOP/s, CUDA cores (not TF32)
};
// The table row for a device name as the CUDA runtime reports it ("NVIDIA H100 80GB HBM3",
// "NVIDIA A100-SXM4-40GB"); nullopt for a device it does not know. A cuda run's MFU is measured
// against it (trainer/loop/trainer.cpp).
std::optional<GpuPeak> gpu_peak_lookup(std::string_view device_name);

}  // namespace llmtrain::kernels
