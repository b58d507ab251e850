// Model construction (parameter layout, flat buffers, activation arena), initialization, the
// memory plan, and the whole-model calls. One pipeline stage's forward and backward are in
// model_stage.cpp, the math of the layers in model_layers.cpp.
//
// Rule a reader could get wrong: the constructor and model_memory_plan run the SAME functions
// (resolve, param_layout, lay_out) — a buffer added to the model is added in lay_out, or the plan
// a dry run prints stops matching what a rank allocates (test_model checks they agree).
#include "trainer/model/model.h"

#include <omp.h>

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "kernels/ops.h"
#include "trainer/model/model_internal.h"
#include "trainer/model/param_init.h"

namespace llmtrain::trainer {

using kernels::DType;
using kernels::Shape;

DType precision_dtype(Precision precision) {
  switch (precision) {
    case Precision::bf16:
      return DType::bf16;
    case Precision::fp16:
      return DType::fp16;
    case Precision::fp32:
      break;
  }
  return DType::fp32;
}

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

StageLayout pipeline_stage_layout(const ModelConfig& model, int stage, int stages, int chunks) {
  LT_CHECK(chunks >= 1 && stages >= 1 && model.layers % (stages * chunks) == 0, "{} chunks of {} stages for {} layers",
           chunks, stages, model.layers);
  const int per = model.layers / (stages * chunks);
  return {stage * per, (stage + 1) * per, stage == 0, stage == stages - 1, chunks, stages * per};
}

StageLayout pipeline_stage_layout(const ModelConfig& model, int stage, int stages, const std::vector<int>& blocks) {
  if (blocks.empty()) return pipeline_stage_layout(model, stage, stages);
  LT_CHECK(int(blocks.size()) == stages && stage >= 0 && stage < stages, "stage {} of {} with {} block counts", stage,
           stages, blocks.size());
  int begin = 0, total = 0;
  for (int s = 0; s < stages; ++s) {
    LT_CHECK(blocks[size_t(s)] >= 1, "stage {} with {} blocks", s, blocks[size_t(s)]);
    if (s < stage) begin += blocks[size_t(s)];
    total += blocks[size_t(s)];
  }
  LT_CHECK(total == model.layers, "block counts adding up to {} for {} layers", total, model.layers);
  return {begin, begin + blocks[size_t(stage)], stage == 0, stage == stages - 1};
}

StageLayout pipeline_stage_layout(const ModelConfig& model, const Layout& layout, int stage) {
  return layout.virtual_stages > 1 ? pipeline_stage_layout(model, stage, layout.pp, layout.virtual_stages)
                                   : pipeline_stage_layout(model, stage, layout.pp, layout.stage_blocks);
}

namespace {

void check_divides(int64_t tp, int64_t value, const char* key) {
  if (value % tp != 0)
    throw Error(fmt::format("parallel.tp {} does not divide {} {}", tp, key, value),
                fmt::format("choose a tensor-parallel size that divides {}", key));
}

// Points `field` (value or grad) of every parameter of one group (the embedding, the head, or
// block `layer`) into `storage`, which holds the group's elements in their flat-buffer order.
void bind_group_to_storage(std::vector<ModelParam>& params, ParamPlace place, int layer, const Tensor& storage,
                           Tensor ModelParam::*field, const char* what) {
  int64_t begin = INT64_MAX;
  auto mine = [&](const ModelParam& p) {
    return p.spec.place == place && (place != ParamPlace::block || p.spec.layer == layer);
  };
  for (const ModelParam& p : params)
    if (mine(p)) begin = std::min(begin, p.offset);
  for (ModelParam& p : params)
    if (mine(p)) {
      LT_CHECK(p.offset - begin + p.numel() <= storage.numel(), "{}: the {} storage holds {} elements", p.spec.name,
               what, storage.numel());
      p.*field = storage.flat(p.offset - begin, p.numel()).view(Shape{std::span<const int64_t>(p.shape)});
    }
}

}  // namespace

kernels::RopeScaling rope_scaling_op(const RopeScalingConfig& c) {
  using T = kernels::RopeScaling::Type;
  const T type = c.type == RopeScalingType::linear   ? T::linear
                 : c.type == RopeScalingType::llama3 ? T::llama3
                 : c.type == RopeScalingType::yarn   ? T::yarn
                                                     : T::none;
  return {.type = type,
          .factor = c.factor,
          .low_freq_factor = c.low_freq_factor,
          .high_freq_factor = c.high_freq_factor,
          .original_max_positions = double(c.original_max_positions),
          .beta_fast = c.beta_fast,
          .beta_slow = c.beta_slow,
          .truncate = c.truncate,
          .attention_factor = c.type == RopeScalingType::yarn ? c.yarn_attention_factor() : 1.0};
}

ModelOptions Model::resolve(const ModelConfig& m, ModelOptions o, int tp_size) {
  LT_CHECK(m.layers > 0 && m.hidden > 0 && m.heads > 0 && m.kv_heads > 0 && m.ffn_hidden > 0 && m.vocab > 0 &&
               m.max_positions > 0 && m.seq_len > 0 && (m.head_dim > 0 || m.hidden % m.heads == 0) &&
               m.heads % m.kv_heads == 0 && m.sliding_window >= 0,
           "model config not resolved or inconsistent");
  LT_CHECK(tp_size >= 1, "tp size {}", tp_size);
  // Dropout is not built; a recipe asking for it is refused before any model exists
  // (unsupported_features, common/recipe/recipe_check.cpp).
  LT_CHECK(m.dropout == 0.0, "a model with model.dropout {}", m.dropout);
  const bool llama = m.family == ModelFamily::llama;
  if (!llama && m.kv_heads != m.heads)
    throw Error(
        fmt::format("model.kv_heads {} != heads {}: grouped-query attention needs family llama", m.kv_heads, m.heads));
  if (llama && m.head_size() % 2 != 0)
    throw Error(fmt::format("head dimension {} is odd: RoPE needs an even one", m.head_size()));
  // The variants of the llama family (recipe_check refuses them for gpt2 with the key named).
  LT_CHECK(llama || (int64_t(m.head_size()) * m.heads == m.hidden && !m.qkv_bias && !m.qk_norm &&
                     m.sliding_window == 0 && m.rope_scaling.type == RopeScalingType::none &&
                     m.query_pre_attn_scalar == 0 && m.activation == MlpActivation::swiglu && !m.post_norms &&
                     !m.scale_embeddings && m.logit_softcap == 0 && !m.attention_sinks && !m.o_bias),
           "a gpt2 model with llama-family options");
  LT_CHECK(!m.moe.enabled() || (m.activation == MlpActivation::swiglu && !m.post_norms),
           "MoE blocks with a geglu gate or post-norms");
  LT_CHECK(o.context_parallel == 1 || m.query_pre_attn_scalar == 0, "context parallelism with a softmax scale");
  check_divides(tp_size, m.heads, "model.heads");  // recipe keys, not parameter names
  if (m.kv_heads % tp_size != 0 && tp_size % m.kv_heads != 0)
    throw Error(fmt::format("parallel.tp {} and model.kv_heads {}: neither divides the other", tp_size, m.kv_heads),
                "key/value heads are split over tp when tp divides kv_heads, replicated when kv_heads divides tp");
  check_divides(tp_size, m.ffn_hidden, "model.ffn_hidden");
  check_divides(tp_size, m.padded_vocab(), "the padded vocabulary");
  if (m.moe.enabled()) {
    // recipe_check and unsupported_features refuse these, naming the keys, before a model exists.
    LT_CHECK(llama && m.moe.top_k >= 1 && m.moe.top_k <= m.moe.experts && m.moe.ffn_hidden > 0 && m.moe.every >= 1 &&
                 m.moe.first_dense >= 0 && m.moe.capacity_factor >= 0,
             "model.moe not resolved or inconsistent");
    // (A capacity factor with cp > 1 is refused by the recipe check, unsupported_features: each cp
    // rank would fill an expert's capacity from its own rows. The model computes that, and the
    // memory it needs is the same.)
    check_divides(tp_size, m.moe.ffn_hidden, "model.moe.ffn_hidden");
    check_divides(tp_size, m.moe.shared_ffn_hidden, "model.moe.shared_ffn_hidden");
  }
  LT_CHECK(
      o.expert_parallel >= 1 && (o.expert_parallel == 1 || (m.moe.enabled() && m.moe.experts % o.expert_parallel == 0)),
      "expert parallelism {} for {} experts", o.expert_parallel, m.moe.experts);
  LT_CHECK(!o.experts_sharded || (o.expert_parallel > 1 && !o.external_grads),
           "sharded experts at expert parallelism {} with external gradients {}", o.expert_parallel, o.external_grads);
  if (o.stage.layer_end == 0 && o.stage.layer_begin == 0) o.stage = pipeline_stage_layout(m, 0, 1);
  if (o.seq_len == 0) o.seq_len = m.seq_len;
  // A MoE block's picks are indexed by int32 (the plan's order and pos, the experts' offsets).
  // With ep > 1 a rank's experts may receive every ep rank's picks.
  const int64_t picks = int64_t(o.micro_batch) * o.seq_len * m.moe.top_k * o.expert_parallel;
  if (m.moe.enabled() && picks > std::numeric_limits<int32_t>::max())
    throw Error(
        fmt::format("train.micro_batch {} × seq_len {} × model.moe.top_k {}{} = {} expert picks per micro-batch "
                    "exceed 2^31 - 1",
                    o.micro_batch, o.seq_len, m.moe.top_k,
                    o.expert_parallel > 1 ? fmt::format(" × parallel.ep {}", o.expert_parallel) : "", picks),
        "MoE blocks index a micro-batch's picks in 32 bits: lower train.micro_batch (or use more cp ranks)");
  LT_CHECK(o.stage.chunks == 1 || (o.stage.chunks > 1 && o.stage.chunk_blocks() >= 1), "{} chunks of {} blocks",
           o.stage.chunks, o.stage.chunk_blocks());
  LT_CHECK(!o.split_backward || (o.checkpointing == ActivationCheckpointing::none && !o.external_grads &&
                                 !o.external_params && o.kv_cache_tokens == 0),
           "a split backward with activation checkpointing, external gradients/parameters or a KV cache");
  // Virtual chunks (the interleaved schedule): the recipe check refuses ZeRO 2/3 with pp > 1, and
  // generation needs the whole model.
  LT_CHECK(o.stage.chunks == 1 || (!o.external_grads && !o.external_params && o.kv_cache_tokens == 0),
           "virtual pipeline chunks with external gradients/parameters or a KV cache");
  if (o.sequence_parallel && tp_size > 1) {
    if (o.kv_cache_tokens > 0) throw Error("not supported yet: sequence parallelism in generation");
    if ((int64_t(o.micro_batch) * o.seq_len) % tp_size != 0)
      throw Error(fmt::format("sequence parallelism splits micro_batch {} × seq_len {} = {} token rows over tp {}, "
                              "which does not divide them",
                              o.micro_batch, o.seq_len, int64_t(o.micro_batch) * o.seq_len, tp_size),
                  "choose train.micro_batch and model.seq_len whose product tp divides");
  }
  LT_CHECK(o.micro_batch >= 1 && o.activation_slots >= 1 && o.kv_cache_tokens >= 0, "micro_batch {} slots {} cache {}",
           o.micro_batch, o.activation_slots, o.kv_cache_tokens);
  LT_CHECK(o.dtype == DType::fp32 || o.dtype == DType::bf16 || o.dtype == DType::fp16, "model storage {}",
           kernels::to_string(o.dtype));
  if (int64_t(o.seq_len) * o.context_parallel > m.max_positions)
    throw Error(fmt::format("sequence length {} exceeds model.max_positions {}",
                            int64_t(o.seq_len) * o.context_parallel, m.max_positions),
                "raise model.max_positions or lower model.seq_len");
  LT_CHECK(o.context_parallel == 1 || m.sliding_window == 0, "context parallelism with a sliding window");
  LT_CHECK(o.context_parallel >= 1 && (o.context_parallel == 1 || (o.seq_len % 2 == 0 && o.kv_cache_tokens == 0)),
           "context parallelism {} with {} local rows, KV cache {}", o.context_parallel, o.seq_len, o.kv_cache_tokens);
  if (o.kv_cache_tokens > 0) {
    LT_CHECK(o.stage.has_embedding && o.stage.has_head, "a KV cache needs the whole model on one stage");
    if (o.kv_cache_tokens > m.max_positions)
      throw Error(
          fmt::format("a context of {} tokens exceeds model.max_positions {}", o.kv_cache_tokens, m.max_positions),
          "generate fewer tokens or use a shorter prompt");
  }
  return o;
}

Model::Model(const ModelConfig& config, const ModelOptions& options, parallel::Comm& tp, parallel::Comm* cp,
             parallel::Comm* ep)
    : config_(config), options_(resolve(config, options, tp.size())), tp_(tp) {
  LT_CHECK((cp ? cp->size() : 1) == options_.context_parallel, "a cp group of {} ranks for context_parallel {}",
           cp ? cp->size() : 1, options_.context_parallel);
  if (options_.context_parallel > 1) cp_ = cp;
  LT_CHECK((ep ? ep->size() : 1) == options_.expert_parallel, "an ep group of {} ranks for expert_parallel {}",
           ep ? ep->size() : 1, options_.expert_parallel);
  if (options_.expert_parallel > 1) ep_ = ep;
  // Generation (the KV cache) runs in fp32, from a checkpoint's fp32 weights.
  LT_CHECK(options_.dtype == DType::fp32 || options_.kv_cache_tokens == 0, "16-bit storage with a KV cache");
  const Dims z(config_, options_, tp_.size());
  llama_ = z.llama;
  sp_ = z.sp;
  seq_ = z.seq;
  heads_ = z.heads;
  kv_heads_ = z.kv_heads;
  head_dim_ = z.head_dim;
  ffn_ = z.ffn;
  shared_ffn_ = z.shared_ffn;
  vocab_local_ = z.vocab_local;
  vocab_begin_ = tp_.rank() * vocab_local_;
  // The ranks holding the same key/value head reduce its gradient (collective over tp).
  if (z.kv_replicas > 1) kv_group_ = tp_.split(int(tp_.rank() / z.kv_replicas), tp_.rank(), "tp kv replicas");
  build_params();
  bind_views();
  build_activations();
}

Model::~Model() = default;

std::vector<ModelParam> Model::param_layout(const ModelConfig& config, const StageLayout& st, int tp, int rank,
                                            int ep_shards, int ep_rank, int64_t* numel) {
  const int64_t held = config.moe.experts / std::max(ep_shards, 1);  // experts per ep rank when sharded
  std::vector<ModelParam> params;
  int64_t offset = 0;
  auto add = [&](const ParamSpec& spec, bool tied_copy) {
    ModelParam p;
    p.spec = spec;
    p.shape = spec.shape;
    const bool kv = spec.role == ParamRole::k_weight || spec.role == ParamRole::v_weight ||
                    spec.role == ParamRole::k_bias || spec.role == ParamRole::v_bias;
    if (kv && tp > config.kv_heads) {
      // Replicated key/value heads: rank r holds head r / (tp / kv_heads), as its query heads read.
      const int replicas = tp / config.kv_heads;
      p.shape[0] /= config.kv_heads;
      p.shard_begin = (rank / replicas) * p.shape[0];
      p.tp_replica = rank % replicas != 0;
    } else if (spec.tp_split_dim >= 0 && tp > 1) {
      p.shape[spec.tp_split_dim] /= tp;
      p.shard_begin = rank * p.shape[spec.tp_split_dim];
    }
    if (spec.tp_split_dim < 0 && rank > 0) p.tp_replica = true;
    p.offset = offset;
    p.tied_copy = tied_copy;
    p.expert_shard = ep_shards > 1 && spec.expert >= 0;
    offset += p.numel();
    params.push_back(std::move(p));
  };
  const std::vector<ParamSpec> specs = model_param_specs(config);
  for (const ParamSpec& spec : specs) {
    const bool mine = (spec.place == ParamPlace::embedding && st.has_embedding) ||
                      (spec.place == ParamPlace::block && st.local(spec.layer) >= 0 &&
                       (ep_shards <= 1 || spec.expert < 0 || spec.expert / held == ep_rank)) ||
                      (spec.place == ParamPlace::head && st.has_head);
    if (mine) add(spec, false);
  }
  // A last stage without the embedding keeps its own copy of a tied word embedding.
  if (st.has_head && !st.has_embedding && config.tie_embeddings)
    for (const ParamSpec& spec : specs)
      if (spec.role == ParamRole::token_embedding) add(spec, true);
  *numel = offset;
  return params;
}

void Model::build_params() {
  int64_t numel = 0;
  params_ = param_layout(config_, options_.stage, tp_.size(), tp_.rank(), options_.experts_sharded ? ep_->size() : 1,
                         options_.experts_sharded ? ep_->rank() : 0, &numel);
  numel_ = numel;
  if (!options_.external_params)
    param_buf_ = kernels::Buffer(options_.dtype, {numel}, options_.device, kernels::MemoryKind::parameters);
  if (!options_.external_grads)
    grad_buf_ = kernels::Buffer(options_.dtype, {numel}, options_.device, kernels::MemoryKind::gradients);
  for (ModelParam& p : params_) {
    const Shape shape{std::span<const int64_t>(p.shape)};
    if (!options_.external_params) p.value = param_buf_.tensor().flat(p.offset, p.numel()).view(shape);
    if (!options_.external_grads) p.grad = grad_buf_.tensor().flat(p.offset, p.numel()).view(shape);
  }
}

const ModelParam& Model::parameter(std::string_view name) const {
  for (const ModelParam& p : params_)
    if (p.spec.name == name) return p;
  LT_CHECK(false, "no parameter {} on this stage", name);
  __builtin_unreachable();
}

const ModelParam& Model::parameter(ParamRole role, int layer) const {
  for (const ModelParam& p : params_)
    if (p.spec.role == role && p.spec.layer == layer) return p;
  LT_CHECK(false, "no parameter of role {} (layer {}) on this stage", int(role), layer);
  __builtin_unreachable();
}

void Model::bind_views() {
  const int layers = options_.stage.blocks();
  weights_.assign(size_t(layers), {});
  weight_grads_.assign(size_t(layers), {});
  ends_ = std::make_unique<EndWeights>();
  end_grads_ = std::make_unique<EndWeights>();
  for (bool grad : {false, true}) {
    // External storage is bound group by group as forward and backward reach them.
    if (grad ? options_.external_grads : options_.external_params) continue;
    for (int i = 0; i < layers; ++i) bind_block(i, grad);
    bind_ends(grad);
  }
}

void Model::bind_block(int i, bool grad) {
  const int64_t d = config_.hidden;
  // Adjacent parameters seen as one matrix of their stacked rows of `cols` (LLaMA's q/k/v and
  // gate/up; the q/k/v biases as rows of 1). Only addresses are compared here; no parameter memory
  // is read.
  auto stacked = [&](const std::vector<const ModelParam*>& parts, int64_t cols) {
    int64_t rows = 0;
    const char* next = nullptr;
    for (const ModelParam* p : parts) {
      const Tensor t = grad ? p->grad : p->value;
      LT_CHECK(!next || t.data == next, "{} is not adjacent to the parameter before it", p->spec.name);
      next = static_cast<const char*>(t.data) + t.bytes();
      rows += t.numel() / cols;
    }
    const Tensor first = grad ? (*parts.begin())->grad : (*parts.begin())->value;
    return Tensor(first.data, first.dtype, {rows, cols}, first.device);
  };
  const int layer = options_.stage.layer(i);
  // A MoE block's expert matrices of the given roles, in flat-buffer order, as one [experts, rows, cols].
  auto experts = [&](std::initializer_list<ParamRole> roles, int64_t cols) {
    std::vector<const ModelParam*> parts;
    for (const ModelParam& q : params_)
      if (q.spec.place == ParamPlace::block && q.spec.layer == layer &&
          std::find(roles.begin(), roles.end(), q.spec.role) != roles.end())
        parts.push_back(&q);
    const Tensor t = stacked(parts, cols);
    const int64_t e = config_.moe.experts / (options_.experts_sharded ? ep_->size() : 1);  // the experts held here
    return t.view({e, t.shape[0] / e, cols});
  };
  auto p = [&](ParamRole role) -> const ModelParam& { return parameter(role, layer); };
  BlockWeights& w = grad ? weight_grads_[size_t(i)] : weights_[size_t(i)];
  auto v = [&](ParamRole role) { return grad ? p(role).grad : p(role).value; };
  // 2-D views of the matrices whatever their spec shape ([3, d, d] qkv included).
  auto mat = [&](ParamRole role) {
    Tensor t = v(role);
    return t.view({t.numel() / t.shape[t.shape.rank() - 1], t.shape[t.shape.rank() - 1]});
  };
  using R = ParamRole;
  w.ln1_w = v(R::attn_norm_weight);
  w.o_w = mat(R::attn_out_weight);
  w.ln2_w = v(R::mlp_norm_weight);
  if (moe_block(i)) {
    w.router = v(R::moe_router_weight);
    w.experts_in = experts({R::moe_gate_weight, R::moe_up_weight}, d);
    w.experts_out = experts({R::moe_down_weight}, config_.moe.ffn_hidden / tp_.size());
    if (config_.moe.bias) {
      w.router_b = v(R::moe_router_bias);
      const Tensor in_b = experts({R::moe_gate_bias, R::moe_up_bias}, 1), out_b = experts({R::moe_down_bias}, 1);
      w.experts_in_b = in_b.view({in_b.shape[0], in_b.shape[1]});
      w.experts_out_b = out_b.view({out_b.shape[0], out_b.shape[1]});
    }
    if (config_.moe.shared_ffn_hidden > 0) {  // the shared expert: the dense MLP's roles, and its gate
      w.fc_w = stacked({&p(R::mlp_gate_weight), &p(R::mlp_up_weight)}, d);
      w.out_w = mat(R::mlp_out_weight);
      w.shared_gate = v(R::moe_shared_gate_weight).view({d});
    }
  } else {
    w.out_w = mat(R::mlp_out_weight);
  }
  if (llama_) {
    w.qkv_w = stacked({&p(R::q_weight), &p(R::k_weight), &p(R::v_weight)}, d);
    if (!moe_block(i)) w.fc_w = stacked({&p(R::mlp_gate_weight), &p(R::mlp_up_weight)}, d);
    if (config_.qkv_bias) {
      const Tensor b = stacked({&p(R::q_bias), &p(R::k_bias), &p(R::v_bias)}, 1);
      w.qkv_b = b.view({b.numel()});
    }
    if (config_.qk_norm) {
      w.qn_w = v(R::q_norm_weight);
      w.kn_w = v(R::k_norm_weight);
    }
    if (config_.attention_sinks) w.sinks = v(R::attn_sinks);
    if (config_.o_bias) w.o_b = v(R::attn_out_bias);
    if (config_.post_norms) {
      w.post_attn_w = v(R::attn_post_norm_weight);
      w.post_mlp_w = v(R::mlp_post_norm_weight);
    }
  } else {
    w.ln1_b = v(R::attn_norm_bias);
    w.qkv_w = mat(R::qkv_weight);
    w.qkv_b = v(R::qkv_bias).view({v(R::qkv_bias).numel()});
    w.o_b = v(R::attn_out_bias);
    w.ln2_b = v(R::mlp_norm_bias);
    w.fc_w = mat(R::mlp_in_weight);
    w.fc_b = v(R::mlp_in_bias);
    w.out_b = v(R::mlp_out_bias);
  }
}

void Model::bind_ends(bool grad) {
  EndWeights& e = grad ? *end_grads_ : *ends_;
  auto v = [&](ParamRole role) { return grad ? parameter(role).grad : parameter(role).value; };
  if (options_.stage.has_embedding) {
    e.wte = v(ParamRole::token_embedding);
    if (!llama_) e.wpe = v(ParamRole::position_embedding);
  }
  if (options_.stage.has_head) {
    e.norm_w = v(ParamRole::final_norm_weight);
    if (!llama_) e.norm_b = v(ParamRole::final_norm_bias);
    // Tied: the first token_embedding of the stage (the embedding itself, or the last stage's copy).
    e.head = v(config_.tie_embeddings ? ParamRole::token_embedding : ParamRole::output_weight);
  }
}

bool tied_in_stage(const ModelConfig& model, const StageLayout& stage) {
  return stage.has_head && stage.has_embedding && model.tie_embeddings && stage.chunks == 1;
}

bool Model::tied_in_stage() const { return trainer::tied_in_stage(config_, options_.stage); }

void Model::hold_params(ParamPlace place, int layer, bool backward) {
  if (!options_.external_params) return;
  LT_CHECK(param_storage_ && param_release_, "a model with external parameters needs a param-storage hook");
  bind_group_to_storage(params_, place, layer, param_storage_(place, layer, backward), &ModelParam::value, "parameter");
  if (place == ParamPlace::block)
    bind_block(options_.stage.local(layer), false);
  else
    bind_ends(false);
}

void Model::release_params(ParamPlace place, int layer) {
  if (options_.external_params) param_release_(place, layer);
}

void Model::bind_group_grads(ParamPlace place, int layer) {
  bind_group_to_storage(params_, place, layer, grad_storage_(place, layer), &ModelParam::grad, "gradient");
  if (place == ParamPlace::block)
    bind_block(options_.stage.local(layer), true);
  else
    bind_ends(true);
}

ModelMemory Model::lay_out(const ModelConfig& config, const ModelOptions& options, const Dims& z, Arena& a,
                           std::vector<Slot>& slots, Work& work) {
  const int64_t b = options.micro_batch, n = b * z.seq, d = config.hidden;
  const int64_t nl = z.sp ? n / z.tp : n;  // this rank's rows of the residual stream
  const int64_t qkv = (z.heads + 2 * z.kv_heads) * z.head_dim, q = z.heads * z.head_dim;
  const int64_t fc = z.llama ? 2 * z.ffn : z.ffn;
  const int64_t shared_fc = 2 * z.shared_ffn;  // a MoE block's shared expert (0: none)
  // Slots hold one chunk's blocks each: activation_slots per chunk, chunk-major.
  const int layers = options.stage.chunk_blocks(), chunks = options.stage.chunks;
  const bool full_ckpt = options.checkpointing == ActivationCheckpointing::full;
  const bool selective = options.checkpointing == ActivationCheckpointing::selective;
  const bool head = options.stage.has_head;
  // A block's activations: the products (linear and attention outputs, and the residual stream
  // after attention) and the element-wise results (norms and their statistics, the MLP
  // activation). Selective recomputation keeps the first per slot and recomputes the second
  // into one shared set.
  enum Parts { kProducts = 1, kElementwise = 2, kAll = 3 };
  const int64_t m = n * z.top_k;  // a MoE block's assignment rows
  const int64_t mx = m * z.ep;    // the rows its experts compute on this rank (at most)
  // [rows, cols] with rows ≥ n enough to also hold n rows of `other` columns.
  auto wide = [&](int64_t cols, int64_t other) {
    return a.take({(n * std::max(cols, other) + cols - 1) / cols, cols});
  };
  // `dense` / `moe`: the MLP activations of a dense block, of a MoE block, or (a recomputation set
  // shared by both kinds) of both. A MoE block's are all kept as products: selective recomputation
  // redoes only its norms.
  auto layer_acts = [&](int parts, bool dense, bool moe) {
    LayerActs l;
    if (parts & kElementwise) {
      l.ln1 = a.take({n, d});
      if (!z.llama) l.ln1_mean = a.take_f32({nl});
      l.ln1_rstd = a.take_f32({nl});
    }
    if (parts & kProducts) {
      l.qkv = a.take({n, qkv});
      if (z.qk_norm) {
        l.qk_in = a.take({n, qkv});
        l.qk_rstd = a.take_f32({n * (z.heads + z.kv_heads)});
      }
      l.att = a.take({n, q});
      l.lse = a.take_f32({b * z.heads * z.seq});
      l.mid = a.take({nl, d});
      if (config.post_norms) {
        l.attn_raw = a.take({nl, d});
        l.attn_rstd = a.take_f32({nl});
        if (dense) {
          l.mlp_raw = a.take({nl, d});
          l.mlp_rstd = a.take_f32({nl});
        }
      }
    }
    if (parts & kElementwise) {
      l.ln2 = a.take({n, d});
      if (!z.llama) l.ln2_mean = a.take_f32({nl});
      l.ln2_rstd = a.take_f32({nl});
    }
    if (moe && (parts & kProducts)) {
      l.probs = a.take_f32({n, z.experts});
      l.router_lse = a.take_f32({n});
      l.route_expert = a.take_int({m});
      l.route_weight = a.take_f32({m});
      l.route_order = a.take_int({m});
      l.route_pos = a.take_int({m});
      l.route_offsets = a.take_int({z.experts + 1});
      l.moe_in = a.take({m, d});
      l.moe_fc = a.take({mx, 2 * z.moe_ffn});
      l.moe_act = a.take({mx, z.moe_ffn});
      l.moe_out = a.take({m, d});
      if (z.ep > 1) {
        l.ep_in = a.take({mx, d});
        l.ep_perm = a.take_int({mx});
        l.ep_inv = a.take_int({mx});
        l.ep_offsets = a.take_int({z.experts / z.ep + 1});
        l.ep_plan = std::make_shared<std::vector<int32_t>>(size_t(z.ep * (z.experts + 1)), 0);
      }
    }
    // A shared expert's fc and act take the dense MLP's buffers: in a recomputation set for both
    // kinds, shaped as the dense MLP's with the rows to hold the shared expert's too (whose code views
    // them at its own width).
    const bool shared = moe && z.shared_ffn > 0;
    if ((dense || shared) && (parts & kProducts))
      l.fc = dense ? wide(fc, shared ? shared_fc : 0) : a.take({n, shared_fc});
    if ((dense && (parts & kElementwise)) || (shared && (parts & kProducts)))
      l.act = dense ? wide(z.ffn, shared ? z.shared_ffn : 0) : a.take({n, z.shared_ffn});
    if (shared && (parts & kProducts)) {
      l.shared_out = a.take({n, d});
      l.shared_gate = a.take_f32({n});
    }
    return l;
  };
  // Whether local block l of chunk c is a MoE block, and whether any of the stage's is (or is not).
  auto moe_at = [&](int c, int l) { return config.moe.layer(options.stage.layer(c * layers + l)); };
  bool any_moe = false, any_dense = false;
  for (int c = 0; c < chunks; ++c)
    for (int l = 0; l < layers; ++l) (moe_at(c, l) ? any_moe : any_dense) = true;
  ModelMemory mem;
  slots.assign(size_t(options.activation_slots) * size_t(chunks), {});
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& s = slots[i];
    const bool head_slot = head && int(i) / options.activation_slots == chunks - 1;
    s.tokens = a.take_int({n});
    s.targets = a.take_int({n});
    for (int l = 0; l <= layers; ++l) s.residual.push_back(a.take({nl, d}));
    const int chunk = int(i) / options.activation_slots;
    // A MoE block's routing statistics, kept with the slot whatever is recomputed (the step reads them).
    for (int l = 0; l < layers; ++l)
      s.moe_stats.push_back(moe_at(chunk, l) ? a.take_f32({2 * z.experts + 2}) : Tensor{});
    if (!full_ckpt)
      for (int l = 0; l < layers; ++l) {
        const bool moe = moe_at(chunk, l);
        s.layers.push_back(layer_acts(selective ? kProducts : kAll, !moe, moe));
        s.layers.back().route_stats = s.moe_stats[size_t(l)];
      }
    if (options.split_backward)
      for (int l = 0; l < layers; ++l)
        // d(out) and d(mid) as the row-parallel linears' backward reads them: all n rows (sequence
        // parallelism gathers them from each rank's nl).
        s.grads.push_back({a.take({n, d}), a.take({n, fc}), a.take({n, d}), a.take({n, qkv})});
    if (head_slot) {
      s.lnf = a.take({n, d});
      if (!z.llama) s.lnf_mean = a.take_f32({nl});
      s.lnf_rstd = a.take_f32({nl});
      s.logits = a.take({n, z.vocab_local});
      mem.head_logits += int64_t(s.logits.bytes());
      s.losses = a.take_f32({n});
      s.ce_lse = a.take_f32({n});
      s.loss = a.take_f32({1});
      s.count = a.take_int({1});
    }
  }
  mem.activations_kept = a.bytes();
  work = Work{};
  if (full_ckpt && layers > 0) {
    work.recompute = layer_acts(kAll, any_dense, any_moe);
    if (any_moe) work.recompute.route_stats = a.take_f32({2 * z.experts + 2});
  }
  if (selective && layers > 0) work.recompute = layer_acts(kElementwise, any_dense, false);
  work.dres = a.take({nl, d});
  work.dln = a.take({n, d});
  work.dqkv = a.take({n, qkv});
  work.datt = a.take({n, q});
  work.dfc = wide(fc, any_moe ? shared_fc : 0);  // a shared expert's too
  work.dact = wide(z.ffn, any_moe ? z.shared_ffn : 0);
  if (any_moe) {
    work.moe_dd = a.take({m, d});
    work.moe_dfc = a.take({mx, 2 * z.moe_ffn});
    work.moe_dact = a.take({mx, z.moe_ffn});
    work.moe_dweight = a.take_f32({m});
    if (z.shared_ffn > 0) work.moe_dlogit = a.take_f32({n});
    if (z.ep > 1) {
      work.ep_recv = a.take({mx, d});
      work.ep_rows = a.take({mx, d});
      work.ep_plan = a.take_int({z.ep * (z.experts + 1)});
    }
  }
  if (z.llama) work.rope = a.take_f32({config.max_positions, 2, z.head_dim / 2});
  if (z.llama && config.sliding_window > 0 && config.rope_local_theta > 0)
    work.rope_local = a.take_f32({config.max_positions, 2, z.head_dim / 2});
  if (config.post_norms && layers > 0) work.dpost = a.take({nl, d});
  if (config.logit_softcap > 0 && head) work.dlogits = a.take({n, z.vocab_local});
  if (z.tp > 1 && head) work.ce_scratch = a.take_f32({3 * n});
  if (z.kv_replicas > 1 && layers > 0)
    work.kv_grad_saved = a.take({config.qkv_bias ? 2 * (2 * z.head_dim * d + 2 * z.head_dim) : 2 * z.head_dim * d});
  if (z.qk_norm && z.tp > 1 && layers > 0) work.qk_grad_saved = a.take({2 * 2 * z.head_dim});
  if (z.sp) {
    work.sp_full = a.take({n, d});
    work.sp_rows = a.take({nl, d});
    work.sp_grad_saved = a.take({2 * 8 * d});
  }
  if (options.context_parallel > 1 && layers > 0) {
    const parallel::RingScratchSizes r = parallel::ring_scratch_sizes(b, z.seq, z.heads, z.kv_heads, z.head_dim);
    for (Tensor& t : work.ring.kv) t = a.take({r.kv});
    for (Tensor& t : work.ring.dkv) t = a.take({r.kv});
    work.ring.part_out = a.take({r.part_out});
    work.ring.part_lse = a.take_f32({r.part_lse});
    work.ring.dq_block = a.take({r.block});
    work.ring.dkv_block = a.take({r.block});
  }
  mem.activations_work = a.bytes() - mem.activations_kept;
  if (options.kv_cache_tokens > 0)
    for (int l = 0; l < layers; ++l)
      work.cache.push_back({a.take({b, options.kv_cache_tokens, z.kv_heads, z.head_dim}),
                            a.take({b, options.kv_cache_tokens, z.kv_heads, z.head_dim})});
  mem.kv_cache = a.bytes() - mem.activations_kept - mem.activations_work;
  return mem;
}

void Model::build_activations() {
  const Dims z(config_, options_, tp_.size());
  Arena measure(nullptr, options_.dtype);
  {
    std::vector<Slot> slots;
    Work work;
    lay_out(config_, options_, z, measure, slots, work);
  }
  // Raw bytes (a multiple of 64) carved into tensors of several dtypes.
  act_buf_ = kernels::Buffer(DType::fp32, {measure.bytes() / 4}, options_.device, kernels::MemoryKind::activations);
  Arena real(act_buf_.data(), options_.dtype, options_.device);
  work_ = std::make_unique<Work>();
  lay_out(config_, options_, z, real, slots_, *work_);
  if (llama_) kernels::rope_table(work_->rope, config_.rope_theta, rope_scaling_op(config_.rope_scaling));
  if (work_->rope_local.defined())
    kernels::rope_table(work_->rope_local, config_.rope_local_theta, kernels::RopeScaling{});
}

ModelMemory model_memory_plan(const ModelConfig& model, const ModelOptions& options, int tp_size, int tp_rank) {
  LT_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "tp rank {} of {}", tp_rank, tp_size);
  const ModelOptions o = Model::resolve(model, options, tp_size);
  int64_t numel = 0;
  Model::param_layout(model, o.stage, tp_size, tp_rank, o.experts_sharded ? o.expert_parallel : 1, 0, &numel);
  Model::Arena measure(nullptr, o.dtype);
  std::vector<Model::Slot> slots;
  Model::Work work;
  ModelMemory mem = Model::lay_out(model, o, Model::Dims(model, o, tp_size), measure, slots, work);
  const int64_t element = int64_t(kernels::dtype_size(o.dtype));
  mem.params = o.external_params ? 0 : numel * element;
  mem.grads = o.external_grads ? 0 : numel * element;
  return mem;
}

std::vector<ModelParam> model_param_layout(const ModelConfig& model, const ModelOptions& options, int tp_size,
                                           int tp_rank) {
  LT_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "tp rank {} of {}", tp_rank, tp_size);
  const ModelOptions o = Model::resolve(model, options, tp_size);
  int64_t numel = 0;
  return Model::param_layout(model, o.stage, tp_size, tp_rank, o.experts_sharded ? o.expert_parallel : 1, 0, &numel);
}

// Initialization draws every value on the host: straight into a CPU parameter buffer, or into a
// host copy of the whole flat buffer that one kernels::copy then moves to the device. It runs once
// at start; nothing in a step does this.
void Model::init_parameters(uint64_t seed) {
  if (!options_.external_params) {
    kernels::Buffer staged;
    if (param_buf_.device() != kernels::Device::cpu)
      staged = kernels::Buffer(options_.dtype, {numel_}, kernels::Device::cpu, kernels::MemoryKind::other);
    const Tensor flat = staged.data() ? staged.tensor() : param_buf_.tensor();
    if (options_.dtype == DType::fp32) {
      for (const ModelParam& p : params_)
        init_param_elements(p, seed, 0, p.numel(), flat.flat(p.offset, p.numel()).ptr<float>());
    } else {
      // 16-bit storage: each parameter drawn in fp32 and rounded once.
      std::vector<float> wide;
      for (const ModelParam& p : params_) {
        wide.resize(size_t(p.numel()));
        init_param_elements(p, seed, 0, p.numel(), wide.data());
        kernels::convert(flat.flat(p.offset, p.numel()), kernels::host_tensor(wide.data(), {p.numel()}));
      }
    }
    if (staged.data()) kernels::copy(param_buf_.tensor(), staged.tensor());
    return;
  }
  // ZeRO 3: only the owned elements, straight into the shard (each is a pure function of its index);
  // a device shard is drawn into a host copy that one kernels::copy then moves.
  LT_CHECK(shard_values_.defined(), "init_parameters on a model with external parameters and no param shard");
  kernels::Buffer staged;
  if (shard_values_.device != kernels::Device::cpu)
    staged = kernels::Buffer(DType::fp32, {shard_values_.numel()}, kernels::Device::cpu, kernels::MemoryKind::other);
  const Tensor shard = staged.data() ? staged.tensor() : shard_values_;
  for (const ModelParam& p : params_)
    for (const parallel::FlatRange& own : shard_ranges_) {
      const int64_t lo = std::max(p.offset, own.begin), hi = std::min(p.offset + p.numel(), own.end);
      if (lo < hi)
        init_param_elements(p, seed, lo - p.offset, hi - p.offset, shard.ptr<float>() + param_shard_offset(lo));
    }
  // 16-bit storage: the fp32 shard is the optimizer's master; it starts from the rounded values,
  // as the master of a model with its own 16-bit buffer does (TrainStep::master_from_params).
  if (options_.dtype != DType::fp32 && shard.numel() > 0) {
    std::vector<uint16_t> rounded(size_t(shard.numel()));
    const Tensor half(rounded.data(), options_.dtype, {shard.numel()});
    kernels::convert(half, shard);
    kernels::convert(shard, half);
  }
  if (staged.data()) kernels::copy(shard_values_, staged.tensor());
}

// Elements [begin, end) of p (this rank's shard, row-major) into out[0, end - begin).
void Model::init_param_elements(const ModelParam& p, uint64_t seed, int64_t begin, int64_t end, float* out) const {
  if (p.spec.init == ParamInit::zeros || p.spec.init == ParamInit::ones) {
    std::fill(out, out + (end - begin), p.spec.init == ParamInit::ones ? 1.0f : 0.0f);
    return;
  }
  const auto key = param_rng_key(seed, p.spec.name);
  const double std = param_init_std(p.spec, config_);
  for_each_shard_run(p, [&](int64_t local, int64_t global, int64_t count) {
    const int64_t lo = std::max(local, begin), hi = std::min(local + count, end);
    if (lo >= hi) return;
    global += lo - local, count = hi - lo;
    float* to = out + (lo - begin);
    constexpr int64_t kChunk = 1 << 14;  // a multiple of 4: chunks never split a Philox block
#pragma omp parallel for schedule(static) if (count > kChunk)
    for (int64_t c = 0; c < count; c += kChunk)
      normal_fill(key, uint64_t(global + c), to + c, std::min(kChunk, count - c), std);
  });
}

void Model::set_param_shard(std::vector<parallel::FlatRange> owned, Tensor values) {
  LT_CHECK(options_.external_params, "set_param_shard on a model with its own parameter buffer");
  int64_t n = 0;
  for (size_t i = 0; i < owned.size(); ++i) {
    LT_CHECK(owned[i].begin >= 0 && owned[i].begin <= owned[i].end && owned[i].end <= numel_ &&
                 (i == 0 || owned[i - 1].end <= owned[i].begin),
             "param shard range [{}, {}) of {}", owned[i].begin, owned[i].end, numel_);
    n += owned[i].numel();
  }
  LT_CHECK(!values.defined() || (values.dtype == DType::fp32 && values.numel() == n),
           "param shard of {} elements for ranges of {}", values.numel(), n);
  shard_ranges_ = std::move(owned);
  shard_values_ = values;
}

int64_t Model::param_shard_offset(int64_t at) const {
  int64_t base = 0;
  for (const parallel::FlatRange& r : shard_ranges_) {
    if (at >= r.begin && at < r.end) return base + (at - r.begin);
    base += r.numel();
  }
  return -1;
}

void Model::zero_grads() {
  if (!options_.external_grads) kernels::fill_zero(grad_buf_.tensor());
}

void Model::require_whole_model(const char* what) const {
  LT_CHECK(options_.stage.has_embedding && options_.stage.has_head, "{} needs the whole model on one stage", what);
}

float Model::host_loss(int slot) const {
  float value = 0;
  kernels::copy(kernels::host_tensor(&value, {1}), loss(slot));  // waits for the loss on a device
  return value;
}

float Model::forward_backward(const MicroBatch& mb, float loss_scale) {
  require_whole_model("forward_backward");
  LT_CHECK(mb.targets.defined(), "forward_backward without targets");
  stage_forward(0, mb, Tensor{});
  stage_backward(0, Tensor{}, loss_scale);
  return host_loss(0);
}

float Model::forward_loss(const MicroBatch& mb) {
  require_whole_model("forward_loss");
  LT_CHECK(mb.targets.defined(), "forward_loss without targets");
  stage_forward(0, mb, Tensor{});
  return host_loss(0);
}

void Model::require_tp1(const char* what) const {
  if (tp_.size() > 1)
    throw Error(fmt::format("not supported yet: {} with tensor parallelism (tp {}): no rank holds the logits of the "
                            "whole vocabulary",
                            what, tp_.size()),
                "run it with tp 1 (a checkpoint written at any tp loads at tp 1)");
}

Tensor Model::forward_logits(Tensor tokens) {
  require_whole_model("forward_logits");
  require_tp1("forward_logits");
  stage_forward(0, MicroBatch{tokens, Tensor{}}, Tensor{});
  const Slot& s = slots_[0];
  const int64_t n = int64_t(s.batch) * s.seq;
  return s.logits.flat(0, n * config_.padded_vocab()).view({s.batch, s.seq, config_.padded_vocab()});
}

Tensor Model::forward_cached(Tensor tokens, int64_t position) {
  require_whole_model("forward_cached");
  require_tp1("forward_cached");
  LT_CHECK(!work_->cache.empty(), "forward_cached on a model built without options.kv_cache_tokens");
  const auto [b, t] = batch_shape(tokens, "tokens", options_.micro_batch, seq_);
  LT_CHECK(position >= 0, "position {}", position);
  if (position + t > options_.kv_cache_tokens)
    throw Error(fmt::format("the context is full: positions [{}, {}) do not fit a KV cache of {} tokens", position,
                            position + t, options_.kv_cache_tokens),
                "generate fewer tokens or use a shorter prompt");
  Slot& s = slots_[0];
  s.batch = b;
  s.seq = t;
  s.has_targets = false;
  const int64_t n = int64_t(b) * t;
  kernels::copy(s.tokens.flat(0, n), tokens.view({n}));
  embedding_forward_held(s, position);
  forward_blocks(s, position, true, 0);
  head_forward_held(s);
  return s.logits.flat(0, n * config_.padded_vocab()).view({b, t, config_.padded_vocab()});
}

}  // namespace llmtrain::trainer
