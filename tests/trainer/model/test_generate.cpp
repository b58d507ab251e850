// Generation: the KV-cached decoder's logits equal the full forward's at every position (both
// families, grouped-query attention), and a fixed seed reproduces a generation.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "parallel/comm.h"
#include "trainer/model/generate.h"
#include "trainer/model/model.h"

using namespace llmtrain;
using namespace llmtrain;
using namespace llmtrain::trainer;

namespace {

ModelConfig config(ModelFamily family) {
  ModelConfig m;
  m.family = family;
  m.layers = 2, m.hidden = 48, m.heads = 6, m.seq_len = 24, m.max_positions = 32;
  m.kv_heads = family == ModelFamily::llama ? 2 : 6;
  m.ffn_hidden = 80, m.vocab = 90, m.vocab_pad = 64, m.init_std = 0.2;
  m.tie_embeddings = family == ModelFamily::gpt2;
  return m;
}

double rel_diff(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) num += double(a[i] - b[i]) * (a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / den);
}

class Generate : public ::testing::TestWithParam<ModelFamily> {};

TEST_P(Generate, CachedLogitsEqualTheFullForward) {
  auto comm = parallel::make_local_comm();
  ModelConfig cfg = config(GetParam());
  ModelOptions opts;
  opts.micro_batch = 1;
  Model model(cfg, opts, *comm);
  model.init_parameters(11);
  std::mt19937 rng(5);
  std::vector<int32_t> tokens(cfg.seq_len);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % cfg.vocab);
  kernels::Tensor full = model.forward_logits(kernels::Tensor(tokens.data(), kernels::DType::int32, {1, cfg.seq_len}));
  const int64_t vpad = cfg.padded_vocab();
  std::vector<float> want(full.ptr<float>(), full.ptr<float>() + cfg.seq_len * vpad);

  KvCacheDecoder dec(model, cfg.max_positions);
  for (int64_t t = 0; t < cfg.seq_len; ++t) {
    auto got = dec.append(std::span<const int32_t>(&tokens[t], 1));
    ASSERT_EQ(static_cast<int64_t>(got.size()), vpad);
    EXPECT_LE(rel_diff(got.data(), &want[t * vpad], cfg.vocab), 1e-5) << "position " << t;
  }
  // A prompt fed at once ends at the same logits.
  dec.reset();
  auto last = dec.append(tokens);
  EXPECT_LE(rel_diff(last.data(), &want[(cfg.seq_len - 1) * vpad], cfg.vocab), 1e-5);
}

TEST_P(Generate, FixedSeedReproduces) {
  auto comm = parallel::make_local_comm();
  ModelConfig cfg = config(GetParam());
  Model model(cfg, {}, *comm);
  model.init_parameters(3);
  std::vector<int32_t> prompt{1, 2, 3};
  GenerateOptions o;
  o.max_tokens = 20;
  o.sampling.temperature = 1.0;
  o.stop_at_eod = false;
  auto run = [&](uint64_t seed) {
    KvCacheDecoder dec(model, cfg.max_positions);
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

TEST_P(Generate, StopsAtTheContextLimit) {
  auto comm = parallel::make_local_comm();
  ModelConfig cfg = config(GetParam());
  Model model(cfg, {}, *comm);
  model.init_parameters(3);
  KvCacheDecoder dec(model, 8);
  GenerateOptions o;
  o.max_tokens = 100;
  o.stop_at_eod = false;
  std::vector<int32_t> prompt{1, 2, 3};
  auto out = generate(dec, prompt, -1, o, [](int32_t) {});
  EXPECT_EQ(out.size(), 6u);  // 3 prompt tokens + 5 fed back = 8 positions; the last sample needs no slot
}

INSTANTIATE_TEST_SUITE_P(Families, Generate, ::testing::Values(ModelFamily::gpt2, ModelFamily::llama),
                         [](const auto& info) { return info.param == ModelFamily::gpt2 ? "gpt2" : "llama"; });

}  // namespace
