// Tensor parallelism in training (trainer/loop/train_step.h with a tp group): tp ranks (as threads, on
// the in-process communicator) take the steps of one rank. Each layout trains 20 steps of a small
// model, GPT-2 and LLaMA, and must log the same losses per step as tp 1 (relative difference
// ≤ 1e-5) and global gradient norms (≤ 1e-5: replicated parameters counted once) and end with
// the same parameters, gathered from the shards (‖a − b‖ / ‖b‖ ≤ 1e-5);
// every tp rank's copy of a replicated parameter must be the same. Layouts: tp 2 and 4,
// tp 2 × dp 2 (ZeRO 0, 1 and 2), sequence parallelism, replicated key/value heads (kv_heads 2 and
// 1 at tp 4); checkpoints move between tp 4 and tp 1 both ways. 16-bit storage (bf16, fp16) at tp 2,
// with and without sequence parallelism and ZeRO, takes the steps of its own tp 1 run within
// 16-bit rounding (bounds and why at the test) and resumes bitwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>

#include "kernels/ops.h"
#include "parallel/comm/comm_threads.h"
#include "tests/common/test_layout.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/data/indexed_dataset.h"
#include "trainer/loop/train_step.h"
#include "trainer/placement/memory.h"

namespace llmtrain::trainer {
namespace {
namespace fs = std::filesystem;

struct Layout {
  int tp = 1, dp = 1, zero = 0;
  bool sp = false;
  int ep = 1;
};

class TensorParallelTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("train_tp_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    prefix_ = (dir_ / "data").string();
    IndexedDatasetWriter w(prefix_, TokenDtype::uint16);
    std::mt19937 rng(3);
    for (int d = 0; d < 40; ++d) {
      std::vector<int32_t> doc(size_t(20 + rng() % 30));
      for (auto& t : doc) t = int32_t(rng() % 60);
      w.add_document(doc);
    }
    w.close();
    w.commit();
    use(ModelFamily::llama, 4);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void use(ModelFamily family, int kv_heads) {
    Recipe& r = recipe_;
    r = Recipe{};
    r.model.family = family;
    r.model.layers = 2, r.model.hidden = 64, r.model.heads = 4, r.model.kv_heads = kv_heads, r.model.ffn_hidden = 128;
    r.model.vocab = 60, r.model.vocab_pad = 32, r.model.seq_len = 12, r.model.max_positions = 12;
    r.model.init_std = 0.1, r.model.tie_embeddings = true;
    r.train.micro_batch = 2, r.train.global_batch = 8, r.train.steps = 20, r.train.grad_clip = 0.5;
    r.optimizer.lr = 3e-3, r.optimizer.warmup = 2, r.optimizer.decay_steps = 20;
  }

  struct Rank {
    Rank(const Recipe& r, const std::string& prefix, std::unique_ptr<parallel::Comm> world)
        : mesh({r.parallel.tp, 1, r.parallel.dp, 1, r.parallel.ep}, world->rank()),
          comms(parallel::make_mesh_comms(mesh, std::move(world))),
          data({{prefix, 1.0}}, r.model.seq_len, 7, r.model.vocab),
          sampler(r.train.global_batch, r.train.micro_batch, comms.dp->rank(), r.parallel.dp),
          batches(data, sampler, r.model.seq_len),
          layout(test_layout(r)),
          placement(place(r, layout, mesh.coord())),
          model(r.model, placement.model, *comms.tp, nullptr, r.parallel.ep > 1 ? comms.ep.get() : nullptr) {
      step.emplace(r, placement, model, comms, batches);
      model.init_parameters(11);   // after the step: at ZeRO 3 the values live in its shard
      step->master_from_params();  // 16-bit: the optimizer's fp32 master (a no-op at fp32)
    }
    parallel::Mesh mesh;
    parallel::MeshComms comms;
    GptDataset data;
    Sampler sampler;
    MicroBatchReader batches;
    llmtrain::Layout layout;
    Placement placement;
    Model model;
    std::optional<TrainStep> step;
  };

  struct Run {
    std::vector<float> losses;
    std::vector<double> grad_norms;                    // before clipping (replicated parameters counted once)
    std::map<std::string, std::vector<float>> params;  // gathered global tensors after the last step
  };

  // This rank's elements of p (its shard's, row-major) as the model's storage holds them, widened
  // to fp32. ZeRO 3: the owned elements of the param shard (fp32, the master), rounded as the
  // 16-bit parameters of the other stages are; NaN where another data-parallel rank owns them.
  static std::vector<float> values(const Model& model, const ModelParam& p) {
    std::vector<float> v(size_t(p.numel()), NAN);
    const kernels::DType dtype = model.options().dtype;
    if (!model.options().external_params) {
      kernels::convert(kernels::host_tensor(v.data(), {p.numel()}), p.value.view({p.numel()}));
      return v;
    }
    for (const parallel::FlatRange& own : model.param_shard_ranges()) {
      const int64_t lo = std::max(p.offset, own.begin), hi = std::min(p.offset + p.numel(), own.end);
      if (lo >= hi) continue;
      const kernels::Tensor master = model.param_shard().flat(model.param_shard_offset(lo), hi - lo);
      const kernels::Tensor out = kernels::host_tensor(v.data() + (lo - p.offset), {hi - lo});
      if (dtype == kernels::DType::fp32) {
        kernels::copy(out, master);
        continue;
      }
      std::vector<uint16_t> rounded(size_t(hi - lo));
      const kernels::Tensor half(rounded.data(), dtype, {hi - lo});
      kernels::convert(half, master);
      kernels::convert(out, half);
    }
    return v;
  }

  // Steps [from, to) at `layout`; `load`: a checkpoint to start from; `save`: where to write one.
  Run run(Layout layout, int from, int to, const std::string& load = "", const std::string& save = "") {
    Recipe r = recipe_;
    r.parallel.tp = layout.tp, r.parallel.dp = layout.dp, r.parallel.zero = layout.zero;
    r.parallel.sequence_parallel = layout.sp;
    r.parallel.ep = layout.ep;
    const int world_size = layout.tp * layout.dp;
    std::vector<std::vector<float>> losses(static_cast<size_t>(world_size));
    std::vector<double> norms;
    Run out;
    std::mutex mu;
    std::vector<std::string> failures;
    parallel::run_ranks_in_threads(world_size, [&](parallel::Comm& world) {
      const int rank = world.rank();
      Rank me(r, prefix_, world.split(0, rank, "world"));
      auto slices = [&] {
        return checkpoint_slices(me.model, &me.step->optimizer(), me.comms.dp->rank() == 0,
                                 me.step->grad_sync().first_copy());
      };
      if (!load.empty()) {
        LoadedCheckpoint c = checkpoint_load(load, slices(), *me.comms.world);
        EXPECT_EQ(c.manifest.step, from);
        me.step->restore(c.manifest.extra, from);
        me.step->params_from_master();  // 16-bit: the loaded fp32 master into the parameters
      }
      for (int s = from; s < to; ++s) {
        const StepOutcome o = me.step->run(s, int64_t(s) * r.train.global_batch);
        losses[size_t(rank)].push_back(o.loss);
        if (rank == 0) norms.push_back(o.grad_norm);
      }
      std::unique_lock lock(mu);
      for (const ModelParam& p : me.model.parameters()) {
        int64_t numel = 1;
        for (int64_t d : p.spec.shape) numel *= d;
        std::vector<float>& global = out.params[p.spec.name];
        if (global.empty()) global.assign(size_t(numel), NAN);
        const std::vector<float> v = values(me.model, p);
        for_each_shard_run(p, [&](int64_t l, int64_t g, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            if (std::isnan(v[size_t(l + i)])) continue;  // ZeRO 3: another data-parallel rank's
            float& dst = global[size_t(g + i)];
            if (std::isnan(dst))
              dst = v[size_t(l + i)];
            else if (dst != v[size_t(l + i)] && failures.size() < 5)
              failures.push_back(p.spec.name + " differs between ranks holding it (rank " + std::to_string(rank) + ")");
          }
        });
      }
      lock.unlock();  // the save below is collective
      if (!save.empty()) {
        CheckpointMeta meta;
        meta.step = to;
        meta.consumed_samples = int64_t(to) * r.train.global_batch;
        meta.extra = me.step->state();
        meta.recipe_yaml = "name: tp\n";
        meta.tokenizer_kind = "byte";
        meta.mesh = {layout.tp, 1, layout.dp, layout.zero, layout.zero > 0 ? layout.dp : 0};
        checkpoint_save(default_file_system(), save, meta, slices(), *me.comms.world, 3);
      }
    });
    for (const std::string& f : failures) ADD_FAILURE() << f;
    for (int rank = 1; rank < world_size; ++rank)
      EXPECT_EQ(losses[size_t(rank)], losses[0]) << "rank " << rank << " logged other losses";
    out.losses = losses[0];
    out.grad_norms = norms;
    return out;
  }

  // The largest relative loss (and gradient norm) difference per step, and ‖a − b‖ / ‖b‖ over all
  // parameters.
  static std::pair<double, double> differences(const Run& got, const Run& want, size_t want_from = 0,
                                               double* norm = nullptr) {
    double loss = 0;
    EXPECT_EQ(got.losses.size() + want_from, want.losses.size());
    for (size_t s = 0; s < got.losses.size() && want_from + s < want.losses.size(); ++s) {
      loss = std::max(
          loss, double(std::abs(got.losses[s] - want.losses[want_from + s])) / std::abs(want.losses[want_from + s]));
      if (norm && s < got.grad_norms.size() && want_from + s < want.grad_norms.size())
        *norm = std::max(*norm,
                         std::abs(got.grad_norms[s] - want.grad_norms[want_from + s]) / want.grad_norms[want_from + s]);
    }
    double num = 0, den = 0;
    EXPECT_EQ(got.params.size(), want.params.size());
    for (const auto& [name, b] : want.params) {
      auto it = got.params.find(name);
      if (it == got.params.end() || it->second.size() != b.size()) {
        ADD_FAILURE() << "parameter " << name << " missing or of another size";
        continue;
      }
      // GPT-2's key bias ([3, d] row 1 of c_attn.bias) has an exactly zero true gradient (softmax
      // ignores a constant added to a row of scores): its computed gradient is rounding noise
      // that depends on the summation order, which Adam turns into ±lr steps (test_train_step's
      // ZeroTest says the same of dp). It is left out here; tests/e2e/tp.sh compares every GPT-2
      // parameter on real text, where the criterion holds.
      const bool key_bias = name.ends_with("attn.c_attn.bias");
      for (size_t i = 0; i < b.size(); ++i) {
        if (key_bias && i >= b.size() / 3 && i < 2 * b.size() / 3) continue;
        num += (double(it->second[i]) - b[i]) * (double(it->second[i]) - b[i]);
        den += double(b[i]) * b[i];
      }
    }
    return {loss, std::sqrt(num / den)};
  }

  // Bounds on the largest relative loss and gradient norm difference per step and on ‖a − b‖ / ‖b‖
  // over the parameters after the last step.
  struct Bounds {
    double loss = 1e-5, norm = 1e-5, params = 1e-5;
  };

  static void expect_close(const Run& got, const Run& want, const char* what, const Bounds& bound,
                           size_t want_from = 0) {
    double norm = 0;
    const auto [loss, param] = differences(got, want, want_from, &norm);
    if (want.params.empty())
      std::printf("[ %s ] relative loss difference ≤ %.2e, grad norm %.2e\n", what, loss, norm);
    else
      std::printf("[ %s ] relative loss difference ≤ %.2e, grad norm %.2e, parameters %.2e\n", what, loss, norm, param);
    EXPECT_LE(norm, bound.norm) << what << ": the global gradient norm (replicated parameters counted once)";
    EXPECT_LE(loss, bound.loss) << what;
    if (!want.params.empty()) {
      EXPECT_LE(param, bound.params) << what;
    }
  }

  static void expect_same(const Run& got, const Run& want, const char* what, size_t want_from = 0) {
    expect_close(got, want, what, Bounds{}, want_from);
  }

  fs::path dir_;
  std::string prefix_;
  Recipe recipe_;
};

TEST_F(TensorParallelTrain, LlamaTakesTheStepsOfOneRank) {
  const Run want = run({1, 1, 0}, 0, 20);
  EXPECT_LT(want.losses.back(), want.losses.front());
  expect_same(run({2, 1, 0}, 0, 20), want, "llama tp 2");
  expect_same(run({4, 1, 0}, 0, 20), want, "llama tp 4");
  expect_same(run({2, 2, 0}, 0, 20), want, "llama tp 2 x dp 2");
  expect_same(run({2, 2, 1}, 0, 20), want, "llama tp 2 x dp 2, zero 1");
  expect_same(run({2, 2, 2}, 0, 20), want, "llama tp 2 x dp 2, zero 2");
  expect_same(run({2, 2, 2, true}, 0, 20), want, "llama tp 2 x dp 2 sp, zero 2");
}

// Replicated key/value heads (kv_heads divides tp): kv_heads 2 at tp 4 (each head on two ranks) and
// kv_heads 1 at tp 2 and 4 (multi-query attention), also with dp 2 and ZeRO 1; the replicas' gradients are
// reduced, so every rank's copy stays the same (checked by run()) and the steps are tp 1's.
TEST_F(TensorParallelTrain, ReplicatedKeyValueHeadsTakeTheStepsOfOneRank) {
  for (int kv : {2, 1}) {
    use(ModelFamily::llama, kv);
    const Run want = run({1, 1, 0}, 0, 20);
    const std::string what = "llama kv_heads " + std::to_string(kv);
    expect_same(run({4, 1, 0}, 0, 20), want, (what + " tp 4").c_str());
    if (kv == 1) expect_same(run({2, 1, 0}, 0, 20), want, (what + " tp 2").c_str());
    if (kv == 2) expect_same(run({4, 2, 1}, 0, 20), want, (what + " tp 4 x dp 2, zero 1").c_str());
  }
}

// Sequence parallelism: the residual stream and norms on 1/tp of the rows, reduce-scatter and
// all-gather in place of the all-reduces, the norms' and row-parallel biases' gradients reduced
// over tp; GPT-2 (LayerNorm, biases, learned positions) and LLaMA, at tp 2 and 4, with replicated
// key/value heads, with dp 2 and ZeRO 1, and with full activation checkpointing.
TEST_F(TensorParallelTrain, SequenceParallelTakesTheStepsOfOneRank) {
  for (ModelFamily family : {ModelFamily::gpt2, ModelFamily::llama}) {
    use(family, 4);
    const Run want = run({1, 1, 0}, 0, 20);
    const std::string f = to_string(family);
    expect_same(run({2, 1, 0, true}, 0, 20), want, (f + " tp 2 sp").c_str());
    expect_same(run({4, 1, 0, true}, 0, 20), want, (f + " tp 4 sp").c_str());
    expect_same(run({2, 2, 1, true}, 0, 20), want, (f + " tp 2 x dp 2 sp, zero 1").c_str());
  }
  use(ModelFamily::llama, 2);
  const Run want = run({1, 1, 0}, 0, 20);
  expect_same(run({4, 1, 0, true}, 0, 20), want, "llama kv_heads 2 tp 4 sp");
  recipe_.train.activation_checkpointing = ActivationCheckpointing::full;
  expect_same(run({4, 1, 0, true}, 0, 20), want, "llama kv_heads 2 tp 4 sp, full recompute");
  recipe_.train.activation_checkpointing = ActivationCheckpointing::selective;
  expect_same(run({4, 1, 0, true}, 0, 20), want, "llama kv_heads 2 tp 4 sp, selective recompute");
}

// MoE blocks (a dense first layer, then 4 experts of width 64, top 2): each expert's width split over
// tp like the dense MLP's, the combined outputs reduced over tp (reduce-scattered with sequence
// parallelism), the router replicated with identical gradients on every rank; tp 2 and 4, tp 2 with
// sequence parallelism, tp 2 × dp 2 with ZeRO 1, and a capacity that drops picks at tp 2 × dp 2. And
// expert parallelism on the in-process communicator (which checks that every rank of a group starts
// the same operations in the same order): ep 2 at dp 2 (ZeRO 0 and 1: sharded experts; ZeRO 2: every
// expert in ZeRO's shards), ep 4 and ep 2 × tp 2 with sequence parallelism.
TEST_F(TensorParallelTrain, MoeTakesTheStepsOfOneRank) {
  recipe_.model.moe = {.experts = 4, .top_k = 2, .ffn_hidden = 64, .first_dense = 1, .aux_loss = 0.1, .z_loss = 0.01};
  const Run want = run({1, 1, 0}, 0, 20);
  EXPECT_LT(want.losses.back(), want.losses.front());
  expect_same(run({2, 1, 0}, 0, 20), want, "moe tp 2");
  expect_same(run({4, 1, 0}, 0, 20), want, "moe tp 4");
  expect_same(run({2, 1, 0, true}, 0, 20), want, "moe tp 2 sp");
  expect_same(run({2, 2, 1, true}, 0, 20), want, "moe tp 2 x dp 2 sp, zero 1");
  expect_same(run({1, 2, 0, false, 2}, 0, 20), want, "moe ep 2 (dp 2)");
  expect_same(run({1, 2, 1, false, 2}, 0, 20), want, "moe ep 2, zero 1");
  expect_same(run({1, 2, 2, false, 2}, 0, 20), want, "moe ep 2, zero 2");
  expect_same(run({1, 4, 0, false, 4}, 0, 20), want, "moe ep 4 (dp 4)");
  expect_same(run({2, 2, 1, true, 2}, 0, 20), want, "moe ep 2 x tp 2 sp, zero 1");
  recipe_.model.moe.capacity_factor = 0.75;
  const Run capped = run({1, 1, 0}, 0, 20);
  expect_same(run({2, 2, 0}, 0, 20), capped, "moe with capacity 0.75 tp 2 x dp 2");
}

TEST_F(TensorParallelTrain, Gpt2TakesTheStepsOfOneRank) {
  use(ModelFamily::gpt2, 4);
  const Run want = run({1, 1, 0}, 0, 20);
  EXPECT_LT(want.losses.back(), want.losses.front());
  expect_same(run({2, 1, 0}, 0, 20), want, "gpt2 tp 2");
  expect_same(run({4, 1, 0}, 0, 20), want, "gpt2 tp 4");
  expect_same(run({2, 2, 0}, 0, 20), want, "gpt2 tp 2 x dp 2");
}

// A checkpoint written at tp 4 resumes at tp 1 and one written at tp 1 resumes at tp 4 (ZeRO 1 over
// dp 2 there: the moments are sharded too), both on tp 1's trajectory; kv_heads 2, so tp 4 holds
// each key/value head twice and writes it once.
TEST_F(TensorParallelTrain, CheckpointsMoveBetweenTpFourAndTpOne) {
  use(ModelFamily::llama, 2);
  const Run want = run({1, 1, 0}, 0, 20);
  const std::string from4 = (dir_ / "ckpt_tp4").string(), from1 = (dir_ / "ckpt_tp1").string();
  const Run first = run({4, 1, 0}, 0, 10, "", from4);
  const Run want10{
      {want.losses.begin(), want.losses.begin() + 10}, {want.grad_norms.begin(), want.grad_norms.begin() + 10}, {}};
  expect_same({first.losses, first.grad_norms, {}}, want10, "llama tp 4, steps 1-10");
  expect_same(run({1, 1, 0}, 10, 20, from4 + "/step_00000010"), want, "llama tp 4 -> tp 1", 10);
  run({1, 1, 0}, 0, 10, "", from1);
  expect_same(run({4, 2, 1}, 10, 20, from1 + "/step_00000010"), want, "llama tp 1 -> tp 4 x dp 2, zero 1", 10);
}

// 16-bit storage with tensor parallelism: parameters, gradients, activations and what the crossings
// move (all-reduces, sequence parallelism's all-gathers and reduce-scatters) in bf16 or fp16, the
// per-row statistics, the vocab-parallel loss's exchange and the optimizer's master in fp32.
// Layouts: bf16 LLaMA with grouped-query attention (kv_heads 2: split over tp 2) at tp 2 with and
// without sequence parallelism (and bitwise the same with full or selective recomputation), at
// tp 2 × dp 2 with sequence parallelism and ZeRO 1, 2 and 3 (16-bit gradients through the pools,
// fp32 owned shards; ZeRO 1 also with parallel.grad_reduce_dtype bf16), and with kv_heads 1 (one key/value head
// replicated on both ranks); fp16 GPT-2 with its loss scaler at tp 2 with and without sequence parallelism. Each takes
// the steps of the same precision's tp 1 run up to 16-bit rounding. Not bitwise: a row-parallel linear's partial sum is
// rounded to 16 bits before it is reduced (tp 1 rounds the whole sum once), and a replicated parameter's gradient
// increment is rounded before its reduction. Each rounding is a relative 2^-8 (bf16) or 2^-11 (fp16), and 20 steps of
// AdamW carry them on as they carry the difference between 16-bit and fp32 storage on the same run.
//
// Measured (20 steps, worst of the layouts): bf16 tp 2 against bf16 tp 1 loss ≤ 8.4e-4 per step,
// grad norm ≤ 3.4e-3, parameters 3.3e-3 — the size of bf16 tp 1's own distance from fp32 tp 1
// (6.6e-4, 3.6e-3, 3.7e-3; printed); fp16 tp 2 against fp16 tp 1 loss ≤ 3.4e-5, grad norm
// 2.7e-4, parameters 5.8e-4 (fp16 tp 1 against fp32: 8.1e-5, 5.6e-4, 6.3e-4). The bounds are
// about three times those. Tried by breaking the code: the replicated key/value head's gradient
// left unreduced gives bf16 loss 4.9e-3 and grad norm 6.2e-2 (kv_heads 1), and the
// sequence-parallel norms' and biases' gradients left unreduced give fp16 GPT-2 loss 1.6e-3 — but
// bf16 LLaMA only 9.6e-4, inside its bound: Adam's step barely depends on a gradient's size, so an
// error confined to a few small parameters hardly moves a trajectory. Those are pinned after one
// backward by test_model_tp's SixteenBitShardsMatchTheSixteenBitWholeModel (every gradient shard;
// there they are 0.6 to 0.9 off against a bound of 7e-2).
TEST_F(TensorParallelTrain, SixteenBitTakesTheStepsOfSixteenBitOneRank) {
  const Bounds bf16{3e-3, 1e-2, 1e-2}, fp16{1e-4, 1e-3, 2e-3}, scale{1, 1, 1};
  use(ModelFamily::llama, 2);
  const Run fp32 = run({1, 1, 0}, 0, 20);
  recipe_.train.precision = Precision::bf16;
  const Run want = run({1, 1, 0}, 0, 20);
  expect_close(want, fp32, "bf16 llama tp 1 against fp32 tp 1 (for scale)", scale);
  const Run sp = run({2, 1, 0, true}, 0, 20);
  expect_close(sp, want, "bf16 llama kv_heads 2 tp 2 sp", bf16);
  // Recomputation redoes the same 16-bit ops, the sequence-parallel gathers included: bitwise.
  for (const ActivationCheckpointing ckpt : {ActivationCheckpointing::full, ActivationCheckpointing::selective}) {
    recipe_.train.activation_checkpointing = ckpt;
    const Run again = run({2, 1, 0, true}, 0, 20);
    EXPECT_EQ(again.losses, sp.losses) << to_string(ckpt) << " recomputation";
    EXPECT_EQ(again.params, sp.params) << to_string(ckpt) << " recomputation";
  }
  recipe_.train.activation_checkpointing = ActivationCheckpointing::none;
  expect_close(run({2, 1, 0}, 0, 20), want, "bf16 llama kv_heads 2 tp 2", bf16);
  expect_close(run({2, 2, 1, true}, 0, 20), want, "bf16 llama kv_heads 2 tp 2 x dp 2 sp, zero 1", bf16);
  expect_close(run({2, 2, 2, true}, 0, 20), want, "bf16 llama kv_heads 2 tp 2 x dp 2 sp, zero 2", bf16);
  expect_close(run({2, 2, 3, true}, 0, 20), want, "bf16 llama kv_heads 2 tp 2 x dp 2 sp, zero 3", bf16);
  // The data-parallel reduction in bf16 words (at dp 2 one sum rounded once: the same numbers).
  recipe_.parallel.grad_reduce_dtype = GradReduceDtype::bf16;
  expect_close(run({2, 2, 1, true}, 0, 20), want, "bf16 llama kv_heads 2 tp 2 x dp 2 sp, zero 1, bf16 reduction", bf16);
  recipe_.parallel.grad_reduce_dtype = GradReduceDtype::fp32;
  use(ModelFamily::llama, 1);
  recipe_.train.precision = Precision::bf16;
  const Run mqa = run({1, 1, 0}, 0, 20);
  expect_close(run({2, 1, 0, true}, 0, 20), mqa, "bf16 llama kv_heads 1 tp 2 sp", bf16);

  use(ModelFamily::gpt2, 4);
  const Run gpt2_fp32 = run({1, 1, 0}, 0, 20);
  recipe_.train.precision = Precision::fp16;
  recipe_.train.loss_scale = {.initial = 1024, .growth_interval = 4, .backoff = 0.5, .hysteresis = 2};
  const Run gpt2 = run({1, 1, 0}, 0, 20);
  EXPECT_LT(gpt2.losses.back(), gpt2.losses.front());
  expect_close(gpt2, gpt2_fp32, "fp16 gpt2 tp 1 against fp32 tp 1 (for scale)", scale);
  expect_close(run({2, 1, 0}, 0, 20), gpt2, "fp16 gpt2 tp 2", fp16);
  expect_close(run({2, 1, 0, true}, 0, 20), gpt2, "fp16 gpt2 tp 2 sp", fp16);
}

// A checkpoint written by bf16 at tp 2 with sequence parallelism (the fp32 master and moments of
// each rank's shards) resumes BITWISE in the same layout: the losses and 16-bit parameters of
// steps 11-20 are those of the uninterrupted run.
TEST_F(TensorParallelTrain, SixteenBitTpTwoResumesBitwise) {
  use(ModelFamily::llama, 2);
  recipe_.train.precision = Precision::bf16;
  const Layout layout{2, 1, 0, true};
  const Run whole = run(layout, 0, 20);
  const std::string ckpt = (dir_ / "ckpt_bf16_tp2").string();
  run(layout, 0, 10, "", ckpt);
  const Run resumed = run(layout, 10, 20, ckpt + "/step_00000010");
  EXPECT_EQ(resumed.losses, std::vector<float>(whole.losses.begin() + 10, whole.losses.end()));
  EXPECT_EQ(resumed.grad_norms, std::vector<double>(whole.grad_norms.begin() + 10, whole.grad_norms.end()));
  EXPECT_EQ(resumed.params, whole.params);
}

// The memory plan of a 16-bit tp 2 layout with sequence parallelism is what its ranks allocate
// (summed over both, as the allocator counts the process): parameters and gradients in bf16, the
// vocab-parallel loss's scratch and the per-row statistics fp32, the sequence-parallel buffers and
// saved replicated gradients in bf16; half of fp32's parameters.
TEST_F(TensorParallelTrain, SixteenBitMemoryPlanIsWhatTheRanksAllocate) {
  use(ModelFamily::gpt2, 4);
  recipe_.parallel.tp = 2, recipe_.parallel.dp = 1, recipe_.parallel.sequence_parallel = true;
  Recipe fp32 = recipe_;
  recipe_.train.precision = Precision::bf16;
  MemoryAccount plan, plan32;
  for (int tp = 0; tp < 2; ++tp) {
    const MemoryAccount p = memory_plan(recipe_, test_layout(recipe_), {0, 0, tp}),
                        q = memory_plan(fp32, test_layout(fp32), {0, 0, tp});
    EXPECT_TRUE(p.notes.empty());
    plan.parameters += p.parameters, plan.gradients += p.gradients, plan.optimizer += p.optimizer;
    plan.activations += p.activations, plan.communication += p.communication;
    plan32.parameters += q.parameters, plan32.activations += q.activations;
  }
  EXPECT_EQ(2 * plan.parameters, plan32.parameters);
  EXPECT_LT(plan.activations, plan32.activations);
  MemoryAccount got;
  parallel::run_ranks_in_threads(2, [&](parallel::Comm& world) {
    Rank me(recipe_, prefix_, world.split(0, world.rank(), "world"));
    me.step->run(0, 0);
    world.barrier();
    if (world.rank() == 0) got = memory_measured(kernels::Device::cpu, false);
    world.barrier();
  });
  EXPECT_EQ(got.parameters, plan.parameters);
  EXPECT_EQ(got.gradients, plan.gradients);
  EXPECT_EQ(got.optimizer, plan.optimizer);
  EXPECT_EQ(got.activations, plan.activations);
  EXPECT_EQ(got.communication, plan.communication);
}

}  // namespace
}  // namespace llmtrain::trainer
