// The learning-rate schedule: linear warmup, then cosine, linear or constant decay to min_lr, or
// warmup-stable-decay. For optimizer step s (0-based: the first update is s = 0), W = warmup, D =
// decay_steps:
//
//   s < W:              lr · (s + 1) / W                          (from lr/W up to lr)
//   constant, s >= W:   lr
//   s >= D:             min_lr                                    (cosine, linear, wsd)
//   otherwise, p = (s - W) / (D - W):
//     cosine:           min_lr + (lr - min_lr) · (1 + cos(π·p)) / 2
//     linear:           lr - (lr - min_lr) · p
//   wsd, with S = the decay's length (wsd_decay_steps, or wsd_decay_fraction · D rounded, ≥ 1) and
//   T = D - S ≥ W its first step:
//     W <= s < T:       lr                                        (the stable phase)
//     T <= s < D:       p = (s - T) / S; linear: lr - (lr - min_lr) · p;
//                       1-sqrt: min_lr + (lr - min_lr) · (1 - √p)
//
// (nanoGPT's and llm.c's schedule.) Rule a reader could get wrong: D counts from step 0, warmup
// included, so min_lr is reached at step D whatever W is.
//
// A resume that moves D (train.steps with decay_steps auto, or decay_steps itself, accepted with
// --allow-change) continues the decay from where the checkpoint's schedule had it: from step R ≥ W
// on, the learning rate goes from L = the checkpoint's schedule at R to min_lr at the new D, with
// the same shape (p = (s - R) / (D - R) from L instead of lr) — no jump at R. The continuation is
// part of the run's state: its later checkpoints record it, and resuming them keeps it. wsd's stable
// phase needs none: a resume at R < T (both the checkpoint's T and the new one) keeps lr and decays
// over the new schedule's last S steps — extending a run from its stable phase continues on the
// curve a run of that length would have had.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/recipe/recipe.h"

namespace llmtrain::trainer {

// `opt` must be resolved (decay_steps > 0).
double lr_at(const OptimizerConfig& opt, int64_t step);

// A run's schedule: the recipe's, continued as above after a resume that moved its end.
class LrScheduler {
 public:
  explicit LrScheduler(const OptimizerConfig& opt);
  double at(int64_t step) const;
  // What a checkpoint records of it (the schedule's values and its continuation).
  nlohmann::json state() const;
  // Resuming at `step` from a checkpoint whose schedule was `saved` (state(), from a manifest: every
  // value is checked; null for a checkpoint that records none, which leaves the recipe's). Returns
  // a line for the log when the schedule differs from the checkpoint's, else "".
  std::string restore(const nlohmann::json& saved, int64_t step);

 private:
  OptimizerConfig opt_;
  int64_t from_ = -1;   // R, the continuation's first step (-1: none)
  double from_lr_ = 0;  // L
};

}  // namespace llmtrain::trainer
