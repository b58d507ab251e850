#include "trainer/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/error.h"

namespace llmtrain::trainer {

int32_t sample_token(std::span<const float> logits, const SamplingParams& p, double uniform) {
  const int32_t n = static_cast<int32_t>(logits.size());
  LT_CHECK(n > 0, "sampling from no logits");
  if (p.temperature <= 0 || p.top_k == 1) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Candidates in decreasing logit order (stable: equal logits keep id order).
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  int32_t keep = p.top_k > 0 ? std::min(p.top_k, n) : n;
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), by_logit);
  ids.resize(keep);

  // Softmax over the candidates at this temperature, in double for a stable cumulative sum.
  std::vector<double> prob(keep);
  const double top = logits[ids[0]];
  double total = 0;
  for (int32_t i = 0; i < keep; ++i) total += prob[i] = std::exp((logits[ids[i]] - top) / p.temperature);
  for (double& q : prob) q /= total;

  // Nucleus: the shortest prefix whose probability reaches top_p.
  if (p.top_p < 1.0) {
    double cum = 0;
    int32_t cut = keep;
    for (int32_t i = 0; i < keep; ++i) {
      cum += prob[i];
      if (cum >= p.top_p) {
        cut = i + 1;
        break;
      }
    }
    prob.resize(cut);
    total = std::accumulate(prob.begin(), prob.end(), 0.0);
    for (double& q : prob) q /= total;
  }

  double cum = 0;
  for (size_t i = 0; i < prob.size(); ++i) {
    cum += prob[i];
    if (uniform < cum) return ids[i];
  }
  // uniform within rounding of 1: the last candidate that can be drawn (a masked id's logit is −∞,
  // its probability 0).
  size_t last = prob.size() - 1;
  while (last > 0 && prob[last] == 0) --last;
  return ids[last];
}

}  // namespace llmtrain::trainer
