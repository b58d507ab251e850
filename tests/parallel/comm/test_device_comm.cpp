// parallel.device_comm's choice (parallel/comm/device_comm.h) in this build: with NCCL (a CUDA build) or
// without (CPU-only, the simulator).
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/error.h"
#include "parallel/comm/comm_libraries.h"
#include "parallel/comm/comm_nccl.h"
#include "parallel/comm/device_comm.h"

namespace llmtrain::parallel {
namespace {

TEST(DeviceComm, StagedIsAlwaysTaken) {
  for (const bool shared : {false, true}) {
    const DeviceCommChoice c = choose_device_comm(DeviceComm::staged, shared);
    EXPECT_EQ(c.comm, DeviceComm::staged);
    EXPECT_EQ(c.why, "parallel.device_comm: staged");
  }
}

TEST(DeviceComm, AutoTakesNcclWhereItCanServeTheRanks) {
  unsetenv("NCCL_MULTI_RANK_GPU_ENABLE");
  const DeviceCommChoice own = choose_device_comm(std::nullopt, false);
  if (!nccl_built()) {
    EXPECT_EQ(own.comm, DeviceComm::staged);
    EXPECT_EQ(own.why, "auto: this build has no NCCL");
    EXPECT_THROW(choose_device_comm(DeviceComm::nccl, false), Error);
    return;
  }
  EXPECT_EQ(own.comm, DeviceComm::nccl);
  EXPECT_EQ(own.why, "NCCL " + nccl_version());
  // Ranks sharing a GPU: only NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 takes them.
  const DeviceCommChoice shared = choose_device_comm(std::nullopt, true);
  EXPECT_EQ(shared.comm, DeviceComm::staged);
  EXPECT_NE(shared.why.find("ranks share a GPU"), std::string::npos) << shared.why;
  try {
    choose_device_comm(DeviceComm::nccl, true);
    ADD_FAILURE() << "an explicit nccl on a shared GPU was accepted without NCCL_MULTI_RANK_GPU_ENABLE";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.device_comm: nccl"), std::string::npos) << e.what();
  }
  setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
  const DeviceCommChoice enabled = choose_device_comm(std::nullopt, true);
  EXPECT_EQ(enabled.comm, nccl_version_code() >= kNcclMultiRankGpuVersion ? DeviceComm::nccl : DeviceComm::staged)
      << enabled.why;
  unsetenv("NCCL_MULTI_RANK_GPU_ENABLE");
}

TEST(DeviceComm, NcclSettingsListTheEnvironmentsNcclVariables) {
  setenv("NCCL_DEBUG", "WARN", 1);
  setenv("NCCL_ALGO", "Ring\x1b[31m", 1);  // printed made printable, never raw
  const std::string s = nccl_settings();
  EXPECT_NE(s.find("NCCL_DEBUG=WARN"), std::string::npos) << s;
  EXPECT_EQ(s.find('\x1b'), std::string::npos) << s;
  EXPECT_LT(s.find("NCCL_ALGO"), s.find("NCCL_DEBUG")) << "sorted: " << s;
  unsetenv("NCCL_DEBUG");
  unsetenv("NCCL_ALGO");
}

}  // namespace
}  // namespace llmtrain::parallel
