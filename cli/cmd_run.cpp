// `llmtrain run`: validate, plan the launch, and (unless --dry-run) train. The dry run prints
// everything the real run would decide: resolved recipe, mesh, model size, batch arithmetic and
// the exact launch command.
//
// How a run starts (launcher/launch_plan.h): when the plan spawns ranks (local mpirun, srun inside
// Slurm, mpirun over ssh), this process runs the pre-flight checks and then supervises the job
// (launcher/supervisor.h) — it never trains itself; each rank is this binary again, started by
// mpirun/srun, and takes the as_rank path. One rank with no launcher trains in this process.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/recipe_emit.h"
#include "cli/recipe_load.h"
#include "cli/recipe_parse.h"
#include "common/error.h"
#include "common/host.h"
#include "common/signals.h"
#include "common/strings.h"
#include "launcher/child_process.h"
#include "launcher/launch_plan.h"
#include "launcher/preflight.h"
#include "launcher/stop_relay.h"
#include "launcher/supervisor.h"
#include "parallel/bootstrap.h"
#include "parallel/launch_env.h"
#include "parallel/mesh.h"
#include "parallel/mesh_comms.h"
#include "trainer/memory.h"
#include "trainer/model/model_spec.h"
#include "trainer/trainer.h"

namespace llmtrain::cli {
namespace {

std::vector<std::string> rank_argv(const RecipeArgs& args) {
  std::vector<std::string> argv{executable_path(), "run",
                                std::filesystem::absolute(args.recipe).lexically_normal().string()};
  for (const auto& o : args.overrides) argv.insert(argv.end(), {"--set", o});
  return argv;
}

// `run RECIPE -- PROGRAM ARGS`: every rank runs PROGRAM (found now, so that every rank, on every
// host, runs the same file).
std::vector<std::string> program_argv(const std::vector<std::string>& command) {
  std::vector<std::string> argv = command;
  std::string found = launcher::find_program(argv[0]);
  if (found.empty())
    throw Error(fmt::format("the rank program {} was not found{}", argv[0],
                            argv[0].find('/') == std::string::npos ? " on PATH" : ""),
                "give its path, or put its folder on PATH");
  argv[0] = std::filesystem::absolute(found).lexically_normal().string();
  return argv;
}

std::string groups_text(const parallel::MeshShape& shape, parallel::GroupKind kind) {
  auto groups = parallel::Mesh::all_groups(shape, kind);
  std::vector<std::string> parts;
  const size_t limit = 16;
  for (size_t i = 0; i < groups.size() && i < limit; ++i) {
    std::vector<std::string> ranks;
    for (int r : groups[i]) ranks.push_back(std::to_string(r));
    parts.push_back("[" + join(ranks, " ") + "]");
  }
  std::string out = join(parts, " ");
  if (groups.size() > limit) out += fmt::format(" ... ({} groups)", groups.size());
  return out;
}

void print_plan(const LoadedRecipe& loaded, const launcher::LaunchPlan& plan) {
  const Recipe& r = loaded.recipe;
  const auto& m = r.model;
  parallel::MeshShape shape{r.parallel.tp, r.parallel.pp, r.parallel.dp};

  std::printf("# resolved recipe\n%s\n", recipe_to_yaml(r).c_str());
  std::printf("# plan\n");
  std::printf("world: %d ranks = %s (from %s)\n", shape.world(), parallel::Mesh::describe(shape).c_str(),
              loaded.world.source.c_str());
  std::printf("mesh order: rank = pp·(dp·tp) + dp·tp + tp (tp fastest)\n");
  for (auto kind :
       {parallel::GroupKind::tp, parallel::GroupKind::pp, parallel::GroupKind::dp, parallel::GroupKind::model_parallel})
    std::printf("  %-15s %s\n", (std::string(parallel::group_kind_name(kind)) + " groups:").c_str(),
                groups_text(shape, kind).c_str());

  int64_t params = trainer::count_parameters(m);
  std::printf("model: %s, %d layers, hidden %d, heads %d (kv %d), ffn %d, vocab %d (padded %d), seq_len %d\n",
              to_string(m.family), m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab, m.padded_vocab(),
              m.seq_len);
  std::printf("parameters: %s (%lld)\n", format_count(double(params)).c_str(), static_cast<long long>(params));
  double flops = trainer::training_flops_per_token(m);
  std::printf("training FLOPs per token: %s (6N + 12·L·d·T, N = %s matmul parameters)\n", format_count(flops).c_str(),
              format_count(double(trainer::count_matmul_parameters(m))).c_str());
  int64_t tokens_per_step = int64_t(r.train.global_batch) * m.seq_len;
  std::printf("batch: global %d sequences = micro_batch %d × dp %d × %d micro-batches per step; %s tokens per step\n",
              r.train.global_batch, r.train.micro_batch, r.parallel.dp, r.grad_accum_steps(),
              format_count(double(tokens_per_step)).c_str());
  std::printf("training: %lld steps, %s tokens, %s FLOPs in all\n", static_cast<long long>(r.train.steps),
              format_count(double(tokens_per_step) * double(r.train.steps)).c_str(),
              format_count(flops * double(tokens_per_step) * double(r.train.steps)).c_str());
  // Memory per rank from the one memory account (each pipeline stage holds different layers; tp
  // and dp ranks of a stage hold the same amounts).
  std::vector<int> stages;
  for (int s = 0; s < r.parallel.pp; ++s)
    if (r.parallel.pp <= 4 || s < 2 || s == r.parallel.pp - 1) stages.push_back(s);
  std::vector<std::string> notes;
  for (int s : stages) {
    const trainer::MemoryAccount mem = trainer::memory_plan(r, {s, 0, 0});
    std::printf("memory per rank%s: %s\n", r.parallel.pp > 1 ? fmt::format(" (stage {})", s).c_str() : "",
                trainer::format_memory(mem).c_str());
    notes = mem.notes;
  }
  for (const auto& note : notes) std::printf("memory note: %s\n", note.c_str());
  std::printf("launch: %s, %d rank(s) per node, %d thread(s) per rank\n", launcher::to_string(plan.mode),
              plan.ranks_per_node, plan.threads_per_rank);
  if (!plan.command.empty()) std::printf("launch command: %s\n", plan.command_line().c_str());
  if (!plan.env.empty()) std::printf("launch environment: %s\n", plan.env_line().c_str());
  for (const auto& note : plan.notes) std::printf("launch note: %s\n", note.c_str());
  if (!plan.blocker.empty())
    std::printf("cannot launch from here: %s (%s)\n", plan.blocker.c_str(), plan.blocker_hint.c_str());
  std::printf("outputs: log %s, checkpoints %s\n", r.log.dir.c_str(), r.checkpoint.dir.c_str());
  auto missing = unsupported_features(r);
  for (const auto& f : missing) std::printf("not supported yet: %s\n", f.c_str());
}

// This process is the whole job (one rank) or one rank of it: bootstrap, build the mesh's groups
// and train.
int run_ranks(const LoadedRecipe& loaded, const launcher::LaunchPlan& plan) {
  const Recipe& r = loaded.recipe;
  return parallel::rank_main(loaded.env, {.timeout_s = r.parallel.timeout_s}, [&](parallel::Runtime& rt) {
    parallel::Mesh mesh({r.parallel.tp, r.parallel.pp, r.parallel.dp}, rt.info().rank);
    parallel::MeshComms comms = parallel::make_mesh_comms(mesh, rt.take_world());
    trainer::TrainContext ctx;
    ctx.recipe = &r;
    ctx.recipe_yaml = recipe_to_yaml(r);
    ctx.mesh = &mesh;
    ctx.comms = &comms;
    ctx.threads = plan.threads_per_rank;
    return trainer::train(ctx);
  });
}

}  // namespace

int cmd_run(const RunArgs& args) {
  // A rank listens for stop requests from its first moment: the supervisor's SIGUSR1
  // (launcher/stop_relay.h) and SIGTERM from it or from Slurm. The trainer's handlers go in before
  // the relay and long before the training loop: a stop that arrives while the rank bootstraps,
  // reads data or loads a checkpoint (minutes for a large model) must still end in a checkpoint and
  // exit 75, not kill the rank (143) — under Slurm that would lose the requeue of a preempted job.
  if (parallel::detect_launch_env().is_rank()) {
    install_stop_handlers();
    launcher::install_stop_relay();
  }
  RecipeArgs recipe_args = args.recipe;
  if (args.nproc > 0) recipe_args.overrides.push_back(fmt::format("launch.procs_per_node={}", args.nproc));
  LoadedRecipe loaded = recipe_load(recipe_args.recipe, recipe_args.overrides);
  parallel::require_usable_launch(loaded.env);
  const bool rank_program = !args.rank_command.empty();
  launcher::LaunchPlan plan =
      launcher::plan_launch(loaded.recipe, launcher::plan_inputs(loaded.env, rank_program),
                            rank_program ? program_argv(args.rank_command) : rank_argv(recipe_args));
  if (args.dry_run) {
    print_plan(loaded, plan);
    return kExitOk;
  }
  if (!plan.blocker.empty()) throw Error(plan.blocker, plan.blocker_hint);
  auto missing = unsupported_features(loaded.recipe);
  auto refuse_unsupported = [&] {
    if (!missing.empty())
      throw Error("not supported yet: " + join(missing, "; "),
                  "`llmtrain validate` accepts this recipe, but this build cannot run it; see docs/recipe.md for what "
                  "runs today");
  };
  if (plan.spawns()) {
    // This process supervises; the ranks train (or run the given program).
    if (!rank_program) refuse_unsupported();
    launcher::preflight_check(loaded.recipe, plan);
    launcher::SupervisorOptions options = launcher::supervisor_options(loaded.recipe);
    options.stop_grace_s = args.stop_grace_s;
    return launcher::supervise(plan, options);
  }
  // This process is the one rank (in_process) or one of the ranks (as_rank): it trains.
  refuse_unsupported();
  // A one-rank run has no supervisor to run the pre-flight checks: without this, an unwritable
  // checkpoint.dir surfaced only at the first checkpoint, after checkpoint.every steps of training.
  // (Ranks started by the supervisor were checked by it before they started.)
  if (plan.mode == launcher::LaunchMode::in_process) {
    launcher::check_writable_dir(loaded.recipe.log.dir, "log.dir");
    launcher::check_writable_dir(loaded.recipe.checkpoint.dir, "checkpoint.dir");
    install_stop_handlers();  // as for ranks above: Ctrl-C while loading stops after a step
  }
  return run_ranks(loaded, plan);
}

}  // namespace llmtrain::cli
