#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "launcher/restart_policy.h"

using namespace llmtrain::launcher;
namespace fs = std::filesystem;

TEST(RestartPolicy, ClassifiesExitStatuses) {
  EXPECT_EQ(classify_exit(0), JobOutcome::finished);
  EXPECT_EQ(classify_exit(2), JobOutcome::user_error);
  EXPECT_EQ(classify_exit(75), JobOutcome::interrupted);
  for (int s : {1, 3, 134, 137, 139, 143, 255}) EXPECT_EQ(classify_exit(s), JobOutcome::failed) << s;
  EXPECT_EQ(describe_exit(137), "exit 137 (killed by signal 9, Killed)");
  EXPECT_EQ(describe_exit(75), "exit 75 (interrupted, checkpoint written)");
  EXPECT_EQ(describe_exit(3), "exit 3");
}

TEST(RestartPolicy, BackOffDoublesUpToTheCap) {
  EXPECT_DOUBLE_EQ(restart_backoff_s(1, 1.0, 60.0), 1.0);
  EXPECT_DOUBLE_EQ(restart_backoff_s(2, 1.0, 60.0), 2.0);
  EXPECT_DOUBLE_EQ(restart_backoff_s(4, 1.0, 60.0), 8.0);
  EXPECT_DOUBLE_EQ(restart_backoff_s(7, 1.0, 60.0), 60.0);
  EXPECT_DOUBLE_EQ(restart_backoff_s(1000, 1.0, 60.0), 60.0);
}

TEST(RestartPolicy, FindsTheNewestCompleteCheckpoint) {
  fs::path dir = fs::path(::testing::TempDir()) / ("ckpt_" + std::to_string(getpid()));
  fs::remove_all(dir);
  EXPECT_EQ(latest_complete_checkpoint(dir.string()), "");  // missing folder
  fs::create_directories(dir);
  EXPECT_EQ(latest_complete_checkpoint(dir.string()), "");  // empty
  auto make = [&](const std::string& name, bool manifest) {
    fs::create_directories(dir / name);
    if (manifest) std::ofstream(dir / name / "manifest.json") << "{}";
  };
  make("step_00000100", true);
  make("step_00000200", true);
  std::ofstream(dir / "latest") << "step_00000100\n";
  make("step_00000300", false);         // no manifest: incomplete
  make("step_00000400.partial", true);  // being written
  make("other", true);
  // `latest` names 100, but 200 is complete and newer (a crash before `latest` was replaced).
  EXPECT_EQ(latest_complete_checkpoint(dir.string()), (dir / "step_00000200").string());
  make("step_100000000", true);  // past 8 digits
  EXPECT_EQ(latest_complete_checkpoint(dir.string()), (dir / "step_100000000").string());
  fs::remove_all(dir);
}

TEST(RestartPolicy, ResumeOverridesPointAtTheRunsOwnCheckpoints) {
  EXPECT_EQ(resume_overrides(), (std::vector<std::string>{"--set", "checkpoint.resume=auto", "--set",
                                                          "checkpoint.load_weights_only=false"}));
}
