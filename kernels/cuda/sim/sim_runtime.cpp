// The simulated device's runtime: the subset of CUDA's runtime API (cuda_runtime_api.h, NVIDIA's
// declarations) that llmtrain calls, implemented on the host: device memory, errors, the devices'
// identity (LLMTRAIN_SIM_DEVICES devices, sim_devices.h, one by default, over one simulated
// memory; streams, events and copies are kernels/cuda/sim/sim_streams.cpp), kernels' attributes
// (cudaFuncSetAttribute: the dynamic shared memory a kernel may ask for, per device). Device memory
// is mapped with no access except while a kernel or a copy runs.
//
// The rule a reader could get wrong: a device pointer is never host-readable here. Each
// allocation is its own mapping, ending at a guard page (an overrun past the 256-byte rounding
// faults even inside a kernel), and every allocation is PROT_NONE whenever no DeviceAccess is
// open, so a host read or write of device memory dies with SIGSEGV, the bug a GPU would report
// as garbage or a crash far away.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "kernels/cuda/sim/sim_counters.h"
#include "kernels/cuda/sim/sim_devices.h"
#include "kernels/cuda/sim/sim_internal.h"

namespace llmtrain::cuda_sim {
namespace {

struct Region {
  char* map_base;
  size_t map_bytes;   // the mapping, guard page included
  size_t data_bytes;  // the accessible part (whole pages before the guard)
  size_t bytes;       // what was asked for
};

struct Memory {
  std::mutex mutex;
  std::map<uintptr_t, Region> regions;  // by the pointer handed out
  int open = 0;                         // DeviceAccess objects alive
};

Memory& memory() {
  static Memory m;
  return m;
}

size_t page_bytes() { return size_t(sysconf(_SC_PAGESIZE)); }

void protect(const Region& r, bool accessible) {
  if (mprotect(r.map_base, r.data_bytes, accessible ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
    fatal("mprotect of simulated device memory failed");
}

thread_local cudaError_t tl_last_error = cudaSuccess;
// The current device is per host thread, as in CUDA.
thread_local int tl_current_device = 0;
thread_local cudaError_t tl_reason_code = cudaSuccess;
thread_local std::string tl_reason;

// cudaFuncAttributeMaxDynamicSharedMemorySize per (device, kernel); ranks as threads set them.
struct FunctionAttributes {
  std::mutex mutex;
  std::map<std::pair<int, const void*>, size_t> max_dynamic_shared;
};

FunctionAttributes& function_attributes() {
  static FunctionAttributes a;
  return a;
}

std::atomic<int64_t> g_synchronizations{0}, g_reads{0}, g_pageable_uploads{0}, g_launches{0}, g_events{0};

bool inside(const Memory& m, const void* p, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = m.regions.upper_bound(a);
  if (it == m.regions.begin()) return false;
  --it;
  return a - it->first <= it->second.bytes && bytes <= it->second.bytes - (a - it->first);
}

}  // namespace

void set_last_error(cudaError_t e) { tl_last_error = e; }

size_t dynamic_shared_limit(const void* func) {
  FunctionAttributes& a = function_attributes();
  std::lock_guard lock(a.mutex);
  auto it = a.max_dynamic_shared.find({current_device(), func});
  return it != a.max_dynamic_shared.end() ? it->second : kDefaultDynamicSharedBytes;
}

cudaError_t fail(cudaError_t e) {
  tl_last_error = e;
  return e;
}

cudaError_t fail_because(cudaError_t e, std::string why) {
  tl_reason_code = e;
  tl_reason = "(simulator: " + why + ")";
  return fail(e);
}

const char* failure_reason(cudaError_t e) { return e == tl_reason_code ? tl_reason.c_str() : ""; }

int current_device() { return tl_current_device; }

void count_synchronization() { ++g_synchronizations; }
void count_read() { ++g_reads; }
void count_pageable_upload() { ++g_pageable_uploads; }
void count_launch() { ++g_launches; }
void count_event() { ++g_events; }

DeviceAccess::DeviceAccess() {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  if (m.open++ == 0)
    for (auto& [p, r] : m.regions) protect(r, true);
}

DeviceAccess::~DeviceAccess() {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  if (--m.open == 0)
    for (auto& [p, r] : m.regions) protect(r, false);
}

bool is_device_range(const void* p, size_t bytes) {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  return inside(m, p, bytes);
}

HostWaits host_waits() { return {g_synchronizations.load(), g_reads.load(), g_pageable_uploads.load()}; }
int64_t kernel_launches() { return g_launches.load(); }
int64_t events_created() { return g_events.load(); }

}  // namespace llmtrain::cuda_sim

using llmtrain::cuda_sim::drain_device;
using llmtrain::cuda_sim::fail;

extern "C" {

cudaError_t cudaMalloc(void** ptr, size_t size) {
  using namespace llmtrain::cuda_sim;
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  const size_t page = page_bytes();
  const size_t rounded = (std::max<size_t>(size, 1) + 255) / 256 * 256;
  const size_t data = (rounded + page - 1) / page * page;
  void* base = mmap(nullptr, data + page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    *ptr = nullptr;
    return fail(cudaErrorMemoryAllocation);
  }
  Region r{static_cast<char*>(base), data + page, data, size};
  char* user = r.map_base + data - rounded;  // ends at the guard page, 256-byte aligned
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  if (m.open > 0) protect(r, true);
  m.regions.emplace(reinterpret_cast<uintptr_t>(user), r);
  *ptr = user;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  using namespace llmtrain::cuda_sim;
  if (ptr == nullptr) return cudaSuccess;
  drain_device();  // CUDA's cudaFree waits for the device's work, which may still use the memory
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  auto it = m.regions.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == m.regions.end()) return fail(cudaErrorInvalidDevicePointer);
  munmap(it->second.map_base, it->second.map_bytes);
  m.regions.erase(it);
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = llmtrain::cuda_sim::tl_last_error;
  llmtrain::cuda_sim::tl_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return llmtrain::cuda_sim::tl_last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorInvalidDeviceFunction:
      return "cudaErrorInvalidDeviceFunction";
    default:
      return "cudaErrorUnknown";
  }
}

static const char* cuda_error_text(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorInvalidDeviceFunction:
      return "invalid device function";
    default:
      return "unknown error (the simulator does not produce this code)";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  // CUDA's text, then the simulator's reason for the refusal this thread saw last, if it was this code.
  thread_local std::string text;
  const char* reason = llmtrain::cuda_sim::failure_reason(error);
  if (*reason == '\0') return cuda_error_text(error);
  text = std::string(cuda_error_text(error)) + " " + reason;
  return text.c_str();
}

// LLMTRAIN_SIM_DEVICES devices (sim_devices.h); a malformed value fails the count. The current
// device is per host thread, as in CUDA; every ordinal shares this process's one simulated memory.

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  const llmtrain::cuda_sim::SimDevices d = llmtrain::cuda_sim::sim_devices();
  *count = d.count;
  return d.error.empty() ? cudaSuccess : fail(cudaErrorInvalidValue);
}

cudaError_t cudaSetDevice(int device) {
  const llmtrain::cuda_sim::SimDevices d = llmtrain::cuda_sim::sim_devices();
  if (!d.error.empty()) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= d.count) return fail(cudaErrorInvalidDevice);
  llmtrain::cuda_sim::tl_current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = llmtrain::cuda_sim::tl_current_device;
  return cudaSuccess;
}

// A kernel's attributes, for the calling thread's current device (CUDA's cudaFuncSetAttribute sets
// them in the current device's context). The simulator models the dynamic shared memory limit and
// accepts the carveout (a hint the driver may ignore); it refuses the other attributes.
cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  using namespace llmtrain::cuda_sim;
  if (func == nullptr) return fail(cudaErrorInvalidDeviceFunction);
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize: {
      if (value < 0 || size_t(value) > kMaxDynamicSharedBytes)
        return fail_because(cudaErrorInvalidValue, "cudaFuncAttributeMaxDynamicSharedMemorySize " +
                                                       std::to_string(value) + " is outside 0 to " +
                                                       std::to_string(kMaxDynamicSharedBytes) +
                                                       " (the device's opt-in maximum per block)");
      FunctionAttributes& a = function_attributes();
      std::lock_guard lock(a.mutex);
      a.max_dynamic_shared[{tl_current_device, func}] = size_t(value);
      return cudaSuccess;
    }
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      return value >= -1 && value <= 100 ? cudaSuccess : fail(cudaErrorInvalidValue);
    default:
      return fail_because(cudaErrorInvalidValue,
                          "cudaFuncSetAttribute: the simulator models only "
                          "cudaFuncAttributeMaxDynamicSharedMemorySize and "
                          "cudaFuncAttributePreferredSharedMemoryCarveout");
  }
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;  // the headers the simulator was built against
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = 0;  // no driver: this is the simulator
  return cudaSuccess;
}

}  // extern "C"
