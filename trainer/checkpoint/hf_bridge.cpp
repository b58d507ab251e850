#include "trainer/checkpoint/hf_bridge.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/error.h"
#include "common/strings.h"

namespace llmtrain::trainer {
using nlohmann::json;

namespace {

// Whether the model has any of Gemma 3's options (it then exports as Gemma3ForCausalLM, or not at all).
bool gemma_variant(const ModelConfig& m) {
  return m.post_norms || m.activation == MlpActivation::geglu || m.scale_embeddings || m.query_pre_attn_scalar > 0 ||
         m.full_attention_every > 0 || m.rope_local_theta > 0 || m.logit_softcap > 0;
}

// Whether the model has any of gpt-oss's options (it then exports as GptOssForCausalLM, or not at all).
bool gpt_oss_variant(const ModelConfig& m) { return m.attention_sinks || m.moe.bias || m.moe.swiglu_limit > 0; }

}  // namespace

std::string hf_model_type(const ModelConfig& m) {
  if (m.family == ModelFamily::gpt2) return "gpt2";
  if (gpt_oss_variant(m)) return "gpt_oss";
  if (gemma_variant(m)) return "gemma3_text";
  if (m.moe.enabled() && m.moe.shared_ffn_hidden > 0) return "qwen2_moe";
  if (m.moe.enabled()) return m.qk_norm ? "qwen3_moe" : "mixtral";
  if (m.qk_norm) return "qwen3";
  if (m.qkv_bias) return "qwen2";
  if (m.sliding_window > 0) return "mistral";
  return "llama";
}

namespace {

// gpt-oss's router (mlp.router.weight, .bias) and its experts, which transformers holds fused only,
// transposed to x @ W, and the gate and up columns interleaved: gate_up_proj [E, d, 2f] (expert e's
// gate row r is column 2r, its up row r column 2r + 1), gate_up_proj_bias [E, 2f] (the same
// interleave), down_proj [E, f, d] (our [d, f] transposed), down_proj_bias [E, d].
void gpt_oss_expert_layout(HfTensorLayout& l, const ParamSpec& p, const std::string& mlp, int64_t experts) {
  const int64_t e = p.expert;
  auto fused = [&](const std::string& name, std::vector<int64_t> shape, int64_t offset, int64_t row_stride,
                   int64_t col_stride) {
    l.name = l.fused_name = mlp + name;
    l.shape = l.fused_shape = std::move(shape);
    l.fused_offset = offset;
    l.fused_row_stride = row_stride;
    l.fused_col_stride = col_stride;
    l.fused_only = true;
  };
  const int64_t up = p.role == ParamRole::moe_up_weight || p.role == ParamRole::moe_up_bias ? 1 : 0;
  switch (p.role) {
    case ParamRole::moe_router_weight:
      l.name = mlp + "router.weight";
      break;
    case ParamRole::moe_router_bias:
      l.name = mlp + "router.bias";
      break;
    case ParamRole::moe_gate_weight:
    case ParamRole::moe_up_weight: {  // ours [f, d]
      const int64_t f = p.shape[0], d = p.shape[1];
      fused("experts.gate_up_proj", {experts, d, 2 * f}, e * d * 2 * f + up, 2, 2 * f);
      break;
    }
    case ParamRole::moe_gate_bias:
    case ParamRole::moe_up_bias: {  // ours [f]
      const int64_t f = p.shape[0];
      fused("experts.gate_up_proj_bias", {experts, 2 * f}, e * 2 * f + up, 2, 0);
      break;
    }
    case ParamRole::moe_down_weight: {  // ours [d, f]
      const int64_t d = p.shape[0], f = p.shape[1];
      fused("experts.down_proj", {experts, f, d}, e * f * d, 1, d);
      break;
    }
    default:  // moe_down_bias, ours [d]
      fused("experts.down_proj_bias", {experts, p.shape[0]}, e * p.shape[0], 1, 0);
      break;
  }
}

// Qwen2-MoE's shared expert and its gate under transformers' names: our block_sparse_moe.X is its
// mlp.X (other names are returned as they are).
std::string shared_expert_hf_name(const std::string& ours) {
  static const std::string kOurs = "block_sparse_moe.";
  const size_t at = ours.find(kOurs);
  return at == std::string::npos ? ours : ours.substr(0, at) + "mlp." + ours.substr(at + kOurs.size());
}

}  // namespace

HfTensorLayout hf_tensor_layout(const ModelConfig& m, const ParamSpec& p) {
  HfTensorLayout l;
  l.name = p.name;
  l.shape = p.shape;
  auto transposed = [&](int64_t rows, int64_t cols) {
    l.transpose = true;
    l.rows = rows;
    l.cols = cols;
    l.shape = {cols, rows};
  };
  switch (p.role) {
    case ParamRole::token_embedding:
    case ParamRole::output_weight:
      l.keep_rows = m.vocab;
      l.shape[0] = m.vocab;
      break;
    case ParamRole::qkv_weight:  // [3, d, d] = [3d, d] out × in; Conv1D: [d, 3d]
      transposed(p.shape[0] * p.shape[1], p.shape[2]);
      break;
    case ParamRole::qkv_bias:
      l.shape = {p.shape[0] * p.shape[1]};
      break;
    case ParamRole::attn_out_weight:
    case ParamRole::mlp_in_weight:
    case ParamRole::mlp_out_weight:
      if (m.family == ModelFamily::gpt2) transposed(p.shape[0], p.shape[1]);
      l.name = shared_expert_hf_name(p.name);
      break;
    case ParamRole::mlp_gate_weight:
    case ParamRole::mlp_up_weight:
    case ParamRole::moe_shared_gate_weight:
      l.name = shared_expert_hf_name(p.name);
      break;
    case ParamRole::moe_router_weight:
    case ParamRole::moe_router_bias:
    case ParamRole::moe_gate_weight:
    case ParamRole::moe_up_weight:
    case ParamRole::moe_down_weight:
    case ParamRole::moe_gate_bias:
    case ParamRole::moe_up_bias:
    case ParamRole::moe_down_bias: {
      // transformers 5's names: the layer's prefix with block_sparse_moe -> mlp, the experts fused.
      const size_t at = p.name.find("block_sparse_moe.");
      LT_CHECK(at != std::string::npos, "MoE parameter {} is not under block_sparse_moe", p.name);
      const std::string mlp = p.name.substr(0, at) + "mlp.";
      const int64_t experts = m.moe.experts, e = p.expert;
      if (hf_model_type(m) == "gpt_oss") {
        gpt_oss_expert_layout(l, p, mlp, experts);
        break;
      }
      // Qwen3-MoE's 4.x names: mlp.gate, mlp.experts.{e}.gate_proj / up_proj / down_proj (Mixtral's
      // w1 / w3 / w2).
      if (hf_model_type(m) == "qwen3_moe" || hf_model_type(m) == "qwen2_moe") {
        static constexpr const char* kProj[] = {"gate_proj", "up_proj", "down_proj"};
        const int which = p.role == ParamRole::moe_gate_weight ? 0 : p.role == ParamRole::moe_up_weight ? 1 : 2;
        l.name = p.role == ParamRole::moe_router_weight ? mlp + "gate.weight"
                                                        : fmt::format("{}experts.{}.{}.weight", mlp, e, kProj[which]);
      }
      if (p.role == ParamRole::moe_router_weight) {
        l.fused_name = mlp + "gate.weight";
        l.fused_shape = p.shape;
      } else if (p.role == ParamRole::moe_down_weight) {  // [d, f] each
        l.fused_name = mlp + "experts.down_proj";
        l.fused_shape = {experts, p.shape[0], p.shape[1]};
        l.fused_offset = e * p.numel();
      } else {  // [f, d] each: w1 rows, then w3 rows
        l.fused_name = mlp + "experts.gate_up_proj";
        l.fused_shape = {experts, 2 * p.shape[0], p.shape[1]};
        l.fused_offset = (2 * e + (p.role == ParamRole::moe_up_weight ? 1 : 0)) * p.numel();
      }
      break;
    }
    default:
      break;
  }
  const bool norm = p.role == ParamRole::attn_norm_weight || p.role == ParamRole::mlp_norm_weight ||
                    p.role == ParamRole::attn_post_norm_weight || p.role == ParamRole::mlp_post_norm_weight ||
                    p.role == ParamRole::q_norm_weight || p.role == ParamRole::k_norm_weight ||
                    p.role == ParamRole::final_norm_weight;
  if (norm && hf_model_type(m) == "gemma3_text") l.offset = 1;
  return l;
}

std::vector<float> to_hf_layout(const HfTensorLayout& l, const ParamSpec& p, const float* ours) {
  int64_t n = 1;
  for (int64_t d : l.shape) n *= d;
  std::vector<float> out(static_cast<size_t>(n));
  if (l.transpose) {
    for (int64_t r = 0; r < l.rows; ++r)
      for (int64_t c = 0; c < l.cols; ++c) out[size_t(c * l.rows + r)] = ours[r * l.cols + c];
  } else {
    std::copy(ours, ours + n, out.begin());  // the vocabulary's kept rows are its first n elements
  }
  if (l.offset != 0)
    for (float& x : out) x -= l.offset;
  (void)p;
  return out;
}

void from_hf_layout(const HfTensorLayout& l, const ParamSpec& p, const float* hf, float* ours) {
  const int64_t total = p.numel();
  if (l.transpose) {
    for (int64_t r = 0; r < l.rows; ++r)
      for (int64_t c = 0; c < l.cols; ++c) ours[r * l.cols + c] = hf[c * l.rows + r];
    return;
  }
  int64_t n = 1;
  for (int64_t d : l.shape) n *= d;
  std::copy(hf, hf + n, ours);
  std::fill(ours + n, ours + total, 0.0f);  // padding rows of the vocabulary
  if (l.offset != 0)
    for (int64_t i = 0; i < n; ++i) ours[i] += l.offset;
}

namespace {

// Calls f(ours index, fused index) for every element of p's part of its fused tensor.
template <class F>
void for_fused_elements(const HfTensorLayout& l, const ParamSpec& p, F f) {
  int64_t fused_numel = 1;
  for (int64_t d : l.fused_shape) fused_numel *= d;
  const int64_t n = p.numel(), rows = p.shape.empty() ? 1 : p.shape[0], cols = rows ? n / rows : 0;
  const bool contiguous = l.fused_row_stride == 0 && l.fused_col_stride == 0;
  const int64_t rs = contiguous ? cols : l.fused_row_stride, cs = contiguous ? 1 : l.fused_col_stride;
  LT_CHECK(n == 0 || (l.fused_offset >= 0 && l.fused_offset + (rows - 1) * rs + (cols - 1) * cs < fused_numel),
           "{}: its part of {} passes the tensor's {} elements", p.name, l.fused_name, fused_numel);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) f(r * cols + c, l.fused_offset + r * rs + c * cs);
}

}  // namespace

void from_hf_fused(const HfTensorLayout& l, const ParamSpec& p, const float* fused, float* ours) {
  for_fused_elements(l, p, [&](int64_t i, int64_t j) { ours[i] = fused[j]; });
}

void to_hf_fused(const HfTensorLayout& l, const ParamSpec& p, const float* ours, float* fused) {
  for_fused_elements(l, p, [&](int64_t i, int64_t j) { fused[j] = ours[i]; });
}

namespace {

json token_id(int32_t id) { return id >= 0 ? json(id) : json(nullptr); }

}  // namespace

namespace {

// rope_scaling as transformers 4.x writes it (5.x reads it too): null, linear as 4.40 knows it,
// Llama 3.1's llama3, or yarn.
json hf_rope_scaling(const RopeScalingConfig& r) {
  switch (r.type) {
    case RopeScalingType::linear:
      return json{{"type", "linear"}, {"factor", r.factor}};
    case RopeScalingType::llama3:
      return json{{"rope_type", "llama3"},
                  {"factor", r.factor},
                  {"low_freq_factor", r.low_freq_factor},
                  {"high_freq_factor", r.high_freq_factor},
                  {"original_max_position_embeddings", r.original_max_positions}};
    case RopeScalingType::yarn: {
      // transformers' defaults (truncate true, the attention factor inferred) written only when set
      // otherwise: versions before truncate existed read the rest.
      json y = {{"rope_type", "yarn"},
                {"factor", r.factor},
                {"original_max_position_embeddings", r.original_max_positions},
                {"beta_fast", r.beta_fast},
                {"beta_slow", r.beta_slow}};
      if (!r.truncate) y["truncate"] = false;
      if (r.attention_factor > 0) y["attention_factor"] = r.attention_factor;
      if (r.mscale != 0) y["mscale"] = r.mscale;
      if (r.mscale_all_dim != 0) y["mscale_all_dim"] = r.mscale_all_dim;
      return y;
    }
    case RopeScalingType::none:
      break;
  }
  return nullptr;
}

// Gemma3ForCausalLM (model_type gemma3_text): Gemma 3's options all together, as transformers 4.x
// writes them (rope_theta, rope_local_base_freq and rope_scaling for the global layers,
// sliding_window_pattern), which 5.x reads too; layer_types beside them for 5.x's readers.
json hf_gemma3_config(const ModelConfig& m, const std::string& torch_dtype, int32_t bos, int32_t eos) {
  auto refuse = [&](const std::string& what, const std::string& why) {
    throw Error(fmt::format("not supported yet: exporting a Gemma-style model with {}: {}", what, why),
                "transformers' Gemma3ForCausalLM has model.post_norms, activation geglu, scale_embeddings and "
                "qk_norm together, without qkv_bias or experts (docs/hf.md)");
  };
  if (!m.post_norms) refuse("post_norms false", "Gemma 3 has four norms per block");
  if (m.activation != MlpActivation::geglu) refuse("activation swiglu", "Gemma 3's MLP is GeGLU");
  if (!m.scale_embeddings) refuse("scale_embeddings false", "Gemma 3 scales its embeddings by √hidden");
  if (!m.qk_norm) refuse("qk_norm false", "Gemma 3 has q/k norms");
  if (m.qkv_bias) refuse("qkv_bias", "Gemma 3's attention_bias also puts a bias on o_proj");
  if (m.moe.enabled()) refuse("experts", "Gemma 3 is dense");
  if (m.sliding_window > 0 && m.rope_local_theta == 0 && m.rope_scaling.type != RopeScalingType::none)
    refuse("rope_scaling and rope_local_theta 0", "Gemma 3's local layers take no rope scaling: set rope_local_theta");
  // Gemma3TextConfig holds the scalar as an int (5.x's strict config refuses 24.0).
  const double scalar = m.query_pre_attn_scalar > 0 ? m.query_pre_attn_scalar : double(m.head_size());
  if (scalar != std::floor(scalar) || scalar > double(int64_t(1) << 40))
    refuse(fmt::format("query_pre_attn_scalar {}", scalar), "Gemma3TextConfig holds a whole number");
  const int64_t query_scalar = int64_t(scalar);
  // As Gemma 3's own configs spell it: "rope_type" (5.x merges the object into the global layers'
  // default one, whose "rope_type" an old-style "type" would not replace).
  json rope_scaling = hf_rope_scaling(m.rope_scaling);
  if (rope_scaling.is_object() && rope_scaling.contains("type")) {
    rope_scaling["rope_type"] = rope_scaling["type"];
    rope_scaling.erase("type");
  }
  json layer_types = json::array();
  for (int l = 0; l < m.layers; ++l) layer_types.push_back(m.windowed(l) ? "sliding_attention" : "full_attention");
  // The pattern that says the same: every full_attention_every-th layer global, or none (one past the last).
  const int pattern = m.sliding_window == 0 ? 1 : m.full_attention_every > 0 ? m.full_attention_every : m.layers + 1;
  return json{{"architectures", {"Gemma3ForCausalLM"}},
              {"model_type", "gemma3_text"},
              {"vocab_size", m.vocab},
              {"hidden_size", m.hidden},
              {"intermediate_size", m.ffn_hidden},
              {"num_hidden_layers", m.layers},
              {"num_attention_heads", m.heads},
              {"num_key_value_heads", m.kv_heads},
              {"head_dim", m.head_size()},
              {"hidden_activation", "gelu_pytorch_tanh"},
              {"max_position_embeddings", m.max_positions},
              {"initializer_range", m.init_std},
              {"rms_norm_eps", m.norm_eps},
              {"rope_theta", m.rope_theta},
              {"rope_local_base_freq", m.rope_local_theta > 0 ? m.rope_local_theta : m.rope_theta},
              {"rope_scaling", rope_scaling},
              {"attention_bias", false},
              {"attention_dropout", 0.0},
              {"query_pre_attn_scalar", query_scalar},
              {"sliding_window", m.sliding_window > 0 ? json(m.sliding_window) : json(nullptr)},
              {"sliding_window_pattern", pattern},
              {"layer_types", layer_types},
              {"final_logit_softcapping", m.logit_softcap > 0 ? json(m.logit_softcap) : json(nullptr)},
              {"attn_logit_softcapping", nullptr},
              {"use_bidirectional_attention", false},
              {"tie_word_embeddings", m.tie_embeddings},
              {"use_cache", true},
              {"bos_token_id", token_id(bos)},
              {"eos_token_id", token_id(eos)},
              {"torch_dtype", torch_dtype}};
}

// GptOssForCausalLM (model_type gpt_oss): gpt-oss's options all together, RoPE as its released
// configs spell it (rope_theta beside rope_scaling, which transformers 4.55+ and 5.x read).
json hf_gpt_oss_config(const ModelConfig& m, const std::string& torch_dtype, int32_t bos, int32_t eos) {
  auto refuse = [&](const std::string& what, const std::string& why) {
    throw Error(fmt::format("not supported yet: exporting a gpt-oss-style model with {}: {}", what, why),
                "transformers' GptOssForCausalLM has model.attention_sinks, qkv_bias, o_bias and a MoE block on "
                "every layer with model.moe.bias and swiglu_limit together (docs/hf.md)");
  };
  const MoeConfig& e = m.moe;
  if (!m.attention_sinks) refuse("attention_sinks false", "gpt-oss's attention has a sink per head");
  if (!m.qkv_bias || !m.o_bias) refuse("no bias on q, k, v or o_proj", "gpt-oss's attention_bias puts one on each");
  if (!e.enabled()) refuse("no experts", "gpt-oss is a mixture of experts");
  if (!e.bias) refuse("moe.bias false", "gpt-oss's router and experts have biases");
  if (e.swiglu_limit <= 0) refuse("moe.swiglu_limit 0", "gpt-oss's experts clamp their SwiGLU");
  if (e.first_dense > 0 || e.every > 1) refuse("dense layers", "every gpt-oss layer is a MoE block");
  if (!e.renormalize) refuse("moe.renormalize false", "gpt-oss's weights are a softmax over the picked logits");
  if (e.shared_ffn_hidden > 0) refuse("a shared expert", "gpt-oss has none");
  if (m.qk_norm) refuse("qk_norm", "gpt-oss has no q/k norms");
  // Gemma 3's options but its layer pattern (gpt-oss alternates local and global layers too).
  ModelConfig pattern_aside = m;
  pattern_aside.full_attention_every = 0;
  if (gemma_variant(pattern_aside)) refuse("Gemma 3's options", "gpt-oss has none of them");
  json layer_types = json::array();
  for (int l = 0; l < m.layers; ++l) layer_types.push_back(m.windowed(l) ? "sliding_attention" : "full_attention");
  json rope_scaling = hf_rope_scaling(m.rope_scaling);
  if (rope_scaling.is_null()) rope_scaling = json{{"rope_type", "default"}};  // GptOssConfig's own default is YaRN
  return json{{"architectures", {"GptOssForCausalLM"}},
              {"model_type", "gpt_oss"},
              {"vocab_size", m.vocab},
              {"hidden_size", m.hidden},
              {"intermediate_size", e.ffn_hidden},
              {"num_hidden_layers", m.layers},
              {"num_attention_heads", m.heads},
              {"num_key_value_heads", m.kv_heads},
              {"head_dim", m.head_size()},
              {"hidden_act", "silu"},
              {"max_position_embeddings", m.max_positions},
              {"initializer_range", m.init_std},
              {"rms_norm_eps", m.norm_eps},
              {"rope_theta", m.rope_theta},
              {"rope_scaling", rope_scaling},
              {"attention_bias", true},
              {"attention_dropout", 0.0},
              {"sliding_window", m.sliding_window > 0 ? json(m.sliding_window) : json(nullptr)},
              {"layer_types", layer_types},
              {"num_local_experts", e.experts},
              {"num_experts_per_tok", e.top_k},
              {"router_aux_loss_coef", e.aux_loss},
              {"output_router_logits", false},
              {"swiglu_limit", e.swiglu_limit},
              {"swiglu_alpha", e.swiglu_alpha},
              {"tie_word_embeddings", m.tie_embeddings},
              {"use_cache", true},
              {"bos_token_id", token_id(bos)},
              {"eos_token_id", token_id(eos)},
              {"torch_dtype", torch_dtype}};
}

// The llama family's variants as the transformers class that has exactly them: q/k norms are
// Qwen3 (Qwen3-MoE with experts), q/k/v biases Qwen2, a sliding window Mistral, experts without
// q/k norms Mixtral, none of them Llama.
json hf_llama_family_config(const ModelConfig& m, const std::string& torch_dtype, int32_t bos, int32_t eos) {
  const bool own_head_dim = m.head_dim > 0 && m.head_dim * m.heads != m.hidden;
  auto refuse = [&](const std::string& what, const std::string& why) {
    throw Error(
        fmt::format("not supported yet: exporting a llama-family model with {}: {}", what, why),
        "transformers' Llama, Qwen2, Qwen3, Qwen3-MoE, Qwen2-MoE and Mistral classes each hold one set of these "
        "options (docs/hf.md lists them)");
  };
  const std::string type = hf_model_type(m);
  if (type == "gemma3_text") return hf_gemma3_config(m, torch_dtype, bos, eos);
  if (type == "gpt_oss") return hf_gpt_oss_config(m, torch_dtype, bos, eos);
  if (m.o_bias)
    throw Error(
        "not supported yet: exporting a model with model.o_bias (a bias on o_proj) without gpt-oss's other "
        "options: LlamaForCausalLM's attention_bias, the class with one, is not exported yet",
        "train and evaluate it with llmtrain; export a model without model.o_bias, or with all of gpt-oss's");
  std::string arch = "LlamaForCausalLM";
  if (type == "qwen2_moe") {
    arch = "Qwen2MoeForCausalLM";
    if (!m.qkv_bias) refuse("a shared expert without qkv_bias", "Qwen2-MoE's q, k and v projections have biases");
    if (m.qk_norm) refuse("a shared expert and qk_norm", "Qwen2-MoE has no q/k norms");
    if (m.sliding_window > 0) refuse("a shared expert and sliding_window", "Qwen2-MoE windows only some layers");
    if (own_head_dim) refuse(fmt::format("head_dim {}", m.head_dim), "Qwen2-MoE's head size is hidden / heads");
  } else if (type == "qwen3_moe") {
    arch = "Qwen3MoeForCausalLM";
    if (m.qkv_bias) refuse("qk_norm, experts and qkv_bias", "Qwen3-MoE's attention_bias also puts a bias on o_proj");
    if (m.sliding_window > 0) refuse("qk_norm, experts and sliding_window", "Qwen3-MoE windows only some layers");
  } else if (type == "mixtral") {
    arch = "MixtralForCausalLM";
    auto refuse_moe = [&](const std::string& key, const std::string& found, const std::string& why) {
      throw Error(
          fmt::format("not supported yet: exporting a mixture-of-experts model with {} {}: {}", key, found, why),
          "transformers' MixtralForCausalLM has a MoE block with renormalised top-k weights on every layer, "
          "and Mistral's attention; a model with model.qk_norm exports as Qwen3MoeForCausalLM, which holds "
          "dense layers and unnormalised weights (docs/hf.md)");
    };
    if (m.moe.first_dense > 0)
      refuse_moe("model.moe.first_dense", std::to_string(m.moe.first_dense), "Mixtral has no dense layers");
    if (m.moe.every > 1) refuse_moe("model.moe.every", std::to_string(m.moe.every), "Mixtral has no dense layers");
    if (!m.moe.renormalize)
      refuse_moe("model.moe.renormalize", "false", "Mixtral always renormalises the top-k router weights");
    if (m.qkv_bias) refuse_moe("model.qkv_bias", "true", "Mixtral's attention has no biases");
  } else if (type == "qwen3") {
    arch = "Qwen3ForCausalLM";
    if (m.qkv_bias) refuse("qk_norm and qkv_bias", "Qwen3's attention_bias also puts a bias on o_proj");
    if (m.sliding_window > 0) refuse("qk_norm and sliding_window", "Qwen3 windows only some layers");
  } else if (type == "qwen2") {
    arch = "Qwen2ForCausalLM";
    if (m.sliding_window > 0) refuse("qkv_bias and sliding_window", "Qwen2 windows only some layers");
    if (own_head_dim) refuse(fmt::format("head_dim {}", m.head_dim), "Qwen2's head size is hidden / heads");
  } else if (type == "mistral") {
    arch = "MistralForCausalLM";
  }
  json c = {{"architectures", {arch}},
            {"model_type", type},
            {"vocab_size", m.vocab},
            {"hidden_size", m.hidden},
            {"intermediate_size", type == "mixtral" ? m.moe.ffn_hidden : m.ffn_hidden},
            {"num_hidden_layers", m.layers},
            {"num_attention_heads", m.heads},
            {"num_key_value_heads", m.kv_heads},
            {"hidden_act", "silu"},
            {"max_position_embeddings", m.max_positions},
            {"initializer_range", m.init_std},
            {"rms_norm_eps", m.norm_eps},
            {"rope_theta", m.rope_theta},
            {"rope_scaling", hf_rope_scaling(m.rope_scaling)},
            {"attention_dropout", 0.0},
            {"tie_word_embeddings", m.tie_embeddings},
            {"use_cache", true},
            {"bos_token_id", token_id(bos)},
            {"eos_token_id", token_id(eos)},
            {"torch_dtype", torch_dtype}};
  if (type == "llama") {
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
    c["pretraining_tp"] = 1;
  }
  if (type == "qwen3" || type == "qwen3_moe") c["attention_bias"] = false;
  if (type == "qwen2" || type == "qwen3" || type == "qwen3_moe" || type == "qwen2_moe") {
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
    c["max_window_layers"] = m.layers;
  }
  if (type == "mistral") c["sliding_window"] = m.sliding_window;
  if (type == "mixtral") {
    // model.moe.z_loss and capacity_factor are training-only terms; Mixtral has neither (docs/hf.md).
    c["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json(nullptr);
    c["num_local_experts"] = m.moe.experts;
    c["num_experts_per_tok"] = m.moe.top_k;
    c["router_aux_loss_coef"] = m.moe.aux_loss;
    c["router_jitter_noise"] = 0.0;
    c["output_router_logits"] = false;
  }
  if (type == "qwen3_moe" || type == "qwen2_moe") {
    // Every dense layer listed in mlp_only_layers (decoder_sparse_step 1): any first_dense / every
    // pattern, exactly. z_loss and capacity_factor are training-only terms Qwen3-MoE has not.
    json dense = json::array();
    for (int l = 0; l < m.layers; ++l)
      if (!m.moe.layer(l)) dense.push_back(l);
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = dense;
    c["moe_intermediate_size"] = m.moe.ffn_hidden;
    c["num_experts"] = m.moe.experts;
    c["num_experts_per_tok"] = m.moe.top_k;
    c["norm_topk_prob"] = m.moe.renormalize;
    c["router_aux_loss_coef"] = m.moe.aux_loss;
    c["output_router_logits"] = false;
  }
  if (type == "qwen2_moe") {
    c["shared_expert_intermediate_size"] = m.moe.shared_ffn_hidden;
    c["qkv_bias"] = true;  // transformers 5's Qwen2MoeConfig key (4.x always has the biases)
  }
  // transformers 4.40's Llama has no head_dim (it is hidden / heads): written where it differs or
  // where the class always had it.
  if (own_head_dim || type == "qwen3" || type == "qwen3_moe" || type == "mistral") c["head_dim"] = m.head_size();
  return c;
}

}  // namespace

json hf_model_config(const ModelConfig& m, const std::string& torch_dtype, int32_t bos, int32_t eos) {
  if (m.family == ModelFamily::gpt2) {
    if (m.kv_heads != m.heads)
      throw Error(fmt::format("model.kv_heads is {} and model.heads {}: transformers' GPT2Config has no grouped-query "
                              "attention",
                              m.kv_heads, m.heads),
                  "export a GPT-2 model with kv_heads = heads, or train the llama family");
    return json{{"architectures", {"GPT2LMHeadModel"}},
                {"model_type", "gpt2"},
                {"vocab_size", m.vocab},
                {"n_positions", m.max_positions},
                {"n_ctx", m.max_positions},
                {"n_embd", m.hidden},
                {"n_layer", m.layers},
                {"n_head", m.heads},
                {"n_inner", m.ffn_hidden},
                {"activation_function", "gelu_new"},
                {"resid_pdrop", 0.0},
                {"embd_pdrop", 0.0},
                {"attn_pdrop", 0.0},
                {"layer_norm_epsilon", m.norm_eps},
                {"initializer_range", m.init_std},
                {"scale_attn_weights", true},
                {"scale_attn_by_inverse_layer_idx", false},
                {"reorder_and_upcast_attn", false},
                {"tie_word_embeddings", m.tie_embeddings},
                {"use_cache", true},
                {"bos_token_id", token_id(bos)},
                {"eos_token_id", token_id(eos)},
                {"torch_dtype", torch_dtype}};
  }
  return hf_llama_family_config(m, torch_dtype, bos, eos);
}

json hf_generation_config(int32_t bos, int32_t eos) {
  return json{{"_from_model_config", true}, {"bos_token_id", token_id(bos)}, {"eos_token_id", token_id(eos)}};
}

}  // namespace llmtrain::trainer
