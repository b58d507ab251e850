#include <fmt/format.h>

#include <cstdio>

#include "cli/commands.h"
#include "cli/recipe_emit.h"
#include "cli/recipe_inputs.h"
#include "cli/recipe_load.h"
#include "cli/recipe_parse.h"
#include "cli/recipe_schema.h"
#include "common/error.h"

namespace llmtrain::cli {
namespace {

// A docs table cell as plain text: `code` marks and the escaped column bar dropped.
std::string unescape_table(const std::string& cell) {
  std::string out;
  for (size_t i = 0; i < cell.size(); ++i) {
    if (cell[i] == '`') continue;
    if (cell[i] == '\\' && i + 1 < cell.size() && cell[i + 1] == '|') continue;
    out += cell[i];
  }
  return out;
}

}  // namespace

int cmd_validate(const RecipeArgs& args) {
  if (args.recipe.empty())
    throw Error("validate needs a recipe file", "llmtrain validate RECIPE.yaml (or --keys to list every recipe key)");
  LoadedRecipe loaded = recipe_load(args.recipe, args.overrides);
  std::fputs(recipe_to_yaml(loaded.recipe).c_str(), stdout);
  // validate is about the recipe itself: a login node without the data or the GPUs must validate a
  // cluster recipe. What it leaves to the machines the job runs on is said as YAML comments, so the
  // output is still the recipe (validating it again gives the same text).
  std::string notes;
  for (const RecipeInput& in : recipe_inputs(loaded))
    if (!in.missing.empty()) notes += "#   " + describe_input(in) + "\n";
  std::printf(
      "# validate checked the recipe itself (exit 0: it is valid). Left to where the job runs (`llmtrain run "
      "--dry-run` there, and `run` before any rank starts):\n"
      "#   the input files%s\n%s"
      "#   the devices (%s), the launch (launcher, hosts, ranks per node), the output folders (writable), a resume's "
      "recipe changes\n",
      notes.empty() ? " (all present here)" : "; missing here:", notes.c_str(),
      loaded.recipe.train.device == DeviceKind::cuda ? "train.device cuda: a usable GPU per rank" : "train.device cpu");
  return 0;
}

int cmd_validate_keys() {
  std::string out;
  for (const RecipeKey& k : recipe_schema())
    out += fmt::format("{}  {}  default: {}  — {}\n", k.key, unescape_table(k.type), unescape_table(k.fallback), k.doc);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace llmtrain::cli
