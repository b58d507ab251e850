#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>

#include "common/error.h"
#include "launcher/child_process.h"

using namespace llmtrain;
using namespace llmtrain::launcher;
using ::testing::HasSubstr;

TEST(ChildProcess, RunsACommandAndFoldsItsStatus) {
  CommandResult r = run_command({"sh", "-c", "echo out; echo err >&2; exit 7"}, 10);
  EXPECT_EQ(r.status, 7);
  EXPECT_FALSE(r.timed_out);
  EXPECT_THAT(r.output, HasSubstr("out\n"));
  EXPECT_THAT(r.output, HasSubstr("err\n"));
  EXPECT_EQ(run_command({"sh", "-c", "kill -9 $$"}, 10).status, 128 + SIGKILL);
}

TEST(ChildProcess, PassesTheEnvironmentOverrides) {
  CommandResult r = run_command({"sh", "-c", "echo $LT_TEST_VALUE"}, 10, {{"LT_TEST_VALUE", "forty two"}});
  EXPECT_EQ(r.output, "forty two\n");
}

TEST(ChildProcess, KillsACommandThatOutlivesItsTimeout) {
  double t0 = monotonic_seconds();
  CommandResult r = run_command({"sh", "-c", "sleep 30 & wait"}, 0.3);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.status, 128 + SIGKILL);
  EXPECT_LT(monotonic_seconds() - t0, 10.0);  // the whole group went, the sleep too
}

TEST(ChildProcess, RunsSeveralAtOnce) {
  auto results = run_commands({{"sh", "-c", "exit 0"}, {"sh", "-c", "echo no >&2; exit 255"}}, 10);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].status, 0);
  EXPECT_EQ(results[1].status, 255);
  EXPECT_EQ(results[1].output, "no\n");
}

TEST(ChildProcess, AMissingProgramIsAnErrorNamingIt) {
  EXPECT_EQ(find_program("no-such-program-xyz"), "");
  EXPECT_NE(find_program("sh"), "");
  CommandResult r = run_command({"no-such-program-xyz"}, 10);
  EXPECT_EQ(r.status, -1);
  EXPECT_THAT(r.start_error, HasSubstr("cannot run no-such-program-xyz: not found on PATH"));
  ChildSpec not_executable;
  not_executable.argv = {"/etc/hostname"};
  try {
    Child::spawn(not_executable);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/etc/hostname"));
  }
}
