// The CUDA backend's runtime: the device allocator, zero fills, host<->device copies, the check
// of every CUDA call, and what the .cu files' entry points share on the host (kernels/cuda/storage.h). Host code
// against CUDA's runtime API: linked with cudart for a GPU, with the simulator (kernels/cuda/sim/sim_runtime.cpp
// implements the calls used here) in the SIM build.
//
// The rule a reader could get wrong: an allocation failure is the user's to fix (a smaller batch),
// every other failed call is the machine's; both name the call and the bytes involved.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <utility>

#include "common/error.h"
#include "common/strings.h"
#include "kernels/buffer.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/storage.h"
#include "kernels/device_select.h"

namespace llmtrain::kernels::cuda {

std::string cuda_error_text(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) [[unlikely]]
    foreign_call_failed("CUDA", (std::string("the launch of ") + kernel).c_str(), static_cast<long long>(e),
                        cuda_error_text(e), file, line);
}

namespace {

class DeviceAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cuda; }

  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it so that later calls do not report it again
      throw environment_error(fmt::format("out of CUDA device memory allocating {} (cudaMalloc: {})",
                                          format_bytes(double(bytes)), cuda_error_text(e)),
                              "lower train.micro_batch or model.seq_len, turn on activation checkpointing, or shard "
                              "with parallel.zero / tensor parallelism");
    }
    if (e != cudaSuccess)
      foreign_call_failed("CUDA", fmt::format("cudaMalloc(&p, {})", bytes).c_str(), static_cast<long long>(e),
                          cuda_error_text(e), __FILE__, __LINE__);
    return p;
  }

  void deallocate(void* p, size_t) noexcept override {
    // A failing free is reported and ignored: this runs in destructors, and the memory is lost
    // either way.
    // At process exit the runtime may already be unloading: nothing is lost then.
    const cudaError_t e = cudaFree(p);
    if (e != cudaSuccess && e != cudaErrorCudartUnloading)
      std::fprintf(stderr, "warning: cudaFree failed: %s\n", cuda_error_text(e).c_str());
  }
};

}  // namespace

Allocator& device_allocator() {
  static DeviceAllocator allocator;
  return allocator;
}

namespace {
thread_local cudaStream_t tl_compute_stream = nullptr;
}  // namespace

cudaStream_t exchange_thread_compute_stream(cudaStream_t stream) { return std::exchange(tl_compute_stream, stream); }

cudaStream_t compute_stream() {
  if (tl_compute_stream != nullptr) return tl_compute_stream;
  // Never destroyed: work may still be queued on it while the process exits, when the runtime may
  // already be unloading.
  static const cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    LT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }();
  return stream;
}

void fill_zero(Tensor x) {
  if (x.bytes() > 0) LT_CUDA(cudaMemsetAsync(x.data, 0, x.bytes(), compute_stream()));
}

void copy(Tensor out, Tensor in) {
  if (out.bytes() == 0) return;
  cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
  if (out.device == Device::cpu) kind = cudaMemcpyDeviceToHost;
  if (in.device == Device::cpu) kind = cudaMemcpyHostToDevice;
  // On the compute stream, after the work queued before. Host memory here is pageable (our host
  // allocator's), so CUDA makes the call synchronous where the host needs it: a copy to the host
  // returns once done (it is read right after), and a host source is staged before the call
  // returns (it may be reused at once). A copy within the device is asynchronous.
  LT_CUDA(cudaMemcpyAsync(out.data, in.data, out.bytes(), kind, compute_stream()));
}

void synchronize() { LT_CUDA(cudaDeviceSynchronize()); }

Storage storage_of(const Tensor& t) {
  switch (t.dtype) {
    case DType::fp32:
      return Storage::fp32;
    case DType::bf16:
      return Storage::bf16;
    case DType::fp16:
      return Storage::fp16;
    default:
      break;
  }
  LT_CHECK(false, "CUDA op: {} is not a float storage dtype", to_string(t.dtype));
  __builtin_unreachable();
}

void not_supported(const std::string& what, const std::string& hint) {
  throw Error("not supported yet: " + what, hint);
}

void* device_scratch(int slot, size_t bytes) {
  LT_CHECK(slot == 0 || slot == 1, "device scratch slot {}", slot);
  thread_local Buffer buffers[2];
  Buffer& b = buffers[slot];
  if (b.bytes() < bytes) b = Buffer(DType::uint8, {int64_t(bytes)}, Device::cuda);
  return b.data();
}

}  // namespace llmtrain::kernels::cuda

namespace llmtrain::kernels {

// kernels/device_select.h's backend half: cudaSetDevice is per host thread.
void device_make_current(int ordinal) { LT_CUDA(cudaSetDevice(ordinal)); }

int device_current() {
  int ordinal = -1;
  LT_CUDA(cudaGetDevice(&ordinal));
  return ordinal;
}

}  // namespace llmtrain::kernels
