#include "trainer/model/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <random>

#include "common/error.h"
#include "kernels/ops.h"

namespace llmtrain::trainer {

KvCacheDecoder::KvCacheDecoder(Model& model) : model_(model), logits_(size_t(model.config().padded_vocab()), 0.0f) {
  const StageLayout& st = model.options().stage;
  LT_CHECK(st.has_embedding && st.has_head, "generation needs the whole model");
  LT_CHECK(model.options().kv_cache_tokens > 0, "generation needs a model built with options.kv_cache_tokens");
}

std::span<const float> KvCacheDecoder::append(std::span<const int32_t> tokens) {
  LT_CHECK(!tokens.empty(), "append of no tokens");
  const int64_t count = int64_t(tokens.size()), chunk = model_.options().seq_len;
  if (pos_ + count > capacity())
    throw Error(fmt::format("the context is full ({} tokens)", capacity()),
                "generate fewer tokens or use a shorter prompt");
  kernels::Tensor logits;
  int64_t last = 0;
  for (int64_t at = 0; at < count; at += chunk) {
    last = std::min(chunk, count - at);
    logits = model_.forward_cached(kernels::host_tensor(tokens.data() + at, {1, last}), pos_);
    pos_ += last;
  }
  const int64_t vpad = int64_t(logits_.size());
  kernels::copy(kernels::host_tensor(logits_.data(), {vpad}), logits.flat((last - 1) * vpad, vpad));
  return logits_;
}

std::vector<int32_t> generate(KvCacheDecoder& decoder, std::span<const int32_t> prompt, int32_t eod,
                              const GenerateOptions& o, const std::function<void(int32_t)>& emit) {
  LT_CHECK(!prompt.empty(), "generation needs at least one prompt token");
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<int32_t> out;
  const size_t vocab = static_cast<size_t>(decoder.vocab());
  LT_CHECK(o.allowed.empty() ||
               (o.allowed.size() == vocab && std::find(o.allowed.begin(), o.allowed.end(), true) != o.allowed.end()),
           "generation allowing {} ids of a vocabulary of {}", o.allowed.size(), vocab);
  std::vector<float> masked(o.allowed.empty() ? 0 : vocab);
  std::span<const float> logits = decoder.append(prompt);
  while (static_cast<int64_t>(out.size()) < o.max_tokens) {
    std::span<const float> row = logits.first(vocab);
    if (!o.allowed.empty()) {
      for (size_t i = 0; i < vocab; ++i) masked[i] = o.allowed[i] ? row[i] : -std::numeric_limits<float>::infinity();
      row = masked;
    }
    int32_t next = sample_token(row, o.sampling, uniform(rng));
    if (o.stop_at_eod && next == eod) break;
    out.push_back(next);
    emit(next);
    if (decoder.position() >= decoder.capacity() || static_cast<int64_t>(out.size()) == o.max_tokens) break;
    logits = decoder.append(std::span<const int32_t>(&next, 1));
  }
  return out;
}

}  // namespace llmtrain::trainer
