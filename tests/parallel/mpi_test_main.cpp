// main() of the multi-rank test binary, run as `mpirun -np N test_parallel_mpi` (tests/parallel/
// run_mpi.sh). Each rank bootstraps through rank_main, as `llmtrain run` will, and runs every test.
// Rank 0 prints GoogleTest's usual output; the other ranks print only their failures, each line
// with the rank, so a failure on rank 2 is visible and attributed. The job fails when any rank
// fails (each rank's exit status is its own result; mpirun reports the first non-zero one).
#include <gtest/gtest.h>

#include <cstdio>

#include "common/log.h"
#include "parallel/bootstrap.h"
#include "parallel/launch_env.h"
#include "tests/parallel/mpi_test_env.h"

namespace llmtrain::parallel::mpitest {
namespace {

Runtime* g_runtime = nullptr;
std::unique_ptr<Comm> g_world;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

}  // namespace

Runtime& runtime() { return *g_runtime; }
MpiComm& world() { return *static_cast<MpiComm*>(g_world.get()); }

}  // namespace llmtrain::parallel::mpitest

int main(int argc, char** argv) {
  using namespace llmtrain::parallel;
  ::testing::InitGoogleTest(&argc, argv);
  LaunchEnv env = detect_launch_env();
  if (!env.is_rank()) {
    std::fprintf(stderr, "run this under mpirun: tests/parallel/run_mpi.sh N %s\n", argv[0]);
    return 2;
  }
  // A hung collective fails its test within this bound instead of hanging the ctest entry.
  return rank_main(env, {.timeout_s = 30.0, .flight_recorder = false}, [](Runtime& rt) {
    mpitest::g_runtime = &rt;
    mpitest::g_world = rt.take_world();
    if (rt.info().rank != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new mpitest::RankFailurePrinter(rt.info().rank));
    }
    const int status = RUN_ALL_TESTS();
    mpitest::g_world.reset();
    return status;
  });
}
