// The model's parameters as data: one ParamSpec per global parameter tensor, in the order the
// forward pass uses them. Parameter counts, FLOPs, the flat buffers, initialization, sharding
// and checkpoint names all derive from this one list.
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

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // global shape
  int tp_split_dim = -1;       // dimension tensor parallelism splits, -1 = replicated
  bool weight_decay = false;   // matrices (linear weights, embeddings) only
  ParamInit init = ParamInit::normal;
  ParamPlace place = ParamPlace::block;
  int layer = -1;  // block index for ParamPlace::block

  int64_t numel() const;
};

std::vector<ParamSpec> model_param_specs(const ModelConfig& model);

int64_t count_parameters(const ModelConfig& model);
// Parameters that take part in matrix multiplies: everything except the input embedding
// lookups (token embedding when untied, position embedding). The "N" of 6N.
int64_t count_matmul_parameters(const ModelConfig& model);
// Training FLOPs per token: 6·N + 12·L·d·T (forward + backward, attention included;
// docs/metrics.md explains the formula).
double training_flops_per_token(const ModelConfig& model);

}  // namespace llmtrain::trainer
