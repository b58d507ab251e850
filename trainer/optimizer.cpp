#include "trainer/optimizer.h"

#include <algorithm>

#include "kernels/ops.h"

namespace llmtrain::trainer {

std::vector<DecayRange> decay_ranges(const std::vector<ModelParam>& params) {
  std::vector<DecayRange> out;
  for (const ModelParam& p : params) {
    const int64_t b = p.offset, e = p.offset + p.numel();
    if (!out.empty() && out.back().end == b && out.back().decay == p.spec.weight_decay)
      out.back().end = e;
    else
      out.push_back({b, e, p.spec.weight_decay});
  }
  return out;
}

AdamW::AdamW(const OptimizerConfig& config, std::vector<DecayRange> ranges, int64_t begin, int64_t end)
    : config_(config),
      ranges_(std::move(ranges)),
      begin_(begin),
      end_(end),
      m_(kernels::DType::fp32, {end - begin}, kernels::Device::cpu, kernels::MemoryKind::optimizer),
      v_(kernels::DType::fp32, {end - begin}, kernels::Device::cpu, kernels::MemoryKind::optimizer) {
  LT_CHECK(0 <= begin && begin <= end, "AdamW range [{}, {})", begin, end);
}

void AdamW::step(kernels::Tensor params, kernels::Tensor grads, double lr, float grad_scale) {
  LT_CHECK(params.numel() == end_ - begin_ && grads.numel() == end_ - begin_,
           "AdamW step on {} / {} elements for [{}, {})", params.numel(), grads.numel(), begin_, end_);
  ++steps_;
  kernels::AdamWStep s{.lr = float(lr),
                       .beta1 = float(config_.beta1),
                       .beta2 = float(config_.beta2),
                       .eps = float(config_.eps),
                       .weight_decay = 0.0f,
                       .step = steps_,
                       .grad_scale = grad_scale};
  for (const DecayRange& r : ranges_) {
    const int64_t b = std::max(r.begin, begin_), e = std::min(r.end, end_);
    if (b >= e) continue;
    s.weight_decay = r.decay ? float(config_.weight_decay) : 0.0f;
    const int64_t off = b - begin_, count = e - b;
    kernels::adamw_update(params.flat(off, count), grads.flat(off, count), m_.tensor().flat(off, count),
                          v_.tensor().flat(off, count), s);
  }
}

double grad_sum_squares(const std::vector<ModelParam>& params, int tp_rank, parallel::FlatRange owned) {
  double sum = 0;
  for (const ModelParam& p : params) {
    if (p.tied_copy) continue;
    if (p.spec.tp_split_dim < 0 && tp_rank != 0) continue;
    const int64_t b = std::max(p.offset, owned.begin), e = std::min(p.offset + p.numel(), owned.end);
    if (b < e) sum += kernels::sum_squares(p.grad.view({p.numel()}).flat(b - p.offset, e - b));
  }
  return sum;
}

float clip_factor(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? float(c) : 1.0f;
}

}  // namespace llmtrain::trainer
