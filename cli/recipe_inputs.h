// The files a recipe reads before training can start — every data.train dataset, data.valid and
// data.tokenizer — each with the key that names it and whether it is there. `run --dry-run` lists
// them; `run` refuses a missing one before any rank starts and before the run directory is
// created, so a mistyped data path leaves nothing behind (docs/recipe.md "data").
//
// Rule a reader could get wrong: a dataset is a PREFIX naming two files, PREFIX.bin and
// PREFIX.idx, and both must exist. Only existence is checked here; the ranks check the contents
// when they open them.
#pragma once

#include <string>
#include <vector>

#include "cli/recipe_load.h"

namespace llmtrain::cli {

struct RecipeInput {
  std::string key;                   // "data.train", "data.train[1].path", "data.valid", "data.tokenizer"
  std::string where;                 // where the key was written: "recipe.yaml:12:9", "--set data.train=x"
  std::string path;                  // absolute: a dataset's PREFIX or a tokenizer; "byte" for the built-in one
  bool dataset = false;              // a PREFIX (.bin + .idx) rather than a tokenizer
  std::vector<std::string> missing;  // the files that do not exist; empty when all are there
  std::string suggestion;            // a dataset given as PREFIX.bin (or .idx) whose PREFIX is there: PREFIX
};

std::vector<RecipeInput> recipe_inputs(const LoadedRecipe& loaded);

// One line for `run --dry-run`: "data.train  /abs/data/train (.bin + .idx)" or "... MISSING: ..."
// (control characters escaped: printable).
std::string describe_input(const RecipeInput& input);

// Throws RecipeError (exit 2) naming every missing file with its key and where it was written.
void require_recipe_inputs(const LoadedRecipe& loaded);

}  // namespace llmtrain::cli
