// Which device a rank holds (kernels/device_select.h): the pure rule in every build; in the
// simulator build (LLMTRAIN_CUDA=SIM) the whole selection on LLMTRAIN_SIM_DEVICES simulated devices;
// in a build without the backend, the error that says so.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/error.h"
#include "kernels/backend_info.h"
#include "kernels/device_select.h"

using namespace llmtrain;
using namespace llmtrain::kernels;
using ::testing::HasSubstr;

namespace {

Error error_of(int local_rank, int local_size, int visible, bool share) {
  try {
    device_for_rank(local_rank, local_size, visible, share);
  } catch (const Error& e) {
    return e;
  }
  return Error("(no error)");
}

// LLMTRAIN_SIM_DEVICES for one test, restored (and device 0 made current again) after it.
class SimDevices {
 public:
  explicit SimDevices(const char* value) {
    if (const char* old = std::getenv("LLMTRAIN_SIM_DEVICES")) old_ = old, had_ = true;
    if (value)
      setenv("LLMTRAIN_SIM_DEVICES", value, 1);
    else
      unsetenv("LLMTRAIN_SIM_DEVICES");
  }
  ~SimDevices() {
    if (had_)
      setenv("LLMTRAIN_SIM_DEVICES", old_.c_str(), 1);
    else
      unsetenv("LLMTRAIN_SIM_DEVICES");
    if (cuda_info().simulator && !cuda_info().devices.empty()) device_make_current(0);
  }

 private:
  std::string old_;
  bool had_ = false;
};

}  // namespace

TEST(DeviceSelect, EachLocalRankTakesItsOwnDevice) {
  EXPECT_EQ(device_for_rank(0, 4, 4, false), 0);
  EXPECT_EQ(device_for_rank(3, 4, 4, false), 3);
  EXPECT_EQ(device_for_rank(1, 2, 8, false), 1);  // fewer ranks than devices: the first ones
  EXPECT_EQ(device_for_rank(0, 1, 1, false), 0);  // srun --gpus-per-task=1: each rank sees one
  EXPECT_EQ(device_for_rank(5, 8, 2, true), 1);   // shared: round-robin
  EXPECT_EQ(device_for_rank(3, 4, 1, true), 0);   // one GPU for every rank
}

TEST(DeviceSelect, MoreLocalRanksThanDevicesIsRefusedNamingBothCounts) {
  const Error e = error_of(2, 4, 2, false);
  EXPECT_THAT(e.what(), HasSubstr("4 local ranks on this node but 2 CUDA device(s) visible"));
  EXPECT_THAT(e.hint(), HasSubstr("launch.share_devices: true"));
  EXPECT_THAT(e.hint(), HasSubstr("at most 2 rank(s) per node"));
  // Sharing needs a device all the same.
  EXPECT_THAT(error_of(0, 2, 0, true).what(), HasSubstr("sees no CUDA device"));
}

// LLMTRAIN_SIM_DEVICES=2: two local ranks each hold a simulated device of their own, without
// sharing; the simulator's runtime agrees on the ordinal.
TEST(DeviceSelect, SimulatorShowsLlmtrainSimDevicesDevices) {
  if (!cuda_info().built || !cuda_info().simulator) GTEST_SKIP() << "the simulator build only (LLMTRAIN_CUDA=SIM)";
  SimDevices two("2");
  EXPECT_EQ(cuda_info().devices.size(), 2u);
  for (int local_rank : {0, 1}) {
    const HeldDevice held = device_select(local_rank, 2, false);
    EXPECT_EQ(held.ordinal, local_rank);
    EXPECT_EQ(held.visible, 2);
    EXPECT_FALSE(held.shared);
    EXPECT_EQ(device_current(), local_rank);
    EXPECT_THAT(held.describe(), HasSubstr("cuda:" + std::to_string(local_rank)));
    EXPECT_THAT(held.describe(), HasSubstr("LLMTRAIN_SIM_DEVICES=2"));
  }
  try {
    device_select(0, 3, false);
    FAIL() << "3 local ranks on 2 simulated devices";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("3 local ranks on this node but 2 CUDA device(s) visible"));
  }
  // srun --gpus-per-task: the visible devices are the rank's own, whatever its local rank.
  SimDevices one("1");
  const HeldDevice own = device_select(3, 4, false, /*gpus_per_task=*/1);
  EXPECT_EQ(own.ordinal, 0);
  EXPECT_FALSE(own.shared);
  EXPECT_THAT(own.describe(), HasSubstr("local rank 3 of 4, the first of its own 1 (srun --gpus-per-task)"));
  {
    // SLURM_GPUS_PER_TASK=1 but every device visible (no binding): the local-rank rule again.
    SimDevices four("4");
    const HeldDevice unbound = device_select(3, 4, false, /*gpus_per_task=*/1);
    EXPECT_EQ(unbound.ordinal, 3);
    EXPECT_FALSE(unbound.own_devices);
  }
  const HeldDevice shared = device_select(2, 3, true);
  EXPECT_EQ(shared.ordinal, 0);
  EXPECT_TRUE(shared.shared);
  EXPECT_THAT(shared.describe(), HasSubstr("shared: launch.share_devices"));
}

TEST(DeviceSelect, SimulatorRefusesAMalformedDeviceCount) {
  if (!cuda_info().built || !cuda_info().simulator) GTEST_SKIP() << "the simulator build only (LLMTRAIN_CUDA=SIM)";
  for (const char* bad : {"0", "two", "", "65", "-1", "1x"}) {
    SimDevices set(bad);
    EXPECT_TRUE(cuda_info().devices.empty()) << bad;
    try {
      device_select(0, 1, false);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(std::string("LLMTRAIN_SIM_DEVICES=\"") + bad + "\""));
      EXPECT_THAT(e.what(), HasSubstr("expected a whole number of simulated devices from 1 to 64"));
    }
  }
  SimDevices unset(nullptr);
  EXPECT_EQ(cuda_info().devices.size(), 1u);  // unset: one device
  EXPECT_EQ(device_select(0, 1, false).ordinal, 0);
}

TEST(DeviceSelect, ABuildWithoutTheBackendSaysSo) {
  if (cuda_info().built) GTEST_SKIP() << "a build without the CUDA backend only";
  try {
    device_select(0, 1, false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("this build has no CUDA backend"));
  }
}
