#include "trainer/model/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "common/error.h"
#include "kernels/ops.h"

namespace llmtrain::trainer {
namespace k = llmtrain::kernels;
using k::DType;
using k::Tensor;

namespace {

// Parameter slots, per layer and global, in the order KvCacheDecoder's constructor fills w_.
enum Gpt2Slot { kLn1W, kLn1B, kAttnW, kAttnB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kFc2W, kFc2B, kGpt2Slots };
enum LlamaSlot { kInNorm, kQ, kK, kV, kO, kPostNorm, kGate, kUp, kDown, kLlamaSlots };

Tensor as_row(const k::Buffer& b, int64_t n) { return b.tensor().flat(0, n).view({1, n}); }

}  // namespace

KvCacheDecoder::KvCacheDecoder(const Model& model, int64_t max_tokens)
    : model_(model), cfg_(model.config()), llama_(cfg_.family == ModelFamily::llama), max_(max_tokens) {
  const StageLayout& st = model.options().stage;
  LT_CHECK(st.has_embedding && st.has_head && st.layer_begin == 0 && st.layer_end == cfg_.layers,
           "generation needs the whole model");
  if (!llama_ && max_ > cfg_.max_positions)
    throw Error(fmt::format("a context of {} tokens exceeds model.max_positions {}", max_, cfg_.max_positions),
                "generate fewer tokens or use a shorter prompt");
  d_ = cfg_.hidden, heads_ = cfg_.heads, kv_heads_ = cfg_.kv_heads, hd_ = cfg_.head_dim(), ffn_ = cfg_.ffn_hidden;
  vpad_ = cfg_.padded_vocab();

  auto p = [&](const std::string& name) { return model.parameter(name).value; };
  if (llama_) {
    w_.push_back(p("model.embed_tokens.weight"));
    for (int i = 0; i < cfg_.layers; ++i) {
      auto n = [&](const char* s) { return fmt::format("model.layers.{}.{}", i, s); };
      for (const char* s : {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                            "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
        w_.push_back(p(n(s)));
    }
    w_.push_back(p("model.norm.weight"));
    w_.push_back(cfg_.tie_embeddings ? p("model.embed_tokens.weight") : p("lm_head.weight"));
  } else {
    w_.push_back(p("transformer.wte.weight"));
    w_.push_back(p("transformer.wpe.weight"));
    for (int i = 0; i < cfg_.layers; ++i) {
      auto n = [&](const char* s) { return fmt::format("transformer.h.{}.{}", i, s); };
      for (const char* s : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                            "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                            "mlp.c_proj.weight", "mlp.c_proj.bias"})
        w_.push_back(p(n(s)));
    }
    w_.push_back(p("transformer.ln_f.weight"));
    w_.push_back(p("transformer.ln_f.bias"));
    w_.push_back(cfg_.tie_embeddings ? p("transformer.wte.weight") : p("lm_head.weight"));
  }

  k_cache_ = k::Buffer(DType::fp32, {cfg_.layers, max_, kv_heads_, hd_});
  v_cache_ = k::Buffer(DType::fp32, {cfg_.layers, max_, kv_heads_, hd_});
  x_ = k::Buffer(DType::fp32, {d_});
  y_ = k::Buffer(DType::fp32, {d_});
  qkv_ = k::Buffer(DType::fp32, {(heads_ + 2 * kv_heads_) * hd_});
  att_ = k::Buffer(DType::fp32, {heads_ * hd_});
  h_ = k::Buffer(DType::fp32, {std::max<int64_t>(2 * ffn_, d_)});
  h2_ = k::Buffer(DType::fp32, {std::max<int64_t>(ffn_, max_)});
  logits_ = k::Buffer(DType::fp32, {vpad_});
  stat_ = k::Buffer(DType::fp32, {2});
  if (llama_) {
    rope_ = k::Buffer(DType::fp32, {max_, 2, hd_ / 2});
    k::rope_table(rope_.tensor(), cfg_.rope_theta);
  }
}

std::span<const float> KvCacheDecoder::append(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) {
    if (pos_ >= max_)
      throw Error(fmt::format("the context is full ({} tokens)", max_),
                  "generate fewer tokens or use a shorter prompt");
    LT_CHECK(t >= 0 && t < cfg_.vocab, "token {} outside the vocabulary of {}", t, cfg_.vocab);
    row(t);
    ++pos_;
  }
  return {logits_.ptr<float>(), static_cast<size_t>(vpad_)};
}

void KvCacheDecoder::row(int32_t token) {
  const float eps = static_cast<float>(cfg_.norm_eps);
  const int64_t qkv_w = heads_ + 2 * kv_heads_;
  Tensor x = as_row(x_, d_), y = as_row(y_, d_), qkv = as_row(qkv_, qkv_w * hd_), att = as_row(att_, heads_ * hd_);
  Tensor mean = stat_.tensor().flat(0, 1), rstd = stat_.tensor().flat(1, 1);
  int32_t tok = token;
  k::embedding_forward(x, Tensor(&tok, DType::int32, {1}), w_[0], 0);
  if (!llama_) k::position_embedding_forward(x.view({1, 1, d_}), w_[1], pos_);

  const int64_t per_layer = llama_ ? int64_t(kLlamaSlots) : int64_t(kGpt2Slots);
  const size_t first = llama_ ? 1 : 2;
  for (int layer = 0; layer < cfg_.layers; ++layer) {
    const Tensor* w = &w_[first + size_t(layer) * per_layer];
    // Attention: normalize, project to q, k, v (one packed row), rotate (llama), cache k and v.
    if (llama_) {
      k::rmsnorm_forward(y, rstd, x, w[kInNorm], eps);
      k::linear_forward(qkv.flat(0, heads_ * hd_).view({1, heads_ * hd_}), y, w[kQ], {});
      k::linear_forward(qkv.flat(heads_ * hd_, kv_heads_ * hd_).view({1, kv_heads_ * hd_}), y, w[kK], {});
      k::linear_forward(qkv.flat((heads_ + kv_heads_) * hd_, kv_heads_ * hd_).view({1, kv_heads_ * hd_}), y, w[kV], {});
      k::rope_forward(qkv.view({1, 1, qkv_w, hd_}), rope_.tensor(), heads_ + kv_heads_, pos_);
    } else {
      k::layernorm_forward(y, mean, rstd, x, w[kLn1W], w[kLn1B], eps);
      k::linear_forward(qkv, y, w[kAttnW].view({3 * d_, d_}), w[kAttnB].view({3 * d_}));
    }
    const float* q = qkv_.ptr<float>();
    const float* kn = q + heads_ * hd_;
    const float* vn = kn + kv_heads_ * hd_;
    float* kc = k_cache_.ptr<float>() + (int64_t(layer) * max_) * kv_heads_ * hd_;
    float* vc = v_cache_.ptr<float>() + (int64_t(layer) * max_) * kv_heads_ * hd_;
    std::copy(kn, kn + kv_heads_ * hd_, kc + pos_ * kv_heads_ * hd_);
    std::copy(vn, vn + kv_heads_ * hd_, vc + pos_ * kv_heads_ * hd_);

    // softmax(q·kᵀ/√D)·v over positions 0..pos for every head (head h reads kv head h / group).
    const int64_t group = heads_ / kv_heads_, n = pos_ + 1;
    const float scale = 1.0f / std::sqrt(float(hd_));
    float* scores = h2_.ptr<float>();
    for (int64_t h = 0; h < heads_; ++h) {
      const float* qh = q + h * hd_;
      const int64_t g = h / group;
      float top = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const float* kj = kc + (j * kv_heads_ + g) * hd_;
        float s = 0;
        for (int64_t c = 0; c < hd_; ++c) s += qh[c] * kj[c];
        scores[j] = s * scale;
        top = std::max(top, scores[j]);
      }
      double total = 0;
      for (int64_t j = 0; j < n; ++j) total += scores[j] = std::exp(scores[j] - top);
      float* out = att_.ptr<float>() + h * hd_;
      std::fill(out, out + hd_, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float pj = float(scores[j] / total);
        const float* vj = vc + (j * kv_heads_ + g) * hd_;
        for (int64_t c = 0; c < hd_; ++c) out[c] += pj * vj[c];
      }
    }

    // Output projection into the residual stream, then the MLP.
    Tensor hd = as_row(h_, d_);
    if (llama_) {
      k::linear_forward(hd, att, w[kO], {});
      k::residual_forward(x, x, hd, {});
      k::rmsnorm_forward(y, rstd, x, w[kPostNorm], eps);
      Tensor gate_up = as_row(h_, 2 * ffn_);
      k::linear_forward(gate_up.flat(0, ffn_).view({1, ffn_}), y, w[kGate], {});
      k::linear_forward(gate_up.flat(ffn_, ffn_).view({1, ffn_}), y, w[kUp], {});
      Tensor act = as_row(h2_, ffn_);
      k::swiglu_forward(act, gate_up);
      k::linear_forward(hd, act, w[kDown], {});
      k::residual_forward(x, x, hd, {});
    } else {
      k::linear_forward(hd, att, w[kProjW], w[kProjB]);
      k::residual_forward(x, x, hd, {});
      k::layernorm_forward(y, mean, rstd, x, w[kLn2W], w[kLn2B], eps);
      Tensor fc = as_row(h_, ffn_), act = as_row(h2_, ffn_);
      k::linear_forward(fc, y, w[kFcW], w[kFcB]);
      k::gelu_forward(act, fc);
      k::linear_forward(hd, act, w[kFc2W], w[kFc2B]);
      k::residual_forward(x, x, hd, {});
    }
  }
  const size_t tail = first + size_t(cfg_.layers) * per_layer;
  if (llama_)
    k::rmsnorm_forward(y, rstd, x, w_[tail], eps);
  else
    k::layernorm_forward(y, mean, rstd, x, w_[tail], w_[tail + 1], eps);
  k::linear_forward(as_row(logits_, vpad_), y, w_.back(), {});
}

std::vector<int32_t> generate(KvCacheDecoder& decoder, std::span<const int32_t> prompt, int32_t eod,
                              const GenerateOptions& o, const std::function<void(int32_t)>& emit) {
  LT_CHECK(!prompt.empty(), "generation needs at least one prompt token");
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<int32_t> out;
  std::span<const float> logits = decoder.append(prompt);
  while (static_cast<int64_t>(out.size()) < o.max_tokens) {
    int32_t next = sample_token(logits.first(static_cast<size_t>(decoder.vocab())), o.sampling, uniform(rng));
    if (o.stop_at_eod && next == eod) break;
    out.push_back(next);
    emit(next);
    if (decoder.position() >= decoder.capacity() || static_cast<int64_t>(out.size()) == o.max_tokens) break;
    logits = decoder.append(std::span<const int32_t>(&next, 1));
  }
  return out;
}

}  // namespace llmtrain::trainer
