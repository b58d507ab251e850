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

namespace {

// The llama family's variant keys a derived recipe needs (none for a plain model), model.moe's
// included.
std::string variant_keys(const ModelConfig& m) {
  std::string out;
  if (m.head_dim > 0) out += fmt::format(", head_dim: {}", m.head_dim);
  if (m.qkv_bias) out += ", qkv_bias: true";
  if (m.o_bias) out += ", o_bias: true";
  if (m.qk_norm) out += ", qk_norm: true";
  if (m.sliding_window > 0) out += fmt::format(", sliding_window: {}", m.sliding_window);
  // Gemma 3's
  if (m.full_attention_every > 0) out += fmt::format(", full_attention_every: {}", m.full_attention_every);
  if (m.rope_local_theta > 0) out += fmt::format(", rope_local_theta: {}", m.rope_local_theta);
  if (m.query_pre_attn_scalar > 0) out += fmt::format(", query_pre_attn_scalar: {}", m.query_pre_attn_scalar);
  if (m.activation != MlpActivation::swiglu) out += fmt::format(", activation: {}", to_string(m.activation));
  if (m.post_norms) out += ", post_norms: true";
  if (m.scale_embeddings) out += ", scale_embeddings: true";
  if (m.logit_softcap > 0) out += fmt::format(", logit_softcap: {}", m.logit_softcap);
  if (m.attention_sinks) out += ", attention_sinks: true";  // gpt-oss's
  if (m.moe.enabled()) {
    std::string extra;
    if (m.moe.shared_ffn_hidden > 0)
      extra += fmt::format(",\n              shared_ffn_hidden: {}", m.moe.shared_ffn_hidden);
    if (m.moe.bias) extra += ", bias: true";
    if (m.moe.swiglu_limit > 0)
      extra +=
          fmt::format(",\n              swiglu_limit: {}, swiglu_alpha: {}", m.moe.swiglu_limit, m.moe.swiglu_alpha);
    out += fmt::format(
        ",\n        moe: {{experts: {}, top_k: {}, ffn_hidden: {}, every: {}, first_dense: {}, renormalize: {},\n"
        "              aux_loss: {}, z_loss: {}, capacity_factor: {}{}}}",
        m.moe.experts, m.moe.top_k, m.moe.ffn_hidden, m.moe.every, m.moe.first_dense,
        m.moe.renormalize ? "true" : "false", m.moe.aux_loss, m.moe.z_loss, m.moe.capacity_factor, extra);
  }
  const RopeScalingConfig& r = m.rope_scaling;
  if (r.type == RopeScalingType::linear)
    out += fmt::format(",\n        rope_scaling: {{type: linear, factor: {}}}", r.factor);
  if (r.type == RopeScalingType::llama3)
    out += fmt::format(
        ",\n        rope_scaling: {{type: llama3, factor: {}, low_freq_factor: {}, high_freq_factor: {}, "
        "original_max_positions: {}}}",
        r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_positions);
  if (r.type == RopeScalingType::yarn) {
    out += fmt::format(
        ",\n        rope_scaling: {{type: yarn, factor: {}, original_max_positions: {}, beta_fast: {}, "
        "beta_slow: {}, truncate: {}",
        r.factor, r.original_max_positions, r.beta_fast, r.beta_slow, r.truncate ? "true" : "false");
    if (r.attention_factor > 0) out += fmt::format(", attention_factor: {}", r.attention_factor);
    if (r.mscale != 0 || r.mscale_all_dim != 0)
      out += fmt::format(", mscale: {}, mscale_all_dim: {}", r.mscale, r.mscale_all_dim);
    out += "}";
  }
  return out;
}

}  // namespace

std::string recipe_derived_yaml(const ModelConfig& m, const std::string& name, const std::string& tokenizer,
                                const std::string& resume, const std::string& config_path) {
  return fmt::format(
      "# Derived from {} by `llmtrain import`: set data.train to your dataset, then `llmtrain run`.\n"
      "name: {}\n"
      "model: {{family: {}, layers: {}, hidden: {}, heads: {}, kv_heads: {}, ffn_hidden: {}, vocab: {},\n"
      "        seq_len: {}, max_positions: {}, rope_theta: {}, norm_eps: {}, init_std: {}, tie_embeddings: {}{}}}\n"
      "data: {{tokenizer: {}, train: [data/train]}}\n"
      "train: {{steps: 1000, micro_batch: 1}}\n"
      "checkpoint: {{resume: {}, load_weights_only: true}}\n",
      printable(config_path), yaml_quoted(name, "the run name"), to_string(m.family), m.layers, m.hidden, m.heads,
      m.kv_heads, m.ffn_hidden, m.vocab, m.seq_len, m.max_positions, m.rope_theta, m.norm_eps, m.init_std,
      m.tie_embeddings ? "true" : "false", variant_keys(m),
      tokenizer == "byte" ? std::string("byte") : yaml_quoted(tokenizer, "the tokenizer's path"),
      yaml_quoted(resume, "the checkpoint's path"));
}

}  // namespace llmtrain::cli
