// Resolution and cross-field validation of a parsed recipe. Problems are returned, not thrown,
// so that the CLI can report every one of them at once, each with the file location of its key.
#pragma once

#include <functional>
#include <string>
#include <vector>

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

// Cross-field rules on a resolved recipe: divisibility of the layout, batch arithmetic,
// precision vs device, schedule consistency. Empty when the recipe is valid.
std::vector<RecipeProblem> recipe_check(const Recipe& recipe, const WorldInfo& world);

// Features the recipe asks for that this build cannot run yet. `run` refuses a recipe while
// this is non-empty; `validate` accepts it (the recipe itself is well formed).
std::vector<std::string> unsupported_features(const Recipe& recipe);

}  // namespace llmtrain
