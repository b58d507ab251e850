// `llmtrain plan`: every layout of a recipe's model and global batch on N devices of the catalogue,
// with memory per rank (the one memory account) and predicted step time (the performance model),
// ranked, each with its predicted MFU and tokens/s per GPU; the recipe's own layout's place among
// them, the predicted time to train the recipe's steps, and a warning where the memory left free
// is under the headroom margin (planner::headroom_margin); `--apply` writes the best into a copy of
// the recipe, `--json` prints it for scripts (docs/plan.md).
//
// Rule a reader could get wrong: the recipe is loaded and checked as it is (its own layout must be
// valid); the plan keeps its model, global batch, precision and everything else, and varies only
// the layout fields with_layout() sets. The recipe's own layout is loaded again on --gpus ranks (dp
// auto becomes N / (tp · cp · pp)), with the plan's global batch, to be compared on the same work.
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

// What every row's derived figures need: the ranks, one GPU's rated peak at the recipe's precision
// (MFU's denominator) and the recipe's steps (the time to train).
struct RowContext {
  int gpus = 1;
  double peak = 0;
  int64_t steps = 0;
};

nlohmann::json candidate_json(const Candidate& c, const RowContext& x) {
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
          {"headroom_bytes", c.memory.headroom()},
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
          {"model_tflops_per_gpu", t.model_flops_per_gpu(x.gpus) / 1e12},
          {"mfu", t.mfu(x.gpus, x.peak)},
          {"tokens_per_s_per_gpu", t.tokens_per_s_per_gpu(x.gpus)},
          {"time_to_train_s", double(x.steps) * t.total},
          {"limit", t.limit}};
}

// The recipe's own layout on --gpus ranks, loaded again against them with the plan's global batch
// (an auto global batch would otherwise follow dp), placed among the search's results.
planner::OwnLayout own_layout_on(const PlanArgs& args, const Recipe& base, const planner::Cluster& cluster,
                                 const planner::SearchResult& found) {
  std::vector<std::string> overrides = args.recipe.overrides;
  overrides.push_back(fmt::format("train.global_batch={}", base.train.global_batch));
  try {
    const LoadedRecipe own =
        recipe_load(args.recipe.recipe, overrides, WorldInfo{args.gpus, fmt::format("--gpus {}", args.gpus), false});
    return planner::own_layout(own.recipe, cluster, found);
  } catch (const RecipeError& e) {
    planner::OwnLayout out;
    out.why = fmt::format("it is not a layout of {} ranks: {}", args.gpus, e.diagnostics().front().message);
    return out;
  }
}

// "" when `c` leaves the headroom margin free; else the warning, with the fastest layout that does.
std::string headroom_warning(const Candidate& c, const std::string& which, const std::vector<Candidate>& ranked,
                             const planner::DeviceSpec& device) {
  if (planner::enough_headroom(c.memory)) return "";
  const int64_t margin = planner::headroom_margin(c.memory.capacity);
  std::string roomier = "no layout that fits leaves that much";
  for (size_t i = 0; i < ranked.size(); ++i)
    if (planner::enough_headroom(ranked[i].memory)) {
      roomier = fmt::format("the fastest that does is #{}, {} ({:.4g} s a step, {} free)", i + 1, ranked[i].layout(),
                            ranked[i].time.total, format_bytes(double(ranked[i].memory.headroom())));
      break;
    }
  const std::string counted = device.reserved > 0
                                  ? fmt::format("our buffers and {} reserved for the CUDA context and libraries",
                                                format_bytes(double(device.reserved)))
                                  : std::string("our buffers");
  return fmt::format(
      "only {} ({:.1f}%) of headroom per rank on {} ({}) with {} ({}): the prediction counts {}, not what the "
      "allocator rounds up or fragments nor larger workspaces, and an out-of-memory error can stop such a run; the "
      "plan asks for max({}, {:.0f}%) = {} free (docs/plan.md, \"Headroom\"): {}",
      format_bytes(double(c.memory.headroom())), 100.0 * double(c.memory.headroom()) / double(c.memory.capacity),
      device.name, format_bytes(double(c.memory.capacity)), which, c.layout(), counted,
      format_bytes(double(planner::kHeadroomFloor)), 100 * planner::kHeadroomFraction, format_bytes(double(margin)),
      roomier);
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

// A rate in a column: three digits below 100, whole numbers above (no exponents).
std::string rate_text(double rate) { return rate < 100 ? fmt::format("{:.3g}", rate) : fmt::format("{:.0f}", rate); }

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
  const RowContext row_context{args.gpus, cluster.device.rated_peak(base.train.precision), base.train.steps};
  const planner::OwnLayout own = own_layout_on(args, base, cluster, found);
  const double step_tokens = double(base.train.global_batch) * base.model.seq_len;
  std::vector<std::string> warnings;
  if (std::string w = headroom_warning(best, "the best layout", ranked, cluster.device); !w.empty())
    warnings.push_back(std::move(w));
  if (own.candidate && own.rank != 1 && own.candidate->memory.fits())
    if (std::string w = headroom_warning(*own.candidate, "this recipe's layout", ranked, cluster.device); !w.empty())
      warnings.push_back(std::move(w));
  // --top unset: the ten best in the table, every layout that fits in the JSON.
  const size_t shown = std::min(ranked.size(), args.top > 0 ? size_t(args.top) : args.json ? ranked.size() : 10);
  if (args.json) {
    auto or_null = [](int n) { return n > 0 ? nlohmann::json(n) : nlohmann::json(nullptr); };
    nlohmann::json j = {{"recipe", base.name},
                        {"gpus", args.gpus},
                        {"gpus_per_node", args.gpus_per_node},
                        {"inter_node_gbps", args.inter_node_gbps},
                        {"device", cluster.device.name},
                        {"device_memory_bytes", cluster.device.memory},
                        {"rate_source", cluster.device.rate_source},
                        {"attention_source", planner::attention_rates(base, cluster).source},
                        {"flops_per_token", trainer::training_flops_per_token(base.model)},
                        {"peak_flops_per_gpu", row_context.peak},
                        {"train_steps", base.train.steps},
                        {"train_tokens", double(base.train.steps) * step_tokens},
                        {"headroom_margin_bytes", planner::headroom_margin(best.memory.capacity)},
                        {"fitting", ranked.size()},
                        {"too_big", found.too_big.size()},
                        {"refused", found.rejected},
                        {"why_best", planner::why_best(ranked)},
                        {"recipe_layout", own.candidate ? candidate_json(*own.candidate, row_context) : nullptr},
                        {"recipe_layout_rank", or_null(own.rank)},
                        {"recipe_layout_would_rank", or_null(own.would_rank)},
                        {"recipe_layout_note", own.why},
                        {"warnings", warnings},
                        {"applied", applied}};
    j["layouts"] = nlohmann::json::array();
    for (size_t i = 0; i < shown; ++i) j["layouts"].push_back(candidate_json(ranked[i], row_context));
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
  const planner::AttentionRates attention = planner::attention_rates(base, cluster);
  std::printf("rates: products at %s%s\n", cluster.device.rate_source.c_str(),
              attention.source.empty() ? "" : ("; attention at " + attention.source).c_str());
  std::printf("%zu layouts fit, %zu do not; %d refused by the recipe checks; times, MFU and tokens/s are predicted\n",
              ranked.size(), found.too_big.size(), found.rejected);
  std::printf("%4s  %s %11s %10s %8s %6s %10s  %s\n", "rank", pad("layout", 66).c_str(), "memory", "step", "TF/s",
              "MFU", "tok/s/GPU", "limit");
  constexpr const char* kMark = "  <- this recipe";
  auto row = [&](const std::string& rank, const Candidate& c, const std::string& mark) {
    std::printf("%4s  %s %11s %9.4gs %8.3g %5.1f%% %10s  %s%s\n", rank.c_str(), pad(c.layout(), 66).c_str(),
                format_bytes(double(c.memory.bytes)).c_str(), c.time.total,
                c.time.model_flops_per_gpu(args.gpus) / 1e12, 100 * c.time.mfu(args.gpus, row_context.peak),
                rate_text(c.time.tokens_per_s_per_gpu(args.gpus)).c_str(), c.time.limit.c_str(), mark.c_str());
  };
  for (size_t i = 0; i < shown; ++i) row(std::to_string(i + 1), ranked[i], own.rank == int(i) + 1 ? kMark : "");
  if (own.rank > int(shown)) {
    std::printf("%4s\n", "...");
    row(std::to_string(own.rank), *own.candidate, kMark);
  } else if (own.rank == 0 && own.candidate && own.candidate->memory.fits()) {
    row("-", *own.candidate, fmt::format("{} (not searched; would be #{})", kMark, own.would_rank));
  }
  const planner::StepPrediction& t = best.time;
  std::printf("best: %s\n  why: %s\n", best.layout().c_str(), planner::why_best(ranked).c_str());
  std::printf(
      "  step %.4g s = compute %.4g + pipeline bubble %.4g + tensor-parallel %.4g + pipeline transfers %.4g + "
      "data-parallel %.4g + optimizer %.4g\n",
      t.total, t.compute, t.bubble, t.tp_comm, t.pp_comm, t.dp_comm, t.optimizer);
  std::printf("  MFU %.1f%% of %d × %.4g TFLOP/s (%s's rated %s peak), %s tokens/s per %s\n",
              100 * t.mfu(args.gpus, row_context.peak), args.gpus, row_context.peak / 1e12, cluster.device.name.c_str(),
              base.train.precision == Precision::fp32 ? "fp32" : "dense 16-bit",
              rate_text(t.tokens_per_s_per_gpu(args.gpus)).c_str(), cluster.device.shares_host ? "rank" : "GPU");
  std::printf("  memory per rank (stage %d): %s; + %s reserved = %s of %s (%s free)\n", best.memory.stage,
              trainer::format_memory(best.memory.account).c_str(),
              format_bytes(double(cluster.device.reserved)).c_str(), format_bytes(double(best.memory.bytes)).c_str(),
              format_bytes(double(best.memory.capacity)).c_str(), format_bytes(double(best.memory.headroom())).c_str());
  // The recipe's own layout: where it ranks, or why it is not among the candidates.
  auto against_best = [&](int place) {
    return fmt::format("#{} of {}, {:.4g} s a step, {:.2f} × the best's {:.4g} s", place, ranked.size(),
                       own.candidate->time.total, own.candidate->time.total / t.total, t.total);
  };
  std::string own_line;
  if (own.rank == 1)
    own_line = "#1 of " + std::to_string(ranked.size()) + ", the best";
  else if (own.rank > 1)
    own_line = against_best(own.rank);
  else if (own.would_rank > 0)
    own_line = "not among the candidates: " + own.why + "; as it is, it would be " + against_best(own.would_rank);
  else
    own_line = "not among the candidates: " + own.why;
  std::printf("this recipe's layout%s: %s\n", own.candidate ? (" (" + own.candidate->layout() + ")").c_str() : "",
              own_line.c_str());
  const bool own_runs = own.candidate && own.candidate->memory.fits();
  std::printf("time to train (predicted): %lld steps × %s tokens = %s tokens: %s with the best layout%s\n",
              static_cast<long long>(base.train.steps), format_count(step_tokens).c_str(),
              format_count(double(base.train.steps) * step_tokens).c_str(),
              format_span(double(base.train.steps) * t.total).c_str(),
              own_runs && own.rank != 1 ? fmt::format(", {} with this recipe's",
                                                      format_span(double(base.train.steps) * own.candidate->time.total))
                                              .c_str()
                                        : "");
  for (const std::string& w : warnings) std::printf("warning: %s\n", w.c_str());
  if (!applied.empty()) std::printf("wrote %s (validated)\n", applied.c_str());
  return kExitOk;
}

}  // namespace llmtrain::cli
