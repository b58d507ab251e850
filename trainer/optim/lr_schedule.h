// The learning-rate schedule: linear warmup, then cosine, linear or constant decay to min_lr.
// For optimizer step s (0-based: the first update is s = 0), W = warmup, D = decay_steps:
//
//   s < W:              lr · (s + 1) / W                          (from lr/W up to lr)
//   constant, s >= W:   lr
//   s >= D:             min_lr                                    (cosine, linear)
//   otherwise, p = (s - W) / (D - W):
//     cosine:           min_lr + (lr - min_lr) · (1 + cos(π·p)) / 2
//     linear:           lr - (lr - min_lr) · p
//
// (nanoGPT's and llm.c's schedule.) Rule a reader could get wrong: D counts from step 0, warmup
// included, so min_lr is reached at step D whatever W is.
#pragma once

#include <cstdint>

#include "common/recipe/recipe.h"

namespace llmtrain::trainer {

// `opt` must be resolved (decay_steps > 0).
double lr_at(const OptimizerConfig& opt, int64_t step);

}  // namespace llmtrain::trainer
