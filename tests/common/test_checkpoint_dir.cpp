// The checkpoint directory layout (common/checkpoint_dir.h): step directory names, and the newest
// complete checkpoint that the launcher restarts from.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/checkpoint_dir.h"

using namespace llmtrain;
namespace fs = std::filesystem;

TEST(CheckpointDir, StepDirectoryNames) {
  EXPECT_EQ(checkpoint_step_dir(100), "step_00000100");
  EXPECT_EQ(checkpoint_parse_step_dir("step_00000100"), 100);
  EXPECT_EQ(checkpoint_parse_step_dir("step_00000100.partial"), -1);
  EXPECT_EQ(checkpoint_parse_step_dir("latest"), -1);
}

TEST(CheckpointDir, FindsTheNewestCompleteCheckpoint) {
  fs::path dir = fs::path(::testing::TempDir()) / ("ckpt_" + std::to_string(getpid()));
  fs::remove_all(dir);
  EXPECT_EQ(checkpoint_newest_complete(dir.string()), "");  // missing folder
  fs::create_directories(dir);
  EXPECT_EQ(checkpoint_newest_complete(dir.string()), "");  // empty
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
  EXPECT_EQ(checkpoint_newest_complete(dir.string()), (dir / "step_00000200").string());
  make("step_100000000", true);  // past 8 digits
  EXPECT_EQ(checkpoint_newest_complete(dir.string()), (dir / "step_100000000").string());
  fs::remove_all(dir);
}

TEST(CheckpointDir, CandidatesAreNewestFirst) {
  fs::path dir = fs::path(::testing::TempDir()) / ("cand_" + std::to_string(getpid()));
  fs::remove_all(dir);
  EXPECT_TRUE(checkpoint_candidates(dir.string()).empty());
  for (const char* name : {"step_00000020", "step_00000100", "step_00000003", "step_00000050.partial", "notes"})
    fs::create_directories(dir / name);
  std::ofstream(dir / "step_00000200") << "a file, not a directory";
  auto c = checkpoint_candidates(dir.string());
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(fs::path(c[0]).filename(), "step_00000100");
  EXPECT_EQ(fs::path(c[1]).filename(), "step_00000020");
  EXPECT_EQ(fs::path(c[2]).filename(), "step_00000003");
  fs::remove_all(dir);
}
