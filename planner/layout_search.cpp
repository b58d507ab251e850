#include "planner/layout_search.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "common/recipe/layout.h"
#include "common/recipe/recipe_check.h"
#include "common/strings.h"

namespace llmtrain::planner {
namespace {

// The virtual stages per pipeline rank the search tries (1: no interleaving).
constexpr int kSearchedVirtualStages[] = {1, 2, 4};

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// What `llmtrain validate` says of the layout, and what this build would refuse to run (train.device
// cuda aside: a GPU plan is made for it): the first problem, or "" when there is none.
std::string refusal(const Recipe& r, int gpus) {
  const WorldInfo world{gpus, fmt::format("--gpus {}", gpus), false};
  if (const std::vector<RecipeProblem> problems = recipe_check(r, world); !problems.empty())
    return fmt::format("{}: {}", problems.front().key, problems.front().message);
  Recipe on_cpu = r;
  on_cpu.train.device = DeviceKind::cpu;
  const std::vector<NotSupported> unsupported = unsupported_features(on_cpu);
  return unsupported.empty() ? "" : "not supported yet: " + unsupported.front().text;
}

bool accepted(const Recipe& r, int gpus) { return refusal(r, gpus).empty(); }

}  // namespace

RankMemory predict_rank_memory(const Recipe& r, const parallel::MeshCoord& coord, const Cluster& c) {
  RankMemory out;
  out.account = trainer::memory_plan(r, layout_of(r), coord);
  out.stage = coord.pp;
  out.bytes = out.account.total() + c.device.reserved;
  const int per_node = std::max(1, std::min(c.gpus, c.gpus_per_node));
  out.capacity = c.device.shares_host ? c.device.memory / per_node : c.device.memory;
  return out;
}

RankMemory predict_memory(const Recipe& r, const Cluster& c) {
  // Stages differ by their layers, the embedding and head, and how many micro-batches they keep:
  // the first holds the most activations, the last the head's logits.
  RankMemory out = predict_rank_memory(r, {0, 0, 0}, c);
  if (r.parallel.pp > 1) {
    RankMemory last = predict_rank_memory(r, {r.parallel.pp - 1, 0, 0}, c);
    if (last.bytes > out.bytes) out = std::move(last);
  }
  return out;
}

std::string Candidate::layout() const {
  const ParallelConfig& p = recipe.parallel;
  std::string s = fmt::format("tp {} · pp {}", p.tp, p.pp);
  if (p.virtual_stages > 1) s += fmt::format(" × v {}", p.virtual_stages);
  if (p.pp > 1 && p.pp_schedule != PipelineSchedule::interleaved) s += fmt::format(" {}", to_string(p.pp_schedule));
  s += fmt::format(" · dp {} · zero {} · mb {} · recompute {}", p.dp, p.zero, recipe.train.micro_batch,
                   to_string(recipe.train.activation_checkpointing));
  if (p.sequence_parallel) s += " · sp";
  if (p.cp > 1) s += fmt::format(" · cp {} ({})", p.cp, to_string(p.cp_comm));
  if (p.ep > 1) s += fmt::format(" · ep {}", p.ep);
  if (p.offload != OffloadKind::none) s += fmt::format(" · offload {}", to_string(p.offload));
  return s;
}

Recipe with_offload(const Recipe& recipe) {
  Recipe r = recipe;
  if (r.train.device == DeviceKind::cuda) {
    r.parallel.offload = OffloadKind::host;
  } else {
    r.parallel.offload = OffloadKind::nvme;
    if (r.parallel.offload_path.empty()) r.parallel.offload_path = kOffloadPathPlaceholder;
  }
  return r;
}

Recipe with_layout(const Recipe& recipe, const LayoutChoice& l) {
  Recipe r = recipe;
  ParallelConfig& p = r.parallel;
  p.tp = l.tp, p.pp = l.pp, p.dp = l.dp, p.zero = l.zero, p.zero_group = 0, p.cp = l.cp, p.ep = l.ep;
  fill_zero_group(p);
  p.virtual_stages = l.virtual_stages, p.pp_schedule = l.schedule, p.pp_layers.clear();
  p.sequence_parallel = l.sequence_parallel;
  r.train.micro_batch = l.micro_batch;
  r.train.activation_checkpointing = l.recompute;
  return r;
}

// Expert parallelism (a MoE model): every ep dividing both the experts and the dp × cp ranks; 1 for
// a dense model.
std::vector<int> expert_parallel_sizes(const ModelConfig& m, int dp_cp) {
  std::vector<int> out;
  for (int ep : divisors(dp_cp))
    if (ep == 1 || (m.moe.enabled() && m.moe.experts % ep == 0)) out.push_back(ep);
  return out;
}

// A layout that does not fit, with its optimizer state offloaded (host memory for GPUs, a disk for
// cpu ranks, whose state is in host memory already), when that fits; else nullopt.
std::optional<Candidate> offloaded(const Recipe& r, const Cluster& c, int ranks) {
  Recipe off = with_offload(r);
  if (!accepted(off, ranks)) return std::nullopt;
  Candidate cand{off, predict_memory(off, c), predict_step(off, c)};
  if (!cand.memory.fits()) return std::nullopt;
  return cand;
}

SearchResult search_layouts(const Recipe& recipe, const Cluster& c) {
  SearchResult out;
  const int n = c.gpus;
  std::vector<int> micro_batches{1, 2, 4, 8};
  if (std::find(micro_batches.begin(), micro_batches.end(), recipe.train.micro_batch) == micro_batches.end())
    micro_batches.push_back(recipe.train.micro_batch);
  // Context parallelism for long sequences (and the recipe's own cp): activations per rank are
  // 1/cp of a sequence's.
  std::vector<int> cps{recipe.parallel.cp};
  if (recipe.model.seq_len >= kLongSequence)
    for (int cp : {1, 2, 4, 8})
      if (cp != recipe.parallel.cp) cps.push_back(cp);
  for (int tp : divisors(n)) {
    if (tp > c.gpus_per_node) continue;  // tensor parallelism stays inside a node's NVLink
    for (int cp : cps)
      for (int pp : (n / tp) % cp == 0 ? divisors(n / tp / cp) : std::vector<int>{}) {
        const int dp = n / tp / cp / pp;
        for (int v : kSearchedVirtualStages) {
          if (v > 1 && pp == 1) continue;
          std::vector<PipelineSchedule> schedules{v > 1 ? PipelineSchedule::interleaved
                                                        : PipelineSchedule::one_f_one_b};
          if (pp > 1 && v == 1) schedules.push_back(PipelineSchedule::zero_bubble);
          for (PipelineSchedule schedule : schedules)
            for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero)
              for (int mb : micro_batches)
                for (ActivationCheckpointing rc :
                     {ActivationCheckpointing::none, ActivationCheckpointing::selective, ActivationCheckpointing::full})
                  for (bool sp : {false, true})
                    for (int ep : expert_parallel_sizes(recipe.model, dp * cp)) {
                      if (sp && tp == 1) continue;
                      const Recipe r = with_layout(recipe, {tp, pp, dp, zero, v, mb, schedule, rc, sp, cp, ep});
                      if (!accepted(r, n)) {
                        ++out.rejected;
                        continue;
                      }
                      Candidate cand{r, predict_memory(r, c), predict_step(r, c)};
                      if (!cand.memory.fits() && recipe.parallel.offload == OffloadKind::none)
                        if (std::optional<Candidate> off = offloaded(r, c, n)) cand = std::move(*off);
                      (cand.memory.fits() ? out.fitting : out.too_big).push_back(std::move(cand));
                    }
        }
      }
  }
  std::stable_sort(out.fitting.begin(), out.fitting.end(), [](const Candidate& a, const Candidate& b) {
    if (a.time.total != b.time.total) return a.time.total < b.time.total;
    return a.memory.bytes < b.memory.bytes;
  });
  std::stable_sort(out.too_big.begin(), out.too_big.end(),
                   [](const Candidate& a, const Candidate& b) { return a.memory.bytes < b.memory.bytes; });
  return out;
}

std::vector<Change> fitting_changes(const Recipe& r, const Cluster& c) {
  const ParallelConfig& p = r.parallel;
  const LayoutChoice now{p.tp,
                         p.pp,
                         p.dp,
                         p.zero,
                         p.virtual_stages,
                         r.train.micro_batch,
                         p.pp_schedule,
                         r.train.activation_checkpointing,
                         p.sequence_parallel,
                         p.cp,
                         p.ep};
  std::vector<std::pair<std::string, LayoutChoice>> tries;
  for (int zero = p.zero + 1; zero <= 3 && p.dp > 1; ++zero) {
    LayoutChoice l = now;
    l.zero = zero;
    tries.push_back({fmt::format("zero {}", zero), l});
  }
  if (p.dp % 2 == 0) {
    LayoutChoice l = now;
    l.tp *= 2, l.dp /= 2;
    tries.push_back({fmt::format("tp {}", l.tp), l});
    l = now;
    l.pp *= 2, l.dp /= 2;
    tries.push_back({fmt::format("pp {}", l.pp), l});
    l = now;
    l.cp *= 2, l.dp /= 2;
    tries.push_back({fmt::format("cp {}", l.cp), l});
  }
  for (ActivationCheckpointing rc : {ActivationCheckpointing::selective, ActivationCheckpointing::full}) {
    if (int(rc) <= int(now.recompute)) continue;
    LayoutChoice l = now;
    l.recompute = rc;
    tries.push_back({fmt::format("recompute {}", to_string(rc)), l});
  }
  for (int mb = now.micro_batch / 2; mb >= 1; mb /= 2) {
    LayoutChoice l = now;
    l.micro_batch = mb;
    tries.push_back({fmt::format("micro_batch {}", mb), l});
    break;
  }
  std::vector<std::pair<std::string, Recipe>> recipes;
  for (const auto& [what, layout] : tries) {
    Recipe changed = with_layout(r, layout);
    changed.parallel.pp_layers = layout.pp == p.pp ? p.pp_layers : std::vector<int>{};
    recipes.push_back({what, std::move(changed)});
  }
  if (p.offload == OffloadKind::none) {
    Recipe off = with_offload(r);
    recipes.push_back({fmt::format("offload {}", to_string(off.parallel.offload)), std::move(off)});
  }
  std::vector<Change> out;
  for (const auto& [what, changed] : recipes) {
    if (!accepted(changed, c.gpus)) continue;
    RankMemory m = predict_memory(changed, c);
    if (m.fits()) out.push_back({what, std::move(m)});
  }
  return out;
}

int64_t headroom_margin(int64_t capacity) {
  return std::max(kHeadroomFloor, int64_t(kHeadroomFraction * double(capacity)));
}

bool enough_headroom(const RankMemory& m) { return m.headroom() >= headroom_margin(m.capacity); }

namespace {

// The layout fields with_layout() and with_offload() set, and the two the search leaves at their
// defaults (an even pp_layers split, ZeRO over the whole dp group); a schedule means nothing
// without pipeline stages.
bool same_layout(const Recipe& a, const Recipe& b) {
  const ParallelConfig &p = a.parallel, &q = b.parallel;
  const bool pipelined = p.pp > 1 || q.pp > 1;
  return p.tp == q.tp && p.pp == q.pp && p.dp == q.dp && p.cp == q.cp && p.ep == q.ep && p.zero == q.zero &&
         p.zero_group == q.zero_group && p.sequence_parallel == q.sequence_parallel && p.offload == q.offload &&
         p.pp_layers == q.pp_layers &&
         (!pipelined || (p.virtual_stages == q.virtual_stages && p.pp_schedule == q.pp_schedule)) &&
         a.train.micro_batch == b.train.micro_batch &&
         a.train.activation_checkpointing == b.train.activation_checkpointing;
}

int place_in(const std::vector<Candidate>& fitting, const Recipe& r) {
  for (size_t i = 0; i < fitting.size(); ++i)
    if (same_layout(fitting[i].recipe, r)) return int(i) + 1;
  return 0;
}

// What of the recipe's layout the search does not vary, when it can tell.
std::string not_enumerated(const Recipe& r, const Cluster& c) {
  const ParallelConfig& p = r.parallel;
  if (p.tp > c.gpus_per_node)
    return fmt::format("tp {} spans more than a node's {} GPUs (the search keeps tensor parallelism inside a node)",
                       p.tp, c.gpus_per_node);
  if (!p.pp_layers.empty()) return "its parallel.pp_layers (the search splits the layers evenly)";
  if (p.zero > 0 && p.zero_group != p.dp)
    return fmt::format("its parallel.zero_group {} (the search shards over the whole dp group, {})", p.zero_group,
                       p.dp);
  if (p.pp > 1 && std::find(std::begin(kSearchedVirtualStages), std::end(kSearchedVirtualStages), p.virtual_stages) ==
                      std::end(kSearchedVirtualStages))
    return fmt::format("its {} virtual stages per pipeline rank (the search tries 1, 2 and 4)", p.virtual_stages);
  if (p.pp > 1 && p.pp_schedule == PipelineSchedule::gpipe)
    return "the gpipe schedule (the search tries 1F1B, zero-bubble and interleaved)";
  return "docs/plan.md lists what the search varies";
}

}  // namespace

OwnLayout own_layout(const Recipe& r, const Cluster& c, const SearchResult& found) {
  OwnLayout out;
  out.rank = place_in(found.fitting, r);
  if (out.rank > 0) {
    out.candidate = found.fitting[size_t(out.rank) - 1];
    return out;
  }
  if (const std::string refused = refusal(r, c.gpus); !refused.empty()) {
    out.why = "the search refuses it: " + refused;
    return out;
  }
  Candidate own{r, predict_memory(r, c), predict_step(r, c)};
  if (!own.memory.fits()) {
    out.why = fmt::format("does not fit: predicted {} per rank, {} available", format_bytes(double(own.memory.bytes)),
                          format_bytes(double(own.memory.capacity)));
    if (r.parallel.offload == OffloadKind::none)
      if (const int off = place_in(found.fitting, with_offload(r)); off > 0)
        out.why += fmt::format("; with its optimizer state offloaded it is #{}", off);
  } else {
    out.would_rank = 1;
    for (const Candidate& other : found.fitting)
      if (other.time.total < own.time.total ||
          (other.time.total == own.time.total && other.memory.bytes <= own.memory.bytes))
        ++out.would_rank;
    out.why = "not a layout the search enumerates: " + not_enumerated(r, c);
  }
  out.candidate = std::move(own);
  return out;
}

std::string why_best(const std::vector<Candidate>& ranked) {
  if (ranked.empty()) return "";
  const StepPrediction& a = ranked[0].time;
  if (ranked.size() == 1) return "the only layout that fits";
  const StepPrediction& b = ranked[1].time;
  struct Part {
    const char* name;
    double best, next;
  };
  const Part parts[] = {{"compute", a.compute, b.compute},
                        {"pipeline bubble", a.bubble, b.bubble},
                        {"tensor-parallel communication", a.tp_comm, b.tp_comm},
                        {"pipeline transfers", a.pp_comm, b.pp_comm},
                        {"data-parallel communication", a.dp_comm, b.dp_comm},
                        {"optimizer time", a.optimizer, b.optimizer}};
  const Part* gain = std::max_element(std::begin(parts), std::end(parts),
                                      [](const Part& x, const Part& y) { return x.next - x.best < y.next - y.best; });
  if (gain->next - gain->best <= 0)
    return fmt::format("as fast as the runner-up ({}) and needs less memory per rank", ranked[1].layout());
  return fmt::format("{:.4g} s a step against {:.4g} s for the runner-up ({}): {:.3g} s less {}", a.total, b.total,
                     ranked[1].layout(), gain->next - gain->best, gain->name);
}

}  // namespace llmtrain::planner
