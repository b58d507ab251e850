// The Hugging Face bridge's layouts and config reading (tests/e2e/hf.sh checks the files against
// transformers itself; these pin the conventions and the refusals, quickly).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "common/error.h"
#include "trainer/checkpoint/hf_bridge.h"
#include "trainer/data/byte_tokenizer.h"
#include "trainer/data/tokenizer.h"
#include "trainer/data/tokenizer_load.h"

namespace llmtrain::trainer {
namespace {

using nlohmann::json;

ModelConfig small(ModelFamily family) {
  ModelConfig m;
  m.family = family;
  m.layers = 1;
  m.hidden = 8;
  m.heads = 2;
  m.kv_heads = family == ModelFamily::llama ? 1 : 2;
  m.ffn_hidden = 24;
  m.vocab = 300;
  m.vocab_pad = 128;  // padded to 384 rows
  m.seq_len = m.max_positions = 16;
  m.tie_embeddings = family == ModelFamily::gpt2;
  return m;
}

const ParamSpec& spec(const std::vector<ParamSpec>& specs, ParamRole role) {
  for (const auto& p : specs)
    if (p.role == role) return p;
  throw std::runtime_error("no such role");
}

// Conv1D holds [in, out]: transformers' c_attn.weight[i][j] is the weight from input channel i to
// output j, where outputs 0..d-1 are q, d..2d-1 k, 2d..3d-1 v; ours is qkv[j / d][j % d][i].
TEST(HfBridge, Gpt2Conv1DWeightsAreTransposed) {
  const ModelConfig m = small(ModelFamily::gpt2);
  const auto specs = model_param_specs(m);
  const ParamSpec& qkv = spec(specs, ParamRole::qkv_weight);
  std::vector<float> ours(static_cast<size_t>(qkv.numel()));
  for (size_t i = 0; i < ours.size(); ++i) ours[i] = float(i);
  const HfTensorLayout l = hf_tensor_layout(m, qkv);
  EXPECT_EQ(l.shape, (std::vector<int64_t>{8, 24}));
  const std::vector<float> hf = to_hf_layout(l, qkv, ours.data());
  const int64_t d = 8;
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < 3 * d; ++j)
      ASSERT_EQ(hf[size_t(i * 3 * d + j)], ours[size_t((j / d) * d * d + (j % d) * d + i)]) << i << "," << j;
  EXPECT_EQ(hf_tensor_layout(m, spec(specs, ParamRole::mlp_in_weight)).shape, (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(hf_tensor_layout(m, spec(specs, ParamRole::qkv_bias)).shape, (std::vector<int64_t>{24}));
}

// LLaMA's nn.Linear weights are ours as they are; both families drop the vocabulary's padding.
TEST(HfBridge, RoundTripEveryTensorAndTrimTheVocabulary) {
  for (ModelFamily family : {ModelFamily::gpt2, ModelFamily::llama}) {
    const ModelConfig m = small(family);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (const ParamSpec& p : model_param_specs(m)) {
      const HfTensorLayout l = hf_tensor_layout(m, p);
      std::vector<float> ours(static_cast<size_t>(p.numel()));
      for (auto& x : ours) x = normal(rng);
      if (l.keep_rows >= 0) {
        EXPECT_EQ(l.shape[0], 300) << p.name;
        std::fill(ours.begin() + 300 * p.shape[1], ours.end(), 0.0f);  // padding rows are zero
      }
      if (family == ModelFamily::llama) {
        EXPECT_FALSE(l.transpose) << p.name;
      }
      const std::vector<float> hf = to_hf_layout(l, p, ours.data());
      std::vector<float> back(ours.size(), 7.0f);
      from_hf_layout(l, p, hf.data(), back.data());
      EXPECT_EQ(back, ours) << p.name;
    }
  }
}

TEST(HfBridge, ReadsWhatItWrites) {
  for (ModelFamily family : {ModelFamily::gpt2, ModelFamily::llama}) {
    ModelConfig m = small(family);
    m.norm_eps = 1e-6;
    m.rope_theta = 500000.0;
    const HfImportedConfig back = hf_read_model_config(hf_model_config(m, "float32", 256, 256), "config.json");
    EXPECT_EQ(back.model.family, m.family);
    EXPECT_EQ(back.model.layers, m.layers);
    EXPECT_EQ(back.model.hidden, m.hidden);
    EXPECT_EQ(back.model.heads, m.heads);
    EXPECT_EQ(back.model.kv_heads, m.kv_heads);
    EXPECT_EQ(back.model.ffn_hidden, m.ffn_hidden);
    EXPECT_EQ(back.model.vocab, m.vocab);
    EXPECT_EQ(back.model.max_positions, m.max_positions);
    EXPECT_EQ(back.model.norm_eps, m.norm_eps);
    EXPECT_EQ(back.model.tie_embeddings, m.tie_embeddings);
    if (family == ModelFamily::llama) {
      EXPECT_EQ(back.model.rope_theta, m.rope_theta);
    }
    EXPECT_EQ(back.eos, 256);
    EXPECT_TRUE(back.warnings.empty());
  }
}

std::string refusal(const json& j) {
  try {
    hf_read_model_config(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfBridge, RefusesWhatItDoesNotImplementNamingEachField) {
  json llama = hf_model_config(small(ModelFamily::llama), "float32", -1, -1);
  json j = llama;
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 8.0}};
  j["mlp_bias"] = true;
  j["hidden_act"] = "gelu";
  j["sliding_window"] = 4096;
  const std::string msg = refusal(j);
  EXPECT_NE(msg.find("rope_scaling.rope_type: found \"longrope\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("mlp_bias: found true"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hidden_act: found \"gelu\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("sliding_window: found 4096, llmtrain supports no such field"), std::string::npos) << msg;

  json gpt2 = hf_model_config(small(ModelFamily::gpt2), "float32", -1, -1);
  j = gpt2;
  j["scale_attn_by_inverse_layer_idx"] = true;
  j["activation_function"] = "relu";
  EXPECT_NE(refusal(j).find("scale_attn_by_inverse_layer_idx: found true"), std::string::npos);
  EXPECT_NE(refusal(j).find("activation_function: found \"relu\""), std::string::npos);
  j = gpt2;
  j["model_type"] = "falcon";
  EXPECT_NE(refusal(j).find("model_type is \"falcon\""), std::string::npos);
}

// The llama family's variants written as the transformers class that has them, and read back.
TEST(HfBridge, VariantsTravelAsTheirTransformersClass) {
  struct Case {
    const char* arch;
    void (*set)(ModelConfig&);
  };
  const Case cases[] = {
      {"LlamaForCausalLM",
       [](ModelConfig& m) {
         m.rope_scaling = {RopeScalingType::llama3, 8.0, 1.0, 4.0, 8192};
         m.head_dim = 6;  // not hidden / heads = 4
       }},
      {"LlamaForCausalLM",
       [](ModelConfig& m) {
         m.rope_scaling = {RopeScalingType::linear, 2.0, 1.0, 4.0, 8192};
       }},
      {"Qwen2ForCausalLM", [](ModelConfig& m) { m.qkv_bias = true; }},
      {"Qwen3ForCausalLM",
       [](ModelConfig& m) {
         m.qk_norm = true;
         m.head_dim = 8;
       }},
      {"MistralForCausalLM", [](ModelConfig& m) { m.sliding_window = 5; }},
  };
  for (const Case& c : cases) {
    ModelConfig m = small(ModelFamily::llama);
    c.set(m);
    const json j = hf_model_config(m, "float32", -1, -1);
    EXPECT_EQ(j["architectures"][0], c.arch);
    const ModelConfig back = hf_read_model_config(j, "config.json").model;
    EXPECT_EQ(back.head_size(), m.head_size()) << c.arch;
    EXPECT_EQ(back.qkv_bias, m.qkv_bias) << c.arch;
    EXPECT_EQ(back.qk_norm, m.qk_norm) << c.arch;
    EXPECT_EQ(back.sliding_window, m.sliding_window) << c.arch;
    EXPECT_EQ(back.rope_scaling.type, m.rope_scaling.type) << c.arch;
    EXPECT_EQ(back.rope_scaling.factor, m.rope_scaling.factor) << c.arch;
    EXPECT_EQ(back.rope_scaling.original_max_positions, m.rope_scaling.original_max_positions) << c.arch;
  }
  ModelConfig both = small(ModelFamily::llama);
  both.qk_norm = both.qkv_bias = true;
  EXPECT_THROW(hf_model_config(both, "float32", -1, -1), Error);  // Qwen3's attention_bias biases o_proj too
}

// transformers 5 writes RoPE as rope_parameters (theta inside) and the dtype as `dtype`.
TEST(HfBridge, ReadsTransformers5Spellings) {
  const json j = json::parse(R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "dtype": "bfloat16",
    "hidden_size": 8, "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 300, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-06, "attention_bias": false, "use_sliding_window": false, "sliding_window": null,
    "max_window_layers": 28, "layer_types": ["full_attention", "full_attention"], "tie_word_embeddings": false,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  const ModelConfig m = hf_read_model_config(j, "config.json").model;
  EXPECT_EQ(m.rope_theta, 500000.0);
  EXPECT_EQ(m.rope_scaling.type, RopeScalingType::llama3);
  EXPECT_EQ(m.rope_scaling.factor, 32.0);
  EXPECT_TRUE(m.qk_norm);
  EXPECT_EQ(m.head_size(), 8);
  json windowed = j;
  windowed["use_sliding_window"] = true;
  windowed["layer_types"] = {"full_attention", "sliding_attention"};
  windowed["rope_parameters"]["mrope_section"] = {1, 2};
  windowed["rope_theta"] = 10000.0;
  const std::string msg = refusal(windowed);
  EXPECT_NE(msg.find("use_sliding_window: found true"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer_types: found"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rope_parameters.mrope_section: found"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rope_theta: found 10000.0"), std::string::npos) << msg;
}

// Mixtral: model.moe's block on every layer. The configs are as transformers 4.40.2 and 5.24 save a
// MixtralForCausalLM (MixtralConfig's fields, 4.x's rope_theta and torch_dtype, 5.x's
// rope_parameters, dtype and head_dim null).
TEST(HfBridge, MixtralIsTheLlamaFamilyWithMoeOnEveryLayer) {
  const json v4 = json::parse(R"({"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
    "intermediate_size": 96, "max_position_embeddings": 128, "model_type": "mixtral", "num_attention_heads": 4,
    "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 2, "num_local_experts": 4,
    "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "router_jitter_noise": 0.0, "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "float32",
    "transformers_version": "4.40.2", "use_cache": true, "vocab_size": 300})");
  json v5 = v4;
  v5.erase("rope_theta");
  v5.erase("torch_dtype");
  v5["rope_parameters"] = {{"rope_theta", 1000000.0}, {"rope_type", "default"}};
  v5["dtype"] = "float32";
  v5["head_dim"] = nullptr;
  v5["pad_token_id"] = nullptr;
  v5["sliding_window"] = 16;
  for (const json& j : {v4, v5}) {
    const ModelConfig m = hf_read_model_config(j, "config.json").model;
    EXPECT_EQ(m.family, ModelFamily::llama);
    EXPECT_EQ(m.rope_theta, 1000000.0);
    EXPECT_EQ(m.head_size(), 16);
    EXPECT_EQ(m.moe.experts, 4);
    EXPECT_EQ(m.moe.top_k, 2);
    EXPECT_EQ(m.moe.ffn_hidden, 96);
    EXPECT_EQ(m.moe.every, 1);
    EXPECT_EQ(m.moe.first_dense, 0);
    EXPECT_TRUE(m.moe.renormalize);
    EXPECT_EQ(m.moe.capacity_factor, 0.0);
    EXPECT_EQ(m.moe.aux_loss, 0.001);  // carried over as it is
    EXPECT_EQ(m.moe.z_loss, 0.0);      // Mixtral has none
    EXPECT_EQ(m.sliding_window, j["sliding_window"].is_null() ? 0 : 16);
    for (int i = 0; i < m.layers; ++i) EXPECT_TRUE(m.moe.layer(i));
    // Export writes it back as Mixtral, in 4.x's spelling, and reads as the same model.
    const json out = hf_model_config(m, "float32", -1, -1);
    EXPECT_EQ(out["architectures"][0], "MixtralForCausalLM");
    EXPECT_EQ(out["model_type"], "mixtral");
    EXPECT_EQ(out["num_local_experts"], 4);
    EXPECT_EQ(out["num_experts_per_tok"], 2);
    EXPECT_EQ(out["intermediate_size"], 96);
    EXPECT_EQ(out["rope_theta"], 1000000.0);
    EXPECT_FALSE(out.contains("head_dim"));
    const ModelConfig back = hf_read_model_config(out, "config.json").model;
    EXPECT_EQ(back.moe.experts, 4);
    EXPECT_EQ(back.moe.top_k, 2);
    EXPECT_EQ(back.moe.ffn_hidden, 96);
    EXPECT_EQ(back.moe.aux_loss, 0.001);
    EXPECT_EQ(back.sliding_window, m.sliding_window);
  }
  json bad = v4;
  bad["router_jitter_noise"] = 0.1;
  bad["num_experts_per_tok"] = 5;
  bad["moe_layer_freq"] = 2;  // an option Mixtral does not have: unknown, so refused
  const std::string msg = refusal(bad);
  EXPECT_NE(msg.find("router_jitter_noise: found 0.1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("num_experts_per_tok: found 5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("moe_layer_freq: found 2"), std::string::npos) << msg;
  json no_experts = v4;
  no_experts.erase("num_local_experts");
  EXPECT_NE(refusal(no_experts).find("num_local_experts: found missing"), std::string::npos);
}

// transformers 5's in-memory MoE layout (save_pretrained(save_original_format=False)): mlp.gate,
// experts.gate_up_proj [E, 2f, d] holding expert e's w1 then w3, experts.down_proj [E, d, f].
TEST(HfBridge, MixtralFusedExpertsAreFoundByOffset) {
  ModelConfig m = small(ModelFamily::llama);
  m.layers = 2;
  m.moe.experts = 3;
  m.moe.ffn_hidden = 12;
  const int64_t d = m.hidden, f = 12;
  int seen = 0;
  for (const ParamSpec& p : model_param_specs(m)) {
    const HfTensorLayout l = hf_tensor_layout(m, p);
    EXPECT_EQ(l.name, p.name);  // the per-expert names are the files' (4.40.2 and 5.x's default)
    const std::string layer = fmt::format("model.layers.{}.mlp.", p.layer);
    switch (p.role) {
      case ParamRole::moe_router_weight:
        EXPECT_EQ(l.fused_name, layer + "gate.weight");
        EXPECT_EQ(l.fused_offset, 0);
        break;
      case ParamRole::moe_gate_weight:
      case ParamRole::moe_up_weight:
        EXPECT_EQ(l.fused_name, layer + "experts.gate_up_proj");
        EXPECT_EQ(l.fused_shape, (std::vector<int64_t>{3, 2 * f, d}));
        EXPECT_EQ(l.fused_offset, (2 * p.expert + (p.role == ParamRole::moe_up_weight)) * f * d);
        break;
      case ParamRole::moe_down_weight:
        EXPECT_EQ(l.fused_name, layer + "experts.down_proj");
        EXPECT_EQ(l.fused_shape, (std::vector<int64_t>{3, d, f}));
        EXPECT_EQ(l.fused_offset, p.expert * d * f);
        break;
      default:
        EXPECT_TRUE(l.fused_name.empty()) << p.name;
        continue;
    }
    ++seen;
  }
  EXPECT_EQ(seen, 2 * (1 + 3 * 3));
}

// Qwen3-MoE: Qwen3's attention (q/k norms, its own head size) with MoE blocks. Its layer set
// (decoder_sparse_step, mlp_only_layers) becomes model.moe's first_dense / every; export lists every
// dense layer in mlp_only_layers, so any pattern travels; a set llmtrain cannot hold is refused by name.
TEST(HfBridge, Qwen3MoeIsQwen3WithMoeBlocks) {
  const json v5 = json::parse(R"({"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": null, "decoder_sparse_step": 1, "dtype": "float32",
    "eos_token_id": null, "head_dim": 32, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
    "intermediate_size": 176, "max_position_embeddings": 128, "mlp_only_layers": [0], "model_type": "qwen3_moe",
    "moe_intermediate_size": 48, "norm_topk_prob": false, "num_attention_heads": 4, "num_experts": 8,
    "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_key_value_heads": 2, "output_router_logits": false,
    "pad_token_id": null, "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
    "transformers_version": "5.24.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 300})");
  const ModelConfig m = hf_read_model_config(v5, "config.json").model;
  EXPECT_EQ(m.family, ModelFamily::llama);
  EXPECT_TRUE(m.qk_norm);
  EXPECT_FALSE(m.qkv_bias);
  EXPECT_EQ(m.head_size(), 32);
  EXPECT_EQ(m.ffn_hidden, 176);  // the dense layer's MLP
  EXPECT_EQ(m.moe.experts, 8);
  EXPECT_EQ(m.moe.top_k, 2);
  EXPECT_EQ(m.moe.ffn_hidden, 48);
  EXPECT_FALSE(m.moe.renormalize);
  EXPECT_EQ(m.moe.first_dense, 1);
  EXPECT_EQ(m.moe.every, 1);
  EXPECT_EQ(m.moe.aux_loss, 0.001);
  EXPECT_EQ(m.moe.z_loss, 0.0);
  EXPECT_EQ(hf_model_type(m), "qwen3_moe");
  const json out = hf_model_config(m, "float32", -1, -1);
  EXPECT_EQ(out["architectures"][0], "Qwen3MoeForCausalLM");
  EXPECT_EQ(out["mlp_only_layers"], json::array({0}));
  EXPECT_EQ(out["decoder_sparse_step"], 1);
  EXPECT_EQ(out["moe_intermediate_size"], 48);
  EXPECT_EQ(out["intermediate_size"], 176);
  EXPECT_EQ(out["norm_topk_prob"], false);
  EXPECT_EQ(out["head_dim"], 32);
  const ModelConfig back = hf_read_model_config(out, "config.json").model;
  EXPECT_EQ(back.moe.first_dense, 1);
  EXPECT_EQ(back.moe.every, 1);
  EXPECT_EQ(back.moe.ffn_hidden, 48);
  EXPECT_FALSE(back.moe.renormalize);
  // The tensors under Qwen3-MoE's names (4.x per expert; 5.x fused at the same offsets as Mixtral).
  int experts = 0;
  for (const ParamSpec& p : model_param_specs(m)) {
    const HfTensorLayout l = hf_tensor_layout(m, p);
    const std::string mlp = fmt::format("model.layers.{}.mlp.", p.layer);
    if (p.role == ParamRole::moe_router_weight) EXPECT_EQ(l.name, mlp + "gate.weight");
    if (p.role == ParamRole::moe_gate_weight)
      EXPECT_EQ(l.name, fmt::format("{}experts.{}.gate_proj.weight", mlp, p.expert));
    if (p.role == ParamRole::moe_up_weight)
      EXPECT_EQ(l.name, fmt::format("{}experts.{}.up_proj.weight", mlp, p.expert));
    if (p.role == ParamRole::moe_down_weight) {
      EXPECT_EQ(l.name, fmt::format("{}experts.{}.down_proj.weight", mlp, p.expert));
      EXPECT_EQ(l.fused_name, mlp + "experts.down_proj");
      ++experts;
    }
  }
  EXPECT_EQ(experts, 2 * 8);
  // decoder_sparse_step k: layers k − 1, 2k − 1, ... (first_dense k − 1, every k).
  json step = v5;
  step["num_hidden_layers"] = 6;
  step["decoder_sparse_step"] = 2;
  step["mlp_only_layers"] = json::array();
  const ModelConfig s2 = hf_read_model_config(step, "config.json").model;
  EXPECT_EQ(s2.moe.first_dense, 1);
  EXPECT_EQ(s2.moe.every, 2);
  for (int l = 0; l < 6; ++l) EXPECT_EQ(s2.moe.layer(l), (l + 1) % 2 == 0) << l;
  EXPECT_EQ(hf_model_config(s2, "float32", -1, -1)["mlp_only_layers"], json::array({0, 2, 4}));
  // A dense layer between MoE blocks that no first_dense / every pattern holds.
  json holes = v5;
  holes["num_hidden_layers"] = 4;
  holes["mlp_only_layers"] = json::array({2});
  try {
    hf_read_model_config(holes, "config.json");
    ADD_FAILURE() << "mlp_only_layers [2] accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mlp_only_layers: found [2]"), std::string::npos) << e.what();
  }
  json bias = v5;
  bias["attention_bias"] = true;
  EXPECT_THROW(hf_read_model_config(bias, "config.json"), Error);
}

// Qwen2-MoE: Qwen2's attention (q/k/v biases) with Qwen3-MoE's blocks and a gated shared expert
// (shared_expert_intermediate_size): config and tensor names both ways; a shared expert without the
// biases (5.x's qkv_bias false) is refused by name, and so is exporting one.
TEST(HfBridge, Qwen2MoeHasAGatedSharedExpert) {
  const json v5 = json::parse(R"({"architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": null, "decoder_sparse_step": 1, "dtype": "float32", "eos_token_id": null, "hidden_act": "silu",
    "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 176, "layer_types": ["full_attention",
    "full_attention", "full_attention"], "max_position_embeddings": 128, "max_window_layers": 28,
    "mlp_only_layers": [0], "model_type": "qwen2_moe", "moe_intermediate_size": 48, "norm_topk_prob": false,
    "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 3,
    "num_key_value_heads": 2, "output_router_logits": false, "pad_token_id": null, "qkv_bias": true,
    "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 96, "sliding_window": null,
    "tie_word_embeddings": false, "transformers_version": "5.24.0", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 300})");
  const ModelConfig m = hf_read_model_config(v5, "config.json").model;
  EXPECT_TRUE(m.qkv_bias);
  EXPECT_FALSE(m.qk_norm);
  EXPECT_EQ(m.moe.experts, 8);
  EXPECT_EQ(m.moe.ffn_hidden, 48);
  EXPECT_EQ(m.moe.shared_ffn_hidden, 96);
  EXPECT_EQ(m.moe.first_dense, 1);
  EXPECT_FALSE(m.moe.renormalize);
  EXPECT_EQ(hf_model_type(m), "qwen2_moe");
  const json out = hf_model_config(m, "float32", -1, -1);
  EXPECT_EQ(out["architectures"][0], "Qwen2MoeForCausalLM");
  EXPECT_EQ(out["shared_expert_intermediate_size"], 96);
  EXPECT_EQ(out["qkv_bias"], true);
  EXPECT_EQ(out["mlp_only_layers"], json::array({0}));
  const ModelConfig back = hf_read_model_config(out, "config.json").model;
  EXPECT_EQ(back.moe.shared_ffn_hidden, 96);
  EXPECT_TRUE(back.qkv_bias);
  // The shared expert's tensors under mlp., not fused; the routed experts' as Qwen3-MoE's.
  std::vector<std::string> shared;
  for (const ParamSpec& p : model_param_specs(m)) {
    const HfTensorLayout l = hf_tensor_layout(m, p);
    if (p.layer == 1 && l.name.find("shared_expert") != std::string::npos) {
      shared.push_back(l.name + (l.fused_name.empty() ? "" : " fused"));
      EXPECT_EQ(l.shape, p.shape) << p.name;
    }
    if (p.layer == 1 && p.role == ParamRole::moe_gate_weight && p.expert == 3)
      EXPECT_EQ(l.name, "model.layers.1.mlp.experts.3.gate_proj.weight");
    if (p.layer == 0 && p.role == ParamRole::mlp_gate_weight) EXPECT_EQ(l.name, "model.layers.0.mlp.gate_proj.weight");
  }
  EXPECT_EQ(shared,
            (std::vector<std::string>{
                "model.layers.1.mlp.shared_expert.gate_proj.weight", "model.layers.1.mlp.shared_expert.up_proj.weight",
                "model.layers.1.mlp.shared_expert.down_proj.weight", "model.layers.1.mlp.shared_expert_gate.weight"}));
  // Every parameter counts as active but the unvisited experts: the shared expert is every token's.
  const int64_t shared_params = 2 * (3 * 96 * 64 + 64), expert = 3 * 48 * 64;
  EXPECT_EQ(count_parameters(m) - count_active_parameters(m), 2 * 6 * expert);
  ModelConfig unshared = m;
  unshared.moe.shared_ffn_hidden = 0;
  EXPECT_EQ(count_parameters(m) - count_parameters(unshared), shared_params);
  json nobias = v5;
  nobias["qkv_bias"] = false;
  try {
    hf_read_model_config(nobias, "config.json");
    ADD_FAILURE() << "qkv_bias false accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qkv_bias: found false"), std::string::npos) << e.what();
  }
  ModelConfig plain = m;
  plain.qkv_bias = false;
  try {
    hf_model_config(plain, "float32", -1, -1);
    ADD_FAILURE() << "a shared expert without biases exported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without qkv_bias"), std::string::npos) << e.what();
  }
}

// Gemma 3 as transformers 4.50 saves gemma-3-1b (rope_local_base_freq, sliding_window_pattern):
// every option, the norms' (1 + w) as an offset of 1, back out as a config 5.x reads; Gemma 2's
// capped attention scores refused by name, and so is exporting half of Gemma's options.
TEST(HfBridge, Gemma3HasLocalAndGlobalLayers) {
  const json v4 = json::parse(R"({"architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": 1, "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
    "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
    "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})");
  const ModelConfig m = hf_read_model_config(v4, "config.json").model;
  EXPECT_EQ(m.head_size(), 256);
  EXPECT_TRUE(m.qk_norm && m.post_norms && m.scale_embeddings && m.tie_embeddings);
  EXPECT_EQ(m.activation, MlpActivation::geglu);
  EXPECT_EQ(m.sliding_window, 512);
  EXPECT_EQ(m.full_attention_every, 6);
  EXPECT_TRUE(m.windowed(0) && m.windowed(4) && !m.windowed(5) && m.windowed(6) && !m.windowed(11));
  EXPECT_EQ(m.rope_theta, 1e6);
  EXPECT_EQ(m.rope_local_theta, 10000);
  EXPECT_EQ(m.query_pre_attn_scalar, 0);  // 256 = the head size: the default scale
  EXPECT_EQ(m.logit_softcap, 0);
  EXPECT_EQ(hf_model_type(m), "gemma3_text");
  ModelConfig scaled = m;
  scaled.query_pre_attn_scalar = 168;  // Gemma 3 27B's hidden / heads
  scaled.logit_softcap = 30;
  scaled.rope_scaling.type = RopeScalingType::linear;
  scaled.rope_scaling.factor = 8;
  const json out = hf_model_config(scaled, "float32", 2, 1);
  EXPECT_EQ(out["architectures"][0], "Gemma3ForCausalLM");
  EXPECT_TRUE(out["query_pre_attn_scalar"].is_number_integer());
  EXPECT_EQ(out["query_pre_attn_scalar"], 168);
  EXPECT_EQ(out["final_logit_softcapping"], 30.0);
  EXPECT_EQ(out["sliding_window_pattern"], 6);
  EXPECT_EQ(out["layer_types"][5], "full_attention");
  EXPECT_EQ(out["layer_types"][6], "sliding_attention");
  const ModelConfig back = hf_read_model_config(out, "config.json").model;
  EXPECT_EQ(back.query_pre_attn_scalar, 168);
  EXPECT_EQ(back.logit_softcap, 30);
  EXPECT_EQ(back.full_attention_every, 6);
  EXPECT_EQ(back.rope_local_theta, 10000);
  EXPECT_EQ(back.rope_scaling.type, RopeScalingType::linear);
  EXPECT_EQ(back.rope_scaling.factor, 8);
  // Four norms a block under Gemma's names, each (like the q/k and final norms) offset by 1.
  std::vector<std::string> norms;
  for (const ParamSpec& p : model_param_specs(m)) {
    const HfTensorLayout l = hf_tensor_layout(m, p);
    if (l.offset != 0 && (p.layer == 2 || p.layer == -1)) norms.push_back(l.name);
    if (p.role == ParamRole::q_weight) EXPECT_EQ(l.offset, 0) << p.name;
    if (p.role == ParamRole::mlp_post_norm_weight && p.layer == 2) {
      std::vector<float> hf(size_t(p.numel()), 0.25f), ours(size_t(p.numel()));
      hf[1] = -1.0f;
      from_hf_layout(l, p, hf.data(), ours.data());
      EXPECT_EQ(ours[0], 1.25f);
      EXPECT_EQ(ours[1], 0.0f);
      EXPECT_EQ(to_hf_layout(l, p, ours.data()), hf);
    }
  }
  EXPECT_EQ(norms, (std::vector<std::string>{
                       "model.layers.2.input_layernorm.weight", "model.layers.2.self_attn.q_norm.weight",
                       "model.layers.2.self_attn.k_norm.weight", "model.layers.2.post_attention_layernorm.weight",
                       "model.layers.2.pre_feedforward_layernorm.weight",
                       "model.layers.2.post_feedforward_layernorm.weight", "model.norm.weight"}));
  json capped = v4;
  capped["attn_logit_softcapping"] = 50.0;
  try {
    hf_read_model_config(capped, "config.json");
    ADD_FAILURE() << "attn_logit_softcapping accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attn_logit_softcapping: found 50.0"), std::string::npos) << e.what();
  }
  ModelConfig half = m;
  half.post_norms = false;
  try {
    hf_model_config(half, "float32", -1, -1);
    ADD_FAILURE() << "Gemma without post-norms exported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("post_norms false"), std::string::npos) << e.what();
  }
}

// YaRN as transformers 5 writes it (rope_parameters) and 4.x (rope_scaling): every field, the
// defaults transformers fills in (original_max_position_embeddings, the factor from their ratio),
// and back out.
// gpt-oss (GptOssForCausalLM) as its released config.json spells it (transformers 4.55: rope_theta
// beside rope_scaling, experts_per_token, initial_context_length) and as 5.x saves it: sinks,
// biases on q/k/v/o, the router and the experts, the clamped SwiGLU, alternating layers, YaRN.
TEST(HfBridge, GptOssHasSinksBiasedExpertsAndAlternatingLayers) {
  const json v4 = json::parse(R"({"architectures": ["GptOssForCausalLM"], "attention_bias": true,
    "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 4, "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": false,
    "pad_token_id": 199999, "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0,
    "factor": 32.0, "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": false, "transformers_version": "4.55.0.dev0", "use_cache": true, "vocab_size": 201088})");
  const ModelConfig m = hf_read_model_config(v4, "config.json").model;
  EXPECT_TRUE(m.attention_sinks && m.qkv_bias && m.o_bias && m.moe.bias);
  EXPECT_FALSE(m.qk_norm);
  EXPECT_EQ(m.head_size(), 64);
  EXPECT_EQ(m.head_dim, 64);  // not 2880 / 64
  EXPECT_EQ(m.sliding_window, 128);
  EXPECT_EQ(m.full_attention_every, 2);
  EXPECT_TRUE(m.windowed(0));
  EXPECT_FALSE(m.windowed(1));
  EXPECT_EQ(m.rope_theta, 150000);
  EXPECT_EQ(m.rope_scaling.type, RopeScalingType::yarn);
  EXPECT_EQ(m.rope_scaling.factor, 32);
  EXPECT_EQ(m.rope_scaling.original_max_positions, 4096);
  EXPECT_FALSE(m.rope_scaling.truncate);
  EXPECT_EQ(m.moe.experts, 32);
  EXPECT_EQ(m.moe.top_k, 4);
  EXPECT_EQ(m.moe.ffn_hidden, 2880);
  EXPECT_TRUE(m.moe.renormalize);
  EXPECT_EQ(m.moe.every, 1);
  EXPECT_EQ(m.moe.aux_loss, 0.9);
  EXPECT_EQ(m.moe.swiglu_limit, 7.0);
  EXPECT_EQ(m.moe.swiglu_alpha, 1.702);
  EXPECT_EQ(hf_model_type(m), "gpt_oss");
  // GptOssConfig's defaults where the config is silent: YaRN, theta 150000, window 128, alternating.
  json bare = v4;
  for (const char* key : {"rope_scaling", "rope_theta", "layer_types", "sliding_window", "swiglu_limit"})
    bare.erase(key);
  const ModelConfig d = hf_read_model_config(bare, "config.json").model;
  EXPECT_EQ(d.rope_theta, 150000);
  EXPECT_EQ(d.rope_scaling.type, RopeScalingType::yarn);
  EXPECT_EQ(d.rope_scaling.factor, 32);
  EXPECT_EQ(d.full_attention_every, 2);
  EXPECT_EQ(d.sliding_window, 128);
  EXPECT_EQ(d.moe.swiglu_limit, 7.0);
  // Export writes what import reads, RoPE as the released config spells it.
  ModelConfig small_m = m;
  small_m.vocab = 300;
  const json out = hf_model_config(small_m, "bfloat16", 0, 0);
  EXPECT_EQ(out["architectures"][0], "GptOssForCausalLM");
  EXPECT_EQ(out["attention_bias"], true);
  EXPECT_EQ(out["intermediate_size"], 2880);
  EXPECT_EQ(out["layer_types"][2], "sliding_attention");
  EXPECT_EQ(out["rope_scaling"]["rope_type"], "yarn");
  EXPECT_EQ(out["swiglu_limit"], 7.0);
  const ModelConfig back = hf_read_model_config(out, "config.json").model;
  EXPECT_EQ(back.rope_scaling.factor, 32);
  EXPECT_EQ(back.full_attention_every, 2);
  EXPECT_EQ(back.moe.aux_loss, 0.9);
  EXPECT_TRUE(back.moe.bias && back.attention_sinks);
  ModelConfig unscaled = small_m;
  unscaled.rope_scaling = {};  // GptOssConfig's own default is YaRN: "default" must be written
  EXPECT_EQ(hf_model_config(unscaled, "float32", 0, 0)["rope_scaling"]["rope_type"], "default");
  EXPECT_EQ(hf_read_model_config(hf_model_config(unscaled, "float32", 0, 0), "c").model.rope_scaling.type,
            RopeScalingType::none);
  // Refusals: the released MXFP4 experts, a top-k the two keys disagree on; an export without the
  // experts' biases.
  json mxfp4 = v4;
  mxfp4["quantization_config"] = {{"quant_method", "mxfp4"}};
  json disagree = v4;
  disagree["experts_per_token"] = 2;
  for (const auto& [bad, field] :
       {std::pair{mxfp4, "quantization_config: found"}, std::pair{disagree, "experts_per_token: found 2"}}) {
    try {
      hf_read_model_config(bad, "config.json");
      ADD_FAILURE() << field << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
  ModelConfig unbiased = small_m;
  unbiased.moe.bias = false;
  try {
    hf_model_config(unbiased, "float32", 0, 0);
    ADD_FAILURE() << "exported without expert biases";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe.bias false"), std::string::npos) << e.what();
  }
}

// gpt-oss's experts exist only fused, transposed to x @ W and with gate and up interleaved: each of
// our per-expert tensors is a strided part, read and written at the same elements.
TEST(HfBridge, GptOssExpertsAreStridedPartsOfFusedTensors) {
  ModelConfig m = small(ModelFamily::llama);
  m.attention_sinks = m.qkv_bias = m.o_bias = true;
  m.moe.experts = 3;
  m.moe.top_k = 2;
  m.moe.ffn_hidden = 5;
  m.moe.bias = true;
  m.moe.swiglu_limit = 7;
  const int64_t d = m.hidden, f = 5, e_count = 3;
  std::map<std::string, std::vector<float>> fused;
  std::map<std::string, std::vector<int>> covered;
  for (const ParamSpec& p : model_param_specs(m)) {
    if (p.layer != 0 || p.role < ParamRole::moe_router_weight) continue;
    const HfTensorLayout l = hf_tensor_layout(m, p);
    if (p.role == ParamRole::moe_router_weight || p.role == ParamRole::moe_router_bias) {
      EXPECT_EQ(l.name, std::string("model.layers.0.mlp.router.") +
                            (p.role == ParamRole::moe_router_weight ? "weight" : "bias"));
      EXPECT_FALSE(l.fused_only);
      continue;
    }
    if (p.expert < 0) continue;
    ASSERT_TRUE(l.fused_only) << p.name;
    EXPECT_EQ(l.name, l.fused_name);
    int64_t n = 1;
    for (int64_t s : l.fused_shape) n *= s;
    auto& t = fused.try_emplace(l.fused_name, size_t(n), 0.0f).first->second;
    covered.try_emplace(l.fused_name, size_t(n), 0);
    // ours[i] = a code naming (role, expert, element); written into the fused tensor and read back.
    std::vector<float> ours(size_t(p.numel()));
    for (int64_t i = 0; i < p.numel(); ++i) ours[size_t(i)] = float(1000 * int(p.role) + 100 * p.expert + i);
    to_hf_fused(l, p, ours.data(), t.data());
    std::vector<float> back(size_t(p.numel()));
    from_hf_fused(l, p, t.data(), back.data());
    EXPECT_EQ(back, ours) << p.name;
    for (int64_t i = 0; i < n; ++i) covered[l.fused_name][size_t(i)] += t[size_t(i)] != 0.0f;
  }
  const std::string x = "model.layers.0.mlp.experts.";
  ASSERT_EQ(fused.size(), 4u);
  const auto& gu = fused[x + "gate_up_proj"];  // [E, d, 2f]
  // Expert 1's gate row 3, input column 2, is column 2·3 of row 2; its up row 3 the next column.
  EXPECT_EQ(gu[size_t((1 * d + 2) * 2 * f + 6)], float(1000 * int(ParamRole::moe_gate_weight) + 100 + 3 * d + 2));
  EXPECT_EQ(gu[size_t((1 * d + 2) * 2 * f + 7)], float(1000 * int(ParamRole::moe_up_weight) + 100 + 3 * d + 2));
  const auto& down = fused[x + "down_proj"];  // [E, f, d]: ours [d, f] transposed
  EXPECT_EQ(down[size_t((2 * f + 4) * d + 1)], float(1000 * int(ParamRole::moe_down_weight) + 200 + 1 * f + 4));
  const auto& gub = fused[x + "gate_up_proj_bias"];  // [E, 2f], interleaved
  EXPECT_EQ(gub[size_t(2 * 2 * f + 2 * 4 + 1)], float(1000 * int(ParamRole::moe_up_bias) + 200 + 4));
  EXPECT_EQ(fused[x + "down_proj_bias"][size_t(1 * d + 3)], float(1000 * int(ParamRole::moe_down_bias) + 100 + 3));
  EXPECT_EQ(fused[x + "gate_up_proj"].size(), size_t(e_count * d * 2 * f));
  // Every element of every fused tensor is some parameter's (the codes are never 0 but expert 0's
  // gate element 0 of role 0, and no role is 0 here).
  for (const auto& [name, c] : covered) EXPECT_EQ(std::count(c.begin(), c.end(), 0), 0) << name;
}

TEST(HfBridge, YarnRopeTravels) {
  json j = json::parse(R"({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 300,
    "head_dim": 16, "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                        "beta_slow": 1.0, "original_max_position_embeddings": 128, "truncate": false}})");
  ModelConfig m = hf_read_model_config(j, "config.json").model;
  EXPECT_EQ(m.rope_scaling.type, RopeScalingType::yarn);
  EXPECT_EQ(m.rope_theta, 150000.0);
  EXPECT_EQ(m.rope_scaling.factor, 32.0);
  EXPECT_EQ(m.rope_scaling.original_max_positions, 128);
  EXPECT_FALSE(m.rope_scaling.truncate);
  EXPECT_EQ(m.rope_scaling.attention_factor, 0.0);  // inferred: 0.1 ln 32 + 1
  json out = hf_model_config(m, "float32", -1, -1);
  EXPECT_EQ(out["rope_scaling"]["rope_type"], "yarn");
  EXPECT_EQ(out["rope_scaling"]["truncate"], false);
  EXPECT_FALSE(out["rope_scaling"].contains("attention_factor"));
  const ModelConfig back = hf_read_model_config(out, "config.json").model;
  EXPECT_EQ(back.rope_scaling.factor, 32.0);
  EXPECT_EQ(back.rope_scaling.original_max_positions, 128);
  EXPECT_FALSE(back.rope_scaling.truncate);
  // No factor: max_position_embeddings / original; no original: max_position_embeddings; the
  // mscales and an explicit attention factor kept.
  j["rope_parameters"] = {{"rope_type", "yarn"},
                          {"rope_theta", 10000.0},
                          {"original_max_position_embeddings", 1024},
                          {"mscale", 1.0},
                          {"mscale_all_dim", 0.5},
                          {"beta_fast", nullptr},
                          {"attention_factor", nullptr}};
  m = hf_read_model_config(j, "config.json").model;
  EXPECT_EQ(m.rope_scaling.factor, 4.0);
  EXPECT_EQ(m.rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(m.rope_scaling.mscale, 1.0);
  EXPECT_EQ(m.rope_scaling.mscale_all_dim, 0.5);
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 2.0}, {"attention_factor", 1.5}};
  m = hf_read_model_config(j, "config.json").model;
  EXPECT_EQ(m.rope_scaling.original_max_positions, 4096);
  EXPECT_EQ(m.rope_scaling.attention_factor, 1.5);
  EXPECT_EQ(hf_model_config(m, "float32", -1, -1)["rope_scaling"]["attention_factor"], 1.5);
  // What yarn does not have (partial rotary, longrope's factors) is refused by name.
  j["rope_parameters"]["short_factor"] = json::array({1.0});
  try {
    hf_read_model_config(j, "config.json");
    ADD_FAILURE() << "short_factor accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rope_parameters.short_factor"), std::string::npos) << e.what();
  }
}

// What Mixtral cannot hold is refused by its recipe key; the training-only terms are not.
TEST(HfBridge, MixtralExportRefusesByKey) {
  auto moe = [] {
    ModelConfig m = small(ModelFamily::llama);
    m.layers = 2;
    m.moe.experts = 4;
    m.moe.top_k = 2;
    m.moe.ffn_hidden = 12;
    return m;
  };
  auto refused = [](const ModelConfig& m) {
    try {
      hf_model_config(m, "float32", -1, -1);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ModelConfig m = moe();
  m.moe.first_dense = 1;
  EXPECT_NE(refused(m).find("model.moe.first_dense 1"), std::string::npos) << refused(m);
  m = moe();
  m.moe.every = 2;
  EXPECT_NE(refused(m).find("model.moe.every 2"), std::string::npos) << refused(m);
  m = moe();
  m.moe.renormalize = false;
  EXPECT_NE(refused(m).find("model.moe.renormalize false"), std::string::npos) << refused(m);
  m = moe();
  m.qkv_bias = true;
  EXPECT_NE(refused(m).find("model.qkv_bias true"), std::string::npos) << refused(m);
  m = moe();
  m.moe.z_loss = 0.01;
  m.moe.capacity_factor = 1.25;
  m.sliding_window = 5;
  const json j = hf_model_config(m, "float32", -1, -1);
  EXPECT_EQ(j["intermediate_size"], 12);  // the experts' width (a Mixtral has no MLP of model.ffn_hidden)
  EXPECT_EQ(j["sliding_window"], 5);
}

TEST(HfBridge, HostileValuesAreErrorsNotCrashes) {
  json llama = hf_model_config(small(ModelFamily::llama), "float32", -1, -1);
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{{"hidden_size", -8},
                                                                            {"hidden_size", 1e30},
                                                                            {"hidden_size", "8"},
                                                                            {"num_hidden_layers", 0},
                                                                            {"vocab_size", int64_t(1) << 40},
                                                                            {"num_attention_heads", 3},
                                                                            {"num_key_value_heads", 0},
                                                                            {"rms_norm_eps", "tiny"},
                                                                            {"tie_word_embeddings", 1},
                                                                            {"rope_scaling", "llama3"},
                                                                            {"rope_scaling", json{{"factor", -1}}},
                                                                            {"head_dim", 1e9}}) {
    json j = llama;
    j[key] = value;
    EXPECT_NE(refusal(j).find(key), std::string::npos) << key << " = " << value.dump();
  }
  // Integers checked in the type they arrive in: a float is no integer (1.9 is not 1), and an
  // unsigned 2^64 − 1 is not −1.
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, json>>{{"num_hidden_layers", 2.0},
                                                 {"vocab_size", uint64_t(-1)},
                                                 {"bos_token_id", 1.5},
                                                 {"eos_token_id", uint64_t(1) << 63},
                                                 {"rope_scaling", json{{"rope_type", "llama3"},
                                                                       {"factor", 8.0},
                                                                       {"low_freq_factor", 1.0},
                                                                       {"high_freq_factor", 4.0},
                                                                       {"original_max_position_embeddings", 1.9}}}}) {
    json j = llama;
    j[key] = value;
    EXPECT_NE(refusal(j).find(key), std::string::npos) << key << " = " << value.dump();
  }
  json missing = llama;
  missing.erase("hidden_size");
  EXPECT_NE(refusal(missing).find("hidden_size: found missing"), std::string::npos);
  EXPECT_NE(refusal(json::array()).find("not a JSON object"), std::string::npos);
}

TEST(HfBridge, WeightIndexNamesOnlyFilesOfTheModelDirectory) {
  const json ok = json::parse(R"({"metadata": {"total_size": 8},
      "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  const auto map = hf_read_weight_index(ok, "index.json");
  ASSERT_EQ(map.size(), 2u);
  EXPECT_EQ(map.at("b"), "model-00002-of-00002.safetensors");
  for (const char* bad : {R"([])", R"({})", R"({"weight_map": []})", R"({"weight_map": {"a": 3}})",
                          R"({"weight_map": {"a": "../x.safetensors"}})", R"({"weight_map": {"a": "/etc/passwd"}})",
                          R"({"weight_map": {"a": "a\nb"}})", R"({"weight_map": {"a": ".."}})"})
    EXPECT_THROW(hf_read_weight_index(json::parse(bad), "index.json"), Error) << bad;
}

TEST(HfBridge, DropoutIsAcceptedWithAWarning) {
  json j = hf_model_config(small(ModelFamily::gpt2), "float32", -1, -1);
  j["resid_pdrop"] = 0.1;
  const HfImportedConfig c = hf_read_model_config(j, "config.json");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("resid_pdrop"), std::string::npos);
}

// The byte tokenizer's tokenizer.json, read back by our own BPE loader, gives the byte ids of UTF-8
// text (byte-level BPE, as Hugging Face's, takes only UTF-8; the byte tokenizer takes any bytes, which
// is why `import` recognizes this file and records the byte tokenizer itself).
TEST(HfBridge, ByteTokenizerJsonGivesTheByteIds) {
  auto tok = load_tokenizer_from_bytes(kTokenizerKindHfJson, hf_byte_tokenizer_json(), "byte tokenizer.json");
  const std::string text = "héllo, wörld\n\x01 <|endoftext|>";
  std::vector<int32_t> want;
  for (unsigned char c : text.substr(0, text.size() - 13)) want.push_back(c);
  want.push_back(kByteEodId);  // a special token written in the text, as Hugging Face matches it
  EXPECT_EQ(tok->encode(text), want);
  EXPECT_EQ(tok->eod_id(), kByteEodId);
  EXPECT_EQ(tok->vocab_size(), kByteVocabSize);
}

}  // namespace
}  // namespace llmtrain::trainer
