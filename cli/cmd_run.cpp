// `llmtrain run`: validate, plan the launch, and (unless --dry-run) train. The dry run prints
// everything the real run would decide: resolved recipe, mesh, model size, batch arithmetic, the
// exact launch command and the input files (and which are missing).
//
// How a run starts (launcher/launch_plan.h): when the plan spawns ranks (local mpirun, srun inside
// Slurm, mpirun over ssh), this process runs the pre-flight checks and then supervises the job
// (launcher/supervisor.h) — it never trains itself; each rank is this binary again, started by
// mpirun/srun, and takes the as_rank path. One rank with no launcher trains in this process.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/recipe_emit.h"
#include "cli/recipe_inputs.h"
#include "cli/recipe_load.h"
#include "cli/recipe_parse.h"
#include "cli/recipe_schema.h"
#include "common/error.h"
#include "common/host.h"
#include "common/signals.h"
#include "common/strings.h"
#include "kernels/device_select.h"
#include "launcher/child_process.h"
#include "launcher/launch_plan.h"
#include "launcher/preflight.h"
#include "launcher/stop_relay.h"
#include "launcher/supervisor.h"
#include "parallel/bootstrap.h"
#include "parallel/comm/device_comm.h"
#include "parallel/launch_env.h"
#include "parallel/mesh.h"
#include "parallel/mesh_comms.h"
#include "parallel/pipeline_schedule.h"
#include "planner/layout_search.h"
#include "trainer/checkpoint/checkpointer.h"
#include "trainer/loop/trainer.h"
#include "trainer/model/model.h"
#include "trainer/model/model_spec.h"
#include "trainer/placement/memory.h"
#include "trainer/placement/placement.h"

namespace llmtrain::cli {
namespace {

std::vector<std::string> rank_argv(const RecipeArgs& args, const std::vector<std::string>& allow_changes) {
  std::vector<std::string> argv{executable_path(), "run",
                                std::filesystem::absolute(args.recipe).lexically_normal().string()};
  for (const auto& o : args.overrides) argv.insert(argv.end(), {"--set", o});
  for (const auto& a : allow_changes) argv.insert(argv.end(), {"--allow-change", a});
  return argv;
}

// --allow-change's values: `all`, a recipe key or a section.
void check_allow_changes(const std::vector<std::string>& allowed) {
  const std::vector<std::string> keys = recipe_schema_keys();
  for (const std::string& a : allowed) {
    if (a == "all" || std::any_of(keys.begin(), keys.end(), [&](const std::string& k) {
          return k == a || (k.starts_with(a) && k[a.size()] == '.');
        }))
      continue;
    const std::optional<std::string> near = closest_match(a, keys);
    throw Error(fmt::format("--allow-change {}: not a recipe key or section", printable(a)),
                near ? fmt::format("did you mean {}?", *near)
                     : std::string("give a key such as train.steps, a section such as optimizer, or all"));
  }
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

// pp > 1: the schedule of one step as a text timeline per stage (forward and backward one unit
// each), the micro-batches whose activations each stage keeps, and the bubble.
void print_pipeline(const Recipe& r, const Layout& layout) {
  const int m = r.grad_accum_steps(), p = layout.pp, v = layout.virtual_stages;
  std::vector<std::vector<parallel::PipeOp>> lists;
  try {
    lists = parallel::make_schedules(layout.schedule, {p, 0, m, v});
  } catch (const Error&) {
    return;  // a schedule not supported yet: the last lines say so
  }
  std::vector<std::string> kept, blocks;
  for (int s = 0; s < p; ++s) {
    kept.push_back(fmt::format("{}", parallel::max_in_flight(lists[size_t(s)])));
    const trainer::StageLayout st = trainer::pipeline_stage_layout(r.model, layout, s);
    blocks.push_back(v > 1 ? fmt::format("{}×{}", v, st.chunk_blocks()) : fmt::format("{}", st.blocks()));
  }
  std::printf(
      "pipeline: %s, %d stages holding %s blocks, %d micro-batches per step; micro-batches%s whose activations each "
      "stage keeps: %s\n",
      to_string(layout.schedule), p, join(blocks, ", ").c_str(), m, v > 1 ? " (× chunks)" : "",
      join(kept, ", ").c_str());
  const parallel::Timeline timeline = parallel::schedule_timeline(lists, m, v);
  if (timeline.slots() <= 64) {
    std::printf("pipeline timeline (one column per unit of forward or backward work, . idle):\n%s",
                parallel::format_timeline(timeline).c_str());
  }
  if (layout.schedule == PipelineSchedule::zero_bubble)
    std::printf(
        "pipeline bubble: %.1f%% of the step's stage-time idle = (p − 1)/(3m + p − 1) with p %d, m %d, forward, "
        "input-gradient and weight-gradient work one unit each (ZB-H1: (p − 1)(F + I − W) idle per stage; 1F1B's "
        "3(p − 1) would be %.1f%%)\n",
        100.0 * timeline.bubble_fraction(), p, m, 100.0 * 3 * (p - 1) / (3 * m + 3 * (p - 1)));
  else if (v > 1)
    std::printf(
        "pipeline bubble: %.1f%% of the step's stage-time idle; (p − 1)/(v·m + p − 1) = %.1f%% with p %d, v %d, m %d "
        "((p − 1)/(v·m) = %.1f%% of the ideal time)\n",
        100.0 * timeline.bubble_fraction(), 100.0 * (p - 1) / (v * m + p - 1), p, v, m, 100.0 * (p - 1) / (v * m));
  else
    std::printf(
        "pipeline bubble: %.1f%% of the step's stage-time idle = (p − 1)/(m + p − 1) with p %d, m %d "
        "((p − 1)/m = %.1f%% of the ideal time)\n",
        100.0 * timeline.bubble_fraction(), p, m, 100.0 * (p - 1) / m);
}

// The planner's memory per rank (the largest stage's account plus what the device reserves) against
// the device: this host for train.device cpu (its ranks share it), --gpu NAME for cuda. Returns
// the warning when it does not fit ("" when it does or cannot be known), with what would fit.
std::string memory_check(const Recipe& r, int ranks_per_node, const std::string& gpu, std::string* line) {
  if (r.train.device == DeviceKind::cuda && gpu.empty()) {
    const planner::RankMemory m =
        planner::predict_memory(r, {planner::device_memory("a100-80g"), r.world_size(), ranks_per_node});
    *line = fmt::format(
        "predicted memory per rank: {} (stage {}) in our buffers, plus the CUDA context and library workspaces; "
        "cannot check it against the device without --gpu NAME ({})",
        format_bytes(double(m.account.total())), m.stage, join(planner::device_names(), ", "));
    return "";
  }
  const std::string name = r.train.device == DeviceKind::cpu ? "cpu" : gpu;
  const planner::Cluster cluster{planner::device_memory(name), r.world_size(), ranks_per_node};
  const planner::RankMemory m = planner::predict_memory(r, cluster);
  const bool host = cluster.device.shares_host;
  *line = fmt::format(
      "predicted memory per rank: {} (stage {}{}) of {} {}", format_bytes(double(m.bytes)), m.stage,
      cluster.device.reserved > 0
          ? fmt::format("; + {} reserved by CUDA and its libraries", format_bytes(double(cluster.device.reserved)))
          : "",
      format_bytes(double(m.capacity)),
      host ? fmt::format("(this host's memory / {} ranks on it)", std::max(1, std::min(r.world_size(), ranks_per_node)))
           : fmt::format("per GPU ({})", cluster.device.model));
  if (m.fits()) return "";
  std::vector<std::string> fixes;
  for (const planner::Change& c : planner::fitting_changes(r, cluster))
    fixes.push_back(fmt::format("{} ({})", c.what, format_bytes(double(c.memory.bytes))));
  return fmt::format("predicted {} per {} > {}: {}", format_bytes(double(m.bytes)), host ? "rank" : "GPU",
                     format_bytes(double(m.capacity)),
                     fixes.empty()
                         ? "no single change of zero, tp, pp, recompute or micro_batch fits; see `llmtrain plan`"
                         : join(fixes, " or ") + " would fit");
}

// parallel.offload nvme: the state files of this host's ranks (the largest stage's, times the ranks
// on a node) against the free space of offload_path's file system (its nearest existing
// directory), before any rank starts. Each rank reserves its file's space when it starts, too: on
// the other nodes, that is the check.
void check_offload_space(const Recipe& r, int ranks_per_node) {
  if (r.parallel.offload != OffloadKind::nvme) return;
  const Layout layout = layout_of(r);
  int64_t per_rank = 0;
  for (int s = 0; s < layout.pp; ++s)
    per_rank = std::max(per_rank, trainer::memory_plan(r, layout, {s, 0, 0}).offload_disk);
  const int64_t need = per_rank * std::max(1, std::min(r.world_size(), ranks_per_node));
  std::filesystem::path dir = r.parallel.offload_path;
  std::error_code ec;
  while (!std::filesystem::exists(dir, ec) && dir.has_parent_path() && dir != dir.parent_path())
    dir = dir.parent_path();
  const std::filesystem::space_info space = std::filesystem::space(dir, ec);
  if (ec) return;  // unknown: the ranks' reservations will tell
  if (int64_t(space.available) < need)
    throw Error(
        fmt::format("parallel.offload_path {}: the optimizer state of this host's ranks needs {} ({} per rank), "
                    "its file system has {} free",
                    printable(r.parallel.offload_path), format_bytes(double(need)), format_bytes(double(per_rank)),
                    format_bytes(double(space.available))),
        "point offload_path at a larger local disk, free space there, or shard the state over more ranks "
        "(parallel.zero, more dp)");
}

// parallel.device_comm as the parallel layer takes it: nullopt for auto.
std::optional<parallel::DeviceComm> requested_device_comm(const Recipe& r) {
  return parallel::requested_device_comm(r.parallel.device_comm);
}

// Prints what the run would do; false when it finds that `llmtrain run` would stop: an input is
// missing, a resume would be refused (a recipe change it does not accept), or the recipe asks for
// what this build does not support yet.
bool print_plan(const LoadedRecipe& loaded, const launcher::LaunchPlan& plan, const std::string& gpu,
                const std::string& rates, const std::vector<std::string>& allowed) {
  const Recipe& r = loaded.recipe;
  const auto& m = r.model;
  const Layout layout = layout_of(r);
  parallel::MeshShape shape{layout.tp, layout.pp, layout.dp, layout.cp, layout.ep};

  std::printf("# resolved recipe\n%s\n", recipe_to_yaml(r).c_str());
  std::printf("# plan\n");
  std::printf("world: %d ranks = %s (from %s)\n", shape.world(), parallel::Mesh::describe(shape).c_str(),
              loaded.world.source.c_str());
  if (layout.cp > 1)
    std::printf("mesh order: rank = pp·(dp·cp·tp) + dp·(cp·tp) + cp·tp + tp (tp fastest, then cp)\n");
  else
    std::printf("mesh order: rank = pp·(dp·tp) + dp·tp + tp (tp fastest)\n");
  std::vector<parallel::GroupKind> kinds{parallel::GroupKind::tp, parallel::GroupKind::pp, parallel::GroupKind::dp,
                                         parallel::GroupKind::model_parallel};
  if (layout.cp > 1) kinds.insert(kinds.end(), {parallel::GroupKind::cp, parallel::GroupKind::dp_cp});
  if (layout.ep > 1) kinds.insert(kinds.end(), {parallel::GroupKind::ep, parallel::GroupKind::edp});
  for (auto kind : kinds)
    std::printf("  %-15s %s\n", (std::string(parallel::group_kind_name(kind)) + " groups:").c_str(),
                groups_text(shape, kind).c_str());
  if (layout.cp > 1)
    std::printf(
        "context parallel: cp %d, %s; each sequence of %d tokens in %d chunks of %d, %lld tokens per rank "
        "(rank i of a cp group holds chunks i and %d − i)\n",
        layout.cp, to_string(layout.cp_comm), m.seq_len, 2 * layout.cp, m.seq_len / (2 * layout.cp),
        static_cast<long long>(layout.local_seq(m.seq_len)), 2 * layout.cp - 1);
  if (layout.ep > 1)
    std::printf(
        "expert parallel: ep %d, experts %d per rank (each rank of an ep group computes its experts for the group's "
        "tokens, exchanged by all-to-all; %s)\n",
        layout.ep, m.moe.experts / layout.ep,
        layout.experts_sharded() ? "it holds only those, their gradients reduced over the edp group"
                                 : "ZeRO's shards over dp × cp hold every expert");
  if (layout.optimizer_sharded()) std::printf("zero: %s\n", layout.describe_zero().c_str());
  if (r.train.device == DeviceKind::cuda && shape.world() > 1) {
    try {
      const parallel::DeviceCommChoice c = parallel::choose_device_comm(requested_device_comm(r), false);
      std::printf("device communication: %s (%s)%s\n", parallel::to_string(c.comm), c.why.c_str(),
                  r.launch.share_devices && c.comm == parallel::DeviceComm::nccl
                      ? "; ranks that share a GPU take it only with NCCL 2.30 or later and "
                        "NCCL_MULTI_RANK_GPU_ENABLE=1 (else auto stages)"
                      : "");
    } catch (const Error& e) {
      std::printf("device communication: %s\n", e.what());
    }
  }

  int64_t params = trainer::count_parameters(m);
  std::printf("model: %s, %d layers, hidden %d, heads %d (kv %d), ffn %d, vocab %d (padded %d), seq_len %d\n",
              to_string(m.family), m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab, m.padded_vocab(),
              m.seq_len);
  std::printf("parameters: %s (%lld)\n", format_count(double(params)).c_str(), static_cast<long long>(params));
  if (m.moe.enabled()) {
    const int64_t active = trainer::count_active_parameters(m);
    int moe_layers = 0;
    for (int i = 0; i < m.layers; ++i) moe_layers += m.moe.layer(i) ? 1 : 0;
    std::printf(
        "moe: %d of %d layers, %d experts (ffn %d), top %d%s%s; active parameters per token %s (%lld)\n", moe_layers,
        m.layers, m.moe.experts, m.moe.ffn_hidden, m.moe.top_k,
        m.moe.capacity_factor > 0 ? fmt::format(", capacity factor {}", m.moe.capacity_factor).c_str() : ", dropless",
        m.moe.shared_ffn_hidden > 0 ? fmt::format(", a gated shared expert (ffn {})", m.moe.shared_ffn_hidden).c_str()
                                    : "",
        format_count(double(active)).c_str(), static_cast<long long>(active));
  }
  double flops = trainer::training_flops_per_token(m);
  std::printf("training FLOPs per token: %s (6N + 12·L·d·T, N = %s matmul parameters)\n", format_count(flops).c_str(),
              format_count(double(trainer::count_matmul_parameters(m))).c_str());
  int64_t tokens_per_step = int64_t(r.train.global_batch) * m.seq_len;
  std::printf("batch: global %d sequences = micro_batch %d × dp %d × %d micro-batches per step; %s tokens per step\n",
              r.train.global_batch, r.train.micro_batch, layout.dp, r.grad_accum_steps(),
              format_count(double(tokens_per_step)).c_str());
  std::printf("training: %lld steps, %s tokens, %s FLOPs in all\n", static_cast<long long>(r.train.steps),
              format_count(double(tokens_per_step) * double(r.train.steps)).c_str(),
              format_count(flops * double(tokens_per_step) * double(r.train.steps)).c_str());
  // Memory per rank from the one memory account (each pipeline stage holds different layers; tp
  // and dp ranks of a stage hold the same amounts).
  std::vector<int> stages;
  for (int s = 0; s < layout.pp; ++s)
    if (layout.pp <= 4 || s < 2 || s == layout.pp - 1) stages.push_back(s);
  std::vector<std::string> notes;
  for (int s : stages) {
    const trainer::MemoryAccount mem = trainer::memory_plan(r, layout, {s, 0, 0});
    std::printf("memory per rank%s: %s\n", layout.pp > 1 ? fmt::format(" (stage {})", s).c_str() : "",
                trainer::format_memory(mem).c_str());
    if (mem.head_logits > 0)
      std::printf(
          "head activations per rank: logits [%lld tokens, %lld vocabulary columns] = %s (1/tp of the vocabulary)\n",
          static_cast<long long>(int64_t(r.train.micro_batch) * m.seq_len),
          static_cast<long long>(m.padded_vocab() / layout.tp), format_bytes(double(mem.head_logits)).c_str());
    notes = mem.notes;
  }
  {
    // The same account for each recomputation mode, the rest of the recipe unchanged.
    std::string modes;
    for (ActivationCheckpointing mode :
         {ActivationCheckpointing::none, ActivationCheckpointing::selective, ActivationCheckpointing::full}) {
      Recipe other = r;
      other.train.activation_checkpointing = mode;
      // A mode this build cannot run with the rest of the recipe (MoE blocks recompute nothing yet).
      const std::string bytes =
          unsupported_features(other).size() > unsupported_features(r).size()
              ? std::string("not supported yet")
              : format_bytes(double(trainer::memory_plan(other, layout_of(other), {0, 0, 0}).activations));
      modes += fmt::format("{}{} {}{}", modes.empty() ? "" : ", ", to_string(mode), bytes,
                           mode == r.train.activation_checkpointing ? " (this recipe)" : "");
    }
    std::printf("activations per rank%s by train.activation_checkpointing: %s\n", layout.pp > 1 ? " (stage 0)" : "",
                modes.c_str());
  }
  for (const auto& note : notes) std::printf("memory note: %s\n", note.c_str());
  {
    std::string line;
    const std::string warning = memory_check(r, std::max(1, plan.ranks_per_node), gpu, &line);
    std::printf("%s\n", line.c_str());
    if (!warning.empty()) std::printf("warning: %s\n", warning.c_str());
    const std::string device = r.train.device == DeviceKind::cpu ? "cpu" : gpu;
    if (!device.empty()) {
      // The performance model on this layout (llmtrain plan ranks the others); nodes of
      // launch.procs_per_node ranks, 400 Gb/s per rank between them.
      planner::DeviceSpec spec = planner::device_lookup(device, &r);
      if (!rates.empty()) planner::apply_measured_rates(spec, rates);
      const planner::Cluster cluster{spec, r.world_size(), std::max(1, plan.ranks_per_node), 50e9};
      const planner::StepPrediction t = planner::predict_step(r, cluster);
      std::printf(
          "predicted step time: %.4g s on %s = compute %.4g + pipeline bubble %.4g + tensor-parallel %.4g + pipeline "
          "transfers %.4g + data-parallel %.4g + optimizer %.4g; limit: %s (docs/plan.md)\n",
          t.total, cluster.device.model.c_str(), t.compute, t.bubble, t.tp_comm, t.pp_comm, t.dp_comm, t.optimizer,
          t.limit.c_str());
      const int ranks = r.world_size();
      std::printf("predicted: MFU %.1f%% of %d × %.4g TFLOP/s (rated), %.0f tokens/s per %s; %lld steps in %s\n",
                  100 * t.mfu(ranks, spec.rated_peak(r.train.precision)), ranks,
                  spec.rated_peak(r.train.precision) / 1e12, t.tokens_per_s_per_gpu(ranks),
                  spec.shares_host ? "rank" : "GPU", static_cast<long long>(r.train.steps),
                  format_span(double(r.train.steps) * t.total).c_str());
      if (!rates.empty())
        std::printf("rates: products at %s; attention at %s\n", spec.rate_source.c_str(),
                    planner::attention_rates(r, cluster).source.c_str());
    }
  }
  if (layout.pp > 1) print_pipeline(r, layout);
  std::printf("launch: %s, %d rank(s) per node, %d thread(s) per rank\n", launcher::to_string(plan.mode),
              plan.ranks_per_node, plan.threads_per_rank);
  if (!plan.command.empty()) std::printf("launch command: %s\n", plan.command_line().c_str());
  if (!plan.env.empty()) std::printf("launch environment: %s\n", plan.env_line().c_str());
  for (const auto& note : plan.notes) std::printf("launch note: %s\n", note.c_str());
  if (!plan.blocker.empty())
    std::printf("cannot launch from here: %s (%s)\n", plan.blocker.c_str(), plan.blocker_hint.c_str());
  std::printf("outputs: log %s, checkpoints %s\n", r.log.dir.c_str(), r.checkpoint.dir.c_str());
  std::printf("inputs:\n");
  int missing_inputs = 0;
  for (const RecipeInput& in : recipe_inputs(loaded)) {
    std::printf("  %s\n", describe_input(in).c_str());
    missing_inputs += in.missing.empty() ? 0 : 1;
  }
  bool resumable = true;
  try {
    trainer::check_resume_changes(trainer::checkpoint_to_continue(r.checkpoint), recipe_to_yaml(r), allowed);
  } catch (const Error& e) {
    std::printf("cannot run: %s (%s)\n", printable(e.what()).c_str(), printable(e.hint()).c_str());
    resumable = false;
  }
  if (missing_inputs > 0)
    std::printf("cannot run: %d input%s missing (MISSING above); `llmtrain run` would stop before starting any rank\n",
                missing_inputs, missing_inputs == 1 ? " is" : "s are");
  const std::vector<NotSupported> unsupported = unsupported_features(r);
  for (const NotSupported& f : unsupported) std::printf("not supported yet: %s\n", f.text.c_str());
  return missing_inputs == 0 && unsupported.empty() && resumable;
}

// This process is the whole job (one rank) or one rank of it: bootstrap, build the mesh's groups
// and train.
int run_ranks(const LoadedRecipe& loaded, const launcher::LaunchPlan& plan, const std::vector<std::string>& allowed) {
  const Recipe& r = loaded.recipe;
  return parallel::rank_main(loaded.env, {.timeout_s = r.parallel.timeout_s}, [&](parallel::Runtime& rt) {
    // The rank's device, from its local rank among the ranks of its node (bootstrap's count, not
    // the launching host's), before anything allocates on it or a device communicator is made.
    std::optional<kernels::HeldDevice> device;
    if (r.train.device == DeviceKind::cuda)
      device = kernels::device_select(rt.info().local_rank, rt.info().local_size, r.launch.share_devices,
                                      loaded.env.gpus_per_task);
    const Layout layout = layout_of(r);
    parallel::Mesh mesh({layout.tp, layout.pp, layout.dp, layout.cp, layout.ep}, rt.info().rank);
    std::unique_ptr<parallel::Comm> world = rt.take_world();
    parallel::DeviceCommChoice device_comm;
    if (device)
      device_comm =
          parallel::agree_device_comm(requested_device_comm(r), device->shared, /*across_processes=*/true, *world);
    parallel::MeshComms comms = parallel::make_mesh_comms(
        mesh, std::move(world), layout.device == DeviceKind::cuda ? kernels::Device::cuda : kernels::Device::cpu,
        device_comm.comm);
    const trainer::Placement placement = trainer::place(r, layout, mesh.coord());
    trainer::TrainContext ctx;
    ctx.recipe = &r;
    ctx.placement = &placement;
    // The run's recipe.yaml: resolved, with the threads this host's launch gave each rank.
    Recipe written = r;
    written.train.threads = plan.threads_per_rank;
    ctx.recipe_yaml = recipe_to_yaml(written);
    ctx.mesh = &mesh;
    ctx.comms = &comms;
    ctx.threads = plan.threads_per_rank;
    ctx.allowed_changes = allowed;
    if (device) {
      ctx.device = device->ordinal;
      ctx.device_text = device->describe();
      ctx.device_comm_text = fmt::format("{} ({})", parallel::to_string(device_comm.comm), device_comm.why);
    }
    return trainer::train(ctx);
  });
}

// Errors every rank meets alike — the recipe's content, the launch plan, what this build cannot
// run — are printed once, by rank 0, when the user's mpirun or srun started the ranks (each parses
// the recipe before MPI exists, so they cannot agree on anything else). The other ranks exit with
// the same status without a word, but not at once: a launcher ends the whole job when one rank
// fails, and a rank 1 that exited first could get rank 0 killed before it printed. They wait for
// the launcher's SIGTERM (mpirun, srun --kill-on-bad-exit send it when rank 0 exits) or at most
// this long. Errors of a rank's own I/O (a file it cannot read) are printed by every rank that meets them.
constexpr auto kWaitForRank0 = std::chrono::seconds(5);

bool leaves_report_to_rank0(const parallel::LaunchEnv& env) {
  return env.launcher != parallel::Launcher::none && env.rank != 0;
}

int exit_after_rank0(int status) {
  const auto until = std::chrono::steady_clock::now() + kWaitForRank0;
  while (!stop_requested() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return status;
}

}  // namespace

// torchrun's multi-node flags, given to `run`: what llmtrain does instead.
void refuse_torchrun_flags(const std::map<std::string, std::string>& given) {
  for (const auto& [flag, value] : given) {
    if (value.empty()) continue;
    throw Error(
        fmt::format("{} {}: torchrun's multi-node flag; llmtrain starts the ranks of every node from one command", flag,
                    printable(value)),
        flag == "--nnodes"
            ? "inside a Slurm allocation (salloc/sbatch) `llmtrain run` starts one srun over its nodes (`llmtrain "
              "sbatch --nodes N` writes the script); without Slurm, --set launch.hostfile=HOSTS with --nproc N per "
              "host starts them over ssh (docs/launching.md)"
            : "drop it: the rendezvous (a rank's node, the address and port of rank 0) comes from Slurm, the hostfile "
              "or your own mpirun, never from flags; for several nodes run inside a Slurm allocation or give "
              "--set launch.hostfile=HOSTS (docs/launching.md)");
  }
}

int cmd_run(const RunArgs& args) {
  // A rank listens for stop requests from its first moment: the supervisor's SIGUSR1
  // (launcher/stop_relay.h) and SIGTERM from it or from Slurm. The trainer's handlers go in before
  // the relay and long before the training loop: a stop that arrives while the rank bootstraps,
  // reads data or loads a checkpoint (minutes for a large model) must still end in a checkpoint and
  // exit 75, not kill the rank (143) — under Slurm that would lose the requeue of a preempted job.
  const parallel::LaunchEnv env = parallel::detect_launch_env();
  if (env.is_rank()) {
    install_stop_handlers();
    launcher::install_stop_relay();
  }
  if (!args.gpu.empty() && !args.dry_run)
    throw Error(fmt::format("--gpu {} is for --dry-run", args.gpu),
                "add --dry-run to check the predicted memory against that GPU; a run uses the device it has");
  if (!args.gpu.empty()) planner::device_memory(args.gpu);  // an unknown name fails before anything else
  if (!args.rates.empty() && args.gpu.empty())
    throw Error(fmt::format("--rates {} needs --gpu", printable(args.rates)),
                "name the GPU the rates were measured on: --dry-run --gpu h100 --rates FILE");
  refuse_torchrun_flags(args.torchrun_flags);
  check_allow_changes(args.allow_changes);
  RecipeArgs recipe_args = args.recipe;
  if (args.nproc > 0) recipe_args.overrides.push_back(fmt::format("launch.procs_per_node={}", args.nproc));
  const bool rank_program = !args.rank_command.empty();
  LoadedRecipe loaded;
  launcher::LaunchPlan plan;
  try {
    loaded = recipe_load(recipe_args.recipe, recipe_args.overrides);
    parallel::require_usable_launch(loaded.env);
    plan = launcher::plan_launch(
        loaded.recipe, launcher::plan_inputs(loaded.env, rank_program),
        rank_program ? program_argv(args.rank_command) : rank_argv(recipe_args, args.allow_changes));
    if (!args.dry_run) {
      if (!plan.blocker.empty()) throw Error(plan.blocker, plan.blocker_hint);
      // Ranks that run a program of their own train nothing; everything else needs what is built.
      const std::vector<NotSupported> missing = unsupported_features(loaded.recipe);
      if (!missing.empty() && !(plan.spawns() && rank_program)) throw unsupported_error(missing, "");
      // device_comm: nccl in a build without NCCL, before any rank starts (a shared GPU's NCCL
      // version is each rank's to check, on its node).
      if (loaded.recipe.train.device == DeviceKind::cuda && !rank_program)
        parallel::choose_device_comm(requested_device_comm(loaded.recipe), false);
    }
  } catch (const RecipeError& e) {
    if (!e.io() && leaves_report_to_rank0(env)) return exit_after_rank0(kExitUserError);
    throw;
  } catch (const Error& e) {
    if (leaves_report_to_rank0(env)) return exit_after_rank0(e.exit_code());
    throw;
  }
  // A dry run that finds the training run would stop is not a success (exit 2, as the run's own
  // refusal); a rank program (`run RECIPE -- PROGRAM`) trains nothing and needs none of it.
  if (args.dry_run)
    return print_plan(loaded, plan, args.gpu, args.rates, args.allow_changes) || rank_program ? kExitOk
                                                                                              : kExitUserError;
  // A CPU run whose ranks will not fit this host's memory is told so before any rank starts (once:
  // by the process that launches, or by rank 0 of ranks the user's mpirun started). It still runs:
  // the host may swap, or the prediction's margin may not matter.
  if (!rank_program && loaded.recipe.train.device == DeviceKind::cpu &&
      (plan.mode != launcher::LaunchMode::as_rank || env.rank == 0)) {
    std::string line;
    const std::string warning = memory_check(loaded.recipe, std::max(1, plan.ranks_per_node), "", &line);
    if (!warning.empty()) std::fprintf(stderr, "warning: %s\n", warning.c_str());
    // This host's ranks and threads against its cores and what else runs on them now (the
    // launching process itself is the one runnable thread of ours so far).
    const std::string busy = launcher::oversubscription_warning(std::max(1, plan.ranks_per_node), plan.threads_per_rank,
                                                                usable_cores(), runnable_threads() - 1);
    if (!busy.empty()) std::fprintf(stderr, "warning: %s\n", busy.c_str());
  }
  // The data and tokenizer files, checked before anything is created: the run directory comes
  // from pre-flight (spawned ranks), from the check below (one rank in this process), or from
  // rank 0's trainer (ranks started by the user's mpirun/srun, where rank 0 checks and reports).
  if (!rank_program && (plan.mode != launcher::LaunchMode::as_rank || env.rank == 0)) {
    trainer::check_resume_changes(trainer::checkpoint_to_continue(loaded.recipe.checkpoint),
                                  recipe_to_yaml(loaded.recipe), args.allow_changes);
    require_recipe_inputs(loaded);
    check_offload_space(loaded.recipe, std::max(1, plan.ranks_per_node));
  }
  if (plan.spawns()) {
    // This process supervises; the ranks train (or run the given program).
    launcher::preflight_check(loaded.recipe, plan);
    // Every check has passed: a rank program (`run RECIPE -- PROGRAM`) finds the output folders made,
    // as training ranks make theirs.
    if (rank_program)
      for (const std::string* dir : {&loaded.recipe.log.dir, &loaded.recipe.checkpoint.dir}) {
        std::error_code ec;
        std::filesystem::create_directories(*dir, ec);
        if (ec)
          throw environment_error(fmt::format("cannot create {}: {}", *dir, ec.message()),
                                  "choose a folder this user can write (log.dir, checkpoint.dir)");
      }
    launcher::SupervisorOptions options = launcher::supervisor_options(loaded.recipe);
    options.stop_grace_s = args.stop_grace_s;
    return launcher::supervise(plan, options);
  }
  // This process is the one rank (in_process) or one of the ranks (as_rank): it trains.
  // A one-rank run has no supervisor to run the pre-flight checks: without this, an unwritable
  // checkpoint.dir surfaced only at the first checkpoint, after checkpoint.every steps of training.
  // (Ranks started by the supervisor were checked by it before they started.)
  if (plan.mode == launcher::LaunchMode::in_process) {
    launcher::check_writable_dir(loaded.recipe.log.dir, "log.dir");
    launcher::check_writable_dir(loaded.recipe.checkpoint.dir, "checkpoint.dir");
    install_stop_handlers();  // as for ranks above: Ctrl-C while loading stops after a step
  }
  return run_ranks(loaded, plan, args.allow_changes);
}

}  // namespace llmtrain::cli
