// A recipe written back as YAML: the run directory's recipe.yaml, checkpoints' manifests and
// `validate`'s output.
#pragma once

#include <string>

#include "common/recipe/recipe.h"

namespace llmtrain::cli {

// The resolved recipe as YAML (every key, defaults filled in, paths absolute). Parsing this text
// again gives the same recipe.
std::string recipe_to_yaml(const Recipe& recipe);

}  // namespace llmtrain::cli
