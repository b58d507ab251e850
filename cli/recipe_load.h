// Loading a recipe for a command: parse (cli/recipe_parse.h), resolve every "auto" against the world
// size the launch will have, and check the cross-field rules (common/recipe/recipe_check.h); every
// problem of every stage is reported at once, at the location of its key.
#pragma once

#include <string>
#include <vector>

#include "cli/recipe_parse.h"
#include "common/recipe/recipe.h"
#include "common/recipe/recipe_check.h"
#include "parallel/launch_env.h"

namespace llmtrain::cli {

struct LoadedRecipe {
  Recipe recipe;  // resolved: every auto filled, paths absolute
  WorldInfo world;
  parallel::LaunchEnv env;
  std::string file;  // the recipe file as given
  YamlValue tree;    // the document after overrides: where each key was written, for later messages
};

// parse -> resolve (against the world size from the environment or the launch section) -> check.
// Throws RecipeError with every diagnostic.
LoadedRecipe recipe_load(const std::string& file, const std::vector<std::string>& overrides);
// The same, resolved and checked against `world` instead of the launch's (`llmtrain plan --gpus N`:
// the recipe's own layout on N ranks, dp auto becoming N / (tp · cp · pp)).
LoadedRecipe recipe_load(const std::string& file, const std::vector<std::string>& overrides, const WorldInfo& world);

}  // namespace llmtrain::cli
