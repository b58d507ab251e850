// The CUDA backend's runtime (kernels/cuda/runtime.cpp, stream.cpp) on the simulated device: every
// failed call is an llmtrain::Error naming it, copies move bytes, events keep the order they were
// recorded in, and a host read of a device Buffer's memory kills the process.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "kernels/backend_info.h"
#include "kernels/buffer.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sim/sim_rules.h"
#include "kernels/cuda/stream.h"
#include "kernels/ops.h"
#include "tests/kernels/sim/sim_test_kernels.h"

namespace llmtrain::kernels::cuda {
namespace {

std::string error_of(void (*f)()) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CudaRuntime, AFailedCallIsAnErrorNamingIt) {
  const std::string what = error_of([] {
    int host = 0;
    LT_CUDA(cudaMemcpy(&host, &host, sizeof(host), cudaMemcpyDeviceToHost));
  });
  EXPECT_NE(what.find("CUDA call failed"), std::string::npos) << what;
  EXPECT_NE(what.find("cudaMemcpy(&host, &host, sizeof(host), cudaMemcpyDeviceToHost)"), std::string::npos) << what;
  EXPECT_NE(what.find("cudaErrorInvalidValue: invalid argument"), std::string::npos) << what;
  EXPECT_NE(what.find("test_cuda_runtime.cpp"), std::string::npos) << what;
  cudaGetLastError();
}

TEST(CudaRuntime, ABadLaunchIsAnErrorNamingTheKernel) {
  const std::string what = error_of([] {
    Buffer b(DType::fp32, {32}, Device::cuda);
    cuda_sim_test::launch_too_many_threads(static_cast<float*>(b.data()));  // leaves the error pending
    LT_CUDA_LAUNCHED("deadlock_kernel");
  });
  EXPECT_NE(what.find("the launch of deadlock_kernel"), std::string::npos) << what;
  EXPECT_NE(what.find("cudaErrorInvalidConfiguration"), std::string::npos) << what;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the check consumed it
}

// LLMTRAIN_SIM_DEVICES=N: the runtime counts N devices and accepts ordinals below N, per host
// thread as CUDA does; a malformed value fails the count instead of quietly being 1.
TEST(CudaRuntime, SimulatedDeviceCountComesFromTheEnvironment) {
  setenv("LLMTRAIN_SIM_DEVICES", "3", 1);
  int count = 0, current = -1;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 3);
  EXPECT_EQ(cudaSetDevice(2), cudaSuccess);
  EXPECT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 2);
  std::thread([] {
    int other = -1;
    cudaGetDevice(&other);
    EXPECT_EQ(other, 0);  // another host thread has its own current device
  }).join();
  EXPECT_EQ(cudaSetDevice(3), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaSetDevice(-1), cudaErrorInvalidDevice);
  cudaGetLastError();
  setenv("LLMTRAIN_SIM_DEVICES", "many", 1);
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(cuda_info().unavailable_reason,
            "LLMTRAIN_SIM_DEVICES=\"many\": expected a whole number of simulated devices from 1 to 64");
  unsetenv("LLMTRAIN_SIM_DEVICES");
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 1);
}

TEST(CudaRuntime, EnvironmentReportsTheSimulator) {
  const CudaInfo c = cuda_info();
  EXPECT_TRUE(c.built);
  EXPECT_TRUE(c.simulator);
  ASSERT_EQ(c.devices.size(), 1u);
  EXPECT_NE(c.devices[0].name.find("simulator"), std::string::npos);
}

// What the CUDA runtime guarantees, and the simulator keeps: events recorded on a stream complete
// in the order they were recorded, so the time from one to a later one is positive when work lies
// between them, the times add up along the stream and change sign when asked backwards (the
// runtime returns end − start); a stream that waits on an event runs its later work after the work
// before that event.
TEST(CudaRuntime, EventsAreRecordedInOrder) {
  Stream s, t;
  Event c, b, a;  // created in the other order: an event's time is its record's
  Buffer d(DType::uint8, {int64_t(4) << 20}, Device::cuda);
  kernels::synchronize(
      Device::cuda);  // a new Buffer is zeroed on the compute stream, which nothing orders with s and t
  a.record(s);
  LT_CUDA(cudaMemsetAsync(d.data(), 0, d.bytes(), s.get()));
  b.record(s);
  b.wait_on(t);  // t's memset runs after s's
  LT_CUDA(cudaMemsetAsync(d.data(), 1, d.bytes(), t.get()));
  c.record(t);
  const float ab = b.elapsed_ms_since(a), bc = c.elapsed_ms_since(b), ac = c.elapsed_ms_since(a);
  EXPECT_GT(ab, 0.0f) << "a 4 MiB memset lies between a and b";
  EXPECT_GT(bc, 0.0f) << "a 4 MiB memset lies between b and c";
  EXPECT_GT(ac, ab);
  EXPECT_GT(ac, bc);
  EXPECT_NEAR(ac, ab + bc, 1e-3f + 1e-4f * ac);
  EXPECT_FLOAT_EQ(a.elapsed_ms_since(b), -ab);
  EXPECT_LT(a.elapsed_ms_since(c), 0.0f);
  // The later memset won: every byte is 1 (the copy runs on the compute stream, which waits for c).
  c.make_compute_wait();
  std::vector<uint8_t> host(d.bytes());
  copy(Tensor(host.data(), DType::uint8, {int64_t(host.size())}), d.tensor());
  EXPECT_EQ(std::count(host.begin(), host.end(), uint8_t(1)), int64_t(host.size()));
}

TEST(CudaRuntime, CopiesBetweenHostAndDeviceAndWithinTheDevice) {
  std::vector<float> v(100);
  for (int i = 0; i < 100; ++i) v[size_t(i)] = float(i) * 0.5f;
  Tensor host(v.data(), DType::fp32, {100});
  Buffer d(DType::fp32, {100}, Device::cuda), e(DType::fp32, {100}, Device::cuda);
  copy(d.tensor(), host);
  copy(e.tensor(), d.tensor());
  std::vector<float> out(100);
  copy(Tensor(out.data(), DType::fp32, {100}), e.tensor());
  EXPECT_EQ(out, v);
}

// Pinned host memory for the stream tests, freed by the test's end.
struct Pinned {
  explicit Pinned(size_t bytes) { LT_CUDA(cudaMallocHost(&p, bytes)); }
  ~Pinned() { cudaFreeHost(p); }
  void* p = nullptr;
};

// What the simulator promises so that a missing wait fails a test: work on a stream is deferred
// until the host needs it, and work that no event orders runs in an order CUDA allows but does not
// promise (the stream queued last first). Stream t copies the buffer that stream s fills: without
// t waiting for an event recorded after s's fill, t reads what was there before.
TEST(CudaRuntime, AStreamThatDoesNotWaitForAnotherReadsTheOldContents) {
  for (const bool wait : {false, true}) {
    Stream s, t;
    Event filled, copied;
    Buffer d(DType::uint8, {4096}, Device::cuda);  // zeroed on the compute stream
    kernels::synchronize(Device::cuda);
    Pinned host(4096);
    LT_CUDA(cudaMemsetAsync(d.data(), 7, d.bytes(), s.get()));
    filled.record(s);
    if (wait) filled.wait_on(t);
    LT_CUDA(cudaMemcpyAsync(host.p, d.data(), d.bytes(), cudaMemcpyDeviceToHost, t.get()));
    copied.record(t);
    copied.synchronize();
    const auto* bytes = static_cast<const uint8_t*>(host.p);
    EXPECT_EQ(int(std::count(bytes, bytes + 4096, uint8_t(wait ? 7 : 0))), 4096)
        << (wait ? "with" : "without") << " the wait";
    s.synchronize();
  }
}

// A copy into pinned memory is asynchronous: it has not happened until an event behind it says so,
// and the first query of that event, made before anything waited, reports the work as not ready.
TEST(CudaRuntime, CopiesToPinnedMemoryHappenBehindTheirEvent) {
  Stream s;
  Event done;
  Buffer d(DType::uint8, {256}, Device::cuda);
  kernels::synchronize(Device::cuda);
  LT_CUDA(cudaMemsetAsync(d.data(), 5, d.bytes(), s.get()));
  Pinned host(256);
  std::memset(host.p, 0, 256);
  LT_CUDA(cudaMemcpyAsync(host.p, d.data(), d.bytes(), cudaMemcpyDeviceToHost, s.get()));
  done.record(s);
  EXPECT_EQ(static_cast<const uint8_t*>(host.p)[0], 0) << "the copy ran before anything needed it";
  EXPECT_FALSE(done.done());
  EXPECT_TRUE(done.done());
  EXPECT_EQ(static_cast<const uint8_t*>(host.p)[255], 5);
}

// The ops run on the compute stream: a copy to pageable host memory sees every op queued before it,
// and a stream that waits for an event recorded on the compute stream sees the op's result.
TEST(CudaRuntime, OpsRunOnTheComputeStream) {
  Buffer d(DType::fp32, {64}, Device::cuda);
  kernels::synchronize(Device::cuda);
  Stream comm;
  Event after_zero;
  LT_CUDA(cudaMemsetAsync(d.data(), 0xFF, d.bytes(), comm.get()));  // would win if nothing ordered it
  comm.synchronize();
  fill_zero(d.tensor());
  after_zero.record();
  after_zero.wait_on(comm);
  Pinned host(d.bytes());
  LT_CUDA(cudaMemcpyAsync(host.p, d.data(), d.bytes(), cudaMemcpyDeviceToHost, comm.get()));
  comm.synchronize();
  const auto* f = static_cast<const float*>(host.p);
  EXPECT_EQ(int(std::count(f, f + 64, 0.0f)), 64);
}

// Every call that takes a stream accepts only a stream the runtime made and has not destroyed: the
// legacy default stream is refused (llmtrain's code never uses it; CUDA orders it with no
// non-blocking stream), with the reason in the error's text, unless a test allows it.
TEST(CudaRuntime, CallsRefuseTheLegacyStreamAndStreamsTheRuntimeDidNotMake) {
  Buffer d(DType::fp32, {64}, Device::cuda);
  kernels::synchronize(Device::cuda);
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  cudaStream_t gone = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(gone), cudaSuccess);
  for (cudaStream_t bad : {cudaStream_t(nullptr), cudaStreamLegacy, cudaStreamPerThread, gone}) {
    const std::string why = bad == gone ? "did not create, or has destroyed" : "the legacy default stream";
    auto check = [&](cudaError_t r, const char* call) {
      EXPECT_EQ(r, cudaErrorInvalidResourceHandle) << call;
      EXPECT_NE(std::string(cudaGetErrorString(r)).find(why), std::string::npos)
          << call << ": " << cudaGetErrorString(r);
      cudaGetLastError();
    };
    check(cudaMemsetAsync(d.data(), 0, d.bytes(), bad), "cudaMemsetAsync");
    check(cudaMemcpyAsync(d.data(), d.data(), 4, cudaMemcpyDeviceToDevice, bad), "cudaMemcpyAsync");
    check(cudaEventRecord(e, bad), "cudaEventRecord");
    check(cudaStreamWaitEvent(bad, e, 0), "cudaStreamWaitEvent");
    check(cudaStreamSynchronize(bad), "cudaStreamSynchronize");
    check(cudaStreamQuery(bad), "cudaStreamQuery");
    cuda_sim_test::launch_on(static_cast<float*>(d.data()), bad);
    try {
      LT_CUDA_LAUNCHED("fill_kernel");
      ADD_FAILURE() << "a launch on a refused stream was accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(why), std::string::npos) << err.what();
    }
  }
  {
    cuda_sim::LegacyStreamAllowed legacy;
    EXPECT_EQ(cudaMemsetAsync(d.data(), 0, d.bytes(), nullptr), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(e, nullptr), cudaSuccess);
  }
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
}

using CudaRuntimeDeathTest = ::testing::Test;

TEST_F(CudaRuntimeDeathTest, HostReadOfADeviceBufferFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Buffer d(DType::fp32, {64}, Device::cuda);
  // What a trainer bug looks like: reading a tensor's data on the host as if it were there.
  EXPECT_DEATH({ [[maybe_unused]] volatile float x = d.ptr<float>()[3]; }, "");
}

}  // namespace
}  // namespace llmtrain::kernels::cuda
