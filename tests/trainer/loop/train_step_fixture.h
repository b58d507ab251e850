// The fixture shared by the training-step tests (test_train_step.cpp, test_train_zero.cpp): a real
// dataset file, a small Llama recipe, and a rank's whole training set-up as train() builds it.
#pragma once

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>

#include "kernels/ops.h"
#include "parallel/comm/comm_threads.h"
#include "tests/common/count_allocations.h"
#include "tests/common/test_layout.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/data/indexed_dataset.h"
#include "trainer/loop/train_step.h"
#include "trainer/placement/memory.h"

namespace llmtrain::trainer {
namespace {
namespace fs = std::filesystem;

class TrainStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("train_step_" + std::to_string(getpid()));
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

    Recipe& r = recipe_;
    r.model.family = ModelFamily::llama;
    r.model.layers = 2, r.model.hidden = 32, r.model.heads = 4, r.model.kv_heads = 2, r.model.ffn_hidden = 64;
    r.model.vocab = 60, r.model.vocab_pad = 32, r.model.seq_len = 12, r.model.max_positions = 12;
    r.model.init_std = 0.1, r.model.tie_embeddings = true;
    r.train.micro_batch = 2, r.train.global_batch = 8, r.train.steps = 10, r.train.grad_clip = 1.0;
    r.optimizer.lr = 1e-2, r.optimizer.warmup = 2, r.optimizer.decay_steps = 10;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A rank's whole training set-up, as train() builds it (tensor, context and expert parallelism: the
  // recipe's tp, cp and ep).
  // `storage`: the model's dtype when it is not train.precision's (fp16 loss scaling on fp32 storage).
  struct Rank {
    Rank(const Recipe& r, const std::string& prefix, std::unique_ptr<parallel::Comm> world, int dp, int pp = 1,
         std::optional<kernels::DType> storage = std::nullopt)
        : mesh({r.parallel.tp, pp, dp, r.parallel.cp, r.parallel.ep}, world->rank()),
          comms(parallel::make_mesh_comms(mesh, std::move(world))),
          data({{prefix, 1.0}}, r.model.seq_len, 7, r.model.vocab),
          sampler(r.train.global_batch, r.train.micro_batch, comms.dp->rank(), dp),
          batches(data, sampler, r.model.seq_len, {comms.cp->size(), comms.cp->rank()}),
          layout(layout_at(r, dp, pp)),
          placement(with_storage(place(at(r, dp, pp), layout, mesh.coord()), storage)),
          model(r.model, placement.model, *comms.tp, r.parallel.cp > 1 ? comms.cp.get() : nullptr,
                r.parallel.ep > 1 ? comms.ep.get() : nullptr) {
      step.emplace(r, placement, model, comms, batches);
      model.init_parameters(11);  // after the step: at ZeRO 3 the values live in its shard
      step->master_from_params();
    }
    // The recipe resolved at (dp, pp), and the layout train() computes for it.
    static Recipe at(Recipe r, int dp, int pp) {
      r.parallel.dp = dp, r.parallel.pp = pp;
      return r;
    }
    static llmtrain::Layout layout_at(const Recipe& r, int dp, int pp) { return test_layout(at(r, dp, pp)); }
    // The placement with the model's storage dtype replaced (fp16 loss scaling on fp32 storage).
    static Placement with_storage(Placement p, std::optional<kernels::DType> storage) {
      if (storage) p.model.dtype = *storage;
      return p;
    }
    // The parameters, widened to fp32 (a copy).
    std::vector<float> params_fp32() const {
      const kernels::Tensor p = model.params();
      std::vector<float> out(size_t(p.numel()));
      kernels::convert(kernels::host_tensor(out.data(), {p.numel()}), p);
      return out;
    }
    // The parameters this rank updates, as a flat buffer's tensor: the model's at stages 0-2, the
    // sync's owned shard at 3.
    kernels::Tensor values() const { return model.options().external_params ? model.param_shard() : model.params(); }
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

  struct Layout {
    int pp, dp, zero;
    PipelineSchedule schedule;
    std::vector<int> blocks;  // parallel.pp_layers
    int virtual_stages = 1;
  };
  // Pipeline layouts against one rank, for the recipe's model.
  void check_pipeline_layouts(const std::vector<Layout>& layouts);

  fs::path dir_;
  std::string prefix_;
  Recipe recipe_;
};

inline double rel_diff(const kernels::Tensor& a, const kernels::Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.ptr<float>()[i], y = b.ptr<float>()[i];
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / den);
}

}  // namespace
}  // namespace llmtrain::trainer
