// LLMTRAIN_FAULT's grammar, <kind>@<step>[:<rank>]: what the fault tests of docs/testing.md rely on.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/error.h"
#include "trainer/loop/fault_injection.h"

namespace llmtrain::trainer {
namespace {

Fault parse(const char* value) {
  ::setenv("LLMTRAIN_FAULT", value, 1);
  Fault f = fault_from_env();
  ::unsetenv("LLMTRAIN_FAULT");
  return f;
}

TEST(FaultInjection, ParsesKindStepAndRank) {
  Fault f = parse("kill@12:3");
  EXPECT_EQ(f.kind, "kill");
  EXPECT_EQ(f.step, 12);
  EXPECT_EQ(f.rank, 3);
  f = parse("slow@0");
  EXPECT_EQ(f.kind, "slow");
  EXPECT_EQ(f.step, 0);
  EXPECT_EQ(f.rank, -1);
  EXPECT_EQ(parse("term@5:1").kind, "term");
  EXPECT_EQ(parse("full-disk-in-save@4").kind, "full-disk-in-save");
  EXPECT_EQ(parse("").kind, "");
}

TEST(FaultInjection, MalformedValuesAreErrors) {
  for (const char* bad : {"kill", "kill@", "kill@x", "kill@3:", "kill@3:x", "boom@3", "@3", "kill@3:1:2", "kill@-1",
                          "kill@99999999999999999999999", "kill@1:99999999999"}) {
    EXPECT_THROW(parse(bad), Error) << bad;
    ::unsetenv("LLMTRAIN_FAULT");
  }
}

// term-in-save stops a background write: without checkpoint.async there is none, which is said
// rather than ignored; with it, only the fault's rank and step fire.
TEST(FaultInjection, TermInSaveNeedsAsyncCheckpoints) {
  const Fault f = parse("term-in-save@4:1");
  EXPECT_EQ(f.kind, "term-in-save");
  try {
    fault_writer_hook(f, 1, /*async=*/false);
    ADD_FAILURE() << "term-in-save without checkpoint.async was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint.async is false"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fault_writer_hook(f, 0, true));  // another rank
  EXPECT_TRUE(fault_writer_hook(f, 1, true));
  EXPECT_FALSE(fault_writer_hook(parse("term@4"), 0, true));  // not a writer fault
}

// The injector as train() holds it: a slow fault's sleep is forward time from its step on, on its
// rank only; without a save fault the checkpoints write through the file system given.
TEST(FaultInjection, TheInjectorSlowsItsRankFromItsStepOn) {
  ::setenv("LLMTRAIN_FAULT", "slow@3:1", 1);
  FaultInjector slowed(1, nullptr), other(0, nullptr);
  ::unsetenv("LLMTRAIN_FAULT");
  auto forward_after = [](FaultInjector& f, int64_t step) {
    StepOutcome outcome;
    outcome.times.forward = 0.002;
    f.step_done(step, outcome);
    f.step_boundary(step);  // slow fires nothing at the boundary
    return outcome.times.forward;
  };
  EXPECT_EQ(forward_after(slowed, 2), 0.002);
  EXPECT_GE(forward_after(slowed, 3), 0.002 + 9 * 0.002);
  EXPECT_GE(forward_after(slowed, 4), 0.002 + 9 * 0.002);
  EXPECT_EQ(forward_after(other, 4), 0.002);
  FileSystem& base = default_file_system();
  EXPECT_EQ(&slowed.file_system(base), &base);
  EXPECT_FALSE(slowed.writer_hook(false));
}

TEST(FaultInjection, OffloadIoErrorWithoutAnOffloadFileIsSaid) {
  ::setenv("LLMTRAIN_FAULT", "offload-io-error@2", 1);
  FaultInjector f(0, nullptr);
  ::unsetenv("LLMTRAIN_FAULT");
  EXPECT_NO_THROW(f.step_boundary(1));
  try {
    f.step_boundary(2);
    ADD_FAILURE() << "offload-io-error without an offload file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without an offload file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace llmtrain::trainer
