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

}  // namespace
}  // namespace llmtrain::trainer
