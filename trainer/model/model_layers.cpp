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
//    bias is added after the all-reduce, by residual_forward).
#include "kernels/ops.h"
#include "parallel/tensor_parallel.h"
#include "trainer/model/model_internal.h"

namespace llmtrain::trainer {

namespace k = kernels;
namespace tpx = parallel;

namespace {

// The first n rows of a [rows, cols] buffer.
Tensor rows(const Tensor& t, int64_t n) {
  const int64_t cols = t.shape[t.shape.rank() - 1];
  return t.flat(0, n * cols).view({n, cols});
}
Tensor first(const Tensor& t, int64_t n) { return t.flat(0, n); }

}  // namespace

void Model::embed_forward(Slot& s) {
  const int64_t n = int64_t(s.batch) * s.seq, d = config_.hidden;
  const Tensor x = rows(s.residual[0], n);
  const Tensor tokens = first(s.tokens, n);
  k::embedding_forward(x, tokens, params_[0].value, vocab_begin_);
  tpx::reduce_from_tp_region_forward(tp_, x);
  if (!llama_) k::position_embedding_forward(x.view({s.batch, s.seq, d}), params_[1].value, 0);
}

void Model::embed_backward(Slot& s) {
  const int64_t n = int64_t(s.batch) * s.seq, d = config_.hidden;
  const Tensor dx = rows(work_->dres, n);
  if (!llama_) k::position_embedding_backward(params_[1].grad, dx.view({s.batch, s.seq, d}), 0);
  tpx::reduce_from_tp_region_backward(tp_, dx);
  k::embedding_backward(params_[0].grad, dx, first(s.tokens, n), vocab_begin_);
}

void Model::block_forward(int layer, LayerActs& a, Tensor x_in, Tensor x_out, int b, int t, bool recompute) {
  const BlockWeights& w = weights_[size_t(layer)];
  const int64_t n = int64_t(b) * t, hd = head_dim_;
  const float eps = float(config_.norm_eps);
  const Tensor x = rows(x_in, n), ln1 = rows(a.ln1, n), qkv = rows(a.qkv, n), att = rows(a.att, n);
  const Tensor mid = rows(a.mid, n), ln2 = rows(a.ln2, n), fc = rows(a.fc, n), act = rows(a.act, n);
  const Tensor qkv4 = qkv.view({b, t, heads_ + 2 * kv_heads_, hd}), lse = first(a.lse, b * heads_ * t);

  // Attention sub-block: mid = x + proj(attention(norm(x))).
  if (llama_)
    k::rmsnorm_forward(ln1, first(a.ln1_rstd, n), x, w.ln1_w, eps);
  else
    k::layernorm_forward(ln1, first(a.ln1_mean, n), first(a.ln1_rstd, n), x, w.ln1_w, w.ln1_b, eps);
  tpx::copy_to_tp_region_forward(tp_, ln1);
  k::linear_forward(qkv, ln1, w.qkv_w, w.qkv_b);
  if (llama_) k::rope_forward(qkv4, work_->rope, heads_ + kv_heads_, 0);
  k::attention_forward(att, lse, qkv4, heads_, kv_heads_);
  k::linear_forward(mid, att, w.o_w, Tensor{});
  tpx::reduce_from_tp_region_forward(tp_, mid);
  k::residual_forward(mid, x, mid, w.o_b);

  // MLP sub-block: out = mid + down(activation(up(norm(mid)))).
  if (llama_)
    k::rmsnorm_forward(ln2, first(a.ln2_rstd, n), mid, w.ln2_w, eps);
  else
    k::layernorm_forward(ln2, first(a.ln2_mean, n), first(a.ln2_rstd, n), mid, w.ln2_w, w.ln2_b, eps);
  tpx::copy_to_tp_region_forward(tp_, ln2);
  k::linear_forward(fc, ln2, w.fc_w, w.fc_b);
  if (llama_)
    k::swiglu_forward(act, fc);
  else
    k::gelu_forward(act, fc);
  if (recompute) return;  // backward needs everything above, not the block's output
  const Tensor out = rows(x_out, n);
  k::linear_forward(out, act, w.out_w, Tensor{});
  tpx::reduce_from_tp_region_forward(tp_, out);
  k::residual_forward(out, mid, out, w.out_b);
}

void Model::block_backward(int layer, LayerActs& a, Tensor x_in, int b, int t) {
  const BlockWeights &w = weights_[size_t(layer)], &g = weight_grads_[size_t(layer)];
  Work& wk = *work_;
  const int64_t n = int64_t(b) * t, hd = head_dim_;
  const Tensor x = rows(x_in, n), ln1 = rows(a.ln1, n), qkv = rows(a.qkv, n), att = rows(a.att, n);
  const Tensor mid = rows(a.mid, n), ln2 = rows(a.ln2, n), fc = rows(a.fc, n), act = rows(a.act, n);
  const Tensor lse = first(a.lse, b * heads_ * t);
  const Tensor dres = rows(wk.dres, n), dln = rows(wk.dln, n), dqkv = rows(wk.dqkv, n), datt = rows(wk.datt, n);
  const Tensor dfc = rows(wk.dfc, n), dact = rows(wk.dact, n);

  // MLP sub-block; dres holds d(out).
  if (g.out_b.defined()) k::residual_backward(g.out_b, dres);
  tpx::reduce_from_tp_region_backward(tp_, dres);
  k::linear_backward(dact, g.out_w, Tensor{}, dres, act, w.out_w);
  if (llama_)
    k::swiglu_backward(dfc, dact, fc);
  else
    k::gelu_backward(dfc, dact, fc);
  k::linear_backward(dln, g.fc_w, g.fc_b, dfc, ln2, w.fc_w);
  tpx::copy_to_tp_region_backward(tp_, dln);
  if (llama_)
    k::rmsnorm_backward(dres, g.ln2_w, dln, mid, w.ln2_w, first(a.ln2_rstd, n), dres);
  else
    k::layernorm_backward(dres, g.ln2_w, g.ln2_b, dln, mid, w.ln2_w, first(a.ln2_mean, n), first(a.ln2_rstd, n), dres);

  // Attention sub-block; dres holds d(mid).
  if (g.o_b.defined()) k::residual_backward(g.o_b, dres);
  tpx::reduce_from_tp_region_backward(tp_, dres);
  k::linear_backward(datt, g.o_w, Tensor{}, dres, att, w.o_w);
  const Tensor qkv4 = qkv.view({b, t, heads_ + 2 * kv_heads_, hd});
  const Tensor dqkv4 = dqkv.view({b, t, heads_ + 2 * kv_heads_, hd});
  k::attention_backward(dqkv4, datt.view({b, t, heads_, hd}), qkv4, att.view({b, t, heads_, hd}), lse, heads_,
                        kv_heads_);
  if (llama_) k::rope_backward(dqkv4, work_->rope, heads_ + kv_heads_, 0);
  k::linear_backward(dln, g.qkv_w, g.qkv_b, dqkv, ln1, w.qkv_w);
  tpx::copy_to_tp_region_backward(tp_, dln);
  if (llama_)
    k::rmsnorm_backward(dres, g.ln1_w, dln, x, w.ln1_w, first(a.ln1_rstd, n), dres);
  else
    k::layernorm_backward(dres, g.ln1_w, g.ln1_b, dln, x, w.ln1_w, first(a.ln1_mean, n), first(a.ln1_rstd, n), dres);
}

namespace {
// The head's parameters: final norm weight (and bias), and the output matrix (the word embedding
// when tied). They are the last parameters of the stage, in spec order.
struct HeadParams {
  const ModelParam *norm_w = nullptr, *norm_b = nullptr, *out = nullptr;
};
HeadParams head_params(const std::vector<ModelParam>& params, bool llama, bool tied) {
  HeadParams h;
  for (const ModelParam& p : params) {
    const std::string& name = p.spec.name;
    if (name == "transformer.ln_f.weight" || name == "model.norm.weight") h.norm_w = &p;
    if (name == "transformer.ln_f.bias") h.norm_b = &p;
    if (name == "lm_head.weight" ||
        (tied && (name == "transformer.wte.weight" || name == "model.embed_tokens.weight") && !h.out))
      h.out = &p;
  }
  LT_CHECK(h.norm_w && h.out && (llama || h.norm_b), "head parameters missing");
  return h;
}
}  // namespace

float Model::head_forward(Slot& s) {
  const HeadParams h = head_params(params_, llama_, config_.tie_embeddings);
  const int64_t n = int64_t(s.batch) * s.seq;
  const float eps = float(config_.norm_eps);
  const Tensor x = rows(s.residual.back(), n), lnf = rows(s.lnf, n);
  if (llama_)
    k::rmsnorm_forward(lnf, first(s.lnf_rstd, n), x, h.norm_w->value, eps);
  else
    k::layernorm_forward(lnf, first(s.lnf_mean, n), first(s.lnf_rstd, n), x, h.norm_w->value, h.norm_b->value, eps);
  tpx::copy_to_tp_region_forward(tp_, lnf);
  const Tensor logits = rows(s.logits, n), full = rows(s.logits_full, n);
  k::linear_forward(logits, lnf, h.out->value, Tensor{});
  tpx::gather_from_tp_region_forward(tp_, logits, full, work_->gather_scratch);
  s.counted = 0;
  if (!s.has_targets) return 0.0f;
  const Tensor targets = first(s.targets, n), losses = first(s.losses, n);
  k::cross_entropy_forward(losses, first(s.ce_lse, n), full, targets, config_.vocab, kIgnoreIndex);
  const int32_t* tg = targets.ptr<int32_t>();
  const float* l = losses.ptr<float>();
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    if (tg[i] != kIgnoreIndex) {
      sum += l[i];
      ++s.counted;
    }
  // No counted token: the micro-batch contributes nothing (loss 0, zero gradient).
  return s.counted ? float(sum / double(s.counted)) : 0.0f;
}

void Model::head_backward(Slot& s, float loss_scale) {
  const HeadParams h = head_params(params_, llama_, config_.tie_embeddings);
  const int64_t n = int64_t(s.batch) * s.seq;
  const Tensor x = rows(s.residual.back(), n), lnf = rows(s.lnf, n);
  const Tensor logits = rows(s.logits, n), full = rows(s.logits_full, n);
  const float dloss = s.counted ? loss_scale / float(s.counted) : 0.0f;
  // dlogits overwrite the logits in place.
  k::cross_entropy_backward(full, full, first(s.ce_lse, n), first(s.targets, n), config_.vocab, kIgnoreIndex, dloss);
  tpx::gather_from_tp_region_backward(tp_, full, logits);
  const Tensor dln = rows(work_->dln, n), dres = rows(work_->dres, n);
  k::linear_backward(dln, h.out->grad, Tensor{}, logits, lnf, h.out->value);
  tpx::copy_to_tp_region_backward(tp_, dln);
  if (llama_)
    k::rmsnorm_backward(dres, h.norm_w->grad, dln, x, h.norm_w->value, first(s.lnf_rstd, n), Tensor{});
  else
    k::layernorm_backward(dres, h.norm_w->grad, h.norm_b->grad, dln, x, h.norm_w->value, first(s.lnf_mean, n),
                          first(s.lnf_rstd, n), Tensor{});
}

}  // namespace llmtrain::trainer
