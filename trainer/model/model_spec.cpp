#include "trainer/model/model_spec.h"

#include <fmt/format.h>

#include <algorithm>

namespace llmtrain::trainer {

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

void add(std::vector<ParamSpec>& out, ParamRole role, std::string name, std::vector<int64_t> shape, int split,
         bool decay, ParamInit init, ParamPlace place, int layer = -1, int expert = -1) {
  out.push_back({std::move(name), std::move(shape), split, decay, init, place, layer, role, expert});
}

// Layer i's MoE block (Mixtral's names; the order model_spec.h gives). The experts' matrices split
// over tp like the dense MLP's.
void moe_specs(const ModelConfig& m, int i, std::vector<ParamSpec>& out) {
  const int64_t d = m.hidden, f = m.moe.ffn_hidden;
  auto p = [&](const std::string& s) { return fmt::format("model.layers.{}.block_sparse_moe.{}", i, s); };
  add(out, ParamRole::moe_router_weight, p("gate.weight"), {m.moe.experts, d}, -1, true, ParamInit::normal,
      ParamPlace::block, i);
  if (m.moe.bias)
    add(out, ParamRole::moe_router_bias, p("gate.bias"), {m.moe.experts}, -1, false, ParamInit::zeros,
        ParamPlace::block, i);
  // The shared expert (Qwen2-MoE) next: every token's, so counted active (expert -1) and replicated
  // over ep; before the routed experts, so that the dense parameters of a block stay one range of the
  // flat buffer and the experts' another (expert parallelism shards the latter).
  if (m.moe.shared_ffn_hidden > 0) {
    const int64_t fs = m.moe.shared_ffn_hidden;
    add(out, ParamRole::mlp_gate_weight, p("shared_expert.gate_proj.weight"), {fs, d}, 0, true, ParamInit::normal,
        ParamPlace::block, i);
    add(out, ParamRole::mlp_up_weight, p("shared_expert.up_proj.weight"), {fs, d}, 0, true, ParamInit::normal,
        ParamPlace::block, i);
    add(out, ParamRole::mlp_out_weight, p("shared_expert.down_proj.weight"), {d, fs}, 1, true,
        ParamInit::normal_residual, ParamPlace::block, i);
    add(out, ParamRole::moe_shared_gate_weight, p("shared_expert_gate.weight"), {1, d}, -1, true, ParamInit::normal,
        ParamPlace::block, i);
  }
  for (int e = 0; e < m.moe.experts; ++e) {
    add(out, ParamRole::moe_gate_weight, p(fmt::format("experts.{}.w1.weight", e)), {f, d}, 0, true, ParamInit::normal,
        ParamPlace::block, i, e);
    add(out, ParamRole::moe_up_weight, p(fmt::format("experts.{}.w3.weight", e)), {f, d}, 0, true, ParamInit::normal,
        ParamPlace::block, i, e);
  }
  for (int e = 0; e < m.moe.experts; ++e)
    add(out, ParamRole::moe_down_weight, p(fmt::format("experts.{}.w2.weight", e)), {d, f}, 1, true,
        ParamInit::normal_residual, ParamPlace::block, i, e);
  if (!m.moe.bias) return;
  // gpt-oss's expert biases, last (the experts stay one range): w1's and w3's adjacent per expert,
  // split over tp with their rows; w2's replicated, added once (after the row-parallel reduction).
  for (int e = 0; e < m.moe.experts; ++e) {
    add(out, ParamRole::moe_gate_bias, p(fmt::format("experts.{}.w1.bias", e)), {f}, 0, false, ParamInit::zeros,
        ParamPlace::block, i, e);
    add(out, ParamRole::moe_up_bias, p(fmt::format("experts.{}.w3.bias", e)), {f}, 0, false, ParamInit::zeros,
        ParamPlace::block, i, e);
  }
  for (int e = 0; e < m.moe.experts; ++e)
    add(out, ParamRole::moe_down_bias, p(fmt::format("experts.{}.w2.bias", e)), {d}, -1, false, ParamInit::zeros,
        ParamPlace::block, i, e);
}

void gpt2_specs(const ModelConfig& m, std::vector<ParamSpec>& out) {
  const int64_t d = m.hidden, f = m.ffn_hidden, v = m.padded_vocab();
  add(out, ParamRole::token_embedding, "transformer.wte.weight", {v, d}, 0, true, ParamInit::normal,
      ParamPlace::embedding);
  add(out, ParamRole::position_embedding, "transformer.wpe.weight", {m.max_positions, d}, -1, true, ParamInit::normal,
      ParamPlace::embedding);
  for (int i = 0; i < m.layers; ++i) {
    auto p = [&](const char* s) { return fmt::format("transformer.h.{}.{}", i, s); };
    add(out, ParamRole::attn_norm_weight, p("ln_1.weight"), {d}, -1, false, ParamInit::ones, ParamPlace::block, i);
    add(out, ParamRole::attn_norm_bias, p("ln_1.bias"), {d}, -1, false, ParamInit::zeros, ParamPlace::block, i);
    add(out, ParamRole::qkv_weight, p("attn.c_attn.weight"), {3, d, d}, 1, true, ParamInit::normal, ParamPlace::block,
        i);
    add(out, ParamRole::qkv_bias, p("attn.c_attn.bias"), {3, d}, 1, false, ParamInit::zeros, ParamPlace::block, i);
    add(out, ParamRole::attn_out_weight, p("attn.c_proj.weight"), {d, d}, 1, true, ParamInit::normal_residual,
        ParamPlace::block, i);
    add(out, ParamRole::attn_out_bias, p("attn.c_proj.bias"), {d}, -1, false, ParamInit::zeros, ParamPlace::block, i);
    add(out, ParamRole::mlp_norm_weight, p("ln_2.weight"), {d}, -1, false, ParamInit::ones, ParamPlace::block, i);
    add(out, ParamRole::mlp_norm_bias, p("ln_2.bias"), {d}, -1, false, ParamInit::zeros, ParamPlace::block, i);
    add(out, ParamRole::mlp_in_weight, p("mlp.c_fc.weight"), {f, d}, 0, true, ParamInit::normal, ParamPlace::block, i);
    add(out, ParamRole::mlp_in_bias, p("mlp.c_fc.bias"), {f}, 0, false, ParamInit::zeros, ParamPlace::block, i);
    add(out, ParamRole::mlp_out_weight, p("mlp.c_proj.weight"), {d, f}, 1, true, ParamInit::normal_residual,
        ParamPlace::block, i);
    add(out, ParamRole::mlp_out_bias, p("mlp.c_proj.bias"), {d}, -1, false, ParamInit::zeros, ParamPlace::block, i);
  }
  add(out, ParamRole::final_norm_weight, "transformer.ln_f.weight", {d}, -1, false, ParamInit::ones, ParamPlace::head);
  add(out, ParamRole::final_norm_bias, "transformer.ln_f.bias", {d}, -1, false, ParamInit::zeros, ParamPlace::head);
  if (!m.tie_embeddings)
    add(out, ParamRole::output_weight, "lm_head.weight", {v, d}, 0, true, ParamInit::normal, ParamPlace::head);
}

void llama_specs(const ModelConfig& m, std::vector<ParamSpec>& out) {
  const int64_t d = m.hidden, f = m.ffn_hidden, v = m.padded_vocab();
  const int64_t hd = m.head_size(), q = int64_t(m.heads) * hd, kv = int64_t(m.kv_heads) * hd;
  add(out, ParamRole::token_embedding, "model.embed_tokens.weight", {v, d}, 0, true, ParamInit::normal,
      ParamPlace::embedding);
  for (int i = 0; i < m.layers; ++i) {
    auto p = [&](const char* s) { return fmt::format("model.layers.{}.{}", i, s); };
    add(out, ParamRole::attn_norm_weight, p("input_layernorm.weight"), {d}, -1, false, ParamInit::ones,
        ParamPlace::block, i);
    add(out, ParamRole::q_weight, p("self_attn.q_proj.weight"), {q, d}, 0, true, ParamInit::normal, ParamPlace::block,
        i);
    add(out, ParamRole::k_weight, p("self_attn.k_proj.weight"), {kv, d}, 0, true, ParamInit::normal, ParamPlace::block,
        i);
    add(out, ParamRole::v_weight, p("self_attn.v_proj.weight"), {kv, d}, 0, true, ParamInit::normal, ParamPlace::block,
        i);
    // After the three matrices, so that q, k and v stay adjacent (one packed projection), and the
    // biases too.
    if (m.qkv_bias) {
      add(out, ParamRole::q_bias, p("self_attn.q_proj.bias"), {q}, 0, false, ParamInit::zeros, ParamPlace::block, i);
      add(out, ParamRole::k_bias, p("self_attn.k_proj.bias"), {kv}, 0, false, ParamInit::zeros, ParamPlace::block, i);
      add(out, ParamRole::v_bias, p("self_attn.v_proj.bias"), {kv}, 0, false, ParamInit::zeros, ParamPlace::block, i);
    }
    if (m.qk_norm) {
      add(out, ParamRole::q_norm_weight, p("self_attn.q_norm.weight"), {hd}, -1, false, ParamInit::ones,
          ParamPlace::block, i);
      add(out, ParamRole::k_norm_weight, p("self_attn.k_norm.weight"), {hd}, -1, false, ParamInit::ones,
          ParamPlace::block, i);
    }
    if (m.attention_sinks)
      add(out, ParamRole::attn_sinks, p("self_attn.sinks"), {m.heads}, 0, false, ParamInit::normal, ParamPlace::block,
          i);
    add(out, ParamRole::attn_out_weight, p("self_attn.o_proj.weight"), {d, q}, 1, true, ParamInit::normal_residual,
        ParamPlace::block, i);
    if (m.o_bias)  // replicated: added once, after the row-parallel product's reduction
      add(out, ParamRole::attn_out_bias, p("self_attn.o_proj.bias"), {d}, -1, false, ParamInit::zeros,
          ParamPlace::block, i);
    // Gemma's four norms: post_attention_layernorm is then the attention output's, and the MLP's
    // input norm is pre_feedforward_layernorm.
    if (m.post_norms)
      add(out, ParamRole::attn_post_norm_weight, p("post_attention_layernorm.weight"), {d}, -1, false, ParamInit::ones,
          ParamPlace::block, i);
    add(out, ParamRole::mlp_norm_weight,
        p(m.post_norms ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight"), {d}, -1, false,
        ParamInit::ones, ParamPlace::block, i);
    if (m.moe.layer(i)) {
      moe_specs(m, i, out);
      continue;
    }
    add(out, ParamRole::mlp_gate_weight, p("mlp.gate_proj.weight"), {f, d}, 0, true, ParamInit::normal,
        ParamPlace::block, i);
    add(out, ParamRole::mlp_up_weight, p("mlp.up_proj.weight"), {f, d}, 0, true, ParamInit::normal, ParamPlace::block,
        i);
    add(out, ParamRole::mlp_out_weight, p("mlp.down_proj.weight"), {d, f}, 1, true, ParamInit::normal_residual,
        ParamPlace::block, i);
    if (m.post_norms)
      add(out, ParamRole::mlp_post_norm_weight, p("post_feedforward_layernorm.weight"), {d}, -1, false, ParamInit::ones,
          ParamPlace::block, i);
  }
  add(out, ParamRole::final_norm_weight, "model.norm.weight", {d}, -1, false, ParamInit::ones, ParamPlace::head);
  if (!m.tie_embeddings)
    add(out, ParamRole::output_weight, "lm_head.weight", {v, d}, 0, true, ParamInit::normal, ParamPlace::head);
}

}  // namespace

std::vector<ParamSpec> model_param_specs(const ModelConfig& model) {
  std::vector<ParamSpec> out;
  if (model.family == ModelFamily::gpt2)
    gpt2_specs(model, out);
  else
    llama_specs(model, out);
  return out;
}

int64_t count_parameters(const ModelConfig& model) {
  int64_t n = 0;
  for (const auto& p : model_param_specs(model)) n += p.numel();
  return n;
}

namespace {

// The experts a token does not visit: (experts − top_k) of every MoE block's.
int64_t inactive_expert_parameters(const ModelConfig& model) {
  if (!model.moe.enabled()) return 0;
  int64_t n = 0;
  for (const auto& p : model_param_specs(model))
    if (p.expert >= 0) n += p.numel();
  return n / model.moe.experts * (model.moe.experts - model.moe.top_k);
}

}  // namespace

int64_t count_active_parameters(const ModelConfig& model) {
  return count_parameters(model) - inactive_expert_parameters(model);
}

int64_t count_matmul_parameters(const ModelConfig& model) {
  int64_t n = 0;
  for (const auto& p : model_param_specs(model)) {
    bool lookup_only =
        p.role == ParamRole::position_embedding || (p.role == ParamRole::token_embedding && !model.tie_embeddings);
    if (!lookup_only) n += p.numel();
  }
  return n - inactive_expert_parameters(model);
}

double training_flops_per_token(const ModelConfig& model) {
  // Attention's score and value products: 2 · K · (heads · head size) per token and layer each
  // way, forward and backward, with K = seq_len keys (PaLM's count, which does not halve for the
  // causal mask), or the window's min(sliding_window, seq_len) on a windowed layer.
  double keys = 0;
  for (int l = 0; l < model.layers; ++l)
    keys += double(model.windowed(l) ? std::min(model.sliding_window, model.seq_len) : model.seq_len);
  return 6.0 * double(count_matmul_parameters(model)) + 12.0 * double(model.heads) * double(model.head_size()) * keys;
}

}  // namespace llmtrain::trainer
