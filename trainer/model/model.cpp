// Model construction (parameter layout, flat buffers, activation arena), initialization, and the
// public calls. The math of the layers is in model_layers.cpp.
#include "trainer/model/model.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/ops.h"
#include "trainer/model/model_internal.h"
#include "trainer/model/param_init.h"

namespace llmtrain::trainer {

using kernels::DType;
using kernels::Shape;

int64_t ModelParam::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StageLayout pipeline_stage_layout(const ModelConfig& model, int stage, int stages) {
  LT_CHECK(stages >= 1 && stage >= 0 && stage < stages && model.layers % stages == 0, "stage {} of {} for {} layers",
           stage, stages, model.layers);
  const int per = model.layers / stages;
  return {stage * per, (stage + 1) * per, stage == 0, stage == stages - 1};
}

namespace {

// Carves fp32 (and int32) tensors out of one buffer, each 64-byte aligned. With a null base it
// only measures.
class Arena {
 public:
  explicit Arena(float* base) : base_(base) {}
  Tensor take(Shape s) {
    Tensor t(base_ ? base_ + used_ : nullptr, DType::fp32, s);
    used_ += (s.numel() + 15) / 16 * 16;
    return t;
  }
  Tensor take_int(Shape s) {
    Tensor t = take(s);
    t.dtype = DType::int32;
    return t;
  }
  int64_t used() const { return used_; }

 private:
  float* base_;
  int64_t used_ = 0;
};

void check_divides(int64_t tp, int64_t value, const char* key) {
  if (value % tp != 0)
    throw Error(fmt::format("parallel.tp {} does not divide {} {}", tp, key, value),
                fmt::format("choose a tensor-parallel size that divides {}", key));
}

}  // namespace

Model::Model(const ModelConfig& config, const ModelOptions& options, parallel::Comm& tp)
    : config_(config), options_(options), tp_(tp) {
  const ModelConfig& m = config_;
  LT_CHECK(m.layers > 0 && m.hidden > 0 && m.heads > 0 && m.kv_heads > 0 && m.ffn_hidden > 0 && m.vocab > 0 &&
               m.max_positions > 0 && m.seq_len > 0 && m.hidden % m.heads == 0 && m.heads % m.kv_heads == 0,
           "model config not resolved or inconsistent");
  if (m.dropout != 0.0)
    throw Error(fmt::format("not supported yet: model.dropout {} (only 0)", m.dropout), "set model.dropout: 0");
  llama_ = m.family == ModelFamily::llama;
  if (!llama_ && m.kv_heads != m.heads)
    throw Error(
        fmt::format("model.kv_heads {} != heads {}: grouped-query attention needs family llama", m.kv_heads, m.heads));
  if (llama_ && m.head_dim() % 2 != 0)
    throw Error(fmt::format("head dimension {} (hidden {} / heads {}) is odd: RoPE needs an even one", m.head_dim(),
                            m.hidden, m.heads));
  const int64_t n = tp_.size();
  check_divides(n, m.heads, "model.heads");
  check_divides(n, m.kv_heads, "model.kv_heads");
  check_divides(n, m.ffn_hidden, "model.ffn_hidden");
  check_divides(n, m.padded_vocab(), "the padded vocabulary");
  if (options_.stage.layer_end == 0 && options_.stage.layer_begin == 0) options_.stage = pipeline_stage_layout(m, 0, 1);
  if (options_.seq_len == 0) options_.seq_len = m.seq_len;
  LT_CHECK(options_.micro_batch >= 1 && options_.activation_slots >= 1, "micro_batch {} slots {}", options_.micro_batch,
           options_.activation_slots);
  if (options_.seq_len > m.max_positions)
    throw Error(fmt::format("sequence length {} exceeds model.max_positions {}", options_.seq_len, m.max_positions),
                "raise model.max_positions or lower model.seq_len");
  seq_ = options_.seq_len;
  heads_ = m.heads / n;
  kv_heads_ = m.kv_heads / n;
  head_dim_ = m.head_dim();
  ffn_ = m.ffn_hidden / n;
  vocab_local_ = m.padded_vocab() / n;
  vocab_begin_ = tp_.rank() * vocab_local_;
  build_params();
  bind_views();
  build_activations();
}

Model::~Model() = default;

void Model::build_params() {
  const StageLayout& st = options_.stage;
  const int tp = tp_.size(), rank = tp_.rank();
  int64_t offset = 0;
  auto add = [&](const ParamSpec& spec, bool tied_copy) {
    ModelParam p;
    p.spec = spec;
    p.shape = spec.shape;
    if (spec.tp_split_dim >= 0 && tp > 1) {
      p.shape[spec.tp_split_dim] /= tp;
      p.shard_begin = rank * p.shape[spec.tp_split_dim];
    }
    p.offset = offset;
    p.tied_copy = tied_copy;
    offset += p.numel();
    params_.push_back(std::move(p));
  };
  const std::vector<ParamSpec> specs = model_param_specs(config_);
  for (const ParamSpec& spec : specs) {
    const bool mine = (spec.place == ParamPlace::embedding && st.has_embedding) ||
                      (spec.place == ParamPlace::block && spec.layer >= st.layer_begin && spec.layer < st.layer_end) ||
                      (spec.place == ParamPlace::head && st.has_head);
    if (mine) add(spec, false);
  }
  // A last stage without the embedding keeps its own copy of a tied word embedding.
  if (st.has_head && !st.has_embedding && config_.tie_embeddings) add(specs.front(), true);

  param_buf_ = kernels::Buffer(DType::fp32, {offset});
  grad_buf_ = kernels::Buffer(DType::fp32, {offset});
  for (ModelParam& p : params_) {
    const Shape shape{std::span<const int64_t>(p.shape)};
    p.value = param_buf_.tensor().flat(p.offset, p.numel()).view(shape);
    p.grad = grad_buf_.tensor().flat(p.offset, p.numel()).view(shape);
  }
}

const ModelParam& Model::parameter(std::string_view name) const {
  for (const ModelParam& p : params_)
    if (p.spec.name == name) return p;
  LT_CHECK(false, "no parameter {} on this stage", name);
  __builtin_unreachable();
}

void Model::bind_views() {
  const int layers = options_.stage.layer_end - options_.stage.layer_begin;
  weights_.assign(size_t(layers), {});
  weight_grads_.assign(size_t(layers), {});
  const int64_t d = config_.hidden;
  // Two adjacent parameters seen as one matrix of their stacked rows (LLaMA's q/k/v and gate/up).
  auto stacked = [&](std::initializer_list<const ModelParam*> parts, bool grad) {
    int64_t rows = 0;
    const float* next = nullptr;
    for (const ModelParam* p : parts) {
      const Tensor t = grad ? p->grad : p->value;
      LT_CHECK(!next || t.data == next, "{} is not adjacent to the parameter before it", p->spec.name);
      next = static_cast<const float*>(t.data) + t.numel();
      rows += t.numel() / d;
    }
    const ModelParam* first = *parts.begin();
    return Tensor((grad ? first->grad : first->value).data, DType::fp32, {rows, d});
  };
  for (int i = 0; i < layers; ++i) {
    const int layer = options_.stage.layer_begin + i;
    auto p = [&](const char* suffix) -> const ModelParam& {
      return parameter(llama_ ? fmt::format("model.layers.{}.{}", layer, suffix)
                              : fmt::format("transformer.h.{}.{}", layer, suffix));
    };
    for (bool grad : {false, true}) {
      BlockWeights& w = grad ? weight_grads_[size_t(i)] : weights_[size_t(i)];
      auto v = [&](const char* suffix) { return grad ? p(suffix).grad : p(suffix).value; };
      // 2-D views of the matrices whatever their spec shape ([3, d, d] c_attn included).
      auto mat = [&](const char* suffix) {
        Tensor t = v(suffix);
        return t.view({t.numel() / t.shape[t.shape.rank() - 1], t.shape[t.shape.rank() - 1]});
      };
      if (llama_) {
        w.ln1_w = v("input_layernorm.weight");
        w.qkv_w = stacked({&p("self_attn.q_proj.weight"), &p("self_attn.k_proj.weight"), &p("self_attn.v_proj.weight")},
                          grad);
        w.o_w = mat("self_attn.o_proj.weight");
        w.ln2_w = v("post_attention_layernorm.weight");
        w.fc_w = stacked({&p("mlp.gate_proj.weight"), &p("mlp.up_proj.weight")}, grad);
        w.out_w = mat("mlp.down_proj.weight");
      } else {
        w.ln1_w = v("ln_1.weight");
        w.ln1_b = v("ln_1.bias");
        w.qkv_w = mat("attn.c_attn.weight");
        w.qkv_b = v("attn.c_attn.bias").view({v("attn.c_attn.bias").numel()});
        w.o_w = mat("attn.c_proj.weight");
        w.o_b = v("attn.c_proj.bias");
        w.ln2_w = v("ln_2.weight");
        w.ln2_b = v("ln_2.bias");
        w.fc_w = mat("mlp.c_fc.weight");
        w.fc_b = v("mlp.c_fc.bias");
        w.out_w = mat("mlp.c_proj.weight");
        w.out_b = v("mlp.c_proj.bias");
      }
    }
  }
}

void Model::build_activations() {
  const int64_t b = options_.micro_batch, n = b * seq_, d = config_.hidden;
  const int64_t qkv = (heads_ + 2 * kv_heads_) * head_dim_, q = heads_ * head_dim_;
  const int64_t fc = llama_ ? 2 * ffn_ : ffn_;
  const int layers = options_.stage.layer_end - options_.stage.layer_begin;
  const bool full_ckpt = options_.checkpointing == ActivationCheckpointing::full;
  const int tp = tp_.size();
  auto layout = [&](Arena& a) {
    auto layer_acts = [&]() {
      LayerActs l;
      l.ln1 = a.take({n, d});
      if (!llama_) l.ln1_mean = a.take({n});
      l.ln1_rstd = a.take({n});
      l.qkv = a.take({n, qkv});
      l.att = a.take({n, q});
      l.lse = a.take({b * heads_ * seq_});
      l.mid = a.take({n, d});
      l.ln2 = a.take({n, d});
      if (!llama_) l.ln2_mean = a.take({n});
      l.ln2_rstd = a.take({n});
      l.fc = a.take({n, fc});
      l.act = a.take({n, ffn_});
      return l;
    };
    work_ = std::make_unique<Work>();
    slots_.assign(size_t(options_.activation_slots), {});
    for (Slot& s : slots_) {
      s.tokens = a.take_int({n});
      s.targets = a.take_int({n});
      for (int l = 0; l <= layers; ++l) s.residual.push_back(a.take({n, d}));
      if (!full_ckpt)
        for (int l = 0; l < layers; ++l) s.layers.push_back(layer_acts());
      if (options_.stage.has_head) {
        s.lnf = a.take({n, d});
        if (!llama_) s.lnf_mean = a.take({n});
        s.lnf_rstd = a.take({n});
        s.logits = a.take({n, vocab_local_});
        s.logits_full = tp > 1 ? a.take({n, vocab_local_ * tp}) : s.logits;
        s.losses = a.take({n});
        s.ce_lse = a.take({n});
      }
    }
    Work& w = *work_;
    if (full_ckpt && layers > 0) w.recompute = layer_acts();
    w.dres = a.take({n, d});
    w.dln = a.take({n, d});
    w.dqkv = a.take({n, qkv});
    w.datt = a.take({n, q});
    w.dfc = a.take({n, fc});
    w.dact = a.take({n, ffn_});
    if (llama_) w.rope = a.take({config_.max_positions, 2, head_dim_ / 2});
    if (tp > 1 && options_.stage.has_head) w.gather_scratch = a.take({n * vocab_local_ * tp});
  };
  Arena measure(nullptr);
  layout(measure);
  act_buf_ = kernels::Buffer(DType::fp32, {measure.used()});
  Arena real(act_buf_.ptr<float>());
  layout(real);
  if (llama_) kernels::rope_table(work_->rope, config_.rope_theta);
}

void Model::init_parameters(uint64_t seed) {
  for (const ModelParam& p : params_) {
    float* out = p.value.ptr<float>();
    if (p.spec.init == ParamInit::zeros || p.spec.init == ParamInit::ones) {
      std::fill(out, out + p.numel(), p.spec.init == ParamInit::ones ? 1.0f : 0.0f);
      continue;
    }
    const auto key = param_rng_key(seed, p.spec.name);
    const double std = param_init_std(p.spec, config_);
    for_each_shard_run(p, [&](int64_t local, int64_t global, int64_t count) {
      constexpr int64_t kChunk = 1 << 14;  // a multiple of 4: chunks never split a Philox block
#pragma omp parallel for schedule(static) if (count > kChunk)
      for (int64_t c = 0; c < count; c += kChunk)
        normal_fill(key, uint64_t(global + c), out + local + c, std::min(kChunk, count - c), std);
    });
  }
}

void Model::zero_grads() { kernels::fill_zero(grad_buf_.tensor()); }

void Model::require_whole_model(const char* what) const {
  LT_CHECK(options_.stage.has_embedding && options_.stage.has_head, "{} needs the whole model on one stage", what);
}

float Model::forward_backward(const MicroBatch& mb, float loss_scale) {
  require_whole_model("forward_backward");
  LT_CHECK(mb.targets.defined(), "forward_backward without targets");
  const float loss = stage_forward(0, mb, Tensor{});
  stage_backward(0, Tensor{}, loss_scale);
  return loss;
}

float Model::forward_loss(const MicroBatch& mb) {
  require_whole_model("forward_loss");
  LT_CHECK(mb.targets.defined(), "forward_loss without targets");
  return stage_forward(0, mb, Tensor{});
}

Tensor Model::forward_logits(Tensor tokens) {
  require_whole_model("forward_logits");
  stage_forward(0, MicroBatch{tokens, Tensor{}}, Tensor{});
  const Slot& s = slots_[0];
  const int64_t n = int64_t(s.batch) * s.seq;
  return s.logits_full.flat(0, n * config_.padded_vocab()).view({s.batch, s.seq, config_.padded_vocab()});
}

namespace {

// [B, T] int32 tensor → (B, T), or an Error naming what is wrong.
std::pair<int, int> batch_shape(const Tensor& t, const char* what, int max_batch, int64_t max_seq) {
  LT_CHECK(t.dtype == DType::int32 && t.shape.rank() == 2, "{} must be [B, T] int32, found {} {}", what,
           kernels::to_string(t.dtype), t.shape.str());
  if (t.shape[0] < 1 || t.shape[0] > max_batch || t.shape[1] < 1 || t.shape[1] > max_seq)
    throw Error(fmt::format("{} of shape {} exceed the model's buffers for {} sequences of {} tokens", what,
                            t.shape.str(), max_batch, max_seq));
  return {int(t.shape[0]), int(t.shape[1])};
}

void check_ids(const Tensor& t, const char* what, int64_t vocab, bool allow_ignore) {
  const int32_t* p = t.ptr<int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if ((p[i] < 0 || p[i] >= vocab) && !(allow_ignore && p[i] == kIgnoreIndex))
      throw Error(fmt::format("{} {} at position {} is outside the vocabulary [0, {})", what, p[i], i, vocab),
                  "the data was tokenized with a different tokenizer than model.vocab describes");
}

}  // namespace

float Model::stage_forward(int slot, const MicroBatch& mb, Tensor input) {
  LT_CHECK(slot >= 0 && slot < int(slots_.size()), "activation slot {} of {}", slot, slots_.size());
  Slot& s = slots_[size_t(slot)];
  const StageLayout& st = options_.stage;
  int b = 0, t = 0;
  if (st.has_embedding) {
    std::tie(b, t) = batch_shape(mb.tokens, "tokens", options_.micro_batch, seq_);
    check_ids(mb.tokens, "token id", config_.vocab, false);
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
  s.has_targets = st.has_head && mb.targets.defined();
  if (s.has_targets) {
    const auto [tb, tt] = batch_shape(mb.targets, "targets", options_.micro_batch, seq_);
    LT_CHECK(tb == b && tt == t, "targets [{}, {}] for tokens [{}, {}]", tb, tt, b, t);
    check_ids(mb.targets, "target id", config_.vocab, true);
    std::memcpy(s.targets.data, mb.targets.data, size_t(n) * 4);
  }
  if (st.has_embedding) {
    std::memcpy(s.tokens.data, mb.tokens.data, size_t(n) * 4);
    embed_forward(s);
  } else {
    std::memcpy(s.residual[0].data, input.data, size_t(n * config_.hidden) * 4);
  }
  const int layers = st.layer_end - st.layer_begin;
  const bool ckpt = options_.checkpointing == ActivationCheckpointing::full;
  for (int l = 0; l < layers; ++l) {
    LayerActs& acts = ckpt ? work_->recompute : s.layers[size_t(l)];
    block_forward(l, acts, s.residual[size_t(l)], s.residual[size_t(l) + 1], b, t, false);
  }
  return st.has_head ? head_forward(s) : 0.0f;
}

Tensor Model::stage_output(int slot) const {
  const Slot& s = slots_.at(size_t(slot));
  const int64_t n = int64_t(s.batch) * s.seq;
  return s.residual.back().flat(0, n * config_.hidden).view({s.batch, s.seq, config_.hidden});
}

void Model::stage_backward(int slot, Tensor grad_output, float loss_scale) {
  LT_CHECK(slot >= 0 && slot < int(slots_.size()), "activation slot {} of {}", slot, slots_.size());
  Slot& s = slots_[size_t(slot)];
  const StageLayout& st = options_.stage;
  const int64_t n = int64_t(s.batch) * s.seq, d = config_.hidden;
  Work& w = *work_;
  if (st.has_head) {
    LT_CHECK(s.has_targets, "backward of a forward without targets");
    head_backward(s, loss_scale);
    if (grad_ready_) grad_ready_(ParamPlace::head, -1);
  } else {
    LT_CHECK(grad_output.defined() && grad_output.numel() == n * d, "stage grad_output {} for {} tokens",
             grad_output.shape.str(), n);
    std::memcpy(w.dres.data, grad_output.data, size_t(n * d) * 4);
  }
  const int layers = st.layer_end - st.layer_begin;
  const bool ckpt = options_.checkpointing == ActivationCheckpointing::full;
  for (int l = layers - 1; l >= 0; --l) {
    if (ckpt) block_forward(l, w.recompute, s.residual[size_t(l)], Tensor{}, s.batch, s.seq, true);
    block_backward(l, ckpt ? w.recompute : s.layers[size_t(l)], s.residual[size_t(l)], s.batch, s.seq);
    if (grad_ready_) grad_ready_(ParamPlace::block, st.layer_begin + l);
  }
  if (st.has_embedding) {
    embed_backward(s);
    if (grad_ready_) grad_ready_(ParamPlace::embedding, -1);
  }
  w.input_grad = w.dres.flat(0, n * d).view({s.batch, s.seq, d});
}

Tensor Model::stage_input_grad() const { return work_->input_grad; }

}  // namespace llmtrain::trainer
