#include "cli/recipe_load.h"

#include <fmt/format.h>

#include <filesystem>

#include "launcher/launch_plan.h"
#include "trainer/data/tokenizer_vocab.h"

namespace llmtrain::cli {

RecipeError::RecipeError(std::vector<Diagnostic> diags)
    : std::runtime_error(diags.empty() ? "invalid recipe" : diags.front().format()), diags_(std::move(diags)) {}

bool RecipeError::io() const {
  for (const auto& d : diags_)
    if (d.io) return true;
  return false;
}

std::string RecipeError::format() const {
  std::string out;
  for (const auto& d : diags_) out += "error: " + d.format() + "\n";
  out += fmt::format("{} error{} in the recipe", diags_.size(), diags_.size() == 1 ? "" : "s");
  return out;
}

namespace {

LoadedRecipe load(const std::string& file, const std::vector<std::string>& overrides, const WorldInfo* world) {
  namespace fs = std::filesystem;
  ParsedRecipe parsed = recipe_parse(file, overrides);
  if (!parsed.diags.empty()) throw RecipeError(std::move(parsed.diags));

  LoadedRecipe out;
  out.recipe = std::move(parsed.recipe);
  std::error_code ec;
  out.recipe.source_file = fs::absolute(file, ec).lexically_normal().string();
  out.env = parallel::detect_launch_env();
  if (world) {
    out.world = *world;
  } else {
    out.world = launcher::planned_world(out.recipe, out.env);
    const YamlValue* launch = parsed.tree.find("launch");
    auto given = [&](const char* key) {
      const YamlValue* v = launch && launch->kind == YamlValue::Kind::map ? launch->find(key) : nullptr;
      return v && !v->is_null();
    };
    out.world.defaulted = out.env.launcher == parallel::Launcher::none && !given("nodes") && !given("procs_per_node") &&
                          !given("hostfile");
  }

  std::vector<Diagnostic> diags;
  auto report = [&](const std::vector<RecipeProblem>& problems) {
    for (const auto& p : problems)
      diags.push_back({recipe_key_where(parsed.tree, file, p.key), p.key, p.message, p.hint, p.io});
  };
  report(recipe_resolve(out.recipe, out.world, fs::current_path().string(), trainer::tokenizer_vocab_size));
  if (diags.empty()) report(recipe_check(out.recipe, out.world));
  if (!diags.empty()) throw RecipeError(std::move(diags));
  out.file = file;
  out.tree = std::move(parsed.tree);
  return out;
}

}  // namespace

LoadedRecipe recipe_load(const std::string& file, const std::vector<std::string>& overrides) {
  return load(file, overrides, nullptr);
}

LoadedRecipe recipe_load(const std::string& file, const std::vector<std::string>& overrides, const WorldInfo& world) {
  return load(file, overrides, &world);
}

}  // namespace llmtrain::cli
