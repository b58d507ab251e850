// Asynchronous saves (checkpoint.async, trainer/checkpoint/async_checkpoint.h): the checkpoint holds
// the step's values however training changes them during the write; a failed background write
// commits nothing on any rank, leaves `latest`, is returned (never thrown, never a crash) and the
// next save goes on; an abandoned save commits nothing. The power-loss and fault-injection tests
// of the protocol run through this writer too (test_checkpoint.cpp, Saves/SaveModes.*/async).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>

#include "common/checkpoint_dir.h"
#include "common/error.h"
#include "common/file_io.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/comm_threads.h"
#include "tests/trainer/checkpoint/checkpoint_fixture.h"
#include "trainer/checkpoint/async_checkpoint.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/model/model.h"
#include "trainer/optim/optimizer.h"

using namespace llmtrain;
using namespace llmtrain::trainer;
namespace fs = std::filesystem;

namespace {

// A model and its optimizer state, filled from `seed`.
struct State : CheckpointFixture {
  using CheckpointFixture::CheckpointFixture;
  std::vector<float> copy(kernels::Tensor t) const {
    std::vector<float> out(size_t(t.numel()));
    std::memcpy(out.data(), t.data, t.bytes());
    return out;
  }
};

bool same(const std::vector<float>& a, kernels::Tensor b) {
  return a.size() * sizeof(float) == b.bytes() && std::memcmp(a.data(), b.data, b.bytes()) == 0;
}

fs::path temp_dir(const std::string& name) { return checkpoint_test_dir("llmtrain_async", name); }

// Holds every background write until the training thread waits for it (as the term-in-save fault
// does), so that what happens between start() and finish() happens while the write is in flight.
void hold_until_waited(AsyncCheckpointWriter& w) {
  w.set_hook([](int64_t, const std::function<bool(double)>& wait_for_waiter) {
    if (!wait_for_waiter(60)) throw Error("the test never waited for the write");
  });
}

TEST(AsyncCheckpoint, TheCheckpointHoldsTheStepsValuesWhileTrainingChangesThem) {
  const fs::path dir = temp_dir("snapshot");
  State a(1), b(2);
  const std::vector<float> params = a.copy(a.model.params()), m = a.copy(a.opt.exp_avg()),
                           v = a.copy(a.opt.exp_avg_sq());
  auto world = parallel::make_local_comm();
  AsyncCheckpointWriter writer(default_file_system(), dir.string(), 3, *world, 60);
  hold_until_waited(writer);
  const AsyncSaveResult started = writer.start(meta_at(10), a.slices());
  ASSERT_TRUE(writer.in_flight()) << started.error;
  EXPECT_EQ(writer.snapshot_bytes(), 3 * a.model.numel() * int64_t(sizeof(float)));
  // Training goes on: every value the save covers changes before the write begins.
  std::memcpy(a.model.params().data, b.model.params().data, a.model.params().bytes());
  std::memcpy(a.opt.exp_avg().data, b.opt.exp_avg().data, a.opt.exp_avg().bytes());
  std::memcpy(a.opt.exp_avg_sq().data, b.opt.exp_avg_sq().data, a.opt.exp_avg_sq().bytes());
  // The writer is held: no step boundary commits it, and nothing is committed yet.
  EXPECT_FALSE(writer.poll().has_value());
  EXPECT_FALSE(fs::exists(dir / "step_00000010"));
  EXPECT_FALSE(fs::exists(dir / "latest"));
  const std::optional<AsyncSaveResult> done = writer.finish();
  ASSERT_TRUE(done.has_value());
  ASSERT_TRUE(done->committed()) << done->error;
  EXPECT_EQ(done->path, (dir / "step_00000010").string());
  EXPECT_EQ(read_file((dir / "latest").string()), "step_00000010\n");
  EXPECT_FALSE(writer.in_flight());
  State c(3);
  const LoadedCheckpoint loaded = checkpoint_load((dir / "step_00000010").string(), c.slices(), *world);
  EXPECT_EQ(loaded.manifest.step, 10);
  EXPECT_TRUE(same(params, c.model.params()));
  EXPECT_TRUE(same(m, c.opt.exp_avg()));
  EXPECT_TRUE(same(v, c.opt.exp_avg_sq()));
  fs::remove_all(dir);
}

// Without a wait, the step boundaries commit the save once the write is done (a poll that finds it
// still writing returns nothing and changes nothing).
TEST(AsyncCheckpoint, AStepBoundaryCommitsAFinishedWrite) {
  const fs::path dir = temp_dir("poll");
  State a(1);
  auto world = parallel::make_local_comm();
  AsyncCheckpointWriter writer(default_file_system(), dir.string(), 3, *world, 60);
  for (int64_t step : {10, 20}) {
    writer.start(meta_at(step), a.slices());
    ASSERT_TRUE(writer.in_flight());
    std::optional<AsyncSaveResult> done;
    // Bounded by the writer's own progress: each poll either commits or finds it still writing.
    while (!done) done = writer.poll();
    ASSERT_TRUE(done->committed()) << done->error;
    EXPECT_EQ(read_file((dir / "latest").string()), checkpoint_step_dir(step) + "\n");
  }
  EXPECT_FALSE(writer.finish().has_value());  // nothing in flight
  fs::remove_all(dir);
}

// A full disk under the background write: the save is reported with its path and the error, not
// thrown; `latest` keeps naming step 10; the failed `.partial` is removed; the next save is tried
// and commits.
TEST(AsyncCheckpoint, AFailedWriteKeepsLatestAndTheNextSaveIsTried) {
  const fs::path dir = temp_dir("failed");
  State a(1), b(2);
  auto world = parallel::make_local_comm();
  checkpoint_save(default_file_system(), dir.string(), meta_at(10), a.slices(), *world, 3);
  // Operations 1-3 prepare the directory on the training thread; the 4th is the shard's creation,
  // the first the background writer does.
  FaultyFileSystem faulty(default_file_system());
  faulty.fail_at(4, ENOSPC);
  AsyncCheckpointWriter writer(faulty, dir.string(), 3, *world, 60);
  writer.start(meta_at(20), b.slices());
  ASSERT_TRUE(writer.in_flight());
  const AsyncSaveResult failed = *writer.finish();
  EXPECT_FALSE(failed.committed());
  EXPECT_NE(failed.error.find("step_00000020.partial"), std::string::npos) << failed.error;
  EXPECT_NE(failed.error.find("No space left"), std::string::npos) << failed.error;
  EXPECT_EQ(read_file((dir / "latest").string()), "step_00000010\n");
  EXPECT_FALSE(fs::exists(dir / "step_00000020"));
  EXPECT_FALSE(fs::exists(dir / "step_00000020.partial"));
  writer.start(meta_at(30), b.slices());
  const AsyncSaveResult next = *writer.finish();
  ASSERT_TRUE(next.committed()) << next.error;
  EXPECT_EQ(read_file((dir / "latest").string()), "step_00000030\n");
  State c(3);
  checkpoint_load((dir / "step_00000030").string(), c.slices(), *world);
  EXPECT_TRUE(same(b.copy(b.model.params()), c.model.params()));
  fs::remove_all(dir);
}

// Whatever the writer thread meets — here an exception that is not an llmtrain::Error — ends as a
// failed save with its text, never std::terminate.
TEST(AsyncCheckpoint, AnyExceptionOnTheWriterIsAFailedSaveNotACrash) {
  const fs::path dir = temp_dir("exception");
  State a(1);
  auto world = parallel::make_local_comm();
  AsyncCheckpointWriter writer(default_file_system(), dir.string(), 3, *world, 60);
  writer.set_hook([](int64_t, const std::function<bool(double)>&) { throw std::runtime_error("disk on fire"); });
  writer.start(meta_at(10), a.slices());
  const AsyncSaveResult r = *writer.finish();
  EXPECT_FALSE(r.committed());
  EXPECT_NE(r.error.find("disk on fire"), std::string::npos) << r.error;
  EXPECT_FALSE(fs::exists(dir / "latest"));
  fs::remove_all(dir);
}

// An error path (the writer destroyed with a save in flight, as when the step throws): the write is
// waited for, and nothing is committed — a commit needs every rank's agreement.
TEST(AsyncCheckpoint, AnAbandonedSaveCommitsNothing) {
  const fs::path dir = temp_dir("abandoned");
  State a(1);
  auto world = parallel::make_local_comm();
  checkpoint_save(default_file_system(), dir.string(), meta_at(10), a.slices(), *world, 3);
  {
    AsyncCheckpointWriter writer(default_file_system(), dir.string(), 3, *world, 60);
    writer.start(meta_at(20), a.slices());
    ASSERT_TRUE(writer.in_flight());
  }
  EXPECT_FALSE(fs::exists(dir / "step_00000020"));
  EXPECT_EQ(read_file((dir / "latest").string()), "step_00000010\n");
  EXPECT_EQ(checkpoint_candidates(dir.string()).size(), 1u);
  fs::remove_all(dir);
}

// Two ranks (threads on the in-process communicator), each with its writer: rank 0 writes the
// parameters, rank 1 the moments. When rank 1's background write fails, neither commits: both
// report the failure (rank 0's names rank 1), `latest` stays at step 10, which still loads whole.
// A save that both write commits on both.
TEST(AsyncCheckpoint, AFailedWriteOnOneRankCommitsOnNone) {
  const fs::path dir = temp_dir("two_ranks");
  State a0(1), a1(1), b0(2), b1(2);
  std::vector<AsyncSaveResult> results(2);
  auto save_step = [&](int64_t step, bool fail_rank1, State& s0, State& s1) {
    parallel::run_ranks_in_threads(2, [&](parallel::Comm& world) {
      const int rank = world.rank();
      FaultyFileSystem fsys(default_file_system());
      if (rank == 1 && fail_rank1) fsys.fail_at(1, EIO);  // rank 1's first operation: its shard
      AsyncCheckpointWriter writer(fsys, dir.string(), 3, world, 60);
      State& s = rank == 0 ? s0 : s1;
      writer.start(meta_at(step), s.slices_of(/*params=*/rank == 0, /*moments=*/rank == 1));
      if (!writer.in_flight()) throw Error("not started");
      results[rank] = *writer.finish();
    });
  };
  save_step(10, false, a0, a1);
  ASSERT_TRUE(results[0].committed()) << results[0].error;
  ASSERT_TRUE(results[1].committed()) << results[1].error;
  save_step(20, true, b0, b1);
  EXPECT_FALSE(results[0].committed());
  EXPECT_FALSE(results[1].committed());
  EXPECT_NE(results[0].error.find("rank 1"), std::string::npos) << results[0].error;
  EXPECT_EQ(read_file((dir / "latest").string()), "step_00000010\n");
  EXPECT_FALSE(fs::exists(dir / "step_00000020"));
  State c(3);
  auto world = parallel::make_local_comm();
  checkpoint_load((dir / "step_00000010").string(), c.slices(), *world);
  EXPECT_TRUE(same(a0.copy(a0.model.params()), c.model.params()));
  EXPECT_TRUE(same(a1.copy(a1.opt.exp_avg_sq()), c.opt.exp_avg_sq()));
  fs::remove_all(dir);
}

}  // namespace
