#include <cstdio>

#include "cli/commands.h"
#include "cli/recipe_emit.h"
#include "cli/recipe_load.h"
#include "cli/recipe_parse.h"

namespace llmtrain::cli {

int cmd_validate(const RecipeArgs& args) {
  LoadedRecipe loaded = recipe_load(args.recipe, args.overrides);
  std::fputs(recipe_to_yaml(loaded.recipe).c_str(), stdout);
  return 0;
}

}  // namespace llmtrain::cli
