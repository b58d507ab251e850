// The model's parameters as data: one ParamSpec per global parameter tensor, in the order the
// forward pass uses them. Parameter counts, FLOPs, the flat buffers, initialization, sharding
// and checkpoint names all derive from this one list.
//
// Rule a reader could get wrong: model_spec.cpp is the ONE source file that spells Hugging Face
// names. Code finds a parameter by its role (and layer), never by its name; names are for files
// (checkpoints, exports) and messages.
//
// Names follow Hugging Face (GPT-2: transformer.h.{i}.attn.c_attn.weight; LLaMA:
// model.layers.{i}.self_attn.q_proj.weight). Layouts are ours, documented in
// docs/model.md: every linear weight is [out, in] (nn.Linear's layout), so GPT-2's Conv1D
// weights are the transpose of Hugging Face's, and GPT-2's fused c_attn weight is [3, d, d]
// (q, k, v stacked) so that a tensor-parallel shard of it is one contiguous slice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/recipe/recipe.h"

namespace llmtrain::trainer {

enum class ParamInit {
  normal,           // N(0, init_std)
  normal_residual,  // N(0, init_std / sqrt(2 · layers)): projections into the residual stream
  zeros,            // biases
  ones,             // norm weights
};

// Where a parameter lives in a pipeline: the first stage owns the embedding, the stage that owns
// block `layer` owns its parameters, the last stage owns the final norm and the head.
enum class ParamPlace { embedding, block, head };

// Which weight of the model a parameter is, whatever the family calls it. Per block (GPT-2 name /
// LLaMA name): the families share the norms and the projections into the residual stream;
// GPT-2 has one fused qkv matrix and an MLP input, LLaMA separate q, k, v and a gate and up.
enum class ParamRole {
  token_embedding,     // transformer.wte / model.embed_tokens: [padded vocab, d]
  position_embedding,  // transformer.wpe (GPT-2): [max_positions, d]
  attn_norm_weight,    // ln_1 / input_layernorm
  attn_norm_bias,      // ln_1 (GPT-2)
  qkv_weight,          // attn.c_attn (GPT-2): [3, d, d]
  qkv_bias,            // attn.c_attn (GPT-2): [3, d]
  q_weight,            // self_attn.q_proj (LLaMA)
  k_weight,            // self_attn.k_proj (LLaMA)
  v_weight,            // self_attn.v_proj (LLaMA)
  q_bias,              // self_attn.q_proj.bias (LLaMA with qkv_bias: Qwen2)
  k_bias,              // self_attn.k_proj.bias
  v_bias,              // self_attn.v_proj.bias
  q_norm_weight,       // self_attn.q_norm (LLaMA with qk_norm: Qwen3): [head_dim]
  k_norm_weight,       // self_attn.k_norm: [head_dim]
  attn_out_weight,     // attn.c_proj / self_attn.o_proj
  attn_out_bias,       // attn.c_proj (GPT-2)
  mlp_norm_weight,     // ln_2 / post_attention_layernorm (pre_feedforward_layernorm with post_norms)
  mlp_norm_bias,       // ln_2 (GPT-2)
  mlp_in_weight,       // mlp.c_fc (GPT-2)
  mlp_in_bias,         // mlp.c_fc (GPT-2)
  mlp_gate_weight,     // mlp.gate_proj (LLaMA)
  mlp_up_weight,       // mlp.up_proj (LLaMA)
  mlp_out_weight,      // mlp.c_proj / mlp.down_proj
  mlp_out_bias,        // mlp.c_proj (GPT-2)
  final_norm_weight,   // transformer.ln_f / model.norm
  final_norm_bias,     // transformer.ln_f (GPT-2)
  output_weight,       // the LM head's matrix (untied only; tied models use the token embedding)
  // A MoE block (model.moe) in place of the MLP, Mixtral's names: block_sparse_moe.gate is the router
  // [experts, d]; expert e's w1 (gate), w3 (up) [moe ffn, d] and w2 (down) [d, moe ffn]. The flat
  // buffer holds the router, then every expert's w1 and w3 (adjacent per expert), then every w2, so
  // the experts' gate|up weights form one [experts, 2·ffn, d] tensor and the down weights one
  // [experts, d, ffn] (the grouped expert product's operands).
  moe_router_weight,
  moe_gate_weight,
  moe_up_weight,
  moe_down_weight,
  // model.moe.bias (gpt-oss): the router's block_sparse_moe.gate.bias [experts] after its weight, and
  // after every w2 each expert's w1 and w3 biases [moe ffn] (adjacent per expert: one [experts,
  // 2·ffn] tensor), then every w2's [d].
  moe_router_bias,
  moe_gate_bias,
  moe_up_bias,
  moe_down_bias,
  // A shared expert (model.moe.shared_ffn_hidden > 0, Qwen2-MoE) between the router and the routed
  // experts (a block's dense parameters one range of the flat buffer, its experts another): its SwiGLU
  // takes the dense MLP's roles (mlp_gate_weight, mlp_up_weight [shared ffn, d] adjacent,
  // mlp_out_weight [d, shared ffn]; block_sparse_moe.shared_expert.{gate,up,down}_proj), then its
  // gate block_sparse_moe.shared_expert_gate [1, d].
  moe_shared_gate_weight,
  // model.post_norms (Gemma): the RMSNorms of the attention output (post_attention_layernorm, after
  // o_proj) and of the MLP output (post_feedforward_layernorm, after down_proj) [d].
  attn_post_norm_weight,
  mlp_post_norm_weight,
  // model.attention_sinks (gpt-oss): self_attn.sinks [heads], one softmax logit per query head, split
  // over tp with the heads.
  attn_sinks,
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // global shape
  int tp_split_dim = -1;       // dimension tensor parallelism splits, -1 = replicated
  bool weight_decay = false;   // matrices (linear weights, embeddings) only
  ParamInit init = ParamInit::normal;
  ParamPlace place = ParamPlace::block;
  int layer = -1;  // block index for ParamPlace::block
  ParamRole role = ParamRole::token_embedding;
  int expert = -1;  // the expert's global index (moe_gate/up/down_weight and _bias), else -1

  int64_t numel() const;
};

std::vector<ParamSpec> model_param_specs(const ModelConfig& model);

int64_t count_parameters(const ModelConfig& model);
// The parameters one token's forward pass uses: all of them for a dense model; with MoE blocks only
// top_k of each block's experts (the router counts).
int64_t count_active_parameters(const ModelConfig& model);
// Parameters that take part in matrix multiplies: everything except the input embedding
// lookups (token embedding when untied, position embedding). The "N" of 6N.
int64_t count_matmul_parameters(const ModelConfig& model);
// Training FLOPs per token: 6·N + 12·L·d·T (forward + backward, attention included;
// docs/metrics.md explains the formula), N counting only the active experts of MoE blocks.
double training_flops_per_token(const ModelConfig& model);

}  // namespace llmtrain::trainer
