// The layout search behind `llmtrain plan` and `run --dry-run`'s memory warning: every layout of a
// recipe's model and global batch on a cluster (tp, pp, virtual stages and schedule, dp, ZeRO
// stage, micro-batch, activation recomputation, sequence parallelism) that `llmtrain validate`
// accepts and this build runs, each with its memory per rank from the one memory account
// (trainer/placement/memory.h) and its step time from the performance model (perf_model.h), ranked;
// where the recipe's own layout stands among them (own_layout), and the free memory below which
// `plan` warns (headroom_margin).
//
// Rule a reader could get wrong: validity is recipe_check's and unsupported_features' — the search
// never has rules of its own about which layouts exist; it only enumerates and asks them. The one
// exception is train.device: cuda, which this build cannot run but is what a GPU plan is for.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/recipe/recipe.h"
#include "planner/perf_model.h"
#include "trainer/placement/memory.h"

namespace llmtrain::planner {

// The peak a rank holds: the one memory account's total on the pipeline stage that holds the most,
// plus what the device reserves outside our Buffers (DeviceSpec::reserved).
struct RankMemory {
  trainer::MemoryAccount account;  // of that stage
  int stage = 0;
  int64_t bytes = 0;     // account.total() + reserved
  int64_t capacity = 0;  // what one rank may hold: the device's memory (cpu: the host's / its ranks)
  bool fits() const { return bytes <= capacity; }
  int64_t headroom() const { return capacity - bytes; }  // free beyond the prediction (negative: does not fit)
};
// The free memory per rank below which `plan` warns: max(2 GiB, 5% of the capacity). The account
// predicts our Buffers and DeviceSpec::reserved's stated 2 GiB for the CUDA context and the
// libraries' workspaces; what it cannot predict (what the device allocator rounds up or leaves
// fragmented, workspaces beyond that reserve, memory a library or a version adds) needs room beyond the prediction, and
// a layout that leaves less is one an out-of-memory error may stop. A stated guard, not a
// measurement (docs/plan.md, "Headroom").
inline constexpr int64_t kHeadroomFloor = int64_t(2) << 30;
inline constexpr double kHeadroomFraction = 0.05;
int64_t headroom_margin(int64_t capacity);
bool enough_headroom(const RankMemory& memory);
RankMemory predict_memory(const Recipe& recipe, const Cluster& cluster);
// The rank at `coord`'s: the account there plus the device's reserved bytes (predict_memory is the
// largest of its stages').
RankMemory predict_rank_memory(const Recipe& recipe, const parallel::MeshCoord& coord, const Cluster& cluster);

// What a layout that does not fit could change, one thing at a time on the same ranks, to fit:
// "zero 1", "tp 2", "pp 2", "recompute full", "offload host", "micro_batch 1" — each only when the changed recipe
// passes the same checks as the search's layouts.
struct Change {
  std::string what;
  RankMemory memory;
};
std::vector<Change> fitting_changes(const Recipe& recipe, const Cluster& cluster);

struct Candidate {
  Recipe recipe;  // the base recipe with this layout
  RankMemory memory;
  StepPrediction time;
  // "tp 2 · pp 1 · dp 4 · zero 1 · mb 1 · recompute full · sp" (" · cp 2" with context parallelism)
  std::string layout() const;
};

// The recipe with a layout's fields set (parallel.tp/pp/dp/zero/sequence_parallel/pp_schedule/
// virtual_stages, pp_layers cleared, zero_group auto; train.micro_batch, activation_checkpointing).
struct LayoutChoice {
  int tp = 1, pp = 1, dp = 1, zero = 0, virtual_stages = 1, micro_batch = 1;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  ActivationCheckpointing recompute = ActivationCheckpointing::none;
  bool sequence_parallel = false;
  int cp = 1;  // context parallelism (cp_comm stays the recipe's)
  int ep = 1;  // expert parallelism (MoE models: searched over the divisors of dp × cp and the experts)
};
// Sequences at least this long make the search try context parallelism (cp 2, 4, 8 where 2·cp
// divides seq_len); shorter ones keep the recipe's cp.
inline constexpr int kLongSequence = 16384;
Recipe with_layout(const Recipe& recipe, const LayoutChoice& layout);
// The recipe with its optimizer state offloaded (parallel.offload): host memory on GPUs, a disk on
// cpu ranks (whose state is in host memory already), under kOffloadPathPlaceholder when the recipe
// names no offload_path. The search tries it for a layout that does not fit, and fitting_changes
// offers it.
inline constexpr const char* kOffloadPathPlaceholder = "/OFFLOAD_PATH";
Recipe with_offload(const Recipe& recipe);

struct SearchResult {
  std::vector<Candidate> fitting;  // fastest first
  std::vector<Candidate> too_big;  // valid layouts that do not fit, smallest memory first
  int rejected = 0;                // layouts recipe_check or unsupported_features refused
};
// Every layout of `recipe`'s model and global batch on `cluster.gpus` ranks.
SearchResult search_layouts(const Recipe& recipe, const Cluster& cluster);

// The recipe's own layout among a search's results, for `plan` to print beside the best.
struct OwnLayout {
  std::optional<Candidate> candidate;  // the recipe as it is, predicted; absent when the search refuses it
  int rank = 0;                        // its place (1-based) in the search's `fitting`; 0 when not there
  int would_rank = 0;  // it fits but is not a layout the search enumerates: the place its step time would take
  std::string why;     // rank 0: "does not fit: ...", "not a layout the search enumerates: ...", ...
};
// `recipe` resolved on the search's ranks (its world size cluster.gpus), `found` the search of it.
OwnLayout own_layout(const Recipe& recipe, const Cluster& cluster, const SearchResult& found);

// Why the first of `ranked` wins over the second: "0.41 s less pipeline bubble than tp 2 · pp 2 ..."
std::string why_best(const std::vector<Candidate>& ranked);

}  // namespace llmtrain::planner
