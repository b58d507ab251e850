// Recipe parsing for the CLI: YAML file + `--set` overrides -> Recipe (schema, types, ranges), with
// every problem reported at once with its location. Resolution and the cross-field rules come
// after, in recipe_load (cli/recipe_load.h).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "cli/recipe_schema.h"
#include "cli/yaml_tree.h"
#include "common/recipe/recipe.h"

namespace llmtrain::cli {

struct ParsedRecipe {
  Recipe recipe;   // not yet resolved: "auto" fields hold 0 / ""
  YamlValue tree;  // the document after overrides, for error locations
  std::vector<Diagnostic> diags;
};

// Schema, type and range checks only.
ParsedRecipe recipe_parse(const std::string& file, const std::vector<std::string>& overrides);
ParsedRecipe recipe_parse_text(const std::string& text, const std::string& name,
                               const std::vector<std::string>& overrides);

// Where `key` was written (file:line:col or the --set argument); for a key left at its default,
// its section's location with a note.
std::string recipe_key_where(const YamlValue& root, const std::string& file, const std::string& key);

// Thrown with every diagnostic by recipe_load (cli/recipe_load.h) and by callers of recipe_parse.
class RecipeError : public std::runtime_error {
 public:
  explicit RecipeError(std::vector<Diagnostic> diags);
  // Each problem on its own (the tests check them one by one; llmtrain prints format()).
  const std::vector<Diagnostic>& diagnostics() const { return diags_; }
  std::string format() const;  // one "error: ..." block per diagnostic
  // A file could not be read (Diagnostic::io): this process may be alone in meeting it.
  bool io() const;

 private:
  std::vector<Diagnostic> diags_;
};

}  // namespace llmtrain::cli
