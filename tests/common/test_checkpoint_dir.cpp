// The checkpoint directory layout (common/checkpoint_dir.h): step directory names, and the
// checkpoint that the launcher restarts from (what `latest` names, else the newest complete).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>

#include "common/checkpoint_dir.h"
#include "common/error.h"
#include "common/host.h"

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

// The checkpoint directory's lock: one job writes a directory; a dead holder's lock is taken over.
class CheckpointLock : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("lock_" + std::to_string(getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_lock(const std::string& host, int64_t pid, const std::string& job, int64_t age_s) {
    fs::create_directories(dir_);
    std::ofstream(dir_ / "lock") << "{\"host\":\"" << host << "\",\"pid\":" << pid << ",\"job\":\"" << job
                                 << "\",\"renewed_unix\":" << (int64_t(::time(nullptr)) - age_s) << ",\"nonce\":\"x\"}";
  }
  std::string refusal(const std::string& job, double grace_s = 0) {
    try {
      CheckpointDirLock::acquire(dir_.string(), job, CheckpointDirLock::kDefaultLease, grace_s);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(CheckpointLock, OneJobAtATime) {
  {
    auto lock = CheckpointDirLock::acquire(dir_.string(), "job-a");
    EXPECT_TRUE(fs::exists(dir_ / "lock"));
    // Another job, while this live process holds it: refused, naming the holder.
    const std::string why = refusal("job-b");
    EXPECT_NE(why.find("is in use by another job"), std::string::npos) << why;
    EXPECT_NE(why.find("pid " + std::to_string(getpid())), std::string::npos) << why;
    EXPECT_NE(why.find("job job-a"), std::string::npos) << why;
    // The same job (a restart, a requeue): taken over.
    auto again = CheckpointDirLock::acquire(dir_.string(), "job-a");
    // The first holder learns it lost the lock when it renews.
    EXPECT_THROW(lock->renew(), Error);
    EXPECT_NO_THROW(again->renew());
  }
  EXPECT_FALSE(fs::exists(dir_ / "lock"));  // released by its holder
  EXPECT_NO_THROW(CheckpointDirLock::acquire(dir_.string(), ""));
}

// A live holder on this host is waited for (a rank still exiting after its launcher returned): a
// child takes the lock, tells us, and releases it a moment later; our acquire waits and takes it.
// One that never lets go is refused after the wait, saying so.
TEST_F(CheckpointLock, ALiveHolderOnThisHostIsWaitedFor) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    auto held = CheckpointDirLock::acquire(dir_.string(), "old");
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(2);
    ::usleep(300 * 1000);
    held.reset();  // released as the rank exits
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);  // the child holds the lock now
  EXPECT_NO_THROW(CheckpointDirLock::acquire(dir_.string(), "new", CheckpointDirLock::kDefaultLease, 600));
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ::close(ready[0]);
  ::close(ready[1]);
  auto lock = CheckpointDirLock::acquire(dir_.string(), "held");
  const std::string why = refusal("other", 0.3);
  EXPECT_NE(why.find("is in use by another job"), std::string::npos) << why;
  EXPECT_NE(why.find("waited"), std::string::npos) << why;
}

TEST_F(CheckpointLock, ADeadHoldersLockIsTakenOver) {
  const std::string me = host_info().hostname;
  // A pid that is gone: a child that has exited and been reaped.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  write_lock(me, child, "old", 0);
  EXPECT_NO_THROW(CheckpointDirLock::acquire(dir_.string(), "new"));
  // Another host, renewed long ago (beyond the lease): taken over; renewed just now: refused.
  write_lock("elsewhere", 1, "old", 3600);
  EXPECT_NO_THROW(CheckpointDirLock::acquire(dir_.string(), "new"));
  write_lock("elsewhere", 1, "old", 0);
  EXPECT_NE(refusal("new").find("host elsewhere"), std::string::npos);
  // A damaged lock file counts as nobody's.
  std::ofstream(dir_ / "lock") << "{garbage";
  EXPECT_NO_THROW(CheckpointDirLock::acquire(dir_.string(), "new"));
}
