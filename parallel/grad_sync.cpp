#include "parallel/grad_sync.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "kernels/buffer.h"
#include "kernels/ops.h"

namespace llmtrain::parallel {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// ZeRO stage 0: every rank keeps the whole gradient and the whole optimizer state; gradients are
// averaged by bucketed all-reduces, each launched as soon as backward has finished every parameter
// in it on the step's last micro-batch.
class AllReduceGradSync final : public GradSync {
 public:
  AllReduceGradSync(Comm& dp, GradSyncLayout layout, double bucket_mb)
      : numel_(layout.params.numel()),
        groups_(std::move(layout.groups)),
        buckets_(dp, layout.grads, std::move(layout.param_ranges), bucket_mb),
        owned_{{0, numel_}},
        first_copy_(dp.rank() == 0) {}

  void group_ready(int group, bool last_micro_batch) override {
    LT_CHECK(group >= 0 && group < static_cast<int>(groups_.size()), "parameter group {} of {}", group, groups_.size());
    if (!last_micro_batch) return;  // accumulation continues in place
    for (int p : groups_[static_cast<size_t>(group)]) buckets_.mark_ready(p);
  }
  void progress() override { buckets_.progress(); }
  void finish() override { buckets_.finish(); }
  const std::vector<FlatRange>& owned() const override { return owned_; }
  bool shards_over_dp() const override { return false; }
  bool first_copy() const override { return first_copy_; }
  void gather_params() override {}  // every rank updated the whole buffer identically
  const GradBucketStats& stats() const override { return buckets_.stats(); }

 private:
  int64_t numel_;
  std::vector<std::vector<int>> groups_;
  GradBuckets buckets_;
  std::vector<FlatRange> owned_;
  bool first_copy_;
};

// ZeRO stage 1 (make_grad_sync in grad_sync.h): per parameter group, a reduce-scatter over the
// shard group launched as the group's gradient is final, then (hybrid) an all-reduce of the owned
// chunk over the replicas; all-gathers of the updated chunks in gather_params(). Each group has
// its own scratch: `full` (the padded group) and `chunk` (one chunk), so that padding never
// touches the neighbouring group's elements and every operation of a step can be in flight at once.
class ShardedGradSync final : public GradSync {
 public:
  ShardedGradSync(Comm& dp, GradSyncLayout layout, int zero_group)
      : params_(layout.params), grads_(layout.grads), groups_(std::move(layout.groups)) {
    const int n = zero_group;
    const int shard_index = dp.rank() % n, replica = dp.rank() / n;
    shard_ = dp.split(replica, dp.rank(), dp.name() + " shard");
    replicas_ = dp.split(shard_index, dp.rank(), dp.name() + " replica");
    first_copy_ = replica == 0;
    ranges_ = group_flat_ranges(layout.param_ranges, groups_);
    std::vector<FlatRange> sorted = ranges_;
    std::sort(sorted.begin(), sorted.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < sorted.size(); ++i)
      LT_CHECK(sorted[i].numel() == 0 || sorted[i - 1].end <= sorted[i].begin,
               "parameter groups overlap in the flat buffer: [{}, {}) and [{}, {})", sorted[i - 1].begin,
               sorted[i - 1].end, sorted[i].begin, sorted[i].end);
    scratch_ = kernels::Buffer(grads_.dtype, {std::max<int64_t>(sharded_scratch_numel(ranges_, n), 1)}, grads_.device,
                               kernels::MemoryKind::communication);
    int64_t at = 0;
    for (const FlatRange& g : ranges_) {
      Group s;
      s.range = g;
      s.chunk_numel = (g.numel() + n - 1) / n;
      const int64_t padded = s.chunk_numel * n;
      s.full = scratch_.tensor().flat(at, padded);
      s.chunk = scratch_.tensor().flat(at + padded, s.chunk_numel);
      at += padded + s.chunk_numel;
      const int64_t b = std::min(g.end, g.begin + shard_index * s.chunk_numel);
      s.own = {b, std::min(g.end, b + s.chunk_numel)};
      if (s.own.numel() > 0) owned_.push_back(s.own);
      state_.push_back(std::move(s));
    }
    std::sort(owned_.begin(), owned_.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
    ready_.assign(groups_.size(), 0);
  }

  void group_ready(int group, bool last_micro_batch) override {
    LT_CHECK(group >= 0 && group < static_cast<int>(groups_.size()), "parameter group {} of {}", group, groups_.size());
    if (!last_micro_batch) return;  // accumulation continues in place
    LT_CHECK(!ready_[size_t(group)], "parameter group {} ready twice in one step", group);
    if (!step_started_) step_started_ = true, step_start_ = now_s();
    ready_[size_t(group)] = 1;
    launch_ready();
    progress();
  }

  void progress() override {
    shard_->progress();
    replicas_->progress();
    launch_replica_reduces();
  }

  void finish() override {
    if (!step_started_) step_started_ = true, step_start_ = now_s();
    const double t0 = now_s();
    std::fill(ready_.begin(), ready_.end(), 1);  // every gradient is final by now
    launch_ready();
    for (Group& s : state_) {
      if (s.scatter) s.scatter->wait();
      launch_replica_reduces();
    }
    for (Group& s : state_) {
      if (s.replica) s.replica->wait();
      if (s.own.numel() > 0) kernels::copy(grads_.flat(s.own.begin, s.own.numel()), s.chunk.flat(0, s.own.numel()));
      s.scatter.reset();
      s.replica.reset();
    }
    const double t1 = now_s();
    stats_.steps++;
    stats_.last_exposed_s = t1 - t0;
    stats_.last_span_s = t1 - step_start_;
    stats_.exposed_s += stats_.last_exposed_s;
    stats_.span_s += stats_.last_span_s;
    std::fill(ready_.begin(), ready_.end(), 0);
    next_launch_ = next_replica_ = 0;
    step_started_ = false;
  }

  const std::vector<FlatRange>& owned() const override { return owned_; }
  bool shards_over_dp() const override { return true; }
  bool first_copy() const override { return first_copy_; }

  void gather_params() override {
    std::vector<WorkHandle> work;
    for (Group& s : state_) {
      if (s.range.numel() == 0) continue;
      kernels::fill_zero(s.chunk);
      if (s.own.numel() > 0) kernels::copy(s.chunk.flat(0, s.own.numel()), params_.flat(s.own.begin, s.own.numel()));
      work.push_back(shard_->all_gather_async(s.chunk, s.full));
      count(s.full);
    }
    wait_all(work);
    for (Group& s : state_)
      if (s.range.numel() > 0)
        kernels::copy(params_.flat(s.range.begin, s.range.numel()), s.full.flat(0, s.range.numel()));
  }

  const GradBucketStats& stats() const override { return stats_; }

 private:
  struct Group {
    FlatRange range;          // the group's elements in the flat buffers
    FlatRange own;            // this rank's chunk of it (possibly short or empty: padding)
    int64_t chunk_numel = 0;  // padded group / shard size
    Tensor full, chunk;       // scratch
    WorkHandle scatter, replica;
  };

  void count(const Tensor& t) {
    ++stats_.buckets;
    stats_.bytes += t.numel() * static_cast<int64_t>(kernels::dtype_size(t.dtype));
  }

  // Reduce-scatters, strictly in group order (collectives start in the same order on every rank).
  void launch_ready() {
    const int n = static_cast<int>(state_.size());
    while (next_launch_ < n && ready_[size_t(next_launch_)]) {
      Group& s = state_[size_t(next_launch_++)];
      if (s.range.numel() == 0) continue;
      const int64_t len = s.range.numel();
      kernels::copy(s.full.flat(0, len), grads_.flat(s.range.begin, len));
      if (s.full.numel() > len) kernels::fill_zero(s.full.flat(len, s.full.numel() - len));
      s.scatter = shard_->reduce_scatter_async(s.full, s.chunk, ReduceOp::avg);
      count(s.full);
    }
  }

  // Replica all-reduces of the owned chunks, in group order, each once its reduce-scatter is done.
  void launch_replica_reduces() {
    while (next_replica_ < next_launch_) {
      Group& s = state_[size_t(next_replica_)];
      if (s.scatter && !s.scatter->done()) return;
      if (s.scatter && replicas_->size() > 1) {
        s.replica = replicas_->all_reduce_async(s.chunk, ReduceOp::avg);
        count(s.chunk);
      }
      ++next_replica_;
    }
  }

  Tensor params_, grads_;
  std::vector<std::vector<int>> groups_;
  std::unique_ptr<Comm> shard_, replicas_;
  bool first_copy_ = false;
  std::vector<FlatRange> ranges_, owned_;
  kernels::Buffer scratch_;
  std::vector<Group> state_;
  std::vector<char> ready_;
  int next_launch_ = 0, next_replica_ = 0;
  bool step_started_ = false;
  double step_start_ = 0;
  GradBucketStats stats_;
};

}  // namespace

std::vector<FlatRange> group_flat_ranges(const std::vector<ParamRange>& param_ranges,
                                         const std::vector<std::vector<int>>& groups) {
  std::vector<FlatRange> out;
  for (const auto& g : groups) {
    FlatRange r{INT64_MAX, 0};
    for (int p : g) {
      const ParamRange& pr = param_ranges[size_t(p)];
      if (pr.numel == 0) continue;
      r.begin = std::min(r.begin, pr.offset);
      r.end = std::max(r.end, pr.offset + pr.numel);
    }
    out.push_back(r.end == 0 ? FlatRange{} : r);
  }
  return out;
}

int64_t sharded_scratch_numel(const std::vector<FlatRange>& group_ranges, int shard_size) {
  int64_t total = 0;
  for (const FlatRange& g : group_ranges) {
    const int64_t chunk = (g.numel() + shard_size - 1) / shard_size;
    total += chunk * shard_size + chunk;
  }
  return total;
}

std::unique_ptr<GradSync> make_grad_sync(int zero_stage, Comm& dp, GradSyncLayout layout, double bucket_mb,
                                         int zero_group) {
  LT_CHECK(layout.params.numel() == layout.grads.numel(), "parameters {} and gradients {}", layout.params.numel(),
           layout.grads.numel());
  for (const auto& g : layout.groups)
    for (int p : g)
      LT_CHECK(p >= 0 && p < static_cast<int>(layout.param_ranges.size()), "parameter {} of {} in a group", p,
               layout.param_ranges.size());
  if (zero_stage >= 2)
    throw Error(
        fmt::format("not supported yet: parallel.zero {} (ZeRO stage 1 works; stages 2 and 3 are planned)", zero_stage),
        "set parallel.zero: 1 (or 0)");
  if (zero_stage == 0) return std::make_unique<AllReduceGradSync>(dp, std::move(layout), bucket_mb);
  if (zero_group == 0) zero_group = dp.size();
  LT_CHECK(zero_group >= 1 && dp.size() % zero_group == 0, "zero_group {} does not divide dp {}", zero_group,
           dp.size());
  return std::make_unique<ShardedGradSync>(dp, std::move(layout), zero_group);
}

}  // namespace llmtrain::parallel
