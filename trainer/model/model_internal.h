// The Model's private structures, shared by model.cpp (construction, parameters, the whole-model
// calls), model_stage.cpp (one pipeline stage's forward and backward) and model_layers.cpp (the
// math of the embedding, the blocks and the head). Not for use outside the model.
#pragma once

#include <utility>
#include <vector>

#include "parallel/context_parallel.h"
#include "trainer/model/model.h"

namespace llmtrain::trainer {

using kernels::Tensor;

// The sizes of one rank's share of the model, derived once from the resolved config and options
// and the tp size (per-rank head, kv head, MLP and vocabulary counts).
struct Model::Dims {
  bool llama = false;
  int tp = 1;
  int64_t seq = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab_local = 0;
  // tp ranks holding each key/value head: 1 when tp divides kv_heads (they are split), tp / kv_heads
  // when kv_heads divides tp (each rank holds the one head its query heads read; replicated).
  int64_t kv_replicas = 1;
  bool sp = false;       // sequence parallelism: residual stream and norms on 1/tp of the token rows
  bool qk_norm = false;  // per-head RMSNorm of q and k (Qwen3)
  // MoE blocks (model.moe): experts, picks per token, each expert's SwiGLU width on this rank.
  int64_t experts = 0, top_k = 0, moe_ffn = 0;
  int64_t shared_ffn = 0;  // the shared expert's SwiGLU width on this rank (0: none)
  int64_t ep = 1;          // expert parallelism: ranks splitting the experts (ModelOptions::expert_parallel)

  Dims(const ModelConfig& m, const ModelOptions& o, int tp_size)
      : llama(m.family == ModelFamily::llama),
        tp(tp_size),
        seq(o.seq_len),
        heads(m.heads / tp_size),
        kv_heads(m.kv_heads % tp_size == 0 ? m.kv_heads / tp_size : 1),
        head_dim(m.head_size()),
        ffn(m.ffn_hidden / tp_size),
        vocab_local(m.padded_vocab() / tp_size),
        kv_replicas(m.kv_heads % tp_size == 0 ? 1 : tp_size / m.kv_heads),
        sp(o.sequence_parallel && tp_size > 1),
        qk_norm(m.qk_norm),
        experts(m.moe.experts),
        top_k(m.moe.enabled() ? m.moe.top_k : 0),
        moe_ffn(m.moe.ffn_hidden / tp_size),
        shared_ffn(m.moe.enabled() ? m.moe.shared_ffn_hidden / tp_size : 0),
        ep(o.expert_parallel) {}
};

// Carves tensors out of one buffer, each 64-byte aligned: activations in the storage dtype
// (options.dtype), the per-row statistics fp32 (take_f32), token ids int32. With a null base it
// only measures: model_memory_plan and the constructor's first pass run the same layout with it.
class Model::Arena {
 public:
  Arena(void* base, kernels::DType storage, kernels::Device device = kernels::Device::cpu)
      : base_(static_cast<char*>(base)), storage_(storage), device_(device) {}
  Tensor take(kernels::Shape s) { return take_as(s, storage_); }
  Tensor take_f32(kernels::Shape s) { return take_as(s, kernels::DType::fp32); }
  Tensor take_int(kernels::Shape s) { return take_as(s, kernels::DType::int32); }
  int64_t bytes() const { return used_; }

 private:
  Tensor take_as(kernels::Shape s, kernels::DType t) {
    Tensor out(base_ ? base_ + used_ : nullptr, t, s, device_);
    used_ += (s.numel() * int64_t(kernels::dtype_size(t)) + 63) / 64 * 64;
    return out;
  }
  char* base_;
  kernels::DType storage_;
  kernels::Device device_;
  int64_t used_ = 0;
};

// Views of one block's parameters (or of their gradients). Absent (undefined) tensors are those
// the family does not have (LLaMA: no biases, no LayerNorm bias).
//   gpt2:  ln1_w ln1_b qkv_w [3·d/tp, d] qkv_b  o_w [d, d/tp] o_b  ln2_w ln2_b
//          fc_w [f/tp, d] fc_b  out_w [d, f/tp] out_b
//   llama: ln1_w  qkv_w [(H + 2·KV)/tp·hd, d] (q_proj, k_proj, v_proj adjacent in the flat buffer)
//          [qkv_b [(H + 2·KV)/tp·hd] (qkv_bias)]  [qn_w kn_w [hd] (qk_norm)]
//          o_w  ln2_w  fc_w [2·f/tp, d] (gate_proj, up_proj adjacent)  out_w (down_proj)
//   a MoE block (llama) has, in place of fc_w and out_w: router [E, d], experts_in [E, 2·f, d] (each
//          expert's w1 and w3 adjacent), experts_out [E, d, f] (the w2s); f = model.moe.ffn_hidden;
//          with a shared expert (model.moe.shared_ffn_hidden) also fc_w [2·fs/tp, d] and out_w
//          [d, fs/tp] (its SwiGLU, the dense MLP's layout) and shared_gate [d]; with model.moe.bias
//          (gpt-oss) router_b [E], experts_in_b [E, 2·f/tp] and experts_out_b [E, d]
//   with model.post_norms (Gemma) also post_attn_w and post_mlp_w [d]: the RMSNorms of o_proj's and
//          down_proj's outputs
struct Model::BlockWeights {
  Tensor ln1_w, ln1_b, qkv_w, qkv_b, qn_w, kn_w, o_w, o_b, ln2_w, ln2_b, fc_w, fc_b, out_w, out_b;
  Tensor router, experts_in, experts_out, shared_gate;
  Tensor router_b, experts_in_b, experts_out_b;
  Tensor post_attn_w, post_mlp_w;
  Tensor sinks;  // [H/tp] (model.attention_sinks)
};

// Views of the embedding's and the head's parameters (or their gradients), those this stage
// holds: wte and wpe (GPT-2) on the first stage; the final norm and the output matrix (the LM
// head's own, or the token embedding when tied — the first stage's or the last stage's tied copy) on the last.
struct Model::EndWeights {
  Tensor wte, wpe, norm_w, norm_b, head;
};

// The activations one block keeps for its backward ([N, ·] with N = B·T tokens, sized for the
// largest micro-batch and viewed smaller). With sequence parallelism the norm statistics and mid
// hold this rank's N/tp rows; ln1 and ln2 hold all N rows (gathered).
struct Model::LayerActs {
  Tensor ln1, ln1_mean, ln1_rstd;  // norm output and statistics (mean: LayerNorm only)
  Tensor qkv;                      // [N, (H + 2·KV)/tp · hd], after RoPE for LLaMA
  Tensor qk_in, qk_rstd;           // qk_norm: qkv before the q/k norms; their rstd [N·H/tp], then [N·KV/tp]
  Tensor att, lse;                 // attention output [N, H/tp · hd], log-sum-exp [B, H/tp, T]
                                   // (cp > 1: [B, 2, H/tp, T/2], ring attention's blocks)
  Tensor mid;                      // residual stream after attention [N, d]
  // model.post_norms: o_proj's and down_proj's outputs before their norms [N, d] and the norms' rstd
  // (this rank's rows with sequence parallelism), kept whatever is recomputed selectively
  Tensor attn_raw, attn_rstd, mlp_raw, mlp_rstd;
  Tensor ln2, ln2_mean, ln2_rstd;
  Tensor fc;   // [N, f/tp] pre-GELU (gpt2) or [N, 2·f/tp] gate|up (llama)
  Tensor act;  // [N, f/tp] GELU or SwiGLU output
  // A MoE block's, in place of fc and act (M = N·top_k assignment rows, in expert order after the
  // permutation; the rows past the kept ones are zero):
  Tensor probs, router_lse;                 // fp32 router softmax [N, E] and log-sum-exp [N]
  Tensor route_expert, route_weight;        // [M] int32 picks, fp32 weights (token n's j-th at n·top_k + j)
  Tensor route_order, route_pos;            // [M] int32: the permutation and its inverse (-1: dropped)
  Tensor route_offsets, route_stats;        // [E + 1] int32 each expert's first row; fp32 [2E + 2] (moe_route_stats)
  Tensor moe_in, moe_fc, moe_act, moe_out;  // [M, d] gathered input, [M, 2f] gate|up, [M, f] SwiGLU, [M, d]
  // A shared expert's: fc [N, 2·fs/tp] and act [N, fs/tp] as the dense MLP's (all kept, as the
  // experts' are), its output before the gate [N, d] (a partial sum over tp) and the gate fp32 [N].
  Tensor shared_out, shared_gate;
  // Expert parallelism (ep > 1): moe_in is what this rank sends, moe_out what comes back (both in
  // its plan's order); its experts compute R ≤ ep·M rows from every ep rank, in expert-major order
  // (moe_fc and moe_act hold ep·M rows).
  Tensor ep_in;            // [ep·M, d] the received rows, expert-major
  Tensor ep_perm, ep_inv;  // [ep·M] int32: expert-major row ← received row, received row ← expert-major
  Tensor ep_offsets;       // [E/ep + 1] int32: each of this rank's experts' first row of ep_in
  // host [ep, E + 1]: every ep rank's route_offsets (the exchange's counts), shared by the copies
  // selective recomputation makes of these activations
  std::shared_ptr<std::vector<int32_t>> ep_plan;
};

// A split backward (options.split_backward): what the input-gradient half keeps of one block for
// the weight-gradient half — each linear's output gradient (its input is a kept activation).
struct Model::LayerGrads {
  Tensor d_out;  // [N, d] d(block output): mlp_out's output gradient
  Tensor dfc;    // [N, f/tp] or [N, 2·f/tp]: the MLP input linear's (a dense block's)
  Tensor d_mid;  // [N, d] d(mid): attn_out's
  Tensor dqkv;   // [N, (H + 2·KV)/tp · hd]: the qkv linear's
};

// Everything one micro-batch in flight keeps between its forward and its backward.
struct Model::Slot {
  int batch = 0, seq = 0;
  bool has_targets = false;
  Tensor tokens, targets;          // [N] int32 copies
  std::vector<Tensor> residual;    // layers + 1 tensors [N, d] ([N/tp, d] with sequence parallelism):
                                   // block inputs, then the stage output
  std::vector<LayerActs> layers;   // per layer; empty with full activation checkpointing
  std::vector<Tensor> moe_stats;   // per layer: a MoE block's routing statistics [2E + 2] (else undefined)
  std::vector<LayerGrads> grads;   // per layer with options.split_backward, else empty
  Tensor lnf, lnf_mean, lnf_rstd;  // final norm (last stage)
  Tensor logits;                   // [N, V/tp]: this rank's vocabulary columns, never gathered
  Tensor losses, ce_lse;           // [N]
  Tensor loss;                     // [1] fp32: mean over counted targets (loss_mean_forward)
  Tensor count;                    // [1] int32: the counted targets, for the backward
};

// One layer's KV cache (generation): [B, kv_cache_tokens, kv_heads/tp, head dim] each.
struct Model::Cache {
  Tensor k, v;
};

// Buffers shared by every slot: the backward's gradient buffers, the recomputation's activations
// (activation checkpointing), the RoPE table, the vocab-parallel loss's scratch, and generation's
// KV cache.
struct Model::Work {
  LayerActs recompute;
  Tensor dres, dln, dqkv, datt, dfc, dact;
  // A MoE block's: [M, d], [M, 2f], [M, f], fp32 [M] (the router weights').
  Tensor moe_dd, moe_dfc, moe_dact, moe_dweight;
  Tensor moe_dlogit;  // fp32 [N]: the shared expert's gate logit gradient
  // Expert parallelism: [ep·M, d] twice (the exchanged rows; the experts' rows) and int32 [ep, E + 1]
  // (the gathered offsets); moe_dfc and moe_dact then hold ep·M rows.
  Tensor ep_recv, ep_rows, ep_plan;
  Tensor rope;           // [max_positions, 2, hd/2] (llama)
  Tensor rope_local;     // the windowed layers' own table (model.rope_local_theta), else undefined
  Tensor dpost;          // [N, d] a post-norm's input gradient (model.post_norms; this rank's rows with sp)
  Tensor dlogits;        // [N, V/tp] the capped logits' gradient (model.logit_softcap, last stage)
  Tensor ce_scratch;     // [3·N] row maxima and the [Σ exp, target logit] sums (tp > 1)
  Tensor kv_grad_saved;  // [2·hd·d] the replicated k/v heads' gradient so far (kv_replicas > 1; with
                         // qkv_bias [2·(2·hd·d + 2·hd)], weights and biases packed)
  Tensor qk_grad_saved;  // [2·2·hd] the q/k norm weights' gradients so far and their pack (qk_norm, tp > 1)
  // Sequence parallelism: sp_full [N, d] holds a row-parallel linear's partial output before its
  // reduce-scatter (forward) and the all-gathered residual gradient (backward); sp_rows [N/tp, d]
  // a norm's output before its all-gather (forward) and the reduce-scattered input gradient
  // (backward); sp_grad_saved [2·8·d] the replicated gradients' saved values and their pack.
  Tensor sp_full, sp_rows, sp_grad_saved;
  Tensor input_grad;           // view of dres after the last backward
  parallel::RingScratch ring;  // context parallelism's K/V blocks and partial results (cp > 1)
  std::vector<Cache> cache;    // per local layer (kv_cache_tokens > 0), else empty
};

// [B, T] int32 tensor → (B, T), or an Error naming what is wrong. Reads the shape only.
std::pair<int, int> batch_shape(const kernels::Tensor& t, const char* what, int max_batch, int64_t max_seq);

}  // namespace llmtrain::trainer
