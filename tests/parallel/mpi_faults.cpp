// A rank program that fails on purpose, for tests/parallel/mpi_faults.sh: under mpirun every rank
// runs a few all-reduces (or pipeline send/recv) and rank 1 fails at step 3 in the way MODE says,
// while the others are inside the operation. The script checks that the whole job ends promptly
// with the failing rank and the cause in its output.
//
//   mpi_faults MODE     MODE: ok | info | throw | exit | segv | terminate | hang | hang-recv | size-mismatch
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "parallel/bootstrap.h"
#include "parallel/mesh_comms.h"

using namespace llmtrain;
using namespace llmtrain::parallel;

namespace {

void inject(const std::string& mode) {
  if (mode == "throw") throw Error("injected failure on rank 1 at step 3", "this is the fault-injection test");
  if (mode == "exit") std::exit(3);
  if (mode == "segv") {
    volatile int* p = nullptr;
    *p = 1;
  }
  if (mode == "terminate") std::thread([] { throw std::runtime_error("injected exception in a thread"); }).join();
  if (mode == "hang" || mode == "hang-recv") sleep(120);  // stops responding, does not die
}

int body(const std::string& mode, Runtime& rt) {
  const RankInfo& info = rt.info();
  if (mode == "info") {
    int initialized = 0;
    MPI_Initialized(&initialized);
    std::printf("%s\nmpi_initialized=%d RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s\n",
                info.describe().c_str(), initialized, std::getenv("RANK"), std::getenv("WORLD_SIZE"),
                std::getenv("LOCAL_RANK"), std::getenv("LOCAL_WORLD_SIZE"));
    return 0;
  }
  const bool pipeline = mode == "hang-recv";
  MeshShape shape{1, pipeline ? info.world_size : 1, pipeline ? 1 : info.world_size};
  MeshComms comms = make_mesh_comms(Mesh(shape, info.rank), rt.take_world());
  std::vector<float> buf(1000, 1.0f);
  for (int step = 0; step < 5; ++step) {
    if (info.rank == 1 && step == 3) inject(mode);
    if (pipeline) {
      Comm& pp = *comms.pp;
      if (pp.rank() == 0) pp.recv(kernels::host_tensor(buf.data(), {1000}), 1, step);
      if (pp.rank() == 1) pp.send(kernels::host_tensor(buf.data(), {1000}), 0, step);
    } else {
      comms.dp->all_reduce(kernels::host_tensor(buf.data(), {1000}), ReduceOp::sum);
    }
  }
  if (info.rank == 0) std::printf("completed 5 steps on %d ranks\n", info.world_size);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s ok|info|throw|exit|segv|terminate|hang|hang-recv|size-mismatch\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  LaunchEnv env = detect_launch_env();
  if (mode == "size-mismatch") env.world_size += 1;
  BootstrapOptions options;
  options.timeout_s = mode.starts_with("hang") ? 2.0 : 30.0;
  try {
    return rank_main(env, options, [&](Runtime& rt) { return body(mode, rt); });
  } catch (const Error& e) {  // only without a launcher: what cli's main does
    std::fprintf(stderr, "%s\n", format_error(e).c_str());
    return e.exit_code();
  }
}
