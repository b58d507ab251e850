// The Model's structural properties (its numerics are checked against PyTorch by the parity
// tests): activation checkpointing changes no gradient, pipeline stages compose to the whole
// model, activation slots keep micro-batches apart, every tensor-parallel shard initializes to
// its slice of the whole parameter, initialization statistics, user errors, a warm step
// allocates nothing, the memory plan equals what a model allocates, and a model with external
// gradient storage (ZeRO 2) writes into what its hook hands out the gradients of the flat buffer.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>

#include "common/error.h"
#include "kernels/ops.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/comm_threads.h"
#include "tests/common/count_allocations.h"
#include "trainer/model/model.h"

namespace llmtrain::trainer {
namespace {

ModelConfig small(ModelFamily family, bool tied) {
  ModelConfig m;
  m.family = family;
  m.layers = 4, m.hidden = 32, m.heads = 4, m.kv_heads = family == ModelFamily::llama ? 2 : 4;
  m.ffn_hidden = family == ModelFamily::llama ? 96 : 128;
  m.vocab = 70, m.vocab_pad = 32, m.seq_len = 11, m.max_positions = 16, m.init_std = 0.1;
  m.tie_embeddings = tied;
  return m;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
  int b, t;
  Batch(const ModelConfig& m, int b, int t, uint64_t seed) : b(b), t(t) {
    std::mt19937 rng{uint32_t(seed)};
    std::uniform_int_distribution<int32_t> tok(0, m.vocab - 1);
    for (int i = 0; i < b * t; ++i) {
      tokens.push_back(tok(rng));
      targets.push_back(i % 7 == 3 ? kIgnoreIndex : tok(rng));
    }
  }
  MicroBatch mb() {
    return {kernels::host_tensor(tokens.data(), {b, t}), kernels::host_tensor(targets.data(), {b, t})};
  }
};

std::vector<float> copy(kernels::Tensor t) { return std::vector<float>(t.ptr<float>(), t.ptr<float>() + t.numel()); }

// A stage's loss tensor, copied to the host the way a training loop does it.
float host_loss(const Model& m, int slot) {
  float v = 0;
  kernels::copy(kernels::host_tensor(&v, {1}), m.loss(slot));
  return v;
}

class ModelTest : public ::testing::TestWithParam<ModelFamily> {};

TEST_P(ModelTest, ActivationCheckpointingGivesIdenticalGradients) {
  const ModelConfig m = small(GetParam(), true);
  auto tp = parallel::make_local_comm("tp");
  ModelOptions plain{.micro_batch = 3};
  Model a(m, plain, *tp);
  a.init_parameters(7);
  Batch x(m, 3, 11, 1), y(m, 2, 9, 2);  // a full and a smaller micro-batch
  std::vector<float> want;
  for (Batch* batch : {&x, &y}) want.push_back(a.forward_backward(batch->mb(), 0.5f));
  for (ActivationCheckpointing mode : {ActivationCheckpointing::selective, ActivationCheckpointing::full}) {
    SCOPED_TRACE(to_string(mode));
    Model b(m, ModelOptions{.micro_batch = 3, .checkpointing = mode}, *tp);
    b.init_parameters(7);
    EXPECT_LT(b.activation_bytes(), a.activation_bytes());
    EXPECT_EQ(want[0], b.forward_backward(x.mb(), 0.5f));
    EXPECT_EQ(want[1], b.forward_backward(y.mb(), 0.5f));
    ASSERT_EQ(a.numel(), b.numel());
    EXPECT_EQ(0, std::memcmp(a.grads().data, b.grads().data, a.grads().bytes())) << "gradients differ";
  }
}

// 16-bit storage (kernels/ops.h "Precision"): the same model with bf16 or fp16 parameters,
// activations and gradients computes the fp32 model's loss and gradients within the 16-bit
// rounding of the values it stores, in every recomputation mode (which stay bitwise equal to each
// other, as in fp32).
TEST_P(ModelTest, SixteenBitStorageComputesTheFp32Numbers) {
  const ModelConfig m = small(GetParam(), true);
  auto tp = parallel::make_local_comm("tp");
  Model a(m, ModelOptions{.micro_batch = 3}, *tp);
  a.init_parameters(7);
  Batch x(m, 3, 11, 1);
  const float want = a.forward_backward(x.mb(), 1.0f);
  const std::vector<float> want_grads = copy(a.grads());
  // Tolerances: about 8 (bf16) and 1 (fp16) units of the last place of the stored values, over a
  // model whose every op rounds its output once.
  for (auto [dtype, loss_tol, grad_tol] :
       {std::tuple{kernels::DType::bf16, 1e-2, 6e-2}, std::tuple{kernels::DType::fp16, 2e-3, 1e-2}}) {
    SCOPED_TRACE(kernels::to_string(dtype));
    std::vector<float> first_grads;
    float first_loss = 0;
    for (ActivationCheckpointing mode :
         {ActivationCheckpointing::none, ActivationCheckpointing::selective, ActivationCheckpointing::full}) {
      Model b(m, ModelOptions{.micro_batch = 3, .checkpointing = mode, .dtype = dtype}, *tp);
      b.init_parameters(7);
      ASSERT_EQ(b.params().dtype, dtype);
      const float got = b.forward_backward(x.mb(), 1.0f);
      std::vector<float> grads(want_grads.size());
      kernels::convert(kernels::host_tensor(grads.data(), {int64_t(grads.size())}), b.grads());
      if (mode == ActivationCheckpointing::none) {
        EXPECT_NEAR(got, want, loss_tol * want);
        double num = 0, den = 0;
        for (size_t i = 0; i < grads.size(); ++i)
          num += double(grads[i] - want_grads[i]) * (grads[i] - want_grads[i]),
              den += double(want_grads[i]) * want_grads[i];
        EXPECT_LE(std::sqrt(num / den), grad_tol) << "gradients, ‖a − b‖ / ‖b‖";
        first_loss = got, first_grads = grads;
      } else {
        SCOPED_TRACE(to_string(mode));
        EXPECT_EQ(got, first_loss);
        EXPECT_EQ(grads, first_grads);
      }
    }
  }
}

// Selective recomputation frees, in every layer of every slot, exactly the element-wise results
// (the two norm outputs and statistics, the MLP activation), and holds one shared set of them:
// measured on constructed models, and the plan says the same.
TEST_P(ModelTest, SelectiveRecomputationSavesTheElementwiseBytes) {
  const ModelConfig m = small(GetParam(), false);
  const bool llama = GetParam() == ModelFamily::llama;
  const int slots = 2;
  const int64_t n = 2 * 11, d = m.hidden;
  auto padded = [](int64_t floats) { return (floats + 15) / 16 * 16 * 4; };  // the arena's 64-byte rounding
  const int64_t per_layer = 2 * (padded(n * d) + (llama ? 1 : 2) * padded(n)) + padded(n * m.ffn_hidden);
  auto tp = parallel::make_local_comm("tp");
  Model none(m, ModelOptions{.micro_batch = 2, .activation_slots = slots}, *tp);
  Model sel(
      m, ModelOptions{.micro_batch = 2, .checkpointing = ActivationCheckpointing::selective, .activation_slots = slots},
      *tp);
  EXPECT_EQ(int64_t(none.activation_bytes()) - int64_t(sel.activation_bytes()),
            (int64_t(slots) * m.layers - 1) * per_layer);
  const ModelMemory a = model_memory_plan(m, ModelOptions{.micro_batch = 2, .activation_slots = slots}, 1, 0);
  const ModelMemory b = model_memory_plan(
      m, ModelOptions{.micro_batch = 2, .checkpointing = ActivationCheckpointing::selective, .activation_slots = slots},
      1, 0);
  EXPECT_EQ(a.activations_kept - b.activations_kept, int64_t(slots) * m.layers * per_layer);
  EXPECT_EQ(b.activations_work - a.activations_work, per_layer);
  EXPECT_EQ(b.activations(), int64_t(sel.activation_bytes()));
}

TEST_P(ModelTest, PipelineStagesComposeToTheWholeModel) {
  const ModelConfig m = small(GetParam(), true);
  auto tp = parallel::make_local_comm("tp");
  Model whole(m, ModelOptions{.micro_batch = 2}, *tp);
  Model first(m, ModelOptions{.stage = pipeline_stage_layout(m, 0, 2), .micro_batch = 2}, *tp);
  Model last(m, ModelOptions{.stage = pipeline_stage_layout(m, 1, 2), .micro_batch = 2}, *tp);
  for (Model* model : {&whole, &first, &last}) model->init_parameters(11);
  EXPECT_EQ(first.numel() + last.numel(), whole.numel() + whole.parameters().front().numel())
      << "the last stage holds a copy of the tied embedding";
  EXPECT_TRUE(last.parameters().back().tied_copy);

  Batch x(m, 2, 11, 3);
  const float want = whole.forward_backward(x.mb(), 1.0f);
  first.stage_forward(0, x.mb(), kernels::Tensor{});
  last.stage_forward(0, x.mb(), first.stage_output(0));
  const float got = host_loss(last, 0);
  EXPECT_EQ(got, want);
  last.stage_backward(0, kernels::Tensor{}, 1.0f);
  first.stage_backward(0, last.stage_input_grad(), 1.0f);

  for (const ModelParam& p : whole.parameters()) {
    std::vector<float> g = copy(p.grad);
    std::vector<float> sum(g.size(), 0.0f);
    for (Model* stage : {&first, &last})
      for (const ModelParam& q : stage->parameters())
        if (q.spec.name == p.spec.name)
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += q.grad.ptr<float>()[i];
    double num = 0, den = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      num += (sum[i] - g[i]) * (sum[i] - g[i]);
      den += double(g[i]) * g[i];
    }
    EXPECT_LE(std::sqrt(num), 1e-6 * std::sqrt(den) + 1e-12) << p.spec.name;
  }
}

TEST_P(ModelTest, ActivationSlotsKeepMicroBatchesApart) {
  // Two micro-batches in flight (as a pipeline schedule runs them), backward in reverse order,
  // accumulate the same gradients as running them one after the other; with selective
  // recomputation too (the slots share the recomputed element-wise buffers).
  const ModelConfig m = small(GetParam(), false);
  auto tp = parallel::make_local_comm("tp");
  for (ActivationCheckpointing mode : {ActivationCheckpointing::none, ActivationCheckpointing::selective}) {
    SCOPED_TRACE(to_string(mode));
    Model seq(m, ModelOptions{.micro_batch = 2}, *tp);
    Model slots(m, ModelOptions{.micro_batch = 2, .checkpointing = mode, .activation_slots = 2}, *tp);
    seq.init_parameters(5);
    slots.init_parameters(5);
    Batch x(m, 2, 11, 4), y(m, 2, 11, 5);
    const float lx = seq.forward_backward(x.mb(), 0.5f), ly = seq.forward_backward(y.mb(), 0.5f);
    slots.stage_forward(0, x.mb(), kernels::Tensor{});
    slots.stage_forward(1, y.mb(), kernels::Tensor{});
    EXPECT_EQ(host_loss(slots, 0), lx);
    EXPECT_EQ(host_loss(slots, 1), ly);
    slots.stage_backward(1, kernels::Tensor{}, 0.5f);
    slots.stage_backward(0, kernels::Tensor{}, 0.5f);
    const std::vector<float> a = copy(seq.grads()), b = copy(slots.grads());
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += double(a[i] - b[i]) * (a[i] - b[i]);
      den += double(a[i]) * a[i];
    }
    EXPECT_LE(std::sqrt(num / den), 1e-6);
  }
}

TEST_P(ModelTest, TensorParallelShardsInitializeToSlicesOfTheWhole) {
  // Every parameter of a tp = 2 shard (column-, row- and vocab-parallel splits, GPT-2's [3, d, d]
  // c_attn included) equals its slice of the unsharded parameter.
  const ModelConfig m = small(GetParam(), false);
  auto one = parallel::make_local_comm("tp");
  Model whole(m, ModelOptions{}, *one);
  whole.init_parameters(99);
  parallel::run_ranks_in_threads(2, [&](parallel::Comm& tp) {
    Model shard(m, ModelOptions{}, tp);
    shard.init_parameters(99);
    for (const ModelParam& p : shard.parameters()) {
      const ModelParam& w = whole.parameter(p.spec.name);
      if (p.spec.tp_split_dim >= 0) {
        EXPECT_EQ(p.numel() * 2, w.numel()) << p.spec.name;
      }
      const float* local = p.value.ptr<float>();
      const float* global = w.value.ptr<float>();
      int64_t checked = 0;
      for_each_shard_run(p, [&](int64_t l, int64_t g, int64_t count) {
        for (int64_t i = 0; i < count; ++i)
          ASSERT_EQ(local[l + i], global[g + i]) << p.spec.name << " element " << l + i << " on rank " << tp.rank();
        checked += count;
      });
      EXPECT_EQ(checked, p.numel());
    }
  });
}

TEST_P(ModelTest, InitializationFollowsGpt2AndMegatron) {
  ModelConfig m = small(GetParam(), false);
  m.hidden = 64, m.ffn_hidden = 256, m.init_std = 0.02;
  auto tp = parallel::make_local_comm("tp");
  Model model(m, ModelOptions{}, *tp);
  model.init_parameters(1);
  for (const ModelParam& p : model.parameters()) {
    const float* v = p.value.ptr<float>();
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < p.numel(); ++i) {
      sum += v[i];
      sq += double(v[i]) * v[i];
    }
    const double mean = sum / double(p.numel()), std = std::sqrt(sq / double(p.numel()) - mean * mean);
    switch (p.spec.init) {
      case ParamInit::zeros:
        EXPECT_EQ(sq, 0.0) << p.spec.name;
        break;
      case ParamInit::ones:
        EXPECT_EQ(sum, double(p.numel())) << p.spec.name;
        EXPECT_EQ(std, 0.0) << p.spec.name;
        break;
      case ParamInit::normal:
      case ParamInit::normal_residual: {
        const double want = p.spec.init == ParamInit::normal ? 0.02 : 0.02 / std::sqrt(2.0 * m.layers);
        // 4096+ samples: the sample std is within a few percent, the mean within a few std/√n.
        EXPECT_NEAR(std, want, 0.06 * want) << p.spec.name;
        EXPECT_NEAR(mean, 0.0, 5 * want / std::sqrt(double(p.numel()))) << p.spec.name;
        break;
      }
    }
  }
  // Different seeds, different weights; the same seed, the same weights.
  Model again(m, ModelOptions{}, *tp), other(m, ModelOptions{}, *tp);
  again.init_parameters(1);
  other.init_parameters(2);
  EXPECT_EQ(copy(again.params()), copy(model.params()));
  EXPECT_NE(copy(other.params()), copy(model.params()));
}

TEST_P(ModelTest, RejectsTokensOutsideTheVocabulary) {
  // Token ids are validated where they are read: the data loader and the tokenizer refuse bad
  // ones with an Error (tests/trainer/data); inside the model an id outside the vocabulary is a
  // broken invariant that the embedding and cross-entropy kernels stop at, naming it.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const ModelConfig m = small(GetParam(), true);
  auto tp = parallel::make_local_comm("tp");
  Model model(m, ModelOptions{.micro_batch = 2}, *tp);
  Batch x(m, 2, 11, 6);
  x.tokens[5] = m.vocab;  // a padding row: never a real token
  EXPECT_DEATH(model.forward_backward(x.mb(), 1.0f), "token id 70 at position 5 is outside the vocabulary");
  Batch y(m, 2, 11, 6);
  y.targets[7] = m.vocab + 1;
  EXPECT_DEATH(model.forward_loss(y.mb()), "target 71 at position 7 is outside the vocabulary");
  Batch big(m, 3, 11, 7);  // more sequences than the buffers hold
  EXPECT_THROW(model.forward_loss(big.mb()), Error);
}

TEST_P(ModelTest, AStepAllocatesNothingOnceWarm) {
  const ModelConfig m = small(GetParam(), false);
  auto tp = parallel::make_local_comm("tp");
  Model model(m, ModelOptions{.micro_batch = 2, .checkpointing = ActivationCheckpointing::full}, *tp);
  model.init_parameters(3);
  Batch x(m, 2, 11, 8);
  model.zero_grads();
  model.forward_backward(x.mb(), 1.0f);  // warm: per-thread scratch reaches its high-water mark
  g_allocations = 0;
  g_counting = true;
  model.zero_grads();
  model.forward_backward(x.mb(), 1.0f);
  model.forward_loss(x.mb());
  model.forward_logits(x.mb().tokens);
  g_counting = false;

  EXPECT_EQ(g_allocations.load(), 0);
}

// external_grads: no gradient buffer; backward asks the hook for each group's storage before it
// writes the group (a tied embedding's before the head's) and accumulates there exactly what the
// flat buffer of a plain model accumulates.
TEST_P(ModelTest, ExternalGradientStorageGetsTheFlatBuffersGradients) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const ModelConfig m = small(GetParam(), tied);
    auto tp = parallel::make_local_comm("tp");
    Model plain(m, ModelOptions{.micro_batch = 2}, *tp);
    Model ext(m, ModelOptions{.micro_batch = 2, .external_grads = true}, *tp);
    EXPECT_FALSE(ext.grads().defined());
    EXPECT_EQ(model_memory_plan(m, ModelOptions{.micro_batch = 2, .external_grads = true}, 1, 0).grads, 0);
    plain.init_parameters(3);
    ext.init_parameters(3);
    plain.zero_grads();
    std::vector<float> store(size_t(ext.numel()), 0.0f);
    std::vector<std::string> calls;
    ext.set_grad_storage_hook([&](ParamPlace place, int layer) {
      int64_t begin = ext.numel(), end = 0;
      for (const ModelParam& p : ext.parameters())
        if (p.spec.place == place && (place != ParamPlace::block || p.spec.layer == layer))
          begin = std::min(begin, p.offset), end = std::max(end, p.offset + p.numel());
      calls.push_back(std::to_string(int(place)) + ":" + std::to_string(layer));
      return kernels::host_tensor(store.data() + begin, {end - begin});
    });
    Batch x(m, 2, 11, 1), y(m, 2, 9, 2);
    for (Batch* batch : {&x, &y})
      EXPECT_EQ(plain.forward_backward(batch->mb(), 0.5f), ext.forward_backward(batch->mb(), 0.5f));
    EXPECT_EQ(0, std::memcmp(store.data(), plain.grads().data, plain.grads().bytes())) << "gradients differ";
    const std::string emb = std::to_string(int(ParamPlace::embedding)) + ":-1",
                      head = std::to_string(int(ParamPlace::head)) + ":-1";
    ASSERT_EQ(calls.size(), size_t(2 * (m.layers + 2)));
    EXPECT_EQ(calls[0], tied ? emb : head);
    EXPECT_EQ(calls[1], tied ? head : std::to_string(int(ParamPlace::block)) + ":" + std::to_string(m.layers - 1));
  }
}

// external_params: no parameter buffer; init_parameters writes the param shard, and forward,
// backward and recomputation read each group's values from the hook's storage only between its
// get and its release (released storage is poisoned here), in the documented order, computing
// exactly what a plain model computes.
TEST_P(ModelTest, ExternalParameterStorageIsReadOnlyWhileHeld) {
  using AC = ActivationCheckpointing;
  for (auto [tied, c] : {std::pair{true, AC::none}, std::pair{false, AC::none}, std::pair{true, AC::full},
                         std::pair{false, AC::selective}}) {
    SCOPED_TRACE(::testing::Message() << (tied ? "tied" : "untied") << ", recomputation " << to_string(c));
    const ModelConfig m = small(GetParam(), tied);
    auto tp = parallel::make_local_comm("tp");
    Model plain(m, ModelOptions{.micro_batch = 2, .checkpointing = c}, *tp);
    const ModelOptions eo{.micro_batch = 2, .checkpointing = c, .external_params = true};
    Model ext(m, eo, *tp);
    EXPECT_FALSE(ext.params().defined());
    EXPECT_EQ(model_memory_plan(m, eo, 1, 0).params, 0);
    std::vector<float> shard(size_t(ext.numel())), held(size_t(ext.numel()), NAN);
    ext.set_param_shard({{0, ext.numel()}}, kernels::host_tensor(shard.data(), {ext.numel()}));
    plain.init_parameters(3);
    ext.init_parameters(3);
    ASSERT_EQ(0, std::memcmp(shard.data(), plain.params().data, plain.params().bytes())) << "init differs";
    auto range = [&](ParamPlace place, int layer) {
      int64_t begin = ext.numel(), end = 0;
      for (const ModelParam& p : ext.parameters())
        if (p.spec.place == place && (place != ParamPlace::block || p.spec.layer == layer))
          begin = std::min(begin, p.offset), end = std::max(end, p.offset + p.numel());
      return std::pair{begin, end};
    };
    std::vector<std::string> calls;
    auto name = [](ParamPlace place, int layer) { return std::to_string(int(place)) + ":" + std::to_string(layer); };
    ext.set_param_storage_hook(
        [&](ParamPlace place, int layer, bool backward) {
          const auto [b, e] = range(place, layer);
          std::copy(shard.begin() + b, shard.begin() + e, held.begin() + b);
          calls.push_back((backward ? "B" : "F") + name(place, layer));
          return kernels::host_tensor(held.data() + b, {e - b});
        },
        [&](ParamPlace place, int layer) {
          const auto [b, e] = range(place, layer);
          std::fill(held.begin() + b, held.begin() + e, NAN);
          calls.push_back("-" + name(place, layer));
        });
    plain.zero_grads();
    ext.zero_grads();
    Batch x(m, 2, 11, 1), y(m, 2, 9, 2);
    for (Batch* batch : {&x, &y})
      EXPECT_EQ(plain.forward_backward(batch->mb(), 0.5f), ext.forward_backward(batch->mb(), 0.5f));
    EXPECT_EQ(0, std::memcmp(ext.grads().data, plain.grads().data, plain.grads().bytes())) << "gradients differ";
    EXPECT_EQ(plain.forward_loss(x.mb()), ext.forward_loss(x.mb()));
    for (float v : held) ASSERT_TRUE(std::isnan(v)) << "a group still held after forward";

    // One forward and backward: groups in forward order, then in backward order, each released
    // after use; a tied embedding held across the whole pass.
    const std::string emb = name(ParamPlace::embedding, -1), head = name(ParamPlace::head, -1);
    std::vector<std::string> want{"F" + emb};
    if (!tied) want.push_back("-" + emb);
    for (int l = 0; l < m.layers; ++l)
      for (const char* k : {"F", "-"}) want.push_back(k + name(ParamPlace::block, l));
    for (const std::string& k : {"F" + head, "-" + head}) want.push_back(k);
    if (tied) want.push_back("-" + emb), want.push_back("B" + emb);
    for (const std::string& k : {"B" + head, "-" + head}) want.push_back(k);
    for (int l = m.layers - 1; l >= 0; --l)
      for (const char* k : {"B", "-"}) want.push_back(k + name(ParamPlace::block, l));
    if (!tied) want.push_back("B" + emb);
    want.push_back("-" + emb);
    ASSERT_GE(calls.size(), want.size());
    EXPECT_EQ(std::vector<std::string>(calls.begin(), calls.begin() + std::ptrdiff_t(want.size())), want);
  }
}

TEST_P(ModelTest, MemoryPlanEqualsWhatTheModelAllocates) {
  struct Case {
    const char* what;
    bool tied;
    ModelOptions options;
    int tp_size, tp_rank;
  };
  const ModelConfig probe = small(GetParam(), true);
  const std::vector<Case> cases = {
      {"whole model", true, ModelOptions{.micro_batch = 2}, 1, 0},
      {"untied, two slots, shorter sequences", false,
       ModelOptions{.micro_batch = 3, .seq_len = 7, .activation_slots = 2}, 1, 0},
      {"full recomputation", true, ModelOptions{.micro_batch = 2, .checkpointing = ActivationCheckpointing::full}, 1,
       0},
      {"selective recomputation, two slots", true,
       ModelOptions{.micro_batch = 2, .checkpointing = ActivationCheckpointing::selective, .activation_slots = 2}, 1,
       0},
      {"last pipeline stage of two (tied copy)", true,
       ModelOptions{.stage = pipeline_stage_layout(probe, 1, 2), .micro_batch = 2, .activation_slots = 3}, 1, 0},
      {"first pipeline stage of two", false, ModelOptions{.stage = pipeline_stage_layout(probe, 0, 2)}, 1, 0},
      {"tp rank 1 of 2", false, ModelOptions{.micro_batch = 2}, 2, 1},
      {"KV cache", false, ModelOptions{.micro_batch = 2, .kv_cache_tokens = 13}, 1, 0},
      {"bf16 storage", true, ModelOptions{.micro_batch = 2, .dtype = kernels::DType::bf16}, 1, 0},
      {"fp16 storage, selective recomputation", false,
       ModelOptions{.micro_batch = 3,
                    .checkpointing = ActivationCheckpointing::selective,
                    .activation_slots = 2,
                    .dtype = kernels::DType::fp16},
       1, 0},
      {"bf16 storage, tp rank 1 of 2", false, ModelOptions{.micro_batch = 2, .dtype = kernels::DType::bf16}, 2, 1},
      {"fp16 storage, sequence parallelism, tp rank 0 of 2", true,
       ModelOptions{.micro_batch = 2, .dtype = kernels::DType::fp16, .sequence_parallel = true}, 2, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const ModelConfig m = small(GetParam(), c.tied);
    // Building a shard takes no collective: rank c.tp_rank's communicator alone is enough.
    auto tp = parallel::make_thread_comms(c.tp_size, "tp");
    const ModelMemory plan = model_memory_plan(m, c.options, c.tp_size, c.tp_rank);
    Model model(m, c.options, *tp[size_t(c.tp_rank)]);
    EXPECT_EQ(plan.params, int64_t(model.params().bytes()));
    EXPECT_EQ(plan.grads, int64_t(model.grads().bytes()));
    EXPECT_EQ(plan.activations(), int64_t(model.activation_bytes()));
    EXPECT_GT(plan.activations_kept, 0);
    EXPECT_GT(plan.activations_work, 0);
    // The cache: K and V of every layer, [micro_batch, tokens, kv_heads/tp, head dim] fp32.
    EXPECT_EQ(plan.kv_cache, int64_t(m.layers) * 2 * c.options.micro_batch * c.options.kv_cache_tokens *
                                 (m.kv_heads / c.tp_size) * m.head_size() * 4);
  }
  // What the slots keep scales with the slots; the work buffers are shared.
  const ModelConfig m = small(GetParam(), false);
  const ModelMemory one = model_memory_plan(m, ModelOptions{.micro_batch = 2}, 1, 0);
  const ModelMemory three = model_memory_plan(m, ModelOptions{.micro_batch = 2, .activation_slots = 3}, 1, 0);
  EXPECT_EQ(three.activations_kept, 3 * one.activations_kept);
  EXPECT_EQ(three.activations_work, one.activations_work);
  // The plan checks the shape as the constructor does.
  EXPECT_THROW(model_memory_plan(m, ModelOptions{}, 3, 0), Error);  // tp 3 does not divide 4 heads
}

// 16-bit storage, on recipes/tiny.yaml's model at seq 64: parameters and gradients take half the
// bytes of fp32, and activations (what a step keeps and its work buffers) are within 5% of half of
// fp32's in every recomputation mode; only the per-row statistics stay fp32.
TEST(ModelMemoryPlan, SixteenBitStorageHalvesParametersAndActivations) {
  ModelConfig m;
  m.family = ModelFamily::llama;
  m.layers = 4, m.hidden = 128, m.heads = 4, m.kv_heads = 4, m.ffn_hidden = 512;
  m.vocab = 257, m.vocab_pad = 128, m.seq_len = 64, m.max_positions = 64, m.tie_embeddings = true;
  for (auto ckpt : {ActivationCheckpointing::none, ActivationCheckpointing::selective, ActivationCheckpointing::full})
    for (auto dtype : {kernels::DType::bf16, kernels::DType::fp16}) {
      SCOPED_TRACE(::testing::Message() << to_string(ckpt) << " " << kernels::to_string(dtype));
      const ModelMemory full = model_memory_plan(m, ModelOptions{.micro_batch = 4, .checkpointing = ckpt}, 1, 0);
      const ModelMemory half =
          model_memory_plan(m, ModelOptions{.micro_batch = 4, .checkpointing = ckpt, .dtype = dtype}, 1, 0);
      EXPECT_EQ(2 * half.params, full.params);
      EXPECT_EQ(2 * half.grads, full.grads);
      const double ratio = double(half.activations()) / double(full.activations());
      EXPECT_NEAR(ratio, 0.5, 0.025) << half.activations() << " of " << full.activations() << " bytes";
    }
}

TEST(ModelMemoryPlan, SeventyBillionParametersWithoutAllocatingThem) {
  // Llama-3-70B over tp = 8 × pp = 8: the shards add up to the published count (70,553,706,496;
  // vocabulary 128256 needs no padding) plus the norm weights every tp rank replicates (two per
  // block and the final one, [8192] each, held 8 times), and nothing near 280 GB is allocated.
  ModelConfig m;
  m.family = ModelFamily::llama;
  m.layers = 80, m.hidden = 8192, m.heads = 64, m.kv_heads = 8, m.ffn_hidden = 28672;
  m.vocab = 128256, m.vocab_pad = 128, m.seq_len = 8192, m.max_positions = 8192, m.tie_embeddings = false;
  int64_t params = 0;
  for (int stage = 0; stage < 8; ++stage)
    for (int rank = 0; rank < 8; ++rank) {
      const ModelMemory plan = model_memory_plan(
          m, ModelOptions{.stage = pipeline_stage_layout(m, stage, 8), .activation_slots = 8}, 8, rank);
      EXPECT_EQ(plan.grads, plan.params);
      EXPECT_GT(plan.activations_kept, plan.activations_work);
      params += plan.params;
    }
  const int64_t replicated = (2 * 80 + 1) * int64_t(8192);
  EXPECT_EQ(params, (int64_t(70553706496) + 7 * replicated) * 4);
}

// A llama model with MoE blocks (the PyTorch parity tests check its numbers): bf16 and fp16 storage
// compute the fp32 numbers to their rounding (the router stays fp32), a warm step allocates nothing,
// two pipeline stages compose to the whole model, and ZeRO 3's external parameters give the flat
// buffer's gradients.
ModelConfig small_moe() {
  ModelConfig m = small(ModelFamily::llama, false);
  m.moe = {.experts = 4, .top_k = 2, .ffn_hidden = 48, .first_dense = 1, .aux_loss = 0.1, .z_loss = 0.01};
  return m;
}

TEST(ModelMoe, SixteenBitStorageComputesTheFp32Numbers) {
  const ModelConfig m = small_moe();
  auto tp = parallel::make_local_comm("tp");
  Model a(m, ModelOptions{.micro_batch = 3}, *tp);
  a.init_parameters(7);
  Batch x(m, 3, 11, 1);
  const float want = a.forward_backward(x.mb(), 1.0f);
  const std::vector<float> want_grads = copy(a.grads());
  for (auto [dtype, loss_tol, grad_tol] :
       {std::tuple{kernels::DType::bf16, 1e-2, 8e-2}, std::tuple{kernels::DType::fp16, 2e-3, 1.5e-2}}) {
    SCOPED_TRACE(kernels::to_string(dtype));
    Model b(m, ModelOptions{.micro_batch = 3, .dtype = dtype}, *tp);
    b.init_parameters(7);
    const float got = b.forward_backward(x.mb(), 1.0f);
    std::vector<float> grads(want_grads.size());
    kernels::convert(kernels::host_tensor(grads.data(), {int64_t(grads.size())}), b.grads());
    EXPECT_NEAR(got, want, loss_tol * want);
    double num = 0, den = 0;
    for (size_t i = 0; i < grads.size(); ++i)
      num += double(grads[i] - want_grads[i]) * (grads[i] - want_grads[i]),
          den += double(want_grads[i]) * want_grads[i];
    EXPECT_LE(std::sqrt(num / den), grad_tol) << "gradients, ‖a − b‖ / ‖b‖";
  }
}

TEST(ModelMoe, AStepAllocatesNothingOnceWarm) {
  const ModelConfig m = small_moe();
  auto tp = parallel::make_local_comm("tp");
  Model model(m, ModelOptions{.micro_batch = 2}, *tp);
  model.init_parameters(3);
  Batch x(m, 2, 11, 8);
  model.zero_grads();
  model.forward_backward(x.mb(), 1.0f);
  g_allocations = 0;
  g_counting = true;
  model.zero_grads();
  model.forward_backward(x.mb(), 1.0f);
  model.forward_loss(x.mb());
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0);
}

TEST(ModelMoe, PipelineStagesComposeToTheWholeModel) {
  const ModelConfig m = small_moe();
  auto tp = parallel::make_local_comm("tp");
  Model whole(m, ModelOptions{.micro_batch = 2}, *tp);
  whole.init_parameters(5);
  Batch x(m, 2, 11, 4);
  whole.zero_grads();
  const float want = whole.forward_backward(x.mb(), 1.0f);
  Model s0(m, ModelOptions{.stage = pipeline_stage_layout(m, 0, 2), .micro_batch = 2}, *tp);
  Model s1(m, ModelOptions{.stage = pipeline_stage_layout(m, 1, 2), .micro_batch = 2}, *tp);
  s0.init_parameters(5);
  s1.init_parameters(5);
  s0.zero_grads();
  s1.zero_grads();
  s0.stage_forward(0, x.mb(), kernels::Tensor{});
  s1.stage_forward(0, x.mb(), s0.stage_output(0));
  s1.stage_backward(0, kernels::Tensor{}, 1.0f);
  s0.stage_backward(0, s1.stage_input_grad(), 1.0f);
  EXPECT_NEAR(host_loss(s1, 0), want, 1e-6 * want);
  for (const Model* s : {&s0, &s1})
    for (const ModelParam& p : s->parameters()) {
      const ModelParam& w = whole.parameter(p.spec.name);
      const float *a = p.grad.ptr<float>(), *b = w.grad.ptr<float>();
      for (int64_t i = 0; i < p.numel(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5f + 1e-4f * std::fabs(b[i])) << p.spec.name;
    }
}

// Selective and full recomputation give bitwise the gradients of keeping everything (a MoE block
// keeps its experts' activations under selective, recomputes them under full), and their memory
// plans are what the models allocate.
TEST(ModelMoe, ActivationCheckpointingGivesIdenticalGradients) {
  const ModelConfig m = small_moe();
  auto tp = parallel::make_local_comm("tp");
  Model a(m, ModelOptions{.micro_batch = 3}, *tp);
  a.init_parameters(7);
  Batch x(m, 3, 11, 1), y(m, 2, 9, 2);
  std::vector<float> want;
  for (Batch* batch : {&x, &y}) want.push_back(a.forward_backward(batch->mb(), 0.5f));
  for (ActivationCheckpointing mode : {ActivationCheckpointing::selective, ActivationCheckpointing::full}) {
    SCOPED_TRACE(to_string(mode));
    const ModelOptions o{.micro_batch = 3, .checkpointing = mode};
    Model b(m, o, *tp);
    b.init_parameters(7);
    EXPECT_LT(b.activation_bytes(), a.activation_bytes());
    const ModelMemory plan = model_memory_plan(m, o, 1, 0);
    EXPECT_EQ(int64_t(b.activation_bytes()), plan.activations());
    EXPECT_EQ(want[0], b.forward_backward(x.mb(), 0.5f));
    EXPECT_EQ(want[1], b.forward_backward(y.mb(), 0.5f));
    EXPECT_EQ(0, std::memcmp(a.grads().data, b.grads().data, a.grads().bytes())) << "gradients differ";
  }
}

// Refused by the model: a tp that does not divide the experts' width (the recipe check refuses it
// first, by key), and more picks per micro-batch than int32 indexes.
TEST(ModelMoe, LayoutsNotBuiltYetAreRefused) {
  const ModelConfig m = small_moe();
  auto tp = parallel::make_local_comm("tp");
  // micro_batch × seq_len × top_k picks beyond int32's range.
  ModelConfig long_seq = m;
  long_seq.seq_len = long_seq.max_positions = 1 << 20;
  EXPECT_THROW(model_memory_plan(long_seq, ModelOptions{.micro_batch = 1 << 10}, 1, 0), Error);
  EXPECT_THROW(model_memory_plan(m, ModelOptions{}, 32, 0), Error);  // 48 % 32
  EXPECT_NO_THROW(model_memory_plan(m, ModelOptions{}, 2, 0));
}

INSTANTIATE_TEST_SUITE_P(Families, ModelTest, ::testing::Values(ModelFamily::gpt2, ModelFamily::llama),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace llmtrain::trainer
