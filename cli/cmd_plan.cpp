// `llmtrain plan`: every layout of a recipe's model and global batch on N devices of the catalogue,
// with memory per rank (the one memory account) and predicted step time (the performance model),
// ranked; `--apply` writes the best into a copy of the recipe, `--json` prints it for scripts
// (docs/plan.md).
//
// Rule a reader could get wrong: the recipe is loaded and checked as it is (its own layout must be
// valid); the plan keeps its model, global batch, precision and everything else, and varies only
// the layout fields with_layout() sets.
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/recipe_emit.h"
#include "cli/recipe_load.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/strings.h"
#include "planner/layout_search.h"
#include "trainer/model/model_spec.h"

namespace llmtrain::cli {
namespace {

using planner::Candidate;

nlohmann::json candidate_json(const Candidate& c, int gpus) {
  const ParallelConfig& p = c.recipe.parallel;
  const trainer::MemoryAccount& a = c.memory.account;
  const planner::StepPrediction& t = c.time;
  return {{"layout", c.layout()},
          {"tp", p.tp},
          {"pp", p.pp},
          {"virtual_stages", p.virtual_stages},
          {"pp_schedule", to_string(p.pp_schedule)},
          {"dp", p.dp},
          {"cp", p.cp},
          {"cp_comm", to_string(p.cp_comm)},
          {"ep", p.ep},
          {"offload", to_string(p.offload)},
          {"zero", p.zero},
          {"micro_batch", c.recipe.train.micro_batch},
          {"activation_checkpointing", to_string(c.recipe.train.activation_checkpointing)},
          {"sequence_parallel", p.sequence_parallel},
          {"memory_bytes", c.memory.bytes},
          {"memory_capacity_bytes", c.memory.capacity},
          {"memory_stage", c.memory.stage},
          {"memory_by_kind",
           {{"parameters", a.parameters},
            {"gradients", a.gradients},
            {"optimizer", a.optimizer},
            {"activations", a.activations},
            {"communication", a.communication},
            {"checkpoint_snapshot", a.checkpoint_snapshot}}},
          {"step_s", t.total},
          {"step_parts_s",
           {{"compute", t.compute},
            {"pipeline_bubble", t.bubble},
            {"tensor_parallel", t.tp_comm},
            {"pipeline_transfers", t.pp_comm},
            {"data_parallel", t.dp_comm},
            {"optimizer", t.optimizer}}},
          {"model_tflops_per_gpu", t.model_flops_per_gpu(gpus) / 1e12},
          {"limit", t.limit}};
}

// launch.nodes × launch.procs_per_node = the plan's ranks, so that `validate` of the written recipe
// resolves the same world.
void set_launch(Recipe& r, const PlanArgs& a) {
  if (a.gpus <= a.gpus_per_node) {
    r.launch.nodes = 1, r.launch.procs_per_node = a.gpus;
  } else if (a.gpus % a.gpus_per_node == 0) {
    r.launch.nodes = a.gpus / a.gpus_per_node, r.launch.procs_per_node = a.gpus_per_node;
  } else {
    throw Error(fmt::format("--apply: {} GPUs are not whole nodes of --gpus-per-node {}", a.gpus, a.gpus_per_node),
                "launch.nodes × launch.procs_per_node must equal the ranks: give --gpus a multiple of --gpus-per-node");
  }
  if (!r.launch.hostfile.empty() && r.launch.nodes > 1)
    throw Error(fmt::format("--apply: the recipe's launch.hostfile {} names the hosts, the plan needs {} nodes",
                            r.launch.hostfile, r.launch.nodes),
                "remove launch.hostfile (--set launch.hostfile=) or plan for one node");
}

// Pads to `width` columns counting code points, not bytes (the layouts' "·" is two bytes).
std::string pad(const std::string& text, size_t width) {
  size_t columns = 0;
  for (unsigned char ch : text) columns += (ch & 0xC0) != 0x80 ? 1 : 0;
  return text + std::string(columns < width ? width - columns : 0, ' ');
}

}  // namespace

int cmd_plan(const PlanArgs& args) {
  // The recipe's own counts are bounded by 2^16 (recipe_parse); so are these.
  constexpr int kMaxRanks = 1 << 16;
  if (args.gpus < 1 || args.gpus > kMaxRanks)
    throw Error(fmt::format("--gpus {}: expected 1 to {}", args.gpus, kMaxRanks), "give the number of GPUs in all");
  if (args.gpus_per_node < 1 || args.gpus_per_node > kMaxRanks)
    throw Error(fmt::format("--gpus-per-node {}: expected 1 to {}", args.gpus_per_node, kMaxRanks),
                "give the GPUs of one node (one NVLink domain), e.g. 8");
  if (!(args.inter_node_gbps > 0 && args.inter_node_gbps < 1e6))
    throw Error(fmt::format("--inter-node-gbps {}: expected a positive bandwidth in Gb/s", args.inter_node_gbps),
                "e.g. 400 for one NDR InfiniBand port per GPU");
  LoadedRecipe loaded = recipe_load(args.recipe.recipe, args.recipe.overrides);
  const Recipe& base = loaded.recipe;
  std::string device = args.gpu;
  if (device.empty()) {
    if (base.train.device == DeviceKind::cuda)
      throw Error("train.device is cuda: which GPU?",
                  "give --gpu " + join(planner::device_names(), "|") + " (docs/plan.md lists them)");
    device = "cpu";
  }
  planner::DeviceSpec spec = planner::device_lookup(device, &base);
  if (!args.rates.empty()) planner::apply_measured_rates(spec, args.rates);
  planner::Cluster cluster{spec, args.gpus, args.gpus_per_node, args.inter_node_gbps * 1e9 / 8};
  const planner::SearchResult found = planner::search_layouts(base, cluster);
  const int valid = int(found.fitting.size() + found.too_big.size());
  if (valid == 0)
    throw Error(fmt::format("no layout of {} ranks passes the recipe checks for this model and global batch ({} "
                            "refused: divisibility of heads, layers, batch by tp, pp, dp)",
                            args.gpus, found.rejected),
                fmt::format("choose --gpus dividing the work: global_batch {} must be a multiple of micro_batch × dp, "
                            "and tp × pp × dp = --gpus",
                            base.train.global_batch));
  if (found.fitting.empty()) {
    const Candidate& small = found.too_big.front();
    throw Error(fmt::format("no layout fits {} × {}: the smallest, {}, needs {} per rank, {} available", args.gpus,
                            cluster.device.model, small.layout(), format_bytes(double(small.memory.bytes)),
                            format_bytes(double(small.memory.capacity))),
                "more GPUs, a device with more memory (--gpu h200), or a smaller model, seq_len or batch");
  }
  const std::vector<Candidate>& ranked = found.fitting;
  const Candidate& best = ranked.front();
  std::string applied;
  if (!args.apply.empty()) {
    Recipe out = best.recipe;
    out.train.device = device == "cpu" ? DeviceKind::cpu : DeviceKind::cuda;
    set_launch(out, args);
    write_file_atomic(default_file_system(), args.apply, recipe_to_yaml(out));
    recipe_load(args.apply, {});  // what `llmtrain validate` would say of it; throws with every problem
    applied = args.apply;
    if (out.parallel.offload_path == planner::kOffloadPathPlaceholder)
      applied += fmt::format(" (it offloads the optimizer state to a disk: set parallel.offload_path there, now {})",
                             planner::kOffloadPathPlaceholder);
  }
  // --top unset: the ten best in the table, every layout that fits in the JSON.
  const size_t shown = std::min(ranked.size(), args.top > 0 ? size_t(args.top) : args.json ? ranked.size() : 10);
  if (args.json) {
    nlohmann::json j = {{"recipe", base.name},
                        {"gpus", args.gpus},
                        {"gpus_per_node", args.gpus_per_node},
                        {"inter_node_gbps", args.inter_node_gbps},
                        {"device", cluster.device.name},
                        {"device_memory_bytes", cluster.device.memory},
                        {"rate_source", cluster.device.rate_source},
                        {"attention_source", cluster.device.attention_source},
                        {"fitting", ranked.size()},
                        {"too_big", found.too_big.size()},
                        {"refused", found.rejected},
                        {"why_best", planner::why_best(ranked)},
                        {"applied", applied}};
    j["layouts"] = nlohmann::json::array();
    for (size_t i = 0; i < shown; ++i) j["layouts"].push_back(candidate_json(ranked[i], args.gpus));
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  const ModelConfig& m = base.model;
  std::printf(
      "plan: %s, %s parameters, global batch %d × seq_len %d, %s, on %d × %s (%d per node, %g Gb/s per GPU "
      "between nodes)\n",
      base.name.c_str(), format_count(double(trainer::count_parameters(m))).c_str(), base.train.global_batch, m.seq_len,
      to_string(base.train.precision), args.gpus, cluster.device.model.c_str(), std::min(args.gpus, args.gpus_per_node),
      args.inter_node_gbps);
  std::printf(
      "rates: products at %s%s\n", cluster.device.rate_source.c_str(),
      cluster.device.attention_source.empty() ? "" : ("; attention at " + cluster.device.attention_source).c_str());
  std::printf("%zu layouts fit, %zu do not; %d refused by the recipe checks\n", ranked.size(), found.too_big.size(),
              found.rejected);
  std::printf("%4s  %s %11s %10s %8s  %s\n", "rank", pad("layout", 66).c_str(), "memory", "step", "TF/s", "limit");
  for (size_t i = 0; i < shown; ++i) {
    const Candidate& c = ranked[i];
    std::printf("%4zu  %s %11s %9.4gs %8.3g  %s\n", i + 1, pad(c.layout(), 66).c_str(),
                format_bytes(double(c.memory.bytes)).c_str(), c.time.total,
                c.time.model_flops_per_gpu(args.gpus) / 1e12, c.time.limit.c_str());
  }
  const planner::StepPrediction& t = best.time;
  std::printf("best: %s\n  why: %s\n", best.layout().c_str(), planner::why_best(ranked).c_str());
  std::printf(
      "  step %.4g s = compute %.4g + pipeline bubble %.4g + tensor-parallel %.4g + pipeline transfers %.4g + "
      "data-parallel %.4g + optimizer %.4g\n",
      t.total, t.compute, t.bubble, t.tp_comm, t.pp_comm, t.dp_comm, t.optimizer);
  std::printf("  memory per rank (stage %d): %s; + %s reserved = %s of %s\n", best.memory.stage,
              trainer::format_memory(best.memory.account).c_str(),
              format_bytes(double(cluster.device.reserved)).c_str(), format_bytes(double(best.memory.bytes)).c_str(),
              format_bytes(double(best.memory.capacity)).c_str());
  if (!applied.empty()) std::printf("wrote %s (validated)\n", applied.c_str());
  return kExitOk;
}

}  // namespace llmtrain::cli
