// The math of the model, as sequences of kernels:: ops: embedding, one transformer block (GPT-2
// or LLaMA), and the head with its loss; each forward next to its backward. docs/model.md draws
// the same sequences.
//
// Rules a reader could get wrong:
//  - work.dres carries the gradient of the residual stream backwards through the stage. Ops that
//    join the stream (the norms' backward) add into it in place; the residual adds pass it
//    through unchanged (their backward only produces bias gradients).
//  - Tensor-parallel crossings: copy_to_tp before a column-parallel linear (its backward
//    all-reduces the input gradient), reduce_from_tp after a row-parallel one (the replicated
//    bias is added after the all-reduce, by residual_forward). The head's logits stay split by
//    vocabulary columns: the loss is the vocab-parallel cross-entropy (tp 1 runs the plain one,
//    the same numbers bitwise as before tp existed).
//  - Sequence parallelism (sp_): the stream x/mid/out, the norms and the residual adds hold this
//    rank's n / tp rows; a norm writes its rows to work.sp_rows and the gather fills the full
//    [n, d] input of the column-parallel linear; a row-parallel linear writes its partial [n, d]
//    sums to work.sp_full and the reduce-scatter leaves this rank's rows; in backward the same
//    buffers carry the gathered stream gradient and the reduce-scattered norm input gradient. The
//    replicated parameters that only see this rank's rows (norms, row-parallel biases) have their
//    gradients reduced over tp around each backward (sp_grads).
//  - Context parallelism (cp_): this rank's rows are two chunks of each sequence
//    (parallel/context_parallel.h); learned positions and RoPE take each half's chunk position and
//    attention is ring attention over the cp group. Everything else is per row and unchanged.
//  - Training and generation share this code. `position` offsets learned positions and RoPE;
//    with a KV cache (generation) the block writes its keys and values to the cache and attends
//    over it instead of over its own rows. Training passes position 0 and no cache, and runs
//    exactly the ops it always did.
#include <algorithm>
#include <array>
#include <cmath>

#include "common/error.h"
#include "kernels/ops.h"
#include "parallel/tensor_parallel.h"
#include "trainer/model/model_internal.h"

namespace llmtrain::trainer {

namespace k = kernels;
namespace tpx = parallel;

namespace {

// The first n rows of a [rows, cols] buffer.
Tensor rows(const Tensor& t, int64_t n) {
  if (!t.defined()) return Tensor{};  // a buffer this block does not have (a MoE block's dense MLP)
  const int64_t cols = t.shape[t.shape.rank() - 1];
  return t.flat(0, n * cols).view({n, cols});
}
Tensor first(const Tensor& t, int64_t n) { return t.flat(0, n); }
// The first n rows of `cols` columns of a buffer sized for a wider use too (a shared expert's fc and
// act in the dense MLP's buffers).
Tensor rows_of(const Tensor& t, int64_t n, int64_t cols) { return t.flat(0, n * cols).view({n, cols}); }

}  // namespace

template <class Produce>
void Model::reduce_over_tp(Tensor out, int64_t n, Produce&& produce) {
  if (sp_) {
    const Tensor partial = rows(work_->sp_full, n);  // the partial sums, reduce-scattered
    produce(partial);
    tpx::reduce_scatter_to_sequence_parallel_region_forward(tp_, partial, out);
  } else {
    produce(out);
    tpx::reduce_from_tp_region_forward(tp_, out);
  }
}

void Model::qk_norm_forward(const BlockWeights& w, LayerActs& a, Tensor qkv4) {
  const int64_t n = qkv4.shape[0] * qkv4.shape[1];
  const Tensor in = first(a.qk_in, qkv4.numel()).view(qkv4.shape);
  const float eps = float(config_.norm_eps);
  k::copy(in, qkv4);
  k::head_rmsnorm_forward(qkv4, first(a.qk_rstd, n * heads_), in, w.qn_w, 0, heads_, eps);
  k::head_rmsnorm_forward(qkv4, a.qk_rstd.flat(n * heads_, n * kv_heads_), in, w.kn_w, heads_, kv_heads_, eps);
}

// Each tp rank normalises its own heads with the shared weights: their gradients are partial sums,
// reduced over tp (with replicated key/value heads each rank's dk is its query heads' part, and the
// sum over the replicas is the whole).
void Model::qk_norm_backward(const BlockWeights& w, const BlockWeights& g, const LayerActs& a, Tensor dqkv4) {
  const int64_t n = dqkv4.shape[0] * dqkv4.shape[1];
  const Tensor in = first(a.qk_in, dqkv4.numel()).view(dqkv4.shape);
  const std::array<Tensor, 2> grads = {g.qn_w, g.kn_w};
  if (tp_.size() > 1) tpx::replicated_grads_begin(tp_, grads, work_->qk_grad_saved);
  k::head_rmsnorm_backward(dqkv4, g.qn_w, dqkv4, in, w.qn_w, first(a.qk_rstd, n * heads_), 0, heads_);
  k::head_rmsnorm_backward(dqkv4, g.kn_w, dqkv4, in, w.kn_w, a.qk_rstd.flat(n * heads_, n * kv_heads_), heads_,
                           kv_heads_);
  if (tp_.size() > 1) tpx::replicated_grads_end(tp_, grads, work_->qk_grad_saved);
}

void Model::embed_forward(Slot& s, int64_t position) {
  const int64_t n = int64_t(s.batch) * s.seq, d = config_.hidden;
  const Tensor tokens = first(s.tokens, n);
  if (sp_) {
    // Every rank embeds all rows (its vocabulary shard's part), adds the learned positions once
    // (rank 0), and keeps the sum of its rows.
    const Tensor full = rows(work_->sp_full, n);
    k::embedding_forward(full, tokens, ends_->wte, vocab_begin_, config_.vocab);
    if (!llama_ && tp_.rank() == 0) positions_forward(full.view({s.batch, s.seq, d}), position);
    tpx::reduce_scatter_to_sequence_parallel_region_forward(tp_, full, rows(s.residual[0], n / tp_.size()));
    if (config_.scale_embeddings) k::scale(rows(s.residual[0], n / tp_.size()), embedding_scale());
    return;
  }
  const Tensor x = rows(s.residual[0], n);
  k::embedding_forward(x, tokens, ends_->wte, vocab_begin_, config_.vocab);
  tpx::reduce_from_tp_region_forward(tp_, x);
  if (config_.scale_embeddings) k::scale(x, embedding_scale());
  if (!llama_) positions_forward(x.view({s.batch, s.seq, d}), position);
}

// model.scale_embeddings (Gemma): the embedding rows × √hidden, as transformers multiplies them.
float Model::embedding_scale() const { return float(std::sqrt(double(config_.hidden))); }

// Context parallelism: half h of each sample's rows sits at chunk cp_chunk(rank, h)'s positions.
void Model::positions_forward(Tensor x, int64_t position) {
  if (!cp_) {
    k::position_embedding_forward(x, ends_->wpe, position);
    return;
  }
  const int64_t b = x.shape[0], t = x.shape[1], d = x.shape[2], c = t / 2;
  for (int64_t i = 0; i < b; ++i)
    for (int h = 0; h < 2; ++h)
      k::position_embedding_forward(x.flat((i * t + h * c) * d, c * d).view({1, c, d}), ends_->wpe,
                                    parallel::cp_chunk(cp_->rank(), h, cp_->size()) * c);
}

void Model::positions_backward(Tensor dx) {
  if (!cp_) {
    k::position_embedding_backward(end_grads_->wpe, dx, 0);
    return;
  }
  const int64_t b = dx.shape[0], t = dx.shape[1], d = dx.shape[2], c = t / 2;
  for (int64_t i = 0; i < b; ++i)
    for (int h = 0; h < 2; ++h)
      k::position_embedding_backward(end_grads_->wpe, dx.flat((i * t + h * c) * d, c * d).view({1, c, d}),
                                     parallel::cp_chunk(cp_->rank(), h, cp_->size()) * c);
}

const Tensor& Model::rope_table_of(int local_layer) const {
  const bool local = work_->rope_local.defined() && config_.windowed(options_.stage.layer(local_layer));
  return local ? work_->rope_local : work_->rope;
}

k::AttentionSpec Model::attention_spec(int local_layer) const {
  const int64_t window = config_.windowed(options_.stage.layer(local_layer)) ? config_.sliding_window : 0;
  const double scale = config_.query_pre_attn_scalar > 0 ? 1.0 / std::sqrt(config_.query_pre_attn_scalar) : 0.0;
  return k::AttentionSpec::packed(heads_, kv_heads_, window, scale);
}

void Model::rope_apply(Tensor qkv4, const Tensor& table, int64_t position, bool backward) {
  const int64_t rotary = heads_ + kv_heads_;
  if (!cp_) {
    if (backward)
      k::rope_backward(qkv4, table, rotary, position);
    else
      k::rope_forward(qkv4, table, rotary, position);
    return;
  }
  const int64_t b = qkv4.shape[0], t = qkv4.shape[1], w = qkv4.shape[2], hd = qkv4.shape[3], c = t / 2;
  for (int64_t i = 0; i < b; ++i)
    for (int h = 0; h < 2; ++h) {
      const Tensor part = qkv4.flat((i * t + h * c) * w * hd, c * w * hd).view({1, c, w, hd});
      const int64_t pos = parallel::cp_chunk(cp_->rank(), h, cp_->size()) * c;
      if (backward)
        k::rope_backward(part, table, rotary, pos);
      else
        k::rope_forward(part, table, rotary, pos);
    }
}

void Model::embed_backward(Slot& s) {
  const int64_t n = int64_t(s.batch) * s.seq, d = config_.hidden;
  if (sp_) {
    // The gathered gradient is the same on every rank: so are the positions' gradients.
    const Tensor dfull = rows(work_->sp_full, n);
    tpx::reduce_scatter_to_sequence_parallel_region_backward(tp_, rows(work_->dres, n / tp_.size()), dfull);
    if (config_.scale_embeddings) k::scale(dfull, embedding_scale());
    if (!llama_) positions_backward(dfull.view({s.batch, s.seq, d}));
    k::embedding_backward(end_grads_->wte, dfull, first(s.tokens, n), vocab_begin_, config_.vocab);
    return;
  }
  const Tensor dx = rows(work_->dres, n);
  if (!llama_) positions_backward(dx.view({s.batch, s.seq, d}));
  tpx::reduce_from_tp_region_backward(tp_, dx);
  if (config_.scale_embeddings) k::scale(dx, embedding_scale());
  k::embedding_backward(end_grads_->wte, dx, first(s.tokens, n), vocab_begin_, config_.vocab);
}

void Model::sp_grads(int layer, bool begin) {
  std::array<Tensor, 8> grads;
  if (layer >= 0) {
    const BlockWeights& g = weight_grads_[size_t(layer)];
    grads = {g.ln1_w, g.ln1_b, g.o_b, g.ln2_w, g.ln2_b, g.out_b, g.post_attn_w, g.post_mlp_w};
  } else {
    grads = {end_grads_->norm_w, end_grads_->norm_b};
  }
  if (begin)
    tpx::replicated_grads_begin(tp_, grads, work_->sp_grad_saved);
  else
    tpx::replicated_grads_end(tp_, grads, work_->sp_grad_saved);
}

void Model::norm_into_tp_region(Tensor in, Tensor x, Tensor w, Tensor b, Tensor mean, Tensor rstd) {
  const int64_t nl = x.shape[0];
  const float eps = float(config_.norm_eps);
  const Tensor own = sp_ ? rows(work_->sp_rows, nl) : in;  // sequence parallelism: a norm's own rows, then gathered
  if (llama_)
    k::rmsnorm_forward(own, first(rstd, nl), x, w, eps);
  else
    k::layernorm_forward(own, first(mean, nl), first(rstd, nl), x, w, b, eps);
  if (sp_)
    tpx::gather_from_sequence_parallel_region_forward(tp_, own, in);
  else
    tpx::copy_to_tp_region_forward(tp_, in);
}

void Model::norm_into_tp_region_backward(Tensor dx, Tensor dw, Tensor db, Tensor din, Tensor x, Tensor w, Tensor mean,
                                         Tensor rstd, Tensor dx_add) {
  const int64_t nl = x.shape[0];
  const Tensor din_own = sp_ ? rows(work_->sp_rows, nl) : din;  // sequence parallelism: reduce-scattered
  if (sp_)
    tpx::gather_from_sequence_parallel_region_backward(tp_, din, din_own);
  else
    tpx::copy_to_tp_region_backward(tp_, din);
  if (llama_)
    k::rmsnorm_backward(dx, dw, din_own, x, w, first(rstd, nl), dx_add);
  else
    k::layernorm_backward(dx, dw, db, din_own, x, w, first(mean, nl), first(rstd, nl), dx_add);
}

void Model::row_parallel_out(Tensor out, Tensor in, Tensor w) {
  reduce_over_tp(out, in.shape[0], [&](Tensor partial) { k::linear_forward(partial, in, w, Tensor{}); });
}

// dout: d(out) (this rank's stream rows); dfull: where the crossing's backward leaves the gradient
// of the linear's full output (dout itself without sequence parallelism); kept: where a split
// backward keeps that gradient for the weight half (undefined: the whole backward). With gelu_pre
// (GPT-2's MLP: in = GELU(gelu_pre)) din is the gradient of gelu_pre, through the GELU, and
// gelu_db (gelu_pre's bias gradient, when defined) accumulates its column sums: one product with
// the GELU's gradient in its epilogue on a GPU, in the whole and the split backward alike.
void Model::row_parallel_out_backward(Tensor din, Tensor dw, Tensor db, Tensor dout, Tensor dfull, Tensor in, Tensor w,
                                      Tensor kept, Tensor gelu_pre, Tensor gelu_db) {
  // The bias's gradient is d(out)'s column sums over this rank's rows. Without sequence parallelism
  // those are the rows the weight's product reads (dfull is dout), so the whole backward takes it
  // from that product (on a GPU, cuBLASLt's bias-gradient epilogue: no pass of its own); with
  // sequence parallelism (the product reads the gathered rows) and in a split backward (the weight
  // half runs later) it is summed here.
  const bool bias_with_weight = db.defined() && !sp_ && !kept.defined();
  if (db.defined() && !bias_with_weight) k::residual_backward(db, dout);
  if (sp_)
    tpx::reduce_scatter_to_sequence_parallel_region_backward(tp_, dout, dfull);
  else
    tpx::reduce_from_tp_region_backward(tp_, dout);
  if (kept.defined()) k::copy(kept, dfull);
  const Tensor dbias = bias_with_weight ? db : Tensor{};
  if (gelu_pre.defined()) {
    k::linear_backward_input_gelu(din, gelu_db, dfull, w, gelu_pre);
    if (!kept.defined()) k::linear_backward(Tensor{}, dw, dbias, dfull, in, w);
  } else if (kept.defined()) {
    k::linear_backward_input(din, dfull, w);
  } else {
    k::linear_backward(din, dw, dbias, dfull, in, w);
  }
}

void Model::block_forward(int layer, LayerActs& a, Tensor x_in, Tensor x_out, int b, int t, bool recompute,
                          int64_t position, const Cache* cache) {
  const BlockWeights& w = weights_[size_t(layer)];
  const int64_t n = int64_t(b) * t, hd = head_dim_;
  // Sequence parallelism: the stream (x, mid, out), the norms and the residual adds hold nl rows.
  const int64_t nl = sp_ ? n / tp_.size() : n;
  const Tensor x = rows(x_in, nl), ln1 = rows(a.ln1, n), qkv = rows(a.qkv, n), att = rows(a.att, n);
  const Tensor mid = rows(a.mid, nl), ln2 = rows(a.ln2, n), fc = rows(a.fc, n), act = rows(a.act, n);
  const Tensor qkv4 = qkv.view({b, t, heads_ + 2 * kv_heads_, hd}), lse = first(a.lse, b * heads_ * t);

  // Attention sub-block: mid = x + proj(attention(norm(x))).
  const k::AttentionSpec spec = attention_spec(layer);
  norm_into_tp_region(ln1, x, w.ln1_w, w.ln1_b, a.ln1_mean, a.ln1_rstd);
  k::linear_forward(qkv, ln1, w.qkv_w, w.qkv_b);
  if (config_.qk_norm) qk_norm_forward(w, a, qkv4);
  if (llama_) rope_apply(qkv4, rope_table_of(layer), position, false);
  if (cache) {
    // The cache holds micro_batch sequences; this call uses the first b of them.
    const int64_t rows_per_seq = cache->k.numel() / cache->k.shape[0];
    const kernels::Shape shape{b, cache->k.shape[1], cache->k.shape[2], cache->k.shape[3]};
    const Tensor kc = cache->k.flat(0, b * rows_per_seq).view(shape),
                 vc = cache->v.flat(0, b * rows_per_seq).view(shape);
    k::kv_cache_write(kc, vc, qkv4, heads_, kv_heads_, position);
    k::attention_cached_forward(att, lse, qkv4, kc, vc, heads_, kv_heads_, position, spec.window, spec.scale, w.sinks);
  } else if (cp_ && options_.cp_comm == CpComm::all_to_all) {
    parallel::ulysses_attention_forward(*cp_, att, lse, qkv4, heads_, kv_heads_, work_->ring, w.sinks);
  } else if (cp_) {
    parallel::ring_attention_forward(*cp_, att, lse, qkv4, heads_, kv_heads_, work_->ring, w.sinks);
  } else {
    k::attention_forward(att, lse, qkv4, qkv4, qkv4, w.sinks, spec);
  }
  post_normed_out(mid, att, w.o_w, w.post_attn_w, a.attn_raw, a.attn_rstd);
  k::residual_forward(mid, x, mid, w.o_b);

  // MLP sub-block: out = mid + down(activation(up(norm(mid)))); a MoE block's experts in its place.
  norm_into_tp_region(ln2, mid, w.ln2_w, w.ln2_b, a.ln2_mean, a.ln2_rstd);
  if (moe_block(layer)) {
    if (recompute) {  // backward needs the experts' activations, not their combined output
      moe_forward(w, a, ln2, Tensor{});
      return;
    }
    // With tp > 1 each rank's experts hold a slice of every expert's width: the combined outputs are
    // partial sums, reduced over tp like a row-parallel linear's.
    const Tensor out = rows(x_out, nl);
    reduce_over_tp(out, n, [&](Tensor partial) { moe_forward(w, a, ln2, partial); });
    k::residual_forward(out, mid, out, Tensor{});
    return;
  }
  if (llama_) {
    k::linear_forward(fc, ln2, w.fc_w, w.fc_b);
    gate_forward(act, fc);
  } else {
    k::linear_gelu_forward(act, fc, ln2, w.fc_w, w.fc_b);  // one product on a GPU (GELU in its epilogue)
  }
  // Backward needs everything above, not the block's output (with post_norms, also the MLP output's
  // norm statistics: the norm then writes into work's scratch).
  if (recompute && !config_.post_norms) return;
  const Tensor out = recompute ? rows(work_->dpost, nl) : rows(x_out, nl);
  post_normed_out(out, act, w.out_w, w.post_mlp_w, a.mlp_raw, a.mlp_rstd);
  if (recompute) return;
  k::residual_forward(out, mid, out, w.out_b);
}

// A row-parallel output linear, then (model.post_norms) the RMSNorm of its output: out =
// norm(in · wᵀ) with the product kept in raw and the norm's rstd; without post_norms out = in · wᵀ.
void Model::post_normed_out(Tensor out, Tensor in, Tensor w, Tensor norm_w, Tensor raw, Tensor rstd) {
  if (!norm_w.defined()) return row_parallel_out(out, in, w);
  const int64_t nl = out.shape[0];
  row_parallel_out(rows(raw, nl), in, w);
  k::rmsnorm_forward(out, first(rstd, nl), rows(raw, nl), norm_w, float(config_.norm_eps));
}

// Its backward's first half: from dout = d(out) to d(in · wᵀ) in work.dpost (returned); dout itself
// without post_norms. The norm weight's gradient accumulates in dnorm_w.
Tensor Model::post_norm_backward(Tensor dout, Tensor norm_w, Tensor dnorm_w, Tensor raw, Tensor rstd) {
  if (!norm_w.defined()) return dout;
  const int64_t nl = dout.shape[0];
  const Tensor draw = rows(work_->dpost, nl);
  k::rmsnorm_backward(draw, dnorm_w, dout, rows(raw, nl), norm_w, first(rstd, nl), Tensor{});
  return draw;
}

// The element-wise results block_forward computed, recomputed by the same ops from what selective
// recomputation keeps: ln1 from the block input, ln2 from mid, the MLP activation from fc. RoPE is
// applied in place to the kept qkv product, so it costs no memory of its own and is not redone.
// GPT-2's act is gelu_forward of the kept fc: on a GPU the forward's epilogue took the GELU of the
// unrounded product instead, so with 16-bit storage the recomputed act may differ from it by a
// rounding (the CPU's is bitwise the forward's).
void Model::block_recompute_elementwise(int layer, LayerActs& a, Tensor x_in, int b, int t) {
  const BlockWeights& w = weights_[size_t(layer)];
  const int64_t n = int64_t(b) * t;
  const int64_t nl = sp_ ? n / tp_.size() : n;
  const Tensor x = rows(x_in, nl), mid = rows(a.mid, nl), fc = rows(a.fc, n), act = rows(a.act, n);
  // With the forward crossing again: sequence parallelism gathers the rows (the same collective on
  // every tp rank); without it the copy into the tensor-parallel region is the identity.
  norm_into_tp_region(rows(a.ln1, n), x, w.ln1_w, w.ln1_b, a.ln1_mean, a.ln1_rstd);
  norm_into_tp_region(rows(a.ln2, n), mid, w.ln2_w, w.ln2_b, a.ln2_mean, a.ln2_rstd);
  if (moe_block(layer)) return;  // a MoE block keeps its experts' activations
  if (llama_)
    gate_forward(act, fc);
  else
    k::gelu_forward(act, fc);
}

void Model::gate_forward(Tensor act, Tensor fc) {
  if (config_.activation == MlpActivation::geglu)
    k::geglu_forward(act, fc);
  else
    k::swiglu_forward(act, fc);
}

// The routed experts' gate: SwiGLU, or gpt-oss's clamped one (model.moe.swiglu_limit).
void Model::expert_gate_forward(Tensor act, Tensor fc) {
  const MoeConfig& moe = config_.moe;
  if (moe.swiglu_limit > 0)
    k::swiglu_clamped_forward(act, fc, float(moe.swiglu_alpha), float(moe.swiglu_limit));
  else
    k::swiglu_forward(act, fc);
}

void Model::expert_gate_backward(Tensor dfc, Tensor dact, Tensor fc) {
  const MoeConfig& moe = config_.moe;
  if (moe.swiglu_limit > 0)
    k::swiglu_clamped_backward(dfc, dact, fc, float(moe.swiglu_alpha), float(moe.swiglu_limit));
  else
    k::swiglu_backward(dfc, dact, fc);
}

void Model::gate_backward(Tensor dfc, Tensor dact, Tensor fc) {
  if (config_.activation == MlpActivation::geglu)
    k::geglu_backward(dfc, dact, fc);
  else
    k::swiglu_backward(dfc, dact, fc);
}

void Model::block_backward(int layer, LayerActs& a, Tensor x_in, int b, int t, const LayerGrads* keep) {
  const BlockWeights &w = weights_[size_t(layer)], &g = weight_grads_[size_t(layer)];
  Work& wk = *work_;
  const int64_t n = int64_t(b) * t, hd = head_dim_;
  const int64_t nl = sp_ ? n / tp_.size() : n;  // the stream's rows (sequence parallelism: this rank's)
  const Tensor x = rows(x_in, nl), ln1 = rows(a.ln1, n), qkv = rows(a.qkv, n), att = rows(a.att, n);
  const Tensor mid = rows(a.mid, nl), ln2 = rows(a.ln2, n), fc = rows(a.fc, n), act = rows(a.act, n);
  const Tensor lse = first(a.lse, b * heads_ * t);
  // A split backward (keep): the qkv and MLP input linears' output gradients are computed where the
  // weight half will read them; the other two are copied there from the stream's gradient.
  const Tensor dres = rows(wk.dres, nl), dln = rows(wk.dln, n), datt = rows(wk.datt, n);
  const Tensor dqkv = rows(keep ? keep->dqkv : wk.dqkv, n), dfc = rows(keep ? keep->dfc : wk.dfc, n);
  const Tensor dact = rows(wk.dact, n);
  // Sequence parallelism: the gathered d(stream) for the row-parallel backward, and the norms'
  // input gradient reduce-scattered to this rank's rows; the replicated gradients reduced over tp.
  const Tensor dfull = sp_ ? rows(wk.sp_full, n) : dres;
  if (sp_) sp_grads(layer, true);

  // MLP sub-block; dres holds d(out).
  if (moe_block(layer)) {
    // A split backward (zero bubble) runs a MoE block's whole backward in the input half: its
    // weight gradients come with the input gradient from the same grouped products.
    if (sp_)  // the stream's gradient of all n rows
      tpx::reduce_scatter_to_sequence_parallel_region_backward(tp_, dres, dfull);
    else
      tpx::reduce_from_tp_region_backward(tp_, dres);
    moe_backward(w, g, a, ln2, dfull, dln);
  } else {
    const Tensor d_out = keep ? rows(keep->d_out, n) : Tensor{};
    if (llama_) {
      // post_norms: the stream's gradient through the MLP output's norm first (dres keeps d(out) for
      // the residual path).
      const Tensor dmlp = post_norm_backward(dres, w.post_mlp_w, g.post_mlp_w, a.mlp_raw, a.mlp_rstd);
      row_parallel_out_backward(dact, g.out_w, g.out_b, dmlp, sp_ ? dfull : dmlp, act, w.out_w, d_out);
      gate_backward(dfc, dact, fc);
    } else {
      // dfc straight from the out linear's input-gradient product through the GELU, with the fc
      // bias's gradient (also in a split backward: its weight half then leaves fc_b alone).
      row_parallel_out_backward(dfc, g.out_w, g.out_b, dres, dfull, act, w.out_w, d_out, fc, g.fc_b);
    }
    if (keep)
      k::linear_backward_input(dln, dfc, w.fc_w);
    else
      k::linear_backward(dln, g.fc_w, llama_ ? g.fc_b : Tensor{}, dfc, ln2, w.fc_w);
  }
  norm_into_tp_region_backward(dres, g.ln2_w, g.ln2_b, dln, mid, w.ln2_w, a.ln2_mean, a.ln2_rstd, dres);

  // Attention sub-block; dres holds d(mid).
  const Tensor dattn = post_norm_backward(dres, w.post_attn_w, g.post_attn_w, a.attn_raw, a.attn_rstd);
  row_parallel_out_backward(datt, g.o_w, g.o_b, dattn, sp_ ? dfull : dattn, att, w.o_w,
                            keep ? rows(keep->d_mid, n) : Tensor{});
  const Tensor qkv4 = qkv.view({b, t, heads_ + 2 * kv_heads_, hd});
  const Tensor dqkv4 = dqkv.view({b, t, heads_ + 2 * kv_heads_, hd});
  if (cp_ && options_.cp_comm == CpComm::all_to_all)
    parallel::ulysses_attention_backward(*cp_, dqkv4, datt, qkv4, att, lse, heads_, kv_heads_, work_->ring, g.sinks,
                                         w.sinks);
  else if (cp_)
    parallel::ring_attention_backward(*cp_, dqkv4, datt, qkv4, att, lse, heads_, kv_heads_, work_->ring, g.sinks,
                                      w.sinks);
  else
    k::attention_backward(dqkv4, dqkv4, dqkv4, g.sinks, datt.view({b, t, heads_, hd}), qkv4, qkv4, qkv4,
                          att.view({b, t, heads_, hd}), lse, w.sinks, attention_spec(layer));
  if (llama_) rope_apply(dqkv4, rope_table_of(layer), 0, true);
  if (config_.qk_norm) qk_norm_backward(w, g, a, dqkv4);
  if (keep) {
    k::linear_backward_input(dln, dqkv, w.qkv_w);
  } else {
    std::array<Tensor, 2> kv;
    const std::span<const Tensor> kv_grads(kv.data(), replicated_kv_grads(g, kv));
    if (kv_group_) tpx::replicated_grads_begin(*kv_group_, kv_grads, wk.kv_grad_saved);
    k::linear_backward(dln, g.qkv_w, g.qkv_b, dqkv, ln1, w.qkv_w);
    if (kv_group_) tpx::replicated_grads_end(*kv_group_, kv_grads, wk.kv_grad_saved);
  }
  norm_into_tp_region_backward(dres, g.ln1_w, g.ln1_b, dln, x, w.ln1_w, a.ln1_mean, a.ln1_rstd, dres);
  if (sp_) sp_grads(layer, false);
}

// Replicated key/value heads: each rank's gradient of them is its query heads' part only. The
// k and v rows of the packed projection's weight gradient (and of its bias's, with qkv_bias), in
// `out`; returns how many (none without replicated heads).
size_t Model::replicated_kv_grads(const BlockWeights& g, std::array<Tensor, 2>& out) const {
  if (!kv_group_) return 0;
  const int64_t hd = head_dim_, d = config_.hidden;
  out[0] = g.qkv_w.flat(heads_ * hd * d, 2 * kv_heads_ * hd * d);
  if (!g.qkv_b.defined()) return 1;
  out[1] = g.qkv_b.flat(heads_ * hd, 2 * kv_heads_ * hd);
  return 2;
}

// The weight half of a split block backward: the four linears' weight (and bias) gradients from
// the output gradients the input half kept and the block's kept activations, in the order the
// whole backward accumulates them.
void Model::block_backward_weight(int layer, const LayerActs& a, const LayerGrads& kept, int b, int t) {
  const BlockWeights &w = weights_[size_t(layer)], &g = weight_grads_[size_t(layer)];
  const int64_t n = int64_t(b) * t;
  if (!moe_block(layer)) {  // a MoE block's were computed by the input half
    k::linear_backward(Tensor{}, g.out_w, Tensor{}, rows(kept.d_out, n), rows(a.act, n), w.out_w);
    // GPT-2's fc bias gradient came with dfc, in the input half (block_backward).
    k::linear_backward(Tensor{}, g.fc_w, llama_ ? g.fc_b : Tensor{}, rows(kept.dfc, n), rows(a.ln2, n), w.fc_w);
  }
  k::linear_backward(Tensor{}, g.o_w, Tensor{}, rows(kept.d_mid, n), rows(a.att, n), w.o_w);
  std::array<Tensor, 2> kv;
  const std::span<const Tensor> kv_grads(kv.data(), replicated_kv_grads(g, kv));
  if (kv_group_) tpx::replicated_grads_begin(*kv_group_, kv_grads, work_->kv_grad_saved);
  k::linear_backward(Tensor{}, g.qkv_w, g.qkv_b, rows(kept.dqkv, n), rows(a.ln1, n), w.qkv_w);
  if (kv_group_) tpx::replicated_grads_end(*kv_group_, kv_grads, work_->kv_grad_saved);
}

// A MoE block's MLP on the n normed rows ln2 (model.moe; docs/model.md "Mixture of experts"): the
// router (fp32) picks top_k experts per row, the plan sorts the picks by expert (stable: token order
// within an expert; over capacity, the later picks drop), the gathered rows go through each expert's
// SwiGLU as two grouped products, and the outputs come back weighted by the router. The
// load-balancing and z losses are not computed here: their gradients join in moe_backward and their
// values are read from the statistics (route_stats).
void Model::moe_forward(const BlockWeights& w, LayerActs& a, Tensor ln2, Tensor out) {
  const MoeConfig& moe = config_.moe;
  const int64_t n = ln2.shape[0], m = n * moe.top_k;
  // Capacity per expert (Megatron-Core's): ⌈factor · n · top_k / experts⌉; 0 = dropless.
  const int64_t capacity =
      moe.capacity_factor > 0
          ? std::max<int64_t>(1, int64_t(std::ceil(moe.capacity_factor * double(m) / double(moe.experts))))
          : 0;
  const Tensor probs = rows(a.probs, n), lse = first(a.router_lse, n), expert = first(a.route_expert, m);
  const Tensor weight = first(a.route_weight, m), order = first(a.route_order, m), pos = first(a.route_pos, m);
  k::moe_router_forward(probs, lse, expert, weight, ln2, w.router, w.router_b, moe.top_k, moe.renormalize);
  k::moe_route_plan(order, pos, a.route_offsets, expert, moe.experts, capacity);
  k::moe_route_stats(a.route_stats, probs, lse, expert, a.route_offsets);
  // Context parallelism: the load-balancing loss is of the whole sequence's routing, as at cp 1 (each
  // rank's picks and probabilities summed over the cp group; moe_backward scales for the shares).
  if (cp_) cp_->all_reduce(a.route_stats, parallel::ReduceOp::sum);
  const Tensor in = rows(a.moe_in, m), y = rows(a.moe_out, m);
  k::moe_gather_forward(in, ln2, order, moe.top_k);
  moe_experts_forward(w, a, in, y);
  if (out.defined()) k::moe_combine_forward(out, y, weight, pos);  // undefined: a recomputation
  if (!w.shared_gate.defined()) return;
  // The shared expert (Qwen2-MoE): out += σ(ln2 · gate) ⊙ SwiGLU(ln2), its width split over tp like
  // the dense MLP's (y a partial sum, as the experts' outputs are; the gate is every rank's).
  const int64_t fs = shared_ffn_;
  const Tensor fc = rows_of(a.fc, n, 2 * fs), act = rows_of(a.act, n, fs), shared = rows(a.shared_out, n);
  k::linear_forward(fc, ln2, w.fc_w, Tensor{});
  k::swiglu_forward(act, fc);
  k::linear_forward(shared, act, w.out_w, Tensor{});
  k::moe_shared_gate_forward(out, first(a.shared_gate, n), shared, ln2, w.shared_gate);
}

// Its backward from dout = d(out): the experts' and the router's weight gradients, and d(ln2) in dln
// (the experts' share, then the router's added). The router's gradient carries the auxiliary
// losses' too, scaled like the main loss (loss_scale_).
void Model::moe_backward(const BlockWeights& w, const BlockWeights& g, const LayerActs& a, Tensor ln2, Tensor dout,
                         Tensor dln) {
  const MoeConfig& moe = config_.moe;
  const int64_t n = ln2.shape[0], m = n * moe.top_k;
  Work& wk = *work_;
  const Tensor pos = first(a.route_pos, m), dweight = first(wk.moe_dweight, m);
  const Tensor dd = rows(wk.moe_dd, m);
  k::moe_combine_backward(dd, dweight, dout, rows(a.moe_out, m), first(a.route_weight, m), pos);
  // tp > 1: each rank's expert outputs are partial sums over its slice of the experts' width, so are
  // the weights' gradients; summed, they are the same on every rank, and so is the router's gradient.
  tpx::reduce_from_tp_region_forward(tp_, dweight);
  moe_experts_backward(w, g, a, dd, dd);
  k::moe_gather_backward(dln, dd, pos);
  // d(ln2) is a partial sum over tp (the norm's backward reduces it): the router's share, the same on
  // every rank, joins it on tp rank 0 only; the others send theirs to scratch.
  const Tensor router_din = tp_.rank() == 0 ? dln : rows(wk.moe_dd, n);
  // With cp > 1 the statistics cover cp × n rows (moe_forward summed them over the cp group) and the
  // gradient sync averages over cp: the load-balancing term's coefficient over cp keeps each rank's
  // share of the whole sequence's gradient (the z-loss is per row: nothing to scale).
  const float aux = float(moe.aux_loss) / float(cp_ ? cp_->size() : 1);
  k::moe_router_backward(router_din, g.router, g.router_b, dweight, rows(a.probs, n), first(a.router_lse, n),
                         first(a.route_expert, m), a.route_stats, ln2, w.router, moe.top_k, moe.renormalize, aux,
                         float(moe.z_loss), loss_scale_);
  if (!w.shared_gate.defined()) return;
  // The shared expert: through the gate (its logit's gradient a partial sum over tp, as y is: reduced,
  // the gate weight's gradient is every rank's, and its share of d(ln2) joins on tp rank 0, as the
  // router's), then its SwiGLU, whose d(ln2) share is partial like the experts'.
  const int64_t fs = shared_ffn_;
  const Tensor dy = rows(wk.moe_dd, n), dlogit = first(wk.moe_dlogit, n);
  k::moe_shared_gate_backward(dy, dlogit, dout, rows(a.shared_out, n), first(a.shared_gate, n));
  tpx::reduce_from_tp_region_forward(tp_, dlogit);
  k::moe_shared_gate_weight_backward(tp_.rank() == 0 ? dln : Tensor{}, g.shared_gate, dlogit, ln2, w.shared_gate);
  const Tensor dact = rows_of(wk.dact, n, fs), dfc = rows_of(wk.dfc, n, 2 * fs);
  k::linear_backward(dact, g.out_w, Tensor{}, dy, rows_of(a.act, n, fs), w.out_w);
  k::swiglu_backward(dfc, dact, rows_of(a.fc, n, 2 * fs));
  k::linear_backward(dy, g.fc_w, Tensor{}, dfc, ln2, w.fc_w);  // dy's rows now hold the SwiGLU's d(ln2)
  k::residual_forward(dln, dln, dy, Tensor{});
}

namespace {

// Expert parallelism's exchange, from every ep rank's expert offsets `plan` [ep, E + 1] (each rank's
// picks in expert order): the rows this rank sends each ep rank (its picks of that rank's experts)
// and receives from each (that rank's picks of this rank's experts).
struct EpCounts {
  std::vector<int64_t> send, recv;
  int64_t received = 0;
};

EpCounts ep_counts(const std::vector<int32_t>& plan, int ep, int me, int64_t experts) {
  const int64_t local = experts / ep;
  auto offset = [&](int rank, int64_t e) { return int64_t(plan[size_t(rank * (experts + 1) + e)]); };
  EpCounts c;
  for (int q = 0; q < ep; ++q) {
    c.send.push_back(offset(me, (q + 1) * local) - offset(me, q * local));
    c.recv.push_back(offset(q, (me + 1) * local) - offset(q, me * local));
    c.received += c.recv.back();
  }
  return c;
}

std::vector<int64_t> times(std::vector<int64_t> counts, int64_t cols) {
  for (int64_t& c : counts) c *= cols;
  return counts;
}

}  // namespace

// The experts' SwiGLU on the M gathered rows `in` (the plan's order), outputs in y. With ep > 1
// (docs/model.md "Expert parallelism") the rows go to the ranks of their experts and back: every
// ep rank's offsets are all-gathered and read on the host (the exchange's counts, kept for the
// backward), the rows exchanged by all-to-all, reordered expert-major (expert, then sending rank,
// then that rank's order: a fixed order whatever the layout), run through this rank's E/ep experts,
// restored to the received order and sent back.
void Model::moe_experts_forward(const BlockWeights& w, LayerActs& a, Tensor in, Tensor y) {
  const int64_t m = in.shape[0];
  if (!ep_) {
    const Tensor fc = rows(a.moe_fc, m), act = rows(a.moe_act, m);
    k::grouped_linear_forward(fc, in, w.experts_in, w.experts_in_b, a.route_offsets);
    expert_gate_forward(act, fc);
    k::grouped_linear_forward(y, act, w.experts_out, down_bias(w), a.route_offsets);
    return;
  }
  Work& wk = *work_;
  const int ep = ep_->size(), me = ep_->rank();
  const int64_t experts = config_.moe.experts, local = experts / ep, d = in.shape[1];
  const Tensor gathered = first(wk.ep_plan, ep * (experts + 1));
  ep_->all_gather(a.route_offsets, gathered);
  std::vector<int32_t>& plan = *a.ep_plan;  // [ep · (E + 1)] (build_activations)
  k::copy(k::host_tensor(plan.data(), {ep * (experts + 1)}), gathered);
  const EpCounts c = ep_counts(plan, ep, me, experts);
  const int64_t r = c.received;
  LT_CHECK(r <= a.ep_in.shape[0], "expert parallelism: {} rows received for {}", r, a.ep_in.shape[0]);
  ep_->all_to_all_v_async(in, times(c.send, d), wk.ep_recv, times(c.recv, d))->wait();

  // Expert-major order: perm[j] = the received row of expert-major row j; inv its inverse.
  std::vector<int32_t> perm(static_cast<size_t>(r)), inv(static_cast<size_t>(r)),
      offsets(static_cast<size_t>(local + 1), 0);
  std::vector<int64_t> start(size_t(ep), 0);  // each sender's first received row
  for (int q = 1; q < ep; ++q) start[size_t(q)] = start[size_t(q - 1)] + c.recv[size_t(q - 1)];
  int64_t j = 0;
  for (int64_t e = 0; e < local; ++e) {
    for (int q = 0; q < ep; ++q) {
      const size_t row = size_t(q * (experts + 1) + me * local);
      const int64_t begin = plan[row + size_t(e)] - plan[row],
                    count = plan[row + size_t(e) + 1] - plan[row + size_t(e)];
      for (int64_t i = 0; i < count; ++i, ++j) {
        perm[size_t(j)] = int32_t(start[size_t(q)] + begin + i);
        inv[size_t(perm[size_t(j)])] = int32_t(j);
      }
    }
    offsets[size_t(e + 1)] = int32_t(j);
  }
  k::copy(first(a.ep_offsets, local + 1), k::host_tensor(offsets.data(), {local + 1}));
  const Tensor sent_back = rows(wk.ep_recv, r);
  if (r > 0) {
    k::copy(first(a.ep_perm, r), k::host_tensor(perm.data(), {r}));
    k::copy(first(a.ep_inv, r), k::host_tensor(inv.data(), {r}));
    const Tensor xin = rows(a.ep_in, r), fc = rows(a.moe_fc, r), act = rows(a.moe_act, r), out = rows(wk.ep_rows, r);
    k::moe_gather_forward(xin, rows(wk.ep_recv, r), first(a.ep_perm, r), 1);
    k::grouped_linear_forward(fc, xin, local_experts(w.experts_in), local_experts(w.experts_in_b), a.ep_offsets);
    expert_gate_forward(act, fc);
    k::grouped_linear_forward(out, act, local_experts(w.experts_out), local_experts(down_bias(w)), a.ep_offsets);
    k::moe_gather_forward(sent_back, out, first(a.ep_inv, r), 1);
  }
  ep_->all_to_all_v_async(sent_back, times(c.recv, d), y, times(c.send, d))->wait();
}

// Its backward from dy (the plan's order): the experts' weight gradients, and d(in) in din (may be
// dy itself). With ep > 1, the gradients travel as the rows did, with the forward's counts.
void Model::moe_experts_backward(const BlockWeights& w, const BlockWeights& g, const LayerActs& a, Tensor dy,
                                 Tensor din) {
  Work& wk = *work_;
  if (!ep_) {
    const int64_t m = dy.shape[0];
    const Tensor dfc = rows(wk.moe_dfc, m), dact = rows(wk.moe_dact, m);
    k::grouped_linear_backward(dact, g.experts_out, g.experts_out_b, dy, rows(a.moe_act, m), w.experts_out,
                               a.route_offsets);
    expert_gate_backward(dfc, dact, rows(a.moe_fc, m));
    k::grouped_linear_backward(din, g.experts_in, g.experts_in_b, dfc, rows(a.moe_in, m), w.experts_in,
                               a.route_offsets);
    return;
  }
  const int ep = ep_->size(), me = ep_->rank();
  const int64_t experts = config_.moe.experts, d = dy.shape[1];
  const EpCounts c = ep_counts(*a.ep_plan, ep, me, experts);
  const int64_t r = c.received;
  ep_->all_to_all_v_async(dy, times(c.send, d), wk.ep_recv, times(c.recv, d))->wait();
  const Tensor received = rows(wk.ep_recv, r);
  if (r > 0) {
    const Tensor drows = rows(wk.ep_rows, r), dfc = rows(wk.moe_dfc, r), dact = rows(wk.moe_dact, r);
    k::moe_gather_forward(drows, received, first(a.ep_perm, r), 1);
    k::grouped_linear_backward(dact, local_experts(g.experts_out), local_experts(g.experts_out_b), drows,
                               rows(a.moe_act, r), local_experts(w.experts_out), a.ep_offsets);
    expert_gate_backward(dfc, dact, rows(a.moe_fc, r));
    k::grouped_linear_backward(drows, local_experts(g.experts_in), local_experts(g.experts_in_b), dfc, rows(a.ep_in, r),
                               local_experts(w.experts_in), a.ep_offsets);
    k::moe_gather_forward(received, drows, first(a.ep_inv, r), 1);
  }
  ep_->all_to_all_v_async(received, times(c.recv, d), din, times(c.send, d))->wait();
}

// This ep rank's experts of an [E, ...] expert operand (all of it at ep 1, and what the model holds
// when the experts are sharded; an absent bias stays absent).
Tensor Model::local_experts(const Tensor& all) const {
  if (!ep_ || options_.experts_sharded || !all.defined()) return all;
  const int64_t local = all.shape[0] / ep_->size(), each = all.numel() / all.shape[0];
  kernels::Shape shape = all.shape;
  shape[0] = local;
  return all.flat(ep_->rank() * local * each, local * each).view(shape);
}

// The experts' down-projection bias as the forward adds it: with tp > 1 the outputs are partial sums
// (reduced over tp), so tp rank 0 alone adds it.
Tensor Model::down_bias(const BlockWeights& w) const { return tp_.rank() == 0 ? w.experts_out_b : Tensor{}; }

void Model::head_forward(Slot& s) {
  const EndWeights& h = *ends_;
  const int64_t n = int64_t(s.batch) * s.seq;
  const int64_t nl = sp_ ? n / tp_.size() : n;
  const Tensor x = rows(s.residual.back(), nl), lnf = rows(s.lnf, n);
  norm_into_tp_region(lnf, x, h.norm_w, h.norm_b, s.lnf_mean, s.lnf_rstd);
  const Tensor logits = rows(s.logits, n);
  k::linear_forward(logits, lnf, h.head, Tensor{});
  if (config_.logit_softcap > 0) k::softcap_forward(logits, float(config_.logit_softcap));
  if (!s.has_targets) {  // logits only (forward_logits, generation): no loss
    k::fill_zero(s.loss);
    k::fill_zero(s.count);
    return;
  }
  const Tensor targets = first(s.targets, n), losses = first(s.losses, n);
  if (tp_.size() == 1)
    k::cross_entropy_forward(losses, first(s.ce_lse, n), logits, targets, config_.vocab, kIgnoreIndex);
  else
    tpx::vocab_parallel_cross_entropy_forward(tp_, losses, first(s.ce_lse, n), logits, targets, config_.vocab,
                                              kIgnoreIndex, work_->ce_scratch);
  // No counted token: the micro-batch contributes nothing (loss 0, zero gradient).
  k::loss_mean_forward(s.loss, s.count, losses, targets, kIgnoreIndex);
}

void Model::head_backward(Slot& s, float loss_scale, bool split) {
  const EndWeights &h = *ends_, &g = *end_grads_;
  const int64_t n = int64_t(s.batch) * s.seq;
  const int64_t nl = sp_ ? n / tp_.size() : n;
  const Tensor x = rows(s.residual.back(), nl), lnf = rows(s.lnf, n);
  const Tensor logits = rows(s.logits, n);
  if (sp_) sp_grads(-1, true);
  // dlogits overwrite the logits in place; the per-row gradient is loss_scale / count. With
  // soft-capping the capped logits' gradient goes to work.dlogits first, and through the cap's
  // derivative (read from the capped logits) back into the logits' buffer.
  const bool capped = config_.logit_softcap > 0;
  const Tensor dcapped = capped ? rows(work_->dlogits, n) : logits;
  if (tp_.size() == 1)
    k::cross_entropy_backward(dcapped, logits, first(s.ce_lse, n), first(s.targets, n), config_.vocab, kIgnoreIndex,
                              loss_scale, s.count);
  else
    tpx::vocab_parallel_cross_entropy_backward(tp_, dcapped, logits, first(s.ce_lse, n), first(s.targets, n),
                                               config_.vocab, kIgnoreIndex, loss_scale, s.count);
  if (capped) k::softcap_backward(logits, dcapped, logits, float(config_.logit_softcap));
  const Tensor dln = rows(work_->dln, n), dres = rows(work_->dres, nl);
  if (split)
    k::linear_backward_input(dln, logits, h.head);  // the logits' gradient stays for the weight half
  else
    k::linear_backward(dln, g.head, Tensor{}, logits, lnf, h.head);
  norm_into_tp_region_backward(dres, g.norm_w, g.norm_b, dln, x, h.norm_w, s.lnf_mean, s.lnf_rstd, Tensor{});
  if (sp_) sp_grads(-1, false);
}

void Model::head_backward_weight(Slot& s) {
  const int64_t n = int64_t(s.batch) * s.seq;
  k::linear_backward(Tensor{}, end_grads_->head, Tensor{}, rows(s.logits, n), rows(s.lnf, n), ends_->head);
}

}  // namespace llmtrain::trainer
