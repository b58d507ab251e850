// The CUDA backend's runtime (kernels/cuda/runtime.cu, stream.cu) on the simulated device: every
// failed call is an llmtrain::Error naming it, copies move bytes, events time in order, and a
// host read of a device Buffer's memory kills the process.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/backend_info.h"
#include "kernels/buffer.h"
#include "kernels/cuda/cuda_check.h"
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

TEST(CudaRuntime, EnvironmentReportsTheSimulator) {
  const CudaInfo c = cuda_info();
  EXPECT_TRUE(c.built);
  EXPECT_TRUE(c.simulator);
  ASSERT_EQ(c.devices.size(), 1u);
  EXPECT_NE(c.devices[0].name.find("simulator"), std::string::npos);
}

TEST(CudaRuntime, EventsAreRecordedInOrder) {
  Stream s;
  Event a, b;
  a.record(s);
  Buffer d(DType::fp32, {1 << 16}, Device::cuda);
  fill_zero(d.tensor());
  b.record(s);
  b.wait_on(s);
  s.synchronize();
  EXPECT_GE(b.elapsed_ms_since(a), 0.0f);
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

using CudaRuntimeDeathTest = ::testing::Test;

TEST_F(CudaRuntimeDeathTest, HostReadOfADeviceBufferFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Buffer d(DType::fp32, {64}, Device::cuda);
  // What a trainer bug looks like: reading a tensor's data on the host as if it were there.
  EXPECT_DEATH({ [[maybe_unused]] volatile float x = d.ptr<float>()[3]; }, "");
}

}  // namespace
}  // namespace llmtrain::kernels::cuda
