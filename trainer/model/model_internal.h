// The Model's private structures, shared by model.cpp (construction, parameters, the public
// calls) and model_layers.cpp (the math of the embedding, the blocks and the head). Not for use
// outside the model.
#pragma once

#include <vector>

#include "trainer/model/model.h"

namespace llmtrain::trainer {

using kernels::Tensor;

// Views of one block's parameters (or of their gradients). Absent (undefined) tensors are those
// the family does not have (LLaMA: no biases, no LayerNorm bias).
//   gpt2:  ln1_w ln1_b qkv_w [3·d/tp, d] qkv_b  o_w [d, d/tp] o_b  ln2_w ln2_b
//          fc_w [f/tp, d] fc_b  out_w [d, f/tp] out_b
//   llama: ln1_w  qkv_w [(H + 2·KV)/tp·hd, d] (q_proj, k_proj, v_proj adjacent in the flat buffer)
//          o_w  ln2_w  fc_w [2·f/tp, d] (gate_proj, up_proj adjacent)  out_w (down_proj)
struct Model::BlockWeights {
  Tensor ln1_w, ln1_b, qkv_w, qkv_b, o_w, o_b, ln2_w, ln2_b, fc_w, fc_b, out_w, out_b;
};

// The activations one block keeps for its backward ([N, ·] with N = B·T tokens, sized for the
// largest micro-batch and viewed smaller).
struct Model::LayerActs {
  Tensor ln1, ln1_mean, ln1_rstd;  // norm output and statistics (mean: LayerNorm only)
  Tensor qkv;                      // [N, (H + 2·KV)/tp · hd], after RoPE for LLaMA
  Tensor att, lse;                 // attention output [N, H/tp · hd], log-sum-exp [B, H/tp, T]
  Tensor mid;                      // residual stream after attention [N, d]
  Tensor ln2, ln2_mean, ln2_rstd;
  Tensor fc;   // [N, f/tp] pre-GELU (gpt2) or [N, 2·f/tp] gate|up (llama)
  Tensor act;  // [N, f/tp] GELU or SwiGLU output
};

// Everything one micro-batch in flight keeps between its forward and its backward.
struct Model::Slot {
  int batch = 0, seq = 0;
  bool has_targets = false;
  int64_t counted = 0;             // target tokens that enter the loss
  Tensor tokens, targets;          // [N] int32 copies
  std::vector<Tensor> residual;    // layers + 1 tensors [N, d]: block inputs, then the stage output
  std::vector<LayerActs> layers;   // per layer; empty with activation checkpointing
  Tensor lnf, lnf_mean, lnf_rstd;  // final norm (last stage)
  Tensor logits;                   // [N, V/tp]
  Tensor logits_full;              // [N, V] gathered (tp > 1), else the same as logits
  Tensor losses, ce_lse;           // [N]
};

// Buffers shared by every slot: the backward's gradient buffers, the recomputation's activations
// (activation checkpointing), the RoPE table and the gather scratch.
struct Model::Work {
  LayerActs recompute;
  Tensor dres, dln, dqkv, datt, dfc, dact;
  Tensor rope;            // [max_positions, 2, hd/2] (llama)
  Tensor gather_scratch;  // [N·V] (tp > 1)
  Tensor input_grad;      // view of dres after the last backward
};

}  // namespace llmtrain::trainer
