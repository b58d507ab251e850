// The resolved recipe as YAML: the schema's keys (cli/recipe_schema.h) in its order.
#include "cli/recipe_emit.h"

#include <fmt/format.h>

#include <algorithm>

#include "cli/recipe_schema.h"
#include "common/strings.h"

namespace llmtrain::cli {

std::string recipe_to_yaml(const Recipe& r) {
  std::string y;
  for (const RecipeKey& k : recipe_schema()) {
    const size_t depth = size_t(std::count(k.key.begin(), k.key.end(), '.'));
    const std::string key = std::string(2 * depth, ' ') + leaf(k.key) + ":";
    if (k.section) {
      y += key + "\n";
      continue;
    }
    const std::optional<std::string> value = k.emit(r);
    if (!value) continue;
    // A value that starts a new line (data.train's list) follows the key directly.
    y += key + (value->empty() || value->front() == '\n' ? *value : " " + *value) + "\n";
  }
  return y;
}

std::string recipe_derived_yaml(const ModelConfig& m, const std::string& name, const std::string& tokenizer,
                                const std::string& resume, const std::string& config_path) {
  return fmt::format(
      "# Derived from {} by `llmtrain import`: set data.train to your dataset, then `llmtrain run`.\n"
      "name: {}\n"
      "model: {{family: {}, layers: {}, hidden: {}, heads: {}, kv_heads: {}, ffn_hidden: {}, vocab: {},\n"
      "        seq_len: {}, max_positions: {}, rope_theta: {}, norm_eps: {}, init_std: {}, tie_embeddings: {}}}\n"
      "data: {{tokenizer: {}, train: [data/train]}}\n"
      "train: {{steps: 1000, micro_batch: 1}}\n"
      "checkpoint: {{resume: {}, load_weights_only: true}}\n",
      printable(config_path), yaml_quoted(name, "the run name"), to_string(m.family), m.layers, m.hidden, m.heads,
      m.kv_heads, m.ffn_hidden, m.vocab, m.seq_len, m.max_positions, m.rope_theta, m.norm_eps, m.init_std,
      m.tie_embeddings ? "true" : "false",
      tokenizer == "byte" ? std::string("byte") : yaml_quoted(tokenizer, "the tokenizer's path"),
      yaml_quoted(resume, "the checkpoint's path"));
}

}  // namespace llmtrain::cli
