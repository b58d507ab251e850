// Several ranks of one job as threads of ONE process, for a machine without mpirun (a lent GPU,
// scripts/gpu_check.sh part 4): each thread is a rank that trains exactly as `llmtrain run` would
// in its own process — the recipe resolved for the whole world, the rank's device chosen by its
// local rank (several ranks share a GPU when there are fewer GPUs than ranks), a compute stream of
// its own, the mesh's groups split from an in-process world (parallel/comm/comm_threads.h: the tests'
// communicator), device tensors moved by the communicator parallel.device_comm chooses for ranks
// that are threads (NCCL where it can serve them, else the staged one over the in-process world) —
// and trainer::train. A check tool, not a user command.
//
//   ranks_in_process RECIPE --ranks N [--set KEY=VALUE]...
//
// Prints, per rank, the device it held and the communicator its device tensors used, then exits
// with the ranks' status (0: every rank trained to the end). The run's outputs (metrics.jsonl,
// checkpoints) are those of the same run under mpirun, in the recipe's log.dir.
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "cli/recipe_emit.h"
#include "cli/recipe_load.h"
#include "common/error.h"
#include "common/recipe/layout.h"
#include "kernels/device_select.h"
#include "kernels/device_stream.h"
#include "parallel/comm/comm_threads.h"
#include "parallel/comm/device_comm.h"
#include "parallel/mesh.h"
#include "parallel/mesh_comms.h"
#include "trainer/loop/trainer.h"
#include "trainer/placement/placement.h"

using namespace llmtrain;

namespace {

int usage(const char* why) {
  std::fprintf(stderr, "ranks_in_process: %s\nusage: ranks_in_process RECIPE --ranks N [--set KEY=VALUE]...\n", why);
  return kExitUserError;
}

int run(const std::string& file, int ranks, std::vector<std::string> sets) {
  // The world is `ranks` ranks on this host, as `launch.procs_per_node` says for `llmtrain run`.
  sets.push_back("launch.nodes=1");
  sets.push_back(fmt::format("launch.procs_per_node={}", ranks));
  const cli::LoadedRecipe loaded = cli::recipe_load(file, sets);
  const Recipe& r = loaded.recipe;
  const Layout layout = layout_of(r);
  const kernels::Device device = r.train.device == DeviceKind::cuda ? kernels::Device::cuda : kernels::Device::cpu;
  const std::string yaml = cli::recipe_to_yaml(r);
  std::mutex report_mutex;
  std::vector<std::string> report(static_cast<size_t>(ranks));
  std::vector<int> status(static_cast<size_t>(ranks), kExitFailure);
  parallel::run_ranks_in_threads(
      ranks,
      [&](parallel::Comm& world) {
        const int rank = world.rank();
        std::optional<kernels::HeldDevice> held;
        if (device == kernels::Device::cuda) held = kernels::device_select(rank, ranks, /*share_devices=*/true);
        kernels::ThreadComputeStream own(device);
        parallel::DeviceCommChoice choice;
        if (held)
          choice = parallel::agree_device_comm(parallel::requested_device_comm(r.parallel.device_comm), held->shared,
                                               /*across_processes=*/false, world);
        parallel::Mesh mesh({layout.tp, layout.pp, layout.dp, layout.cp, layout.ep}, rank);
        parallel::MeshComms comms = parallel::make_mesh_comms(mesh, world.split(0, rank, "world"), device, choice.comm);
        comms.set_timeout(r.parallel.timeout_s);
        const trainer::Placement placement = trainer::place(r, layout, mesh.coord());
        trainer::TrainContext ctx;
        ctx.recipe = &r;
        ctx.placement = &placement;
        ctx.recipe_yaml = yaml;
        ctx.mesh = &mesh;
        ctx.comms = &comms;
        ctx.threads = 1;
        if (held) {
          ctx.device = held->ordinal;
          ctx.device_text = held->describe();
          ctx.device_comm_text = fmt::format("{} ({})", parallel::to_string(choice.comm), choice.why);
        }
        const int s = trainer::train(ctx);
        std::lock_guard lock(report_mutex);
        status[size_t(rank)] = s;
        report[size_t(rank)] =
            held ? fmt::format("rank {}: {}; device communication: {}", rank, ctx.device_text, ctx.device_comm_text)
                 : fmt::format("rank {}: cpu", rank);
      },
      r.parallel.timeout_s);
  int worst = kExitOk;
  for (int i = 0; i < ranks; ++i) {
    std::printf("%s, exit status %d\n", report[size_t(i)].c_str(), status[size_t(i)]);
    if (status[size_t(i)] != kExitOk) worst = status[size_t(i)];
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file;
  int ranks = 0;
  std::vector<std::string> sets;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ranks" && i + 1 < argc) {
      char* end = nullptr;
      const long n = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || n < 1 || n > 64) return usage("--ranks takes a whole number from 1 to 64");
      ranks = int(n);
    } else if (a == "--set" && i + 1 < argc) {
      sets.emplace_back(argv[++i]);
    } else if (!a.empty() && a[0] != '-' && file.empty()) {
      file = a;
    } else {
      return usage(("unexpected argument " + a).c_str());
    }
  }
  if (file.empty() || ranks == 0) return usage("a recipe and --ranks are needed");
  try {
    return run(file, ranks, sets);
  } catch (const Error& e) {
    std::fprintf(stderr, "ranks_in_process: %s\n", format_error(e).c_str());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ranks_in_process: %s\n", e.what());
    return kExitFailure;
  }
}
