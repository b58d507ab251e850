// Resolution and cross-field validation of a parsed recipe. Problems are returned, not thrown,
// so that the CLI can report every one of them at once, each with the file location of its key.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/recipe/recipe.h"

namespace llmtrain {

struct RecipeProblem {
  std::string key;      // dotted key the problem is about ("model.heads")
  std::string message;  // what was found and what was expected
  std::string hint;     // what to do
  bool io = false;      // reading a file failed (the tokenizer), not the recipe's content
};

// How many ranks the job has, and where that number came from (named in error messages).
struct WorldInfo {
  int size = 1;
  std::string source;  // "launch.nodes 1 × launch.procs_per_node 4" or "mpirun (OMPI_COMM_WORLD_SIZE)"
  // Nobody chose the rank count: no launcher started this process and the recipe and --set give no
  // launch.nodes, launch.procs_per_node or launch.hostfile, so the world is the default single
  // rank. A layout that needs more ranks is then told how to start them rather than shown the arithmetic.
  bool defaulted = false;
};

// The defaults that depend on another key of the same section (applied by the parser when the
// key is absent): tie_embeddings is true for gpt2 and false for llama.
bool default_tie_embeddings(ModelFamily family);

// The vocabulary size of `data.tokenizer` (resolved, absolute), for `model.vocab: auto`; throws
// llmtrain::Error naming the file. The trainer's tokenizers provide it (trainer/data/
// tokenizer_vocab.h): the recipe is a floor below them and does not read tokenizer files itself.
using TokenizerVocabFn = std::function<int(const std::string& tokenizer)>;

// Fills every "auto" field (docs/recipe.md) and makes paths absolute against `cwd`.
// Asks `tokenizer_vocab` when model.vocab is auto.
std::vector<RecipeProblem> recipe_resolve(Recipe& recipe, const WorldInfo& world, const std::string& cwd,
                                          const TokenizerVocabFn& tokenizer_vocab);

// parallel.zero_group's auto, once dp is known: the whole dp group at zero ≥ 1; at zero 0 nothing is
// sharded, every rank a group of one. recipe_resolve applies it; so does code that changes a
// resolved recipe's layout (the planner's candidates, with zero_group set back to 0 = auto).
void fill_zero_group(ParallelConfig& parallel);

// train.threads' auto, which depends on the host a rank runs on (so the resolved recipe keeps it
// auto): the host's usable cores divided among the ranks it runs.
int threads_per_rank(const Recipe& recipe, int cores, int ranks_on_host);

// Cross-field rules on a resolved recipe: divisibility of the layout, batch arithmetic,
// precision vs device, schedule consistency. Empty when the recipe is valid.
std::vector<RecipeProblem> recipe_check(const Recipe& recipe, const WorldInfo& world);

// What this build parses but cannot run yet. Each refusal is written once, in unsupported_features
// (lifting one is one edit there): `run` refuses a recipe while the list is non-empty (before any
// rank starts, and in every rank); `validate` accepts it (the recipe itself is well formed); the
// planner rejects such layouts, and the memory account plans what this build would allocate instead.
enum class NotYet {
  dropout,
  zero_bubble_recompute,
  bf16_reduce_of_fp32,
  cp_sliding_window,
  cp_softmax_scale,
  moe_layout
};
struct NotSupported {
  NotYet feature;
  std::string text;  // "model.dropout 0.1 (dropout > 0)": follows "not supported yet: "
};
// On a resolved recipe.
std::vector<NotSupported> unsupported_features(const Recipe& recipe);
std::vector<std::string> describe(const std::vector<NotSupported>& features);
// The error `run` and `sbatch` refuse a recipe with while unsupported_features is not empty:
// "not supported yet: <each>; ...", with `consequence` ("so the job would fail") in the hint.
Error unsupported_error(const std::vector<NotSupported>& features, const std::string& consequence);

}  // namespace llmtrain
