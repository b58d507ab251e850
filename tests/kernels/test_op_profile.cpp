// The op profile's hook (kernels/op_profile.h) at the one dispatch point: a known sequence of ops
// is counted and timed by name, library scopes nest inside their op, the pool drops what does not
// fit, and nothing is seen while no profile is active on the calling thread. On the simulated or
// a real device the same sequence is timed by events.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend_info.h"
#include "kernels/buffer.h"
#include "kernels/op_profile.h"
#include "kernels/ops.h"

namespace llmtrain::kernels {
namespace {

const OpTotal* row(const OpProfile& p, const std::string& name, const char* inside = nullptr) {
  for (const OpTotal& t : p.totals())
    if (t.name == name && (inside ? t.inside && t.inside == std::string(inside) : t.inside == nullptr)) return &t;
  return nullptr;
}

// Three ops a pass: gelu_forward twice, residual_forward once, a copy once.
struct Sequence {
  explicit Sequence(Device device)
      : a(DType::fp32, {64}, device), b(DType::fp32, {64}, device), out(DType::fp32, {64}, device) {}
  void run() {
    gelu_forward(out.tensor(), a.tensor());
    gelu_forward(b.tensor(), out.tensor());
    residual_forward(out.tensor(), a.tensor(), b.tensor(), Tensor{});
    copy(a.tensor(), out.tensor());
  }
  Buffer a, b, out;
};

void expect_counts(Device device) {
  Sequence ops(device);
  fill_zero(ops.a.tensor());
  OpProfile profile(device);
  profile.begin_counting();
  ops.run();
  profile.end();
  EXPECT_EQ(profile.counted(), 4);
  EXPECT_TRUE(profile.totals().empty()) << "counting times nothing";
  profile.reserve(profile.counted());
  for (int pass = 0; pass < 3; ++pass) {
    profile.begin_timing();
    ops.run();
    profile.end();
  }
  ASSERT_EQ(profile.totals().size(), 3u);
  const OpTotal* gelu = row(profile, "gelu_forward");
  const OpTotal* residual = row(profile, "residual_forward");
  const OpTotal* copied = row(profile, "copy");
  ASSERT_TRUE(gelu && residual && copied);
  EXPECT_EQ(gelu->calls, 6);
  EXPECT_EQ(residual->calls, 3);
  EXPECT_EQ(copied->calls, 3);
  for (const OpTotal& t : profile.totals()) {
    EXPECT_GE(t.seconds, 0.0) << t.name;
    EXPECT_FALSE(t.side_stream);
  }
  EXPECT_EQ(profile.dropped(), 0);
}

TEST(OpProfile, CountsAndTimesEachOpOfAKnownSequence) { expect_counts(Device::cpu); }

TEST(OpProfile, CountsAndTimesOnTheDevice) {
  if (cuda_info().devices.empty()) GTEST_SKIP() << "no CUDA device in this build";
  expect_counts(Device::cuda);
}

TEST(OpProfile, OffSeesNothing) {
  Sequence ops(Device::cpu);
  OpProfile profile(Device::cpu);
  profile.reserve(16);
  ops.run();  // no profile active: nothing reaches it
  EXPECT_FALSE(profile.active());
  EXPECT_TRUE(profile.totals().empty());
  profile.begin_timing();  // active on this thread only: another thread's ops are not counted
  std::thread([&] { ops.run(); }).join();
  profile.end();
  EXPECT_TRUE(profile.totals().empty());
  EXPECT_EQ(profile.dropped(), 0);
}

TEST(OpProfile, SumsTheTimeOfEachScope) {
  OpProfile profile(Device::cpu);
  profile.reserve(8);
  profile.begin_timing();
  for (int i = 0; i < 2; ++i) {
    const ProfileScope scope("sleep");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  profile.end();
  ASSERT_NE(row(profile, "sleep"), nullptr);
  EXPECT_EQ(row(profile, "sleep")->calls, 2);
  EXPECT_GE(row(profile, "sleep")->seconds, 0.040);
  EXPECT_LT(row(profile, "sleep")->seconds, 1.0);
}

TEST(OpProfile, ALibraryScopeIsARowInsideItsOp) {
  Sequence ops(Device::cpu);
  OpProfile profile(Device::cpu);
  profile.reserve(8);
  profile.begin_timing();
  {
    const ProfileScope op("outer_op");
    const ProfileScope call("outer_op: library");
    gelu_forward(ops.out.tensor(), ops.a.tensor());
  }
  gelu_forward(ops.out.tensor(), ops.a.tensor());
  profile.end();
  ASSERT_EQ(profile.totals().size(), 4u);
  EXPECT_EQ(row(profile, "outer_op")->calls, 1);
  ASSERT_NE(row(profile, "outer_op: library", "outer_op"), nullptr);
  ASSERT_NE(row(profile, "gelu_forward", "outer_op: library"), nullptr) << "an op inside a scope is inside it";
  EXPECT_EQ(row(profile, "gelu_forward")->calls, 1) << "and apart from the same op at the top level";
  EXPECT_GE(row(profile, "outer_op")->seconds, row(profile, "outer_op: library", "outer_op")->seconds);
}

TEST(OpProfile, ScopesBeyondThePoolAreDroppedNotTimed) {
  Sequence ops(Device::cpu);
  OpProfile profile(Device::cpu);
  profile.begin_timing();  // no pool yet
  ops.run();
  profile.end();
  EXPECT_TRUE(profile.totals().empty());
  EXPECT_EQ(profile.dropped(), 4);
  profile.reserve(2);
  profile.begin_timing();
  ops.run();
  profile.end();
  EXPECT_EQ(row(profile, "gelu_forward")->calls, 2);
  EXPECT_EQ(profile.dropped(), 6);
}

}  // namespace
}  // namespace llmtrain::kernels
