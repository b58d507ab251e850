// The recipe's schema: every key declared once — name, type, default, range and one line of
// documentation, with how it is read from YAML and written back. The parser (cli/recipe_parse.cpp)
// and the resolved recipe that `validate` prints (cli/recipe_emit.cpp) walk this table, and
// docs/recipe.md's tables are checked against it (tests/cli/test_recipe_schema.cpp): a key added
// here without its docs row fails the tests.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cli/recipe_section.h"
#include "common/recipe/recipe.h"

namespace llmtrain::cli {

struct RecipeKey {
  std::string key;       // dotted: "model.layers"; a section is a key too ("train.loss_scale")
  std::string type;      // docs/recipe.md's type column: "int ≥ 1 or auto"
  std::string fallback;  // docs/recipe.md's default column: "required", "auto = `heads`", "300s"
  std::string doc;       // one line: what it is
  bool required = false;
  bool section = false;  // a map of keys (its children follow it in the table)
  // Left `auto` by resolution: its value depends on the host a rank runs on (cores, the device's
  // peak), which `validate` on a login node cannot know. The run's log states the value used.
  bool host_auto = false;
  // Reads the key from its section into the recipe (records a Diagnostic when it is wrong).
  std::function<void(Section&, Recipe&)> parse;
  // The value as YAML text; nullopt = the key is not written (an empty optional list).
  std::function<std::optional<std::string>(const Recipe&)> emit;
};

// Every key, sections before their children, in docs/recipe.md's order.
const std::vector<RecipeKey>& recipe_schema();

// Every dotted key the schema knows ("model.layers", "launch.ssh.port", ...).
std::vector<std::string> recipe_schema_keys();

// The section a key belongs to ("" for top-level keys): "launch.ssh" for "launch.ssh.port".
std::string parent_key(const std::string& key);

}  // namespace llmtrain::cli
