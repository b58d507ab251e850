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

// ZeRO stage 1 (make_grad_sync in grad_sync.h): per sharding unit, a reduce-scatter over the
// shard group launched as the unit's gradient is final, then (hybrid) an all-reduce of the owned
// chunk over the replicas; all-gathers of the updated chunks in gather_params(). Each unit has its
// own scratch: `full` (the padded unit) and `chunk` (one chunk), so that padding never touches the
// neighbouring unit's elements and every operation of a step can be in flight at once.
class ShardedGradSync final : public GradSync {
 public:
  ShardedGradSync(Comm& dp, GradSyncLayout layout, double bucket_mb, int zero_group)
      : params_(layout.params), grads_(layout.grads), groups_(std::move(layout.groups)) {
    const int n = zero_group;
    const int shard_index = dp.rank() % n, replica = dp.rank() / n;
    shard_ = dp.split(replica, dp.rank(), dp.name() + " shard");
    replicas_ = dp.split(shard_index, dp.rank(), dp.name() + " replica");
    first_copy_ = replica == 0;
    const std::vector<ShardUnit> units =
        shard_units(layout.param_ranges, groups_, bucket_mb, kernels::dtype_size(grads_.dtype));
    std::vector<FlatRange> sorted;
    for (const ShardUnit& u : units)
      if (u.range.numel() > 0) sorted.push_back(u.range);
    std::sort(sorted.begin(), sorted.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < sorted.size(); ++i)
      LT_CHECK(sorted[i - 1].end <= sorted[i].begin,
               "parameter groups overlap in the flat buffer: [{}, {}) and [{}, {})", sorted[i - 1].begin,
               sorted[i - 1].end, sorted[i].begin, sorted[i].end);
    scratch_ = kernels::Buffer(grads_.dtype, {std::max<int64_t>(sharded_scratch_numel(units, n), 1)}, grads_.device,
                               kernels::MemoryKind::communication);
    unit_of_.assign(groups_.size(), -1);
    int64_t at = 0;
    for (const ShardUnit& u : units) {
      Unit s;
      s.range = u.range;
      s.groups = u.end_group - u.first_group;
      for (int g = u.first_group; g < u.end_group; ++g) unit_of_[size_t(g)] = static_cast<int>(state_.size());
      s.chunk_numel = (u.range.numel() + n - 1) / n;
      const int64_t padded = s.chunk_numel * n;
      s.full = scratch_.tensor().flat(at, padded);
      s.chunk = scratch_.tensor().flat(at + padded, s.chunk_numel);
      at += padded + s.chunk_numel;
      const int64_t b = std::min(u.range.end, u.range.begin + shard_index * s.chunk_numel);
      s.own = {b, std::min(u.range.end, b + s.chunk_numel)};
      if (s.own.numel() > 0) owned_.push_back(s.own);
      state_.push_back(std::move(s));
    }
    std::sort(owned_.begin(), owned_.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
    ready_.assign(groups_.size(), 0);
    rearm();
  }

  void group_ready(int group, bool last_micro_batch) override {
    LT_CHECK(group >= 0 && group < static_cast<int>(groups_.size()), "parameter group {} of {}", group, groups_.size());
    if (!last_micro_batch) return;  // accumulation continues in place
    LT_CHECK(!ready_[size_t(group)], "parameter group {} ready twice in one step", group);
    if (!step_started_) step_started_ = true, step_start_ = now_s();
    ready_[size_t(group)] = 1;
    --state_[size_t(unit_of_[size_t(group)])].pending;
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
    for (size_t g = 0; g < groups_.size(); ++g)  // every gradient is final by now
      if (!ready_[g]) {
        ready_[g] = 1;
        --state_[size_t(unit_of_[g])].pending;
      }
    launch_ready();
    for (Unit& s : state_) {
      if (s.scatter) s.scatter->wait();
      launch_replica_reduces();
    }
    for (Unit& s : state_) {
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
    rearm();
  }

  const std::vector<FlatRange>& owned() const override { return owned_; }
  bool shards_over_dp() const override { return true; }
  bool first_copy() const override { return first_copy_; }

  void gather_params() override {
    std::vector<WorkHandle> work;
    for (Unit& s : state_) {
      if (s.range.numel() == 0) continue;
      kernels::fill_zero(s.chunk);
      if (s.own.numel() > 0) kernels::copy(s.chunk.flat(0, s.own.numel()), params_.flat(s.own.begin, s.own.numel()));
      work.push_back(shard_->all_gather_async(s.chunk, s.full));
      count(s.full);
    }
    wait_all(work);
    for (Unit& s : state_)
      if (s.range.numel() > 0)
        kernels::copy(params_.flat(s.range.begin, s.range.numel()), s.full.flat(0, s.range.numel()));
  }

  const GradBucketStats& stats() const override { return stats_; }

 private:
  struct Unit {
    FlatRange range;          // the unit's elements in the flat buffers
    FlatRange own;            // this rank's chunk of it (possibly short or empty: padding)
    int64_t chunk_numel = 0;  // padded unit / shard size
    int groups = 0, pending = 0;
    Tensor full, chunk;  // scratch
    WorkHandle scatter, replica;
  };

  void count(const Tensor& t) {
    ++stats_.buckets;
    stats_.bytes += t.numel() * static_cast<int64_t>(kernels::dtype_size(t.dtype));
  }

  void rearm() {
    std::fill(ready_.begin(), ready_.end(), 0);
    for (Unit& s : state_) s.pending = s.groups;
    next_launch_ = next_replica_ = 0;
    step_started_ = false;
  }

  // Reduce-scatters, strictly in unit order (collectives start in the same order on every rank).
  void launch_ready() {
    const int n = static_cast<int>(state_.size());
    while (next_launch_ < n && state_[size_t(next_launch_)].pending == 0) {
      Unit& s = state_[size_t(next_launch_++)];
      if (s.range.numel() == 0) continue;
      const int64_t len = s.range.numel();
      kernels::copy(s.full.flat(0, len), grads_.flat(s.range.begin, len));
      if (s.full.numel() > len) kernels::fill_zero(s.full.flat(len, s.full.numel() - len));
      s.scatter = shard_->reduce_scatter_async(s.full, s.chunk, ReduceOp::avg);
      count(s.full);
    }
  }

  // Replica all-reduces of the owned chunks, in unit order, each once its reduce-scatter is done.
  void launch_replica_reduces() {
    while (next_replica_ < next_launch_) {
      Unit& s = state_[size_t(next_replica_)];
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
  std::vector<FlatRange> owned_;
  kernels::Buffer scratch_;
  std::vector<Unit> state_;
  std::vector<int> unit_of_;  // per group
  std::vector<char> ready_;   // per group, this step
  int next_launch_ = 0, next_replica_ = 0;
  bool step_started_ = false;
  double step_start_ = 0;
  GradBucketStats stats_;
};

}  // namespace

std::vector<ShardUnit> shard_units(const std::vector<ParamRange>& param_ranges,
                                   const std::vector<std::vector<int>>& groups, double bucket_mb, size_t element_size) {
  LT_CHECK(bucket_mb > 0, "bucket_mb {}", bucket_mb);
  const auto cap = static_cast<int64_t>(bucket_mb * 1024 * 1024);
  const auto esz = static_cast<int64_t>(element_size);
  std::vector<ShardUnit> out;
  for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
    FlatRange r{INT64_MAX, 0};
    for (int p : groups[size_t(g)]) {
      const ParamRange& pr = param_ranges[size_t(p)];
      if (pr.numel == 0) continue;
      r.begin = std::min(r.begin, pr.offset);
      r.end = std::max(r.end, pr.offset + pr.numel);
    }
    if (r.end == 0) r = {};
    bool join = !out.empty();
    if (join) {
      const FlatRange& u = out.back().range;
      join = r.numel() == 0 || u.numel() == 0 || (u.numel() * esz < cap && r.end == u.begin);
    }
    if (!join) {
      out.push_back({r, g, g + 1});
      continue;
    }
    ShardUnit& u = out.back();
    u.end_group = g + 1;
    if (r.numel() > 0) u.range = u.range.numel() == 0 ? r : FlatRange{r.begin, u.range.end};
  }
  return out;
}

int64_t sharded_scratch_numel(const std::vector<ShardUnit>& units, int shard_size) {
  int64_t total = 0;
  for (const ShardUnit& u : units) {
    const int64_t chunk = (u.range.numel() + shard_size - 1) / shard_size;
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
  return std::make_unique<ShardedGradSync>(dp, std::move(layout), bucket_mb, zero_group);
}

}  // namespace llmtrain::parallel
