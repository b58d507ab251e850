#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

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

  // At once, not one after the other: each command leaves a file and waits (5 s at most) for the
  // other's, which only two commands running together can both see.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("llmtrain-at-once-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto meet = [&](const char* mine, const char* other) {
    const std::string d = dir.string();
    return std::vector<std::string>{"sh", "-c",
                                    "touch " + d + "/" + mine + "; for i in $(seq 100); do [ -e " + d + "/" + other +
                                        " ] && exit 0; sleep 0.05; done; exit 1"};
  };
  const auto met = run_commands({meet("a", "b"), meet("b", "a")}, 10);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(met.size(), 2u);
  EXPECT_EQ(met[0].status, 0) << "the first command never saw the second one's file: they ran one after the other";
  EXPECT_EQ(met[1].status, 0) << "the second command never saw the first one's file";
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
