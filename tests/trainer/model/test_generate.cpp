// Generation: the model's own forward with its KV cache (Model::forward_cached, through
// KvCacheDecoder) gives the logits the full forward gives at every position — token by token, a
// prompt at once, a prompt in several chunks (also across the model's seq_len), two sequences at
// once — for both families, tied and untied, grouped-query attention included; a fixed seed
// reproduces a generation; the context limit stops it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <tuple>

#include "common/error.h"
#include "kernels/ops.h"
#include "parallel/comm/comm.h"
#include "trainer/model/generate.h"
#include "trainer/model/model.h"

using namespace llmtrain;
using namespace llmtrain::trainer;

namespace {

ModelConfig config(ModelFamily family, bool tied) {
  ModelConfig m;
  m.family = family;
  m.layers = 2, m.hidden = 48, m.heads = 6, m.seq_len = 24, m.max_positions = 32;
  m.kv_heads = family == ModelFamily::llama ? 2 : 6;
  m.ffn_hidden = 80, m.vocab = 90, m.vocab_pad = 64, m.init_std = 0.2;
  m.tie_embeddings = tied;
  return m;
}

double rel_diff(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) num += double(a[i] - b[i]) * (a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / den);
}

std::vector<float> to_host(kernels::Tensor t) {
  std::vector<float> out(size_t(t.numel()));
  kernels::copy(kernels::host_tensor(out.data(), t.shape), t);
  return out;
}

std::vector<int32_t> random_tokens(const ModelConfig& cfg, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(n), 0);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % uint32_t(cfg.vocab));
  return tokens;
}

class Generate : public ::testing::TestWithParam<std::tuple<ModelFamily, bool>> {
 protected:
  ModelConfig cfg() const { return config(std::get<0>(GetParam()), std::get<1>(GetParam())); }
  // The model with a KV cache of its whole context, initialised (seed 3), and sampling options
  // that do not stop at end-of-document.
  std::unique_ptr<Model> cached_model(parallel::Comm& comm) const {
    auto model = std::make_unique<Model>(cfg(), ModelOptions{.kv_cache_tokens = cfg().max_positions}, comm);
    model->init_parameters(3);
    return model;
  }
  static GenerateOptions options(int64_t max_tokens) {
    GenerateOptions o;
    o.max_tokens = max_tokens;
    o.stop_at_eod = false;
    return o;
  }
};

TEST_P(Generate, CachedLogitsEqualTheFullForward) {
  auto comm = parallel::make_local_comm();
  ModelConfig cfg = this->cfg();
  Model model(cfg, ModelOptions{.micro_batch = 1, .kv_cache_tokens = cfg.max_positions}, *comm);
  model.init_parameters(11);
  std::vector<int32_t> tokens = random_tokens(cfg, cfg.seq_len, 5);
  const std::vector<float> want = to_host(model.forward_logits(kernels::host_tensor(tokens.data(), {1, cfg.seq_len})));
  const int64_t vpad = cfg.padded_vocab();

  KvCacheDecoder dec(model);
  for (int64_t t = 0; t < cfg.seq_len; ++t) {
    auto got = dec.append(std::span<const int32_t>(&tokens[size_t(t)], 1));
    ASSERT_EQ(static_cast<int64_t>(got.size()), vpad);
    EXPECT_LE(rel_diff(got.data(), &want[size_t(t * vpad)], cfg.vocab), 1e-5) << "position " << t;
  }
  // A prompt fed at once ends at the same logits.
  dec.reset();
  auto last = dec.append(tokens);
  EXPECT_LE(rel_diff(last.data(), &want[size_t((cfg.seq_len - 1) * vpad)], cfg.vocab), 1e-5);
}

TEST_P(Generate, PromptInChunksGivesEveryRowOfTheFullForward) {
  // Two sequences at once, fed in uneven chunks straight through Model::forward_cached: every
  // row of every chunk equals the full forward's.
  auto comm = parallel::make_local_comm();
  ModelConfig cfg = this->cfg();
  Model model(cfg, ModelOptions{.micro_batch = 2, .kv_cache_tokens = cfg.seq_len + 3}, *comm);
  model.init_parameters(12);
  const int64_t t = cfg.seq_len, vpad = cfg.padded_vocab();
  std::vector<int32_t> tokens = random_tokens(cfg, 2 * t, 6);
  const std::vector<float> want = to_host(model.forward_logits(kernels::host_tensor(tokens.data(), {2, t})));
  int64_t pos = 0;
  for (int64_t len : {5, 1, 11, 7}) {
    std::vector<int32_t> chunk;
    for (int64_t s = 0; s < 2; ++s)
      chunk.insert(chunk.end(), tokens.begin() + s * t + pos, tokens.begin() + s * t + pos + len);
    const std::vector<float> got = to_host(model.forward_cached(kernels::host_tensor(chunk.data(), {2, len}), pos));
    ASSERT_EQ(int64_t(got.size()), 2 * len * vpad);
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t i = 0; i < len; ++i)
        EXPECT_LE(rel_diff(&got[size_t((s * len + i) * vpad)], &want[size_t((s * t + pos + i) * vpad)], cfg.vocab),
                  1e-5)
            << "sequence " << s << " position " << pos + i;
    pos += len;
  }
  ASSERT_EQ(pos, t);
  // Past the cache: an Error, not a write out of bounds.
  std::vector<int32_t> more(2 * 4, 1);
  EXPECT_THROW(model.forward_cached(kernels::host_tensor(more.data(), {2, 4}), pos), Error);
}

TEST_P(Generate, APromptLongerThanTheTrainingSequenceIsFedInChunks) {
  // A model whose buffers hold 7 tokens decodes a 24-token prompt (the decoder splits it); its
  // logits equal those of the same weights run over the whole prompt at once.
  auto comm = parallel::make_local_comm();
  ModelConfig cfg = this->cfg();
  Model whole(cfg, ModelOptions{}, *comm);
  Model small(cfg, ModelOptions{.seq_len = 7, .kv_cache_tokens = cfg.max_positions}, *comm);
  whole.init_parameters(13);
  small.init_parameters(13);
  std::vector<int32_t> tokens = random_tokens(cfg, cfg.seq_len, 7);
  const std::vector<float> want = to_host(whole.forward_logits(kernels::host_tensor(tokens.data(), {1, cfg.seq_len})));
  KvCacheDecoder dec(small);
  auto last = dec.append(tokens);
  EXPECT_EQ(dec.position(), cfg.seq_len);
  EXPECT_LE(rel_diff(last.data(), &want[size_t((cfg.seq_len - 1) * cfg.padded_vocab())], cfg.vocab), 1e-5);
}

TEST_P(Generate, FixedSeedReproduces) {
  auto comm = parallel::make_local_comm();
  const ModelConfig cfg = this->cfg();
  const std::unique_ptr<Model> model = cached_model(*comm);
  std::vector<int32_t> prompt{1, 2, 3};
  GenerateOptions o = options(20);
  o.sampling.temperature = 1.0;
  auto run = [&](uint64_t seed) {
    KvCacheDecoder dec(*model);
    o.seed = seed;
    std::vector<int32_t> emitted;
    auto out = generate(dec, prompt, -1, o, [&](int32_t t) { emitted.push_back(t); });
    EXPECT_EQ(out, emitted);  // streamed as produced
    return out;
  };
  auto a = run(7), b = run(7), c = run(8);
  EXPECT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (int32_t t : a) EXPECT_LT(t, cfg.vocab);  // never a padding column
}

// A vocabulary padded past the tokenizer's ids (Qwen2.5's): only the allowed ids are sampled, at
// every temperature, greedy included, whatever the model's logits prefer.
TEST_P(Generate, SamplesOnlyTheAllowedIds) {
  auto comm = parallel::make_local_comm();
  const ModelConfig cfg = this->cfg();
  const std::unique_ptr<Model> model = cached_model(*comm);
  std::vector<int32_t> prompt{1, 2, 3};
  GenerateOptions o = options(25);
  for (double temperature : {0.0, 1.0, 5.0}) {
    // What the model picks unmasked: forbid every one of those, and keep a few others.
    o.sampling.temperature = temperature;
    o.allowed.clear();
    KvCacheDecoder free_run(*model);
    const std::vector<int32_t> unmasked = generate(free_run, prompt, -1, o, [](int32_t) {});
    o.allowed.assign(size_t(cfg.vocab), false);
    int allowed = 0;
    for (int32_t id = cfg.vocab - 1; id >= 0 && allowed < 3; --id)
      if (std::find(unmasked.begin(), unmasked.end(), id) == unmasked.end()) o.allowed[size_t(id)] = true, ++allowed;
    ASSERT_EQ(allowed, 3);
    KvCacheDecoder dec(*model);
    const std::vector<int32_t> out = generate(dec, prompt, -1, o, [](int32_t) {});
    EXPECT_EQ(out.size(), 25u);
    for (int32_t id : out) EXPECT_TRUE(o.allowed[size_t(id)]) << "temperature " << temperature << ": id " << id;
  }
}

TEST_P(Generate, StopsAtTheContextLimit) {
  auto comm = parallel::make_local_comm();
  ModelConfig cfg = this->cfg();
  Model model(cfg, ModelOptions{.kv_cache_tokens = 8}, *comm);
  model.init_parameters(3);
  KvCacheDecoder dec(model);
  GenerateOptions o;
  o.max_tokens = 100;
  o.stop_at_eod = false;
  std::vector<int32_t> prompt{1, 2, 3};
  auto out = generate(dec, prompt, -1, o, [](int32_t) {});
  EXPECT_EQ(out.size(), 6u);  // 3 prompt tokens + 5 fed back = 8 positions; the last sample needs no slot
  EXPECT_THROW(dec.append(prompt), Error);
}

INSTANTIATE_TEST_SUITE_P(Families, Generate,
                         ::testing::Combine(::testing::Values(ModelFamily::gpt2, ModelFamily::llama),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == ModelFamily::gpt2 ? "gpt2" : "llama") +
                                  (std::get<1>(info.param) ? "_tied" : "_untied");
                         });

}  // namespace
