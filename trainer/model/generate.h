// Text generation from a trained model with a KV cache: the keys and values of every position seen
// so far are kept per layer, so each new token costs one row of the network instead of a forward
// over the whole context (`llmtrain generate`).
//
// Rule a reader could get wrong: this is a second implementation of the forward pass (one token row
// at a time, attending over the cache), reading the Model's parameters by name; it must give the
// logits Model::forward_logits gives for the same tokens (tests/trainer/model/test_generate.cpp checks
// it), and it holds no gradients or activations for backward.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kernels/buffer.h"
#include "trainer/model/model.h"
#include "trainer/model/sampling.h"

namespace llmtrain::trainer {

class KvCacheDecoder {
 public:
  // `model` must be a whole model (pp = 1, tp = 1) and outlive the decoder. `max_tokens` bounds the
  // context (at most model.max_positions for GPT-2's learned positions).
  KvCacheDecoder(const Model& model, int64_t max_tokens);

  // Feeds `tokens` at the next positions; returns the logits [padded vocab] after the last one.
  std::span<const float> append(std::span<const int32_t> tokens);
  int64_t position() const { return pos_; }
  int64_t capacity() const { return max_; }
  int32_t vocab() const { return cfg_.vocab; }  // real ids; the logits' padding columns are never sampled
  void reset() { pos_ = 0; }

 private:
  void row(int32_t token);  // one position through every layer; leaves logits_ filled

  const Model& model_;
  const ModelConfig& cfg_;
  bool llama_;
  int64_t max_, pos_ = 0;
  int64_t d_, heads_, kv_heads_, hd_, ffn_, vpad_;
  std::vector<kernels::Tensor> w_;     // parameters by index (see the .cpp for the order)
  kernels::Buffer k_cache_, v_cache_;  // [layers, max, kv_heads, head dim]
  kernels::Buffer x_, y_, qkv_, att_, h_, h2_, logits_, rope_, stat_;
};

struct GenerateOptions {
  int64_t max_tokens = 200;
  SamplingParams sampling;
  uint64_t seed = 0;
  bool stop_at_eod = true;  // stop when the end-of-document token is sampled
};

// Samples up to max_tokens after `prompt`, calling `emit` with each token as it is produced.
// Returns the generated ids. Stops early at end-of-document (when `eod` >= 0) or when the context
// is full.
std::vector<int32_t> generate(KvCacheDecoder& decoder, std::span<const int32_t> prompt, int32_t eod,
                              const GenerateOptions& options, const std::function<void(int32_t)>& emit);

}  // namespace llmtrain::trainer
