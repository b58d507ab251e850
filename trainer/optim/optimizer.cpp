#include "trainer/optim/optimizer.h"

#include <algorithm>

#include "common/error.h"
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

namespace {

int64_t total_numel(const std::vector<parallel::FlatRange>& owned) {
  int64_t n = 0;
  for (const auto& r : owned) {
    LT_CHECK(0 <= r.begin && r.begin <= r.end, "AdamW range [{}, {})", r.begin, r.end);
    n += r.numel();
  }
  return n;
}

}  // namespace

AdamW::AdamW(const OptimizerConfig& config, std::vector<DecayRange> ranges, std::vector<parallel::FlatRange> owned,
             kernels::DType param_dtype, kernels::Device device)
    : config_(config),
      ranges_(std::move(ranges)),
      owned_(std::move(owned)),
      m_(kernels::DType::fp32, {total_numel(owned_)}, device, kernels::MemoryKind::optimizer),
      v_(kernels::DType::fp32, {total_numel(owned_)}, device, kernels::MemoryKind::optimizer) {
  if (param_dtype != kernels::DType::fp32)
    master_ = kernels::Buffer(kernels::DType::fp32, {total_numel(owned_)}, device, kernels::MemoryKind::optimizer);
  for (size_t i = 1; i < owned_.size(); ++i)
    LT_CHECK(owned_[i - 1].end <= owned_[i].begin, "AdamW ranges [{}, {}) and [{}, {}) not ascending",
             owned_[i - 1].begin, owned_[i - 1].end, owned_[i].begin, owned_[i].end);
}

int64_t AdamW::owned_numel() const { return m_.tensor().numel(); }

void AdamW::master_from_params(kernels::Tensor params) {
  if (!has_master()) return;
  master_set_ = true;
  int64_t base = 0;
  for (const parallel::FlatRange& own : owned_) {
    kernels::convert(master_.tensor().flat(base, own.numel()), params.flat(own.begin, own.numel()));
    base += own.numel();
  }
}

void AdamW::params_from_master(kernels::Tensor params) {
  if (!has_master()) return;
  master_set_ = true;
  int64_t base = 0;
  for (const parallel::FlatRange& own : owned_) {
    kernels::convert(params.flat(own.begin, own.numel()), master_.tensor().flat(base, own.numel()));
    base += own.numel();
  }
}

int64_t AdamW::state_offset(int64_t at) const {
  int64_t base = 0;
  for (const auto& r : owned_) {
    if (at >= r.begin && at < r.end) return base + (at - r.begin);
    base += r.numel();
  }
  return -1;
}

void AdamW::step(kernels::Tensor params, kernels::Tensor grads, double lr, float grad_scale, bool compact_grads,
                 bool compact_params) {
  const int64_t end = owned_.empty() ? 0 : owned_.back().end;
  LT_CHECK(params.numel() >= (compact_params ? owned_numel() : end) &&
               grads.numel() >= (compact_grads ? owned_numel() : end),
           "AdamW step on {} / {} elements, owning up to {}", params.numel(), grads.numel(), end);
  LT_CHECK(!has_master() || master_set_, "AdamW step before its fp32 master was set (master_from_params)");
  ++steps_;
  kernels::AdamWStep s{.lr = float(lr),
                       .beta1 = float(config_.beta1),
                       .beta2 = float(config_.beta2),
                       .eps = float(config_.eps),
                       .weight_decay = 0.0f,
                       .step = steps_,
                       .grad_scale = grad_scale};
  int64_t base = 0;  // the owned range's first element in the moments
  for (const parallel::FlatRange& own : owned_) {
    for (const DecayRange& r : ranges_) {
      const int64_t b = std::max(r.begin, own.begin), e = std::min(r.end, own.end);
      if (b >= e) continue;
      s.weight_decay = r.decay ? float(config_.weight_decay) : 0.0f;
      const int64_t count = e - b, at = base + (b - own.begin);
      const kernels::Tensor g = grads.flat(compact_grads ? at : b, count);
      if (has_master()) {
        // The fp32 master takes the update; the 16-bit parameters get it rounded once.
        LT_CHECK(!compact_params, "AdamW master weights with compact parameters");
        kernels::adamw_update(master_.tensor().flat(at, count), g, m_.tensor().flat(at, count),
                              v_.tensor().flat(at, count), s);
        kernels::convert(params.flat(b, count), master_.tensor().flat(at, count));
        continue;
      }
      kernels::adamw_update(params.flat(compact_params ? at : b, count), g, m_.tensor().flat(at, count),
                            v_.tensor().flat(at, count), s);
    }
    base += own.numel();
  }
}

namespace {

// Calls fn(piece, gradient elements) for each counted (parameter, owned range) overlap, in order.
template <typename Fn>
void for_each_norm_piece(const std::vector<ModelParam>& params, int tp_rank,
                         const std::vector<parallel::FlatRange>& owned, kernels::Tensor compact_grads, Fn&& fn) {
  int64_t piece = 0;
  for (const ModelParam& p : params) {
    if (p.tied_copy) continue;
    if (p.tp_replica || (p.spec.tp_split_dim < 0 && tp_rank != 0)) continue;
    int64_t base = 0;  // the owned range's first element in compact_grads
    for (const parallel::FlatRange& own : owned) {
      const int64_t b = std::max(p.offset, own.begin), e = std::min(p.offset + p.numel(), own.end);
      if (b < e)
        fn(piece++, compact_grads.defined() ? compact_grads.flat(base + (b - own.begin), e - b)
                                            : p.grad.view({p.numel()}).flat(b - p.offset, e - b));
      base += own.numel();
    }
  }
}

}  // namespace

int64_t grad_norm_pieces(const std::vector<ModelParam>& params, int tp_rank,
                         const std::vector<parallel::FlatRange>& owned) {
  int64_t n = 0;
  for (const ModelParam& p : params) {
    if (p.tied_copy || p.tp_replica || (p.spec.tp_split_dim < 0 && tp_rank != 0)) continue;
    for (const parallel::FlatRange& own : owned)
      if (std::max(p.offset, own.begin) < std::min(p.offset + p.numel(), own.end)) ++n;
  }
  return n;
}

void grad_sum_squares_into(kernels::Tensor parts, const std::vector<ModelParam>& params, int tp_rank,
                           const std::vector<parallel::FlatRange>& owned, kernels::Tensor compact_grads) {
  LT_CHECK(parts.numel() >= grad_norm_pieces(params, tp_rank, owned), "{} norm parts for {} pieces", parts.numel(),
           grad_norm_pieces(params, tp_rank, owned));
  for_each_norm_piece(params, tp_rank, owned, compact_grads,
                      [&](int64_t i, kernels::Tensor g) { kernels::sum_squares(parts.flat(i, 1), g); });
}

double sum_pieces(std::span<const float> parts) {
  double sum = 0;
  for (float x : parts) sum += x;
  return sum;
}

double grad_sum_squares(const std::vector<ModelParam>& params, int tp_rank,
                        const std::vector<parallel::FlatRange>& owned, kernels::Tensor compact_grads) {
  const int64_t n = grad_norm_pieces(params, tp_rank, owned);
  if (n == 0) return 0;
  const kernels::Device device = compact_grads.defined() ? compact_grads.device : params.front().grad.device;
  kernels::Buffer parts(kernels::DType::fp32, {n}, device);
  grad_sum_squares_into(parts.tensor(), params, tp_rank, owned, compact_grads);
  std::vector<float> host(static_cast<size_t>(n));
  kernels::copy(kernels::host_tensor(host.data(), {n}), parts.tensor());
  return sum_pieces(host);
}

float clip_factor(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? float(c) : 1.0f;
}

}  // namespace llmtrain::trainer
