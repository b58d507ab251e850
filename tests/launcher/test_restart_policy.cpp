#include <gtest/gtest.h>

#include "launcher/restart_policy.h"

using namespace llmtrain::launcher;

TEST(RestartPolicy, ClassifiesExitStatuses) {
  EXPECT_EQ(classify_exit(0), JobOutcome::finished);
  EXPECT_EQ(classify_exit(2), JobOutcome::user_error);
  EXPECT_EQ(classify_exit(75), JobOutcome::interrupted);
  for (int s : {1, 3, 134, 137, 139, 143, 255}) EXPECT_EQ(classify_exit(s), JobOutcome::failed) << s;
  EXPECT_EQ(describe_exit(137), "exit 137 (killed by signal 9, Killed)");
  EXPECT_EQ(describe_exit(75), "exit 75 (interrupted, checkpoint written)");
  EXPECT_EQ(describe_exit(3), "exit 3");
}

// Issue 33: a job whose rank was SIGKILLed made `llmtrain run` itself exit 137, which reads as if the
// launcher had been killed. One rule: 0, 2 and 75 as they are, any failure 1 (torchrun's).
TEST(RestartPolicy, TheLauncherExitsOneForAnyFailure) {
  EXPECT_EQ(launcher_exit_status(0), 0);
  EXPECT_EQ(launcher_exit_status(2), 2);
  EXPECT_EQ(launcher_exit_status(75), 75);
  for (int s : {1, 3, 134, 137, 139, 143, 255}) EXPECT_EQ(launcher_exit_status(s), 1) << s;
}

TEST(RestartPolicy, BackOffDoublesUpToTheCap) {
  EXPECT_DOUBLE_EQ(restart_backoff_s(1, 1.0, 60.0), 1.0);
  EXPECT_DOUBLE_EQ(restart_backoff_s(2, 1.0, 60.0), 2.0);
  EXPECT_DOUBLE_EQ(restart_backoff_s(4, 1.0, 60.0), 8.0);
  EXPECT_DOUBLE_EQ(restart_backoff_s(7, 1.0, 60.0), 60.0);
  EXPECT_DOUBLE_EQ(restart_backoff_s(1000, 1.0, 60.0), 60.0);
}

TEST(RestartPolicy, ResumeOverridesPointAtTheRunsOwnCheckpoints) {
  EXPECT_EQ(resume_overrides(), (std::vector<std::string>{"--set", "checkpoint.resume=auto", "--set",
                                                          "checkpoint.load_weights_only=false"}));
}
