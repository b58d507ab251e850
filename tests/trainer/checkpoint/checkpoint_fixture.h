// What the checkpoint tests share: a small LLaMA and its AdamW state, filled from a seed (the
// parameters by the model's own initialization, the moments with distinct non-trivial values), and
// its checkpoint slices; a test directory and checkpoint metadata.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "parallel/comm/comm.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/model/model.h"
#include "trainer/optim/optimizer.h"

namespace llmtrain::trainer {

inline ModelConfig small_checkpoint_model() {
  ModelConfig m;
  m.family = ModelFamily::llama;
  m.layers = 2, m.hidden = 32, m.heads = 4, m.kv_heads = 2, m.ffn_hidden = 64;
  m.vocab = 100, m.vocab_pad = 64, m.seq_len = 8, m.max_positions = 8, m.tie_embeddings = false;
  return m;
}

struct CheckpointFixture {
  std::unique_ptr<parallel::Comm> world = parallel::make_local_comm();
  ModelConfig config = small_checkpoint_model();
  Model model{config, {}, *world};
  AdamW opt{OptimizerConfig{}, decay_ranges(model.parameters()), {{0, model.numel()}}};

  explicit CheckpointFixture(uint64_t seed) {
    model.init_parameters(seed);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_real_distribution<float> u(0, 1);
    for (int64_t i = 0; i < model.numel(); ++i) {
      opt.exp_avg().ptr<float>()[i] = u(rng);
      opt.exp_avg_sq().ptr<float>()[i] = u(rng);
    }
  }
  // Every tensor: parameters and, with `with_opt`, the optimizer's moments.
  std::vector<CheckpointSlice> slices(bool with_opt = true) {
    return checkpoint_slices(model, with_opt ? &opt : nullptr, true, true);
  }
  // The slices a rank that writes only some kinds of tensors saves.
  std::vector<CheckpointSlice> slices_of(bool params, bool moments) {
    return checkpoint_slices(model, &opt, params, moments);
  }
};

// An empty directory for one test: the system's temporary folder / <prefix>_<pid>_<name>.
inline std::filesystem::path checkpoint_test_dir(const std::string& prefix, const std::string& name) {
  std::filesystem::path d =
      std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(getpid()) + "_" + name);
  std::filesystem::remove_all(d);
  return d;
}

// A checkpoint's metadata at `step` (4 samples a step, the byte tokenizer).
inline CheckpointMeta meta_at(int64_t step) {
  CheckpointMeta m;
  m.step = step;
  m.consumed_samples = step * 4;
  m.recipe_yaml = "name: t\n";
  m.tokenizer_kind = "byte";
  return m;
}

}  // namespace llmtrain::trainer
