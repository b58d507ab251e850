// Text generation from a trained model with a KV cache (`llmtrain generate`): the keys and values
// of every position seen so far are kept per layer, so each new token costs one row of the
// network instead of a forward over the whole context.
//
// Rule a reader could get wrong: there is no second forward pass here. KvCacheDecoder only feeds
// tokens to Model::forward_cached (the training forward with the model's own KV cache) and copies
// the last row of logits to the host for sampling; the model must be built with
// ModelOptions::kv_cache_tokens, which is the decoder's context.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "trainer/model/model.h"
#include "trainer/model/sampling.h"

namespace llmtrain::trainer {

class KvCacheDecoder {
 public:
  // `model` must be a whole model (pp = 1) built with options.kv_cache_tokens > 0, and outlive the
  // decoder. The decoder uses the model's first sequence and slot 0.
  explicit KvCacheDecoder(Model& model);

  // Feeds `tokens` (at least one) at the next positions, in chunks of at most the model's
  // seq_len; returns the logits [padded vocab] after the last one (valid until the next call).
  // Throws an Error when they do not fit the context.
  std::span<const float> append(std::span<const int32_t> tokens);
  int64_t position() const { return pos_; }
  int64_t capacity() const { return model_.options().kv_cache_tokens; }
  int32_t vocab() const { return model_.config().vocab; }  // real ids; padding columns are never sampled
  void reset() { pos_ = 0; }

 private:
  Model& model_;
  int64_t pos_ = 0;
  std::vector<float> logits_;  // host copy of the last row's logits
};

struct GenerateOptions {
  int64_t max_tokens = 200;
  SamplingParams sampling;
  uint64_t seed = 0;
  bool stop_at_eod = true;  // stop when the end-of-document token is sampled
  // The ids that may be sampled (empty: every id of the model): a model's vocabulary is often padded
  // past its tokenizer's ids (Qwen2.5's), and a sampled id the tokenizer cannot decode would end the
  // text half-way. The others' logits are taken as −∞, as transformers' users mask them.
  std::vector<bool> allowed;
};

// Samples up to max_tokens after `prompt`, calling `emit` with each token as it is produced.
// Returns the generated ids. Stops early at end-of-document (when `eod` >= 0) or when the context
// is full.
std::vector<int32_t> generate(KvCacheDecoder& decoder, std::span<const int32_t> prompt, int32_t eod,
                              const GenerateOptions& options, const std::function<void(int32_t)>& emit);

}  // namespace llmtrain::trainer
