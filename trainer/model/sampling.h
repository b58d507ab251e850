// Choosing the next token from logits, for `llmtrain generate`: temperature, top-k, top-p
// (nucleus), or greedy at temperature 0. Pure functions of the logits and one uniform number, so
// a fixed seed reproduces a generation exactly.
#pragma once

#include <cstdint>
#include <span>

namespace llmtrain::trainer {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy (argmax)
  int top_k = 0;             // 0 = no limit
  double top_p = 1.0;        // 1 = no limit
};

// Picks a token id in [0, logits.size()) given `uniform` in [0, 1). Ties in greedy mode go to the
// lowest id. Pass only the real vocabulary's logits (not the padding columns).
int32_t sample_token(std::span<const float> logits, const SamplingParams& params, double uniform);

}  // namespace llmtrain::trainer
