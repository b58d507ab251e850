// A recipe written back as YAML: the run directory's recipe.yaml, checkpoints' manifests and
// `validate`'s output.
#pragma once

#include <string>

#include "common/recipe/recipe.h"

namespace llmtrain::cli {

// The resolved recipe as YAML (every key, defaults filled in, paths absolute). Parsing this text
// again gives the same recipe.
std::string recipe_to_yaml(const Recipe& recipe);

// The fine-tuning recipe `llmtrain import` derives from a model directory (its recipe.yaml): the
// model as config.json says, `tokenizer` ("byte" or a file), the imported checkpoint `resume` to
// start from with load_weights_only, data.train for the user to fill in; a comment names
// `config_path`. Every string is escaped (yaml_quoted, printable): none can end its line or add a
// key, and parsing the text gives back exactly these values. Throws llmtrain::Error for a string
// that is not UTF-8.
std::string recipe_derived_yaml(const ModelConfig& model, const std::string& name, const std::string& tokenizer,
                                const std::string& resume, const std::string& config_path);

}  // namespace llmtrain::cli
