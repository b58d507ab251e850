// `llmtrain env`: what this machine and build offer — the first thing to paste into a bug report.
#include <fmt/format.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <optional>

#include "cli/commands.h"
#include "common/host.h"
#include "common/strings.h"
#include "kernels/backend_info.h"
#include "kernels/device_select.h"
#include "llmtrain_version.h"
#include "parallel/comm/comm_libraries.h"
#include "parallel/comm/comm_nccl.h"
#include "parallel/comm/device_comm.h"
#include "parallel/launch_env.h"

namespace llmtrain::cli {

namespace {

// The device a rank started here takes (kernels/device_select.h): local rank mod the visible
// devices. Under `llmtrain run RECIPE -- llmtrain env` every rank prints its own.
// What takes the matrix products and attention on the device.
void print_cuda_kernels(const kernels::CudaInfo& c) {
  std::printf("gemm:      %s\n", c.gemm.c_str());
  std::printf("attention: bf16 and fp16 at head dims that are multiples of 16 up to 256: %s; fp32: %s\n",
              kernels::cuda_attention_kernel(kernels::DType::bf16, 64).c_str(),
              kernels::cuda_attention_kernel(kernels::DType::fp32, 64).c_str());
}

void print_rank_device(const parallel::LaunchEnv& le, const kernels::CudaInfo& c) {
  const int visible = static_cast<int>(c.devices.size());
  if (visible == 0) return;
  const char* shown = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string where = fmt::format("local rank {} of {}{}", le.local_rank, le.local_size,
                                        le.is_rank() ? "" : " (not started as a rank)");
  const std::string env = c.simulator ? "" : fmt::format(", CUDA_VISIBLE_DEVICES={}", shown ? shown : "unset");
  if (le.gpus_per_task > 0 && le.gpus_per_task == visible)
    std::printf("rank device: %s takes cuda:0, the first of its own %d (srun --gpus-per-task=%d)%s\n", where.c_str(),
                visible, le.gpus_per_task, env.c_str());
  else if (le.local_size <= visible)
    std::printf("rank device: %s takes cuda:%d of %d visible%s\n", where.c_str(),
                kernels::device_for_rank(le.local_rank, le.local_size, visible, false), visible, env.c_str());
  else
    std::printf(
        "rank device: %s: %d local ranks > %d visible device(s): refused unless launch.share_devices: true, "
        "which gives it cuda:%d%s\n",
        where.c_str(), le.local_size, visible, le.local_rank % visible, env.c_str());
}

}  // namespace

int cmd_env() {
  HostInfo h = host_info();
  std::printf("llmtrain %s (commit %s)\n", LLMTRAIN_VERSION, LLMTRAIN_GIT_COMMIT);
  std::printf("host:      %s, %s\n", h.hostname.c_str(), h.os.c_str());
  std::printf("cpu:       %s\n", h.cpu_model.empty() ? "unknown" : h.cpu_model.c_str());
  std::printf("cores:     %d online, %d usable by this process\n", h.cores_online, h.cores_usable);
  std::printf("memory:    %s total, %s available\n", format_bytes(double(h.memory_total)).c_str(),
              format_bytes(double(h.memory_available)).c_str());
  // How OpenMP's idle threads wait: llmtrain runs with GOMP_SPINCOUNT=1000 (a short spin, then
  // sleep) unless the user chose (cli/main.cpp).
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  std::string waiting = "spin (libgomp's default: OMP_WAIT_POLICY and GOMP_SPINCOUNT unset)";
  if (policy != nullptr || spin != nullptr) waiting.clear();
  if (policy != nullptr) waiting = fmt::format("OMP_WAIT_POLICY={}", printable(policy));
  if (spin != nullptr)
    waiting += fmt::format(
        "{}GOMP_SPINCOUNT={}{}", policy != nullptr ? ", " : "", printable(spin),
        policy == nullptr && std::string_view(spin) == "1000" ? " (a short spin, then sleep: llmtrain's default)" : "");
  const char* num = std::getenv("OMP_NUM_THREADS");
  std::printf("openmp:    %d threads (OMP_NUM_THREADS=%s), idle threads: %s\n", omp_get_max_threads(),
              num != nullptr ? printable(num).c_str() : "unset", waiting.c_str());

  kernels::BlasInfo b = kernels::blas_info();
  std::printf("blas:      %s, threading %s, %d threads, kernel %s\n", b.name.c_str(), b.threading.c_str(), b.threads,
              b.coretype.c_str());
  std::printf("           config: %s\n", b.config.c_str());
  // The peak MFU is measured against, for one rank with every usable core (docs/metrics.md).
  kernels::CpuPeak peak = kernels::cpu_peak(h.cores_usable, {});
  std::printf("cpu peak:  %s\n", peak.how.c_str());

  std::printf("mpi:       %s\n", parallel::mpi_library_version().c_str());
  parallel::LaunchEnv le = parallel::detect_launch_env();
  std::printf("launched:  %s%s\n", le.world_source().c_str(),
              le.in_slurm_allocation() ? (", inside Slurm job " + le.slurm_job_id).c_str() : "");

  kernels::CudaInfo c = kernels::cuda_info();
  if (!c.built) {
    std::printf("cuda:      %s\n", c.unavailable_reason.c_str());
  } else if (c.simulator) {
    std::printf("cuda:      simulator (kernels/cuda/sim): CUDA kernels run on this CPU, headers of CUDA %d.%d\n",
                c.runtime_version / 1000, (c.runtime_version % 1000) / 10);
    print_cuda_kernels(c);
    if (c.devices.empty())
      std::printf("devices:   none (%s)\n", c.unavailable_reason.c_str());
    else
      std::printf("devices:   %zu simulated (LLMTRAIN_SIM_DEVICES=%s)\n", c.devices.size(),
                  std::getenv("LLMTRAIN_SIM_DEVICES") ? std::getenv("LLMTRAIN_SIM_DEVICES") : "unset: 1");
    print_rank_device(le, c);
  } else {
    std::printf("cuda:      built for %s, runtime %d.%d, driver %s\n", c.built_archs.c_str(), c.runtime_version / 1000,
                (c.runtime_version % 1000) / 10,
                c.driver_version ? fmt::format("{}.{}", c.driver_version / 1000, (c.driver_version % 1000) / 10).c_str()
                                 : "none");
    print_cuda_kernels(c);
    if (c.devices.empty()) std::printf("devices:   none (%s)\n", c.unavailable_reason.c_str());
    for (const auto& d : c.devices) {
      std::printf("device %d:  %s, compute capability %d.%d, %s, %d SMs\n", d.index, d.name.c_str(), d.cc_major,
                  d.cc_minor, format_bytes(double(d.memory_total)).c_str(), d.multiprocessors);
      std::optional<kernels::GpuPeak> rated = kernels::gpu_peak_lookup(d.name);
      std::printf("           rated peak: %s\n",
                  rated ? fmt::format("{}: {:.4g} TFLOP/s bf16 dense, {:.4g} TFLOP/s fp32", rated->model,
                                      rated->bf16_dense / 1e12, rated->fp32 / 1e12)
                              .c_str()
                        : "not in the table (kernels/gpu_peak.cpp)");
    }
    print_rank_device(le, c);
  }
  std::printf("nccl:      %s\n", parallel::nccl_version().c_str());
  if (parallel::nccl_built()) {
    const bool multi = parallel::nccl_version_code() >= parallel::kNcclMultiRankGpuVersion;
    std::printf("           several ranks on one GPU: %s\n",
                multi ? "with NCCL_MULTI_RANK_GPU_ENABLE=1 (experimental)" : "no (NCCL 2.30 or later accepts them)");
  }
  const std::string settings = parallel::nccl_settings();
  std::printf("NCCL_*:    %s\n",
              settings.empty() ? "none set (the ranks get this environment's NCCL_* settings)" : settings.c_str());
  return 0;
}

}  // namespace llmtrain::cli
