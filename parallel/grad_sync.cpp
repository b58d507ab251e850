#include "parallel/grad_sync.h"

#include <fmt/format.h>

#include "common/error.h"

namespace llmtrain::parallel {
namespace {

// ZeRO stage 0: every rank keeps the whole gradient and the whole optimizer state; gradients are
// averaged by bucketed all-reduces, each launched as soon as backward has finished every parameter
// in it on the step's last micro-batch.
class AllReduceGradSync final : public GradSync {
 public:
  AllReduceGradSync(Comm& dp, GradSyncLayout layout, double bucket_mb)
      : numel_(layout.params.numel()),
        groups_(std::move(layout.groups)),
        buckets_(dp, layout.grads, std::move(layout.param_ranges), bucket_mb) {}

  void group_ready(int group, bool last_micro_batch) override {
    LT_CHECK(group >= 0 && group < static_cast<int>(groups_.size()), "parameter group {} of {}", group, groups_.size());
    if (!last_micro_batch) return;  // accumulation continues in place
    for (int p : groups_[static_cast<size_t>(group)]) buckets_.mark_ready(p);
  }
  void progress() override { buckets_.progress(); }
  void finish() override { buckets_.finish(); }
  FlatRange owned() const override { return {0, numel_}; }
  bool shards_over_dp() const override { return false; }
  void gather_params() override {}  // every rank updated the whole buffer identically
  const GradBucketStats& stats() const override { return buckets_.stats(); }

 private:
  int64_t numel_;
  std::vector<std::vector<int>> groups_;
  GradBuckets buckets_;
};

}  // namespace

std::unique_ptr<GradSync> make_grad_sync(int zero_stage, Comm& dp, GradSyncLayout layout, double bucket_mb) {
  LT_CHECK(layout.params.numel() == layout.grads.numel(), "parameters {} and gradients {}", layout.params.numel(),
           layout.grads.numel());
  for (const auto& g : layout.groups)
    for (int p : g)
      LT_CHECK(p >= 0 && p < static_cast<int>(layout.param_ranges.size()), "parameter {} of {} in a group", p,
               layout.param_ranges.size());
  if (zero_stage != 0)
    throw Error(fmt::format("not supported yet: parallel.zero {} (only 0)", zero_stage), "set parallel.zero: 0");
  return std::make_unique<AllReduceGradSync>(dp, std::move(layout), bucket_mb);
}

}  // namespace llmtrain::parallel
