// One pipeline stage's calls (model.h, "one pipeline stage"): the activation slots, forward of a
// micro-batch through this stage's chunk, its backward whole or split in an input and a weight half
// (zero-bubble schedules), and what crosses to the neighbouring stages. The layers' math is in
// model_layers.cpp, construction and the whole-model calls in model.cpp.
#include <fmt/format.h>

#include <tuple>

#include "common/error.h"
#include "kernels/ops.h"
#include "trainer/model/model.h"
#include "trainer/model/model_internal.h"

namespace llmtrain::trainer {

using kernels::DType;
using kernels::Tensor;

// [B, T] int32 tensor → (B, T), or an Error naming what is wrong. Reads the shape only.
std::pair<int, int> batch_shape(const Tensor& t, const char* what, int max_batch, int64_t max_seq) {
  LT_CHECK(t.dtype == DType::int32 && t.shape.rank() == 2, "{} must be [B, T] int32, found {} {}", what,
           kernels::to_string(t.dtype), t.shape.str());
  if (t.shape[0] < 1 || t.shape[0] > max_batch || t.shape[1] < 1 || t.shape[1] > max_seq)
    throw Error(fmt::format("{} of shape {} exceed the model's buffers for {} sequences of {} tokens", what,
                            t.shape.str(), max_batch, max_seq));
  return {int(t.shape[0]), int(t.shape[1])};
}

Model::Slot& Model::slot_at(int slot, int chunk) {
  const int slots = options_.activation_slots, chunks = options_.stage.chunks;
  LT_CHECK(slot >= 0 && slot < slots && chunk >= 0 && chunk < chunks, "activation slot {} of {}, chunk {} of {}", slot,
           slots, chunk, chunks);
  return slots_[size_t(chunk) * size_t(slots) + size_t(slot)];
}

const Model::Slot& Model::slot_at(int slot, int chunk) const { return const_cast<Model*>(this)->slot_at(slot, chunk); }

kernels::Shape Model::stage_activation_shape() const {
  if (sp_) return {int64_t(options_.micro_batch) * seq_ / tp_.size(), config_.hidden};
  return {options_.micro_batch, seq_, config_.hidden};
}

void Model::stage_forward(int slot, const MicroBatch& mb, Tensor input, int chunk) {
  Slot& s = slot_at(slot, chunk);
  const StageLayout& st = options_.stage;
  const bool embedding = st.has_embedding && chunk == 0, head = st.has_head && chunk == st.chunks - 1;
  int b = 0, t = 0;
  if (embedding) {
    std::tie(b, t) = batch_shape(mb.tokens, "tokens", options_.micro_batch, seq_);
  } else if (sp_) {
    // This tp rank's rows of a full micro-batch.
    LT_CHECK(input.defined() && input.shape == stage_activation_shape(),
             "sequence-parallel stage input {}, expected {}", input.shape.str(), stage_activation_shape().str());
    b = options_.micro_batch;
    t = int(seq_);
  } else {
    LT_CHECK(input.defined() && input.shape.rank() == 3 && input.shape[2] == config_.hidden, "stage input {}",
             input.shape.str());
    b = int(input.shape[0]);
    t = int(input.shape[1]);
    LT_CHECK(b <= options_.micro_batch && t <= seq_, "stage input {} beyond the buffers", input.shape.str());
  }
  s.batch = b;
  s.seq = t;
  const int64_t n = int64_t(b) * t;
  if (sp_ && n % tp_.size() != 0)
    throw Error(fmt::format("sequence parallelism: {} × {} token rows do not divide over tp {}", b, t, tp_.size()));
  s.has_targets = head && mb.targets.defined();
  if (s.has_targets) {
    const auto [tb, tt] = batch_shape(mb.targets, "targets", options_.micro_batch, seq_);
    LT_CHECK(tb == b && tt == t, "targets [{}, {}] for tokens [{}, {}]", tb, tt, b, t);
    kernels::copy(s.targets.flat(0, n), mb.targets.view({n}));
  }
  if (embedding) {
    kernels::copy(s.tokens.flat(0, n), mb.tokens.view({n}));
    embedding_forward_held(s, 0);
  } else {
    const int64_t own = (sp_ ? n / tp_.size() : n) * config_.hidden;
    kernels::copy(s.residual[0].flat(0, own), input.view({own}));
  }
  forward_blocks(s, 0, false, chunk);
  if (head) head_forward_held(s);
}

// The embedding's and the head's forward with their values held (external_params); a tied
// embedding stays held from the first through the second.
void Model::embedding_forward_held(Slot& s, int64_t position) {
  hold_params(ParamPlace::embedding, -1, false);
  embed_forward(s, position);
  if (!tied_in_stage()) release_params(ParamPlace::embedding, -1);
}

void Model::head_forward_held(Slot& s) {
  hold_params(ParamPlace::head, -1, false);
  head_forward(s);
  release_params(ParamPlace::head, -1);
  if (tied_in_stage()) release_params(ParamPlace::embedding, -1);
}

void Model::forward_blocks(Slot& s, int64_t position, bool cached, int chunk) {
  const int layers = options_.stage.chunk_blocks(), first = chunk * layers;
  const bool ckpt = options_.checkpointing == ActivationCheckpointing::full;
  const bool selective = options_.checkpointing == ActivationCheckpointing::selective;
  for (int l = 0; l < layers; ++l) {
    LayerActs merged = selective ? selective_acts(s.layers[size_t(l)]) : LayerActs{};
    LayerActs& acts = ckpt ? work_->recompute : selective ? merged : s.layers[size_t(l)];
    const int layer = options_.stage.layer(first + l);
    hold_params(ParamPlace::block, layer, false);
    block_forward(first + l, acts, s.residual[size_t(l)], s.residual[size_t(l) + 1], s.batch, s.seq, false, position,
                  cached ? &work_->cache[size_t(first + l)] : nullptr);
    // Full recomputation computes into the shared set: the slot keeps the routing statistics.
    if (ckpt && moe_block(first + l)) kernels::copy(s.moe_stats[size_t(l)], acts.route_stats);
    release_params(ParamPlace::block, layer);
    if (layer_done_) layer_done_();
  }
}

Tensor Model::loss(int slot) const {
  LT_CHECK(options_.stage.has_head, "loss() on a stage without the head");
  return slot_at(slot, options_.stage.chunks - 1).loss;
}

Tensor Model::moe_route_stats(int slot, int chunk, int block) const {
  const Slot& s = slot_at(slot, chunk);
  LT_CHECK(block >= 0 && block < int(s.moe_stats.size()), "block {} of a chunk of {}", block, s.moe_stats.size());
  return s.moe_stats[size_t(block)];
}

Tensor Model::stage_output(int slot, int chunk) const {
  const Slot& s = slot_at(slot, chunk);
  const int64_t n = int64_t(s.batch) * s.seq;
  if (sp_) return s.residual.back().flat(0, n / tp_.size() * config_.hidden).view(stage_activation_shape());
  return s.residual.back().flat(0, n * config_.hidden).view({s.batch, s.seq, config_.hidden});
}

void Model::stage_backward(int slot, Tensor grad_output, float loss_scale, int chunk) {
  Slot& s = slot_at(slot, chunk);
  loss_scale_ = loss_scale;
  const StageLayout& st = options_.stage;
  const bool embedding = st.has_embedding && chunk == 0, head = st.has_head && chunk == st.chunks - 1;
  Work& w = *work_;
  // External gradient storage: each group's gradient views are bound just before backward first
  // writes them; a tied head writes the embedding's gradient, so that group is bound first.
  const bool external = options_.external_grads;
  LT_CHECK(!external || grad_storage_, "a model with external gradients needs a grad-storage hook");
  // One chunk holds both ends only without virtual chunks.
  const bool tied_head = tied_in_stage();
  // External parameters: each group's values are held from just before its backward (and
  // recomputation) reads them until it is done; a tied head reads the embedding's.
  if (tied_head) hold_params(ParamPlace::embedding, -1, true);
  if (external && tied_head) bind_group_grads(ParamPlace::embedding, -1);
  if (head) {
    LT_CHECK(s.has_targets, "backward of a forward without targets");
    hold_params(ParamPlace::head, -1, true);
    if (external) bind_group_grads(ParamPlace::head, -1);
    head_backward(s, loss_scale);
    release_params(ParamPlace::head, -1);
    if (grad_ready_) grad_ready_(ParamPlace::head, -1);
  } else {
    take_grad_output(s, grad_output);
  }
  const int layers = st.chunk_blocks(), first = chunk * layers;
  const bool ckpt = options_.checkpointing == ActivationCheckpointing::full;
  const bool selective = options_.checkpointing == ActivationCheckpointing::selective;
  for (int l = layers - 1; l >= 0; --l) {
    const int local = first + l, layer = st.layer(local);
    hold_params(ParamPlace::block, layer, true);
    if (ckpt) block_forward(local, w.recompute, s.residual[size_t(l)], Tensor{}, s.batch, s.seq, true, 0, nullptr);
    LayerActs merged = selective ? selective_acts(s.layers[size_t(l)]) : LayerActs{};
    if (selective) block_recompute_elementwise(local, merged, s.residual[size_t(l)], s.batch, s.seq);
    if (external) bind_group_grads(ParamPlace::block, layer);
    block_backward(local,
                   ckpt        ? w.recompute
                   : selective ? merged
                               : s.layers[size_t(l)],
                   s.residual[size_t(l)], s.batch, s.seq);
    release_params(ParamPlace::block, layer);
    if (grad_ready_) grad_ready_(ParamPlace::block, layer);
    if (layer_done_) layer_done_();
  }
  if (embedding) {
    if (!tied_head) hold_params(ParamPlace::embedding, -1, true);
    if (external && !tied_head) bind_group_grads(ParamPlace::embedding, -1);
    embed_backward(s);
    release_params(ParamPlace::embedding, -1);
    if (grad_ready_) grad_ready_(ParamPlace::embedding, -1);
  }
  keep_input_grad(s);
}

Tensor Model::stage_input_grad() const { return work_->input_grad; }

void Model::take_grad_output(const Slot& s, Tensor grad_output) {
  const int64_t n = int64_t(s.batch) * s.seq;
  const int64_t own = (sp_ ? n / tp_.size() : n) * config_.hidden;  // sequence parallelism: this rank's rows
  LT_CHECK(grad_output.defined() && grad_output.numel() == own, "stage grad_output {} for {} tokens",
           grad_output.shape.str(), n);
  kernels::copy(work_->dres.flat(0, own), grad_output.view({own}));
}

void Model::keep_input_grad(const Slot& s) {
  const int64_t n = int64_t(s.batch) * s.seq, d = config_.hidden;
  work_->input_grad = sp_ ? work_->dres.flat(0, n / tp_.size() * d).view(stage_activation_shape())
                          : work_->dres.flat(0, n * d).view({s.batch, s.seq, d});
}

void Model::stage_backward_input(int slot, Tensor grad_output, float loss_scale, int chunk) {
  LT_CHECK(options_.split_backward, "stage_backward_input on a model built without split_backward");
  Slot& s = slot_at(slot, chunk);
  loss_scale_ = loss_scale;
  const StageLayout& st = options_.stage;
  const bool embedding = st.has_embedding && chunk == 0, head = st.has_head && chunk == st.chunks - 1;
  if (head) {
    LT_CHECK(s.has_targets, "backward of a forward without targets");
    head_backward(s, loss_scale, true);
  } else {
    take_grad_output(s, grad_output);
  }
  const int layers = st.chunk_blocks(), first = chunk * layers;
  for (int l = layers - 1; l >= 0; --l) {
    block_backward(first + l, s.layers[size_t(l)], s.residual[size_t(l)], s.batch, s.seq, &s.grads[size_t(l)]);
    if (layer_done_) layer_done_();
  }
  if (embedding) embed_backward(s);  // the embedding has no input gradient: all of it is here
  keep_input_grad(s);
}

void Model::stage_backward_weight(int slot, int chunk) {
  LT_CHECK(options_.split_backward, "stage_backward_weight on a model built without split_backward");
  Slot& s = slot_at(slot, chunk);
  const StageLayout& st = options_.stage;
  const bool embedding = st.has_embedding && chunk == 0, head = st.has_head && chunk == st.chunks - 1;
  if (head) {
    head_backward_weight(s);
    if (grad_ready_) grad_ready_(ParamPlace::head, -1);
  }
  const int layers = st.chunk_blocks(), first = chunk * layers;
  for (int l = layers - 1; l >= 0; --l) {
    block_backward_weight(first + l, s.layers[size_t(l)], s.grads[size_t(l)], s.batch, s.seq);
    if (grad_ready_) grad_ready_(ParamPlace::block, st.layer(first + l));
    if (layer_done_) layer_done_();
  }
  // The embedding's gradient was complete after the input half; it is reported here, in the
  // grad-ready order (after the blocks).
  if (embedding && grad_ready_) grad_ready_(ParamPlace::embedding, -1);
}

Model::LayerActs Model::selective_acts(const LayerActs& kept) const {
  LayerActs a = work_->recompute;  // the element-wise results, shared by every layer and slot
  a.qkv = kept.qkv;
  a.qk_in = kept.qk_in;
  a.qk_rstd = kept.qk_rstd;
  a.att = kept.att;
  a.lse = kept.lse;
  a.mid = kept.mid;
  a.fc = kept.fc;
  a.attn_raw = kept.attn_raw;  // model.post_norms: the norms' inputs and statistics are kept
  a.attn_rstd = kept.attn_rstd;
  a.mlp_raw = kept.mlp_raw;
  a.mlp_rstd = kept.mlp_rstd;
  // A MoE block keeps everything of its experts (only its norms are recomputed).
  a.probs = kept.probs;
  a.router_lse = kept.router_lse;
  a.route_expert = kept.route_expert;
  a.route_weight = kept.route_weight;
  a.route_order = kept.route_order;
  a.route_pos = kept.route_pos;
  a.route_offsets = kept.route_offsets;
  a.route_stats = kept.route_stats;
  a.moe_in = kept.moe_in;
  a.moe_fc = kept.moe_fc;
  a.moe_act = kept.moe_act;
  a.moe_out = kept.moe_out;
  if (kept.act.defined()) a.act = kept.act;  // a shared expert's (kept like the experts')
  a.shared_out = kept.shared_out;
  a.shared_gate = kept.shared_gate;
  a.ep_in = kept.ep_in;
  a.ep_perm = kept.ep_perm;
  a.ep_inv = kept.ep_inv;
  a.ep_offsets = kept.ep_offsets;
  a.ep_plan = kept.ep_plan;
  return a;
}

}  // namespace llmtrain::trainer
