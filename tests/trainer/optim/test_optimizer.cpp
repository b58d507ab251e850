// AdamW over flat-buffer ranges (trainer/optim/optimizer.h): decay ranges follow the ParamSpecs, a
// range split into shards updates exactly like the whole (ZeRO relies on it), clipping factor and
// the gradient norm's counting rules. The update arithmetic itself is checked against PyTorch by
// the parity tests and against a double reference in tests/kernels/test_adamw.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/ops.h"
#include "parallel/comm/comm.h"
#include "trainer/model/model.h"
#include "trainer/optim/optimizer.h"

namespace llmtrain::trainer {

namespace {
ModelConfig gpt2_small() {
  ModelConfig m;
  m.family = ModelFamily::gpt2;
  m.layers = 2, m.hidden = 16, m.heads = 2, m.kv_heads = 2, m.ffn_hidden = 64, m.vocab = 50, m.vocab_pad = 16;
  m.seq_len = 8, m.max_positions = 8;
  return m;
}
}  // namespace

TEST(Optimizer, DecayRangesFollowTheSpecs) {
  auto tp = parallel::make_local_comm("tp");
  Model model(gpt2_small(), ModelOptions{}, *tp);
  const auto ranges = decay_ranges(model.parameters());
  ASSERT_FALSE(ranges.empty());
  EXPECT_EQ(ranges.front().begin, 0);
  EXPECT_EQ(ranges.back().end, model.numel());
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_EQ(ranges[i].begin, ranges[i - 1].end);
    EXPECT_NE(ranges[i].decay, ranges[i - 1].decay) << "adjacent ranges with one setting are merged";
  }
  for (const ModelParam& p : model.parameters())
    for (const DecayRange& r : ranges)
      if (p.offset >= r.begin && p.offset < r.end) {
        EXPECT_EQ(r.decay, p.spec.weight_decay) << p.spec.name;
      }
}

TEST(Optimizer, ShardedUpdateEqualsTheWhole) {
  auto tp = parallel::make_local_comm("tp");
  Model model(gpt2_small(), ModelOptions{}, *tp);
  const int64_t n = model.numel();
  std::vector<float> p(n), g(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto& x : p) x = nd(rng);
  std::vector<float> q = p;
  OptimizerConfig cfg;
  cfg.weight_decay = 0.1;
  const auto ranges = decay_ranges(model.parameters());
  AdamW whole(cfg, ranges, {{0, n}});
  // Shard boundaries that cut through parameters and decay ranges; s1 owns two ranges (ZeRO: one
  // chunk of each parameter group), its moments compact.
  const int64_t cut1 = n / 3 + 1, cut2 = 2 * n / 3 - 5, cut3 = n - 7;
  AdamW s0(cfg, ranges, {{0, cut1}}), s1(cfg, ranges, {{cut1, cut2}, {cut3, n}}), s2(cfg, ranges, {{cut2, cut3}});
  EXPECT_EQ(s1.owned_numel(), cut2 - cut1 + n - cut3);
  EXPECT_EQ(s1.state_offset(cut3), cut2 - cut1);
  EXPECT_EQ(s1.state_offset(cut2), -1);
  for (int step = 0; step < 4; ++step) {
    for (auto& x : g) x = nd(rng);
    whole.step(kernels::host_tensor(p.data(), {n}), kernels::host_tensor(g.data(), {n}), 1e-2, 0.8f);
    for (AdamW* s : {&s0, &s1, &s2})
      s->step(kernels::host_tensor(q.data(), {n}), kernels::host_tensor(g.data(), {n}), 1e-2, 0.8f);
  }
  EXPECT_EQ(p, q);
  EXPECT_EQ(whole.steps(), 4);
}

// optimizer.state_dtype bf16: the moments are bf16 arrays of half the bytes; fp32 state written in
// (a checkpoint of fp32 moments) is rounded to nearest even, and read back out widened exactly (a
// checkpoint holds fp32), so bf16 → fp32 → bf16 is the identity.
TEST(Optimizer, Bf16StateConvertsOnTheWayInAndOut) {
  OptimizerConfig cfg;
  cfg.state_dtype = StateDtype::bf16;
  const int64_t n = 1000;
  AdamW adamw(cfg, {{0, n, true}}, {{0, n}});
  EXPECT_EQ(adamw.state_dtype(), kernels::DType::bf16);
  EXPECT_EQ(adamw.exp_avg().dtype, kernels::DType::bf16);
  EXPECT_EQ(adamw.exp_avg_sq().bytes(), size_t(n) * 2);
  std::vector<float> in(n), out(n), again(n);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (auto& x : in) x = nd(rng);
  in[0] = 1.0f + 1.5f / 128.0f;  // halfway between bf16 neighbours 1 + 1/128 and 1 + 2/128: to the even one
  adamw.write_state(AdamW::State::exp_avg, 0, kernels::host_tensor(in.data(), {n}));
  adamw.read_state(AdamW::State::exp_avg, 0, kernels::host_tensor(out.data(), {n}));
  EXPECT_EQ(out[0], 1.0f + 2.0f / 128.0f);
  for (int64_t i = 0; i < n; ++i) ASSERT_LE(std::abs(out[i] - in[i]), std::abs(in[i]) / 256.0f) << i;
  adamw.write_state(AdamW::State::exp_avg, 0, kernels::host_tensor(out.data(), {n}));
  adamw.read_state(AdamW::State::exp_avg, 0, kernels::host_tensor(again.data(), {n}));
  EXPECT_EQ(again, out);
}

// optimizer.master false: the tied embedding's copy on the last pipeline stage sits at another
// flat offset than the first stage's embedding; rounding indices by parameter name keep the two
// copies bitwise equal through stochastically rounded updates (by flat offset they drift apart).
TEST(Optimizer, WithoutAMasterEveryCopyOfATiedEmbeddingRoundsAlike) {
  ModelConfig m = gpt2_small();
  m.tie_embeddings = true;
  auto tp = parallel::make_local_comm("tp");
  const ModelOptions bf16{.dtype = kernels::DType::bf16};
  ModelOptions first_options = bf16, last_options = bf16;
  first_options.stage = pipeline_stage_layout(m, 0, 2);
  last_options.stage = pipeline_stage_layout(m, 1, 2);
  Model first(m, first_options, *tp), last(m, last_options, *tp);
  auto embedding = [](const Model& model) {
    for (const ModelParam& p : model.parameters())
      if (p.spec.role == ParamRole::token_embedding) return p;
    ADD_FAILURE() << "no token embedding";
    return model.parameters()[0];
  };
  const ModelParam a = embedding(first), b = embedding(last);
  ASSERT_TRUE(b.tied_copy);
  ASSERT_NE(a.offset, b.offset) << "the test needs the copies at different flat offsets";
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  std::vector<float> values(size_t(a.numel())), grads(size_t(a.numel()));
  auto bits = [](const ModelParam& p) {
    const uint16_t* v = static_cast<const uint16_t*>(p.value.data);
    return std::vector<uint16_t>(v, v + p.numel());
  };
  for (const bool by_name : {true, false}) {
    for (auto& x : values) x = 0.02f * nd(rng);
    for (const ModelParam* p : {&a, &b})
      kernels::convert(p->value.flat(0, a.numel()), kernels::host_tensor(values.data(), {a.numel()}));
    OptimizerConfig cfg;
    cfg.master = false;
    AdamW on_first(cfg, decay_ranges(first.parameters()), {{0, first.numel()}}, kernels::DType::bf16);
    AdamW on_last(cfg, decay_ranges(last.parameters()), {{0, last.numel()}}, kernels::DType::bf16);
    EXPECT_FALSE(on_first.has_master());
    on_first.set_rounding(7, by_name ? rounding_ranges(first.parameters()) : std::vector<RoundingRange>{});
    on_last.set_rounding(7, by_name ? rounding_ranges(last.parameters()) : std::vector<RoundingRange>{});
    for (int step = 0; step < 3; ++step) {
      for (auto& x : grads) x = nd(rng);
      for (const ModelParam* p : {&a, &b})
        kernels::convert(p->grad.flat(0, a.numel()), kernels::host_tensor(grads.data(), {a.numel()}));
      on_first.step(first.params(), first.grads(), 1e-3, 1.0f);
      on_last.step(last.params(), last.grads(), 1e-3, 1.0f);
    }
    if (by_name)
      EXPECT_EQ(bits(a), bits(b)) << "the tied copies rounded apart";
    else
      EXPECT_NE(bits(a), bits(b)) << "by flat offset the copies should round apart: the test cannot fail";
  }
}

TEST(Optimizer, WeightDecayOnlyWhereTheSpecSaysSo) {
  auto tp = parallel::make_local_comm("tp");
  Model model(gpt2_small(), ModelOptions{}, *tp);
  model.init_parameters(1);
  std::vector<float> before(model.params().ptr<float>(), model.params().ptr<float>() + model.numel());
  OptimizerConfig cfg;
  cfg.weight_decay = 0.5;
  AdamW adamw(cfg, decay_ranges(model.parameters()), {{0, model.numel()}});
  // Zero gradients: Adam's step is 0, only decoupled decay moves weights: p · (1 - lr·wd).
  adamw.step(model.params(), model.grads(), 0.1, 1.0f);
  for (const ModelParam& p : model.parameters()) {
    const float factor = p.spec.weight_decay ? 1.0f - 0.1f * 0.5f : 1.0f;
    for (int64_t i = 0; i < p.numel(); ++i)
      ASSERT_EQ(p.value.ptr<float>()[i], before[size_t(p.offset + i)] * factor) << p.spec.name;
  }
}

TEST(Optimizer, ClipFactorIsPyTorchs) {
  EXPECT_EQ(clip_factor(0.5, 1.0), 1.0f);
  EXPECT_FLOAT_EQ(clip_factor(4.0, 1.0), float(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(clip_factor(100.0, 0.0), 1.0f);  // max_norm 0: no clipping
}

TEST(Optimizer, GradNormCountsEachElementOnce) {
  ModelConfig m = gpt2_small();
  m.tie_embeddings = true;
  auto tp = parallel::make_local_comm("tp");
  Model last(m, ModelOptions{.stage = pipeline_stage_layout(m, 1, 2)}, *tp);
  for (const ModelParam& p : last.parameters())
    for (int64_t i = 0; i < p.numel(); ++i) p.grad.ptr<float>()[i] = 1.0f;
  int64_t counted = 0, split = 0;
  for (const ModelParam& p : last.parameters()) {
    if (!p.tied_copy) counted += p.numel();
    if (!p.tied_copy && p.spec.tp_split_dim >= 0) split += p.numel();
  }
  EXPECT_EQ(grad_sum_squares(last.parameters(), 0), double(counted)) << "the tied copy is not counted";
  EXPECT_EQ(grad_sum_squares(last.parameters(), 1), double(split))
      << "tp ranks > 0 skip parameters every tp rank holds";
}

}  // namespace llmtrain::trainer
