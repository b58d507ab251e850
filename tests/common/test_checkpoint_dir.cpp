// The checkpoint directory layout (common/checkpoint_dir.h): step directory names, and the
// checkpoint that the launcher restarts from (what `latest` names, else the newest complete).
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

TEST(CheckpointDir, LatestIsTheTruthAndScanningTheFallback) {
  fs::path dir = fs::path(::testing::TempDir()) / ("ckpt_" + std::to_string(getpid()));
  fs::remove_all(dir);
  EXPECT_EQ(checkpoint_to_resume(dir.string()), "");  // missing folder
  fs::create_directories(dir);
  EXPECT_EQ(checkpoint_to_resume(dir.string()), "");  // empty
  auto make = [&](const std::string& name, bool manifest) {
    fs::create_directories(dir / name);
    if (manifest) std::ofstream(dir / name / "manifest.json") << "{}";
  };
  auto latest = [&](const std::string& text) { std::ofstream(dir / "latest") << text; };
  make("step_00000100", true);
  make("step_00000200", true);
  make("step_00000300", false);         // no manifest: incomplete
  make("step_00000400.partial", true);  // being written
  make("other", true);
  // No `latest`: the newest complete step.
  EXPECT_EQ(checkpoint_to_resume(dir.string()), (dir / "step_00000200").string());
  // `latest` names 100 (a rollback: the run resumed 100 and continues from there; 200 is the
  // abandoned line): 100, never the higher 200.
  latest("step_00000100\n");
  EXPECT_EQ(checkpoint_latest(dir.string()), (dir / "step_00000100").string());
  EXPECT_EQ(checkpoint_to_resume(dir.string()), (dir / "step_00000100").string());
  auto c = checkpoint_candidates(dir.string());
  ASSERT_EQ(c.size(), 1u);  // what latest names, then only older ones (none here)
  // `latest` damaged (names nothing complete, garbage, a name far too long): scan.
  for (const char* bad :
       {"step_00000300\n", "step_00000999\n", "../step_00000100\n", "garbage", "step_99999999999999999999999999\n"}) {
    latest(bad);
    EXPECT_EQ(checkpoint_latest(dir.string()), "") << bad;
    EXPECT_EQ(checkpoint_to_resume(dir.string()), (dir / "step_00000200").string()) << bad;
  }
  make("step_100000000", true);  // past 8 digits
  latest("step_100000000\n");
  EXPECT_EQ(checkpoint_to_resume(dir.string()), (dir / "step_100000000").string());
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
