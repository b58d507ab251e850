// Recipe loading for the CLI: YAML file + `--set` overrides -> trainer::Recipe, with every problem
// (syntax, unknown key, type, range, cross-field rule) reported at once with its location.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "cli/yaml_tree.h"
#include "parallel/launch_env.h"
#include "trainer/recipe.h"
#include "trainer/recipe_check.h"

namespace llmtrain::cli {

struct ParsedRecipe {
  trainer::Recipe recipe;  // not yet resolved: "auto" fields hold 0 / ""
  YamlValue tree;          // the document after overrides, for error locations
  std::vector<Diagnostic> diags;
};

// Schema, type and range checks only.
ParsedRecipe recipe_parse(const std::string& file, const std::vector<std::string>& overrides);
ParsedRecipe recipe_parse_text(const std::string& text, const std::string& name,
                               const std::vector<std::string>& overrides);

// Every dotted key the schema knows ("model.layers", "launch.ssh.port", ...).
std::vector<std::string> recipe_schema_keys();

// Where `key` was written (file:line:col or the --set argument); for a key left at its default,
// its section's location with a note.
std::string recipe_key_where(const YamlValue& root, const std::string& file, const std::string& key);

// Thrown by recipe_load with every diagnostic.
class RecipeError : public std::runtime_error {
 public:
  explicit RecipeError(std::vector<Diagnostic> diags);
  const std::vector<Diagnostic>& diagnostics() const { return diags_; }
  std::string format() const;  // one "error: ..." block per diagnostic

 private:
  std::vector<Diagnostic> diags_;
};

struct LoadedRecipe {
  trainer::Recipe recipe;  // resolved: every auto filled, paths absolute
  trainer::WorldInfo world;
  parallel::LaunchEnv env;
};

// parse -> resolve (against the world size from the environment or the launch section) -> check.
LoadedRecipe recipe_load(const std::string& file, const std::vector<std::string>& overrides);

// The resolved recipe as YAML (every key, defaults filled in, paths absolute). Parsing this text
// again gives the same recipe.
std::string recipe_to_yaml(const trainer::Recipe& recipe);

}  // namespace llmtrain::cli
