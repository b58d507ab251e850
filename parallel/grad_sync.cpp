#include "parallel/grad_sync.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/clock.h"
#include "common/error.h"
#include "kernels/buffer.h"
#include "kernels/ops.h"

namespace llmtrain::parallel {
namespace {

// ZeRO stage 0: every rank keeps the whole gradient and the whole optimizer state; gradients are
// averaged by bucketed all-reduces, each launched as soon as backward has finished every parameter
// in it on the step's last micro-batch.
class AllReduceGradSync final : public GradSync {
 public:
  AllReduceGradSync(Comm& dp, GradSyncLayout layout, double bucket_mb)
      : numel_(layout.params.numel()),
        grads_(layout.grads),
        groups_(std::move(layout.groups)),
        buckets_(dp, layout.grads, std::move(layout.param_ranges), bucket_mb, layout.accumulate),
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
  Tensor group_grads(int) override { return {}; }
  Tensor owned_grads() const override { return grads_; }
  bool grads_compact() const override { return false; }
  Tensor group_params(int, bool) override { return {}; }
  void group_params_done(int) override {}
  Tensor owned_params() const override { return {}; }
  bool params_compact() const override { return false; }
  const GradBucketStats& stats() const override { return buckets_.stats(); }
  bool set_reduced_hook(std::function<void(FlatRange)> hook) override {
    buckets_.set_reduced_hook([hook = std::move(hook)](int64_t offset, int64_t numel) {
      hook({offset, offset + numel});
    });
    return true;
  }

 private:
  int64_t numel_;
  Tensor grads_;
  std::vector<std::vector<int>> groups_;
  GradBuckets buckets_;
  std::vector<FlatRange> owned_;
  bool first_copy_;
};

// ZeRO stages 1, 2 and 3 (make_grad_sync in grad_sync.h). Every stage reduce-scatters a unit's
// gradient through a slot of a small pool as soon as backward completes the unit, and retiring it
// (in launch order: on progress() once done, when a slot is needed, or in finish()) frees the slot.
// Stage 1: backward accumulates into the model's flat gradient buffer; on the step's last
// micro-batch a completed unit is copied into a slot and reduce-scattered, and retiring it copies
// the averaged chunk back into the flat buffer's owned range. Stages 2 and 3: there is no flat
// gradient buffer; backward writes each unit's gradient for one micro-batch straight into a slot
// (group_grads), it is reduce-scattered on every micro-batch, and retiring it adds the chunk into
// the owned shard. Every rank launches and
// retires the same units in the same order, so the replica all-reduces (hybrid sharding) start in
// the same order everywhere. With shard_params (stage 3) there is no flat parameter buffer either:
// the owned values live in owned_params_, and group_params gathers units into a second pool whose
// slots keep their unit until reused (param_slot_of_) or until gather_params() after an update.
class GradShardSync final : public GradSync {
 public:
  GradShardSync(Comm& dp, GradSyncLayout layout, double bucket_mb, int zero_group, int stage)
      : params_(layout.params),
        flat_grads_(layout.grads),
        groups_(std::move(layout.groups)),
        stage_(stage),
        shard_params_(stage == 3),
        owned_values_(layout.owned_values) {
    LT_CHECK(owned_values_ == nullptr || shard_params_, "owned values elsewhere at ZeRO stage {}", stage);
    const int n = zero_group;
    const int shard_index = dp.rank() % n, replica = dp.rank() / n;
    shard_ = dp.split(replica, dp.rank(), dp.name() + " shard");
    LT_CHECK(shard_->rank() == shard_index, "rank {} of the shard group at index {}", shard_->rank(), shard_index);
    replicas_ = dp.split(shard_index, dp.rank(), dp.name() + " replica");
    first_copy_ = replica == 0;
    // 16-bit parameters: backward writes (and the pool reduces) 16-bit gradients, and at stage 3
    // the units are gathered as 16-bit values; the owned gradient shard the optimizer reads and
    // stage 3's owned values (the master weights) stay fp32.
    storage_ = layout.dtype;
    average_ = Reduction(ReduceOp::avg, layout.accumulate);
    LT_CHECK(!layout.params.defined() || layout.params.dtype == storage_, "parameters of {} for a {} layout",
             kernels::to_string(layout.params.dtype), kernels::to_string(storage_));
    LT_CHECK(!layout.grads.defined() || layout.grads.dtype == storage_, "gradients of {} for a {} layout",
             kernels::to_string(layout.grads.dtype), kernels::to_string(storage_));
    const std::vector<ShardUnit> units =
        shard_units(layout.param_ranges, groups_, bucket_mb, kernels::dtype_size(storage_));
    group_range_.assign(groups_.size(), FlatRange{});
    for (size_t g = 0; g < groups_.size(); ++g) {
      FlatRange r{INT64_MAX, 0};
      for (int p : groups_[g]) {
        const ParamRange& pr = layout.param_ranges[size_t(p)];
        if (pr.numel == 0) continue;
        r.begin = std::min(r.begin, pr.offset);
        r.end = std::max(r.end, pr.offset + pr.numel);
      }
      if (r.end > 0) group_range_[g] = r;
    }
    unit_of_.assign(groups_.size(), -1);
    for (const ShardUnit& u : units) {
      Unit s;
      s.range = u.range;
      for (int g = u.first_group; g < u.end_group; ++g) {
        unit_of_[size_t(g)] = static_cast<int>(state_.size());
        if (group_range_[size_t(g)].numel() > 0) ++s.groups;
      }
      s.chunk_numel = (u.range.numel() + n - 1) / n;
      const int64_t b = std::min(u.range.end, u.range.begin + shard_index * s.chunk_numel);
      s.own = {b, std::min(u.range.end, b + s.chunk_numel)};
      if (s.own.numel() > 0) owned_.push_back(s.own);
      state_.push_back(std::move(s));
    }
    std::sort(owned_.begin(), owned_.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
    for (Unit& s : state_) {  // the own chunk's place in the compact owned shard
      int64_t at = 0;
      for (const FlatRange& o : owned_) {
        if (o == s.own) break;
        at += o.numel();
      }
      s.compact = at;
    }
    const int64_t owned_numel = parallel::owned_numel(units, n, shard_index);
    const kernels::Device device = layout.device;
    if (stage_ >= 2) {
      owned_buf_ = kernels::Buffer(kernels::DType::fp32, {std::max<int64_t>(owned_numel, 1)}, device,
                                   kernels::MemoryKind::gradients);
      owned_grads_ = owned_buf_.tensor().flat(0, owned_numel);
    } else {
      owned_grads_ = flat_grads_;
    }
    // Stages 2 and 3 hold the held group's unit in a slot through a whole pass: it gets its own.
    if (stage_ >= 2 && layout.held_group >= 0) {
      held_unit_ = unit_of_group(units, layout.held_group);
      if (held_unit_ >= 0 && state_[size_t(held_unit_)].range.numel() == 0) held_unit_ = -1;
    }
    int slots = 0;
    int64_t full = 0, chunk = 0, held_full = 0;
    for (size_t k = 0; k < state_.size(); ++k) {
      const Unit& s = state_[k];
      if (s.range.numel() == 0) continue;
      chunk = std::max(chunk, s.chunk_numel);
      if (int(k) == held_unit_) {
        held_full = s.chunk_numel * n;
        continue;
      }
      ++slots;
      full = std::max(full, s.chunk_numel * n);
    }
    pool_ = kernels::Buffer(storage_, {std::max<int64_t>(grad_pool_numel(units, n, held_unit_), 1)}, device,
                            kernels::MemoryKind::communication);
    // 16-bit at stages 2 and 3: a retired chunk is widened here before it is added into the fp32
    // owned shard (stage 1 copies it back into the 16-bit flat buffer as it is).
    if (storage_ != kernels::DType::fp32 && stage_ >= 2)
      wide_chunk_ = kernels::Buffer(kernels::DType::fp32, {std::max<int64_t>(chunk, 1)}, device,
                                    kernels::MemoryKind::communication);
    slots_ = pool_slots<Slot>(pool_.tensor(), std::min(slots, kGradPoolSlots), full, held_full);
    if (shard_params_ && owned_values_) {
      // Offloaded: one unit's owned chunk at a time, taken from the store (through host memory), the
      // next one read ahead.
      owned_params_buf_ =
          kernels::Buffer(kernels::DType::fp32, {std::max<int64_t>(chunk, 1)}, device, kernels::MemoryKind::parameters);
      if (device != kernels::Device::cpu)
        owned_host_ = kernels::Buffer(kernels::DType::fp32, {std::max<int64_t>(chunk, 1)}, kernels::Device::cpu,
                                      kernels::MemoryKind::other);
    } else if (shard_params_) {
      owned_params_buf_ = kernels::Buffer(kernels::DType::fp32, {std::max<int64_t>(owned_numel, 1)}, device,
                                          kernels::MemoryKind::parameters);
      owned_params_ = owned_params_buf_.tensor().flat(0, owned_numel);
    }
    if (shard_params_) {
      param_pool_ = kernels::Buffer(storage_, {std::max<int64_t>(param_pool_numel(units, n, held_unit_), 1)}, device,
                                    kernels::MemoryKind::communication);
      param_slots_ = pool_slots<ParamSlot>(param_pool_.tensor(), std::min(slots, kParamPoolSlots), full, held_full);
      param_slot_of_.assign(state_.size(), -1);
    }
    in_flight_.reserve(slots_.size());
    gathering_.assign(slots_.size(), -1);
    ready_.assign(groups_.size(), 0);
    rearm();
  }

  Tensor group_grads(int group) override {
    LT_CHECK(group >= 0 && group < static_cast<int>(groups_.size()), "parameter group {} of {}", group, groups_.size());
    if (stage_ == 1) return {};  // backward accumulates into the flat gradient buffer
    if (!step_started_) {
      step_started_ = true, step_start_ = now_s();
      kernels::fill_zero(owned_grads_);
    }
    Unit& u = state_[size_t(unit_of_[size_t(group)])];
    if (u.slot < 0) take_slot(u, unit_of_[size_t(group)]);
    const FlatRange& r = group_range_[size_t(group)];
    return slots_[size_t(u.slot)].full.flat(r.begin - u.range.begin, r.numel());
  }

  void group_ready(int group, bool last_micro_batch) override {
    LT_CHECK(group >= 0 && group < static_cast<int>(groups_.size()), "parameter group {} of {}", group, groups_.size());
    last_micro_batch_ = last_micro_batch;
    if (stage_ == 1) {
      if (!last_micro_batch) return;  // accumulation continues in the flat buffer
      LT_CHECK(!ready_[size_t(group)], "parameter group {} ready twice in one step", group);
      if (!step_started_) step_started_ = true, step_start_ = now_s();
      ready_[size_t(group)] = 1;
      if (group_range_[size_t(group)].numel() > 0) complete_group(group);
      return;
    }
    complete_group(group);
  }

  void progress() override {
    shard_->progress();
    replicas_->progress();
    // Retiring blocks on the replicas' all-reduce under hybrid sharding. At stage 3, where forward
    // and backward also block on gathers, every blocking wait must sit at the same point of the
    // program on every rank (or ranks could wait on each other in a cycle): retire only when a slot
    // is needed or in finish(). Stage 1, which runs beside pipeline sends and receives, never
    // blocks before finish().
    if (stage_ == 2 || replicas_->size() == 1)
      while (!in_flight_.empty() && slots_[size_t(in_flight_.front())].scatter->done()) retire_oldest();
    if (stage_ == 1) launch_waiting(false);
  }

  void finish() override {
    if (owned_values_) owned_values_->drop();  // the optimizer's update comes next: no read beside it
    if (!step_started_) step_started_ = true, step_start_ = now_s();
    const double t0 = now_s();
    if (stage_ == 1)  // a gradient backward never reported is final by now too
      for (size_t g = 0; g < groups_.size(); ++g)
        if (!ready_[g]) {
          ready_[g] = 1;
          if (group_range_[g].numel() > 0) complete_group(int(g));
        }
    launch_waiting(true);
    while (!in_flight_.empty()) retire_oldest();
    for (const Slot& sl : slots_) LT_CHECK(sl.unit < 0, "sharding unit {} never completed by backward", sl.unit);
    const double t1 = now_s();
    stats_.add_step(t1 - t0, t1 - step_start_);
    rearm();
  }

  const std::vector<FlatRange>& owned() const override { return owned_; }
  bool shards_over_dp() const override { return true; }
  bool first_copy() const override { return first_copy_; }
  UnitShards shards_at(int64_t offset) const override {
    const int n = shard_->size();
    if (n <= 1) return {};
    for (const Unit& s : state_) {
      if (offset < s.range.begin || offset >= s.range.end) continue;
      UnitShards out{shard_.get(), {}};
      for (int q = 0; q < n; ++q) {  // as the constructor cuts the unit
        const int64_t b = std::min(s.range.end, s.range.begin + q * s.chunk_numel);
        out.chunks.push_back({b, std::min(s.range.end, b + s.chunk_numel)});
      }
      return out;
    }
    LT_CHECK(false, "flat element {} is in none of the {} sharding units", offset, state_.size());
    return {};
  }
  Tensor owned_grads() const override { return owned_grads_; }
  bool grads_compact() const override { return stage_ >= 2; }
  Tensor owned_params() const override { return owned_params_; }
  bool params_compact() const override { return shard_params_; }

  Tensor group_params(int group, bool backward) override {
    LT_CHECK(shard_params_, "group_params without sharded parameters (stage 3)");
    LT_CHECK(group >= 0 && group < static_cast<int>(groups_.size()), "parameter group {} of {}", group, groups_.size());
    const FlatRange& r = group_range_[size_t(group)];
    if (r.numel() == 0) return {};
    const int unit = unit_of_[size_t(group)];
    int i = param_slot_of_[size_t(unit)];
    if (i < 0) {
      i = free_param_slot(unit);
      LT_CHECK(i >= 0, "every parameter pool slot is held (unit {} requested)", unit);
      launch_gather(unit, i);
    }
    ParamSlot& ps = param_slots_[size_t(i)];
    ++ps.holds;
    ps.used = ++clock_;
    // The next unit in the caller's direction, gathered while this one computes.
    const int step = backward ? 1 : -1;
    int next = unit + step;
    while (next >= 0 && next < int(state_.size()) && state_[size_t(next)].range.numel() == 0) next += step;
    if (next >= 0 && next < int(state_.size()) && param_slot_of_[size_t(next)] < 0) {
      const int j = free_param_slot(next);
      if (j >= 0) launch_gather(next, j);
    }
    // Offloaded values: the unit after that one read while these compute.
    if (owned_values_ && next >= 0 && next < int(state_.size())) {
      int after = next + step;
      while (after >= 0 && after < int(state_.size()) && state_[size_t(after)].range.numel() == 0) after += step;
      if (after >= 0 && after < int(state_.size()) && param_slot_of_[size_t(after)] < 0 &&
          state_[size_t(after)].own.numel() > 0)
        owned_values_->ahead(after, state_[size_t(after)].compact, state_[size_t(after)].own.numel());
    }
    if (ps.gather) {
      ps.gather->wait();
      ps.gather.reset();
    }
    return ps.full.flat(r.begin - state_[size_t(unit)].range.begin, r.numel());
  }

  void group_params_done(int group) override {
    LT_CHECK(group >= 0 && group < static_cast<int>(groups_.size()), "parameter group {} of {}", group, groups_.size());
    if (group_range_[size_t(group)].numel() == 0) return;
    const int i = param_slot_of_[size_t(unit_of_[size_t(group)])];
    LT_CHECK(i >= 0 && param_slots_[size_t(i)].holds > 0, "parameter group {} released but not held", group);
    --param_slots_[size_t(i)].holds;
    progress();  // between layers: lets the next unit's gather (and launched reductions) advance
  }

  // Stages 1 and 2: all-gathers of the updated chunks through the pool's slots, unit by unit (a slot is
  // reused once its all-gather is done and copied out). Stage 3: the gathered copies are stale;
  // the next group_params gathers again.
  void gather_params() override {
    if (owned_values_) owned_values_->drop();  // read before the update
    if (shard_params_) {
      for (ParamSlot& ps : param_slots_) {
        LT_CHECK(ps.holds == 0, "unit {} still held after the step", ps.unit);
        if (ps.gather) ps.gather->wait();
        ps.gather.reset();
        if (ps.unit >= 0) param_slot_of_[size_t(ps.unit)] = -1;
        ps.unit = -1;
      }
      return;
    }
    std::vector<int>& unit_in = gathering_;  // per slot: the unit whose all-gather it holds
    std::fill(unit_in.begin(), unit_in.end(), -1);
    size_t next = 0;
    const size_t shared = slots_.size() - (held_unit_ >= 0 ? 1 : 0);
    auto drain = [&](size_t i) {
      if (unit_in[i] < 0) return;
      const Unit& u = state_[size_t(unit_in[i])];
      slots_[i].scatter->wait();
      slots_[i].scatter.reset();
      kernels::copy(params_.flat(u.range.begin, u.range.numel()), slots_[i].full.flat(0, u.range.numel()));
      unit_in[i] = -1;
    };
    for (size_t k = 0; k < state_.size(); ++k) {
      const Unit& u = state_[k];
      if (u.range.numel() == 0) continue;
      const size_t i = int(k) == held_unit_ ? shared : next++ % shared;
      drain(i);
      Slot& sl = slots_[i];
      Tensor chunk = own_block(sl.full, u);
      if (u.own.numel() < u.chunk_numel) kernels::fill_zero(chunk.flat(u.own.numel(), u.chunk_numel - u.own.numel()));
      if (u.own.numel() > 0) kernels::copy(chunk.flat(0, u.own.numel()), params_.flat(u.own.begin, u.own.numel()));
      const int64_t padded = u.chunk_numel * shard_->size();
      sl.scatter = shard_->all_gather_async(chunk, sl.full.flat(0, padded));
      count(padded, kernels::dtype_size(storage_));
      unit_in[i] = int(k);
    }
    for (size_t i = 0; i < slots_.size(); ++i) drain(i);
  }

  const GradBucketStats& stats() const override { return stats_; }
  bool set_reduced_hook(std::function<void(FlatRange)> hook) override {
    reduced_hook_ = std::move(hook);
    return true;
  }

 private:
  struct Unit {
    FlatRange range;          // the unit's elements in the flat parameter buffer
    FlatRange own;            // this rank's chunk of it (possibly short or empty: padding)
    int64_t chunk_numel = 0;  // padded unit / shard size
    int64_t compact = 0;      // where `own` starts in the owned shard
    int groups = 0;           // groups with elements
    int pending = 0;          // of those, not yet completed in this micro-batch
    int slot = -1;            // the pool slot holding its gradient while backward writes it
  };
  struct Slot {
    Tensor full;    // the largest padded unit (the held unit's own slot: that unit's size)
    int unit = -1;  // the unit it holds (-1: free)
    WorkHandle scatter;
    bool last = false;  // the scatter is of the step's last micro-batch (its chunk is final once retired)
  };
  struct ParamSlot {
    Tensor full;        // as Slot
    int unit = -1;      // the unit whose values it holds or is gathering (-1: none)
    int holds = 0;      // groups of that unit between group_params and group_params_done
    uint64_t used = 0;  // when last requested or launched: the least recent free slot is reused
    WorkHandle gather;  // in flight
  };
  // `count` shared slots of `full` elements carved from a pool, at i·full, then (held_full > 0) the
  // held unit's own slot of held_full elements after them (grad_pool_numel's layout).
  template <typename S>
  static std::vector<S> pool_slots(const Tensor& pool, int count, int64_t full, int64_t held_full) {
    std::vector<S> out(size_t(std::max(count, 0)));
    for (size_t i = 0; i < out.size(); ++i) out[i].full = pool.flat(int64_t(i) * full, full);
    if (held_full > 0) out.emplace_back().full = pool.flat(int64_t(count) * full, held_full);
    return out;
  }

  // This rank's chunk of unit u inside a slot: its own block of the padded unit, where the
  // collectives run in place (an all-gather's input, a reduce-scatter's output).
  Tensor own_block(const Tensor& full, const Unit& u) const {
    return full.flat(int64_t(shard_->rank()) * u.chunk_numel, u.chunk_numel);
  }

  // A free gradient slot for unit `index` (retiring the oldest reduction while none is free),
  // zeroed over the padded unit: the held unit's own slot (the last), or a shared one.
  void take_slot(Unit& u, int index) {
    const bool held = index == held_unit_;
    const size_t shared = slots_.size() - (held_unit_ >= 0 ? 1 : 0);
    int free = -1;
    while (free < 0) {
      if (held && slots_.back().unit < 0) free = int(shared);
      for (size_t i = 0; !held && i < shared && free < 0; ++i)
        if (slots_[i].unit < 0) free = int(i);
      if (free >= 0) break;
      LT_CHECK(!in_flight_.empty(), "every gradient pool slot is held by a unit backward has not completed");
      retire_oldest();
    }
    u.slot = free;
    Slot& sl = slots_[size_t(free)];
    sl.unit = index;
    kernels::fill_zero(sl.full.flat(0, u.chunk_numel * shard_->size()));
  }

  // Group `group` (with elements) is complete for this micro-batch (stage 1: for the step). When
  // it completes its unit, stages 2 and 3 launch the unit's reduce-scatter from the slot backward
  // wrote it into. Stage 1 launches completed units strictly in unit order, each copied into a slot
  // once one is free (launch_waiting: stage 1 never blocks in backward, where pipeline ranks may be
  // waiting on each other's sends).
  void complete_group(int group) {
    const int index = unit_of_[size_t(group)];
    Unit& u = state_[size_t(index)];
    LT_CHECK(u.pending > 0 && (stage_ == 1 || u.slot >= 0), "parameter group {} ready without its gradients", group);
    if (--u.pending > 0 || stage_ == 1) {
      if (stage_ == 1) progress();
      return;
    }
    // Units complete in unit order within a micro-batch (groups are numbered in backward order).
    while (state_[size_t(next_launch_)].groups == 0) next_launch_ = (next_launch_ + 1) % int(state_.size());
    LT_CHECK(index == next_launch_, "sharding unit {} completed before unit {}", index, next_launch_);
    next_launch_ = (next_launch_ + 1) % int(state_.size());
    u.pending = u.groups;
    launch_scatter(u);
    progress();
  }

  void launch_scatter(Unit& u) {
    Slot& sl = slots_[size_t(u.slot)];
    const int64_t padded = u.chunk_numel * shard_->size();
    sl.scatter = shard_->reduce_scatter_async(sl.full.flat(0, padded), own_block(sl.full, u), average_);
    sl.last = stage_ == 1 || last_micro_batch_;  // stage 1 reduces once, after the last micro-batch
    count(padded, wire_element_size(average_, storage_));
    in_flight_.push_back(u.slot);
    u.slot = -1;
  }

  // Stage 1: launches the completed units, in unit order up to the first incomplete one, while a
  // slot is free (or, `block`, retiring the oldest reduction to free one).
  void launch_waiting(bool block) {
    for (; next_launch_ < int(state_.size()); ++next_launch_) {
      Unit& u = state_[size_t(next_launch_)];
      if (u.groups == 0) continue;
      if (u.pending > 0) return;
      bool free = false;
      for (const Slot& sl : slots_) free = free || sl.unit < 0;
      if (!free && !block) return;
      take_slot(u, next_launch_);
      kernels::copy(slots_[size_t(u.slot)].full.flat(0, u.range.numel()),
                    flat_grads_.flat(u.range.begin, u.range.numel()));
      launch_scatter(u);
    }
  }

  // A slot for `unit` that no group holds: the held unit's own (the last slot), else a shared one
  // without a unit, else the least recently used (its gather, if a prefetch nobody asked for yet,
  // completed first); -1 when every shared slot is held.
  int free_param_slot(int unit) {
    const size_t shared = param_slots_.size() - (held_unit_ >= 0 ? 1 : 0);
    if (unit == held_unit_) {
      LT_CHECK(param_slots_.back().holds == 0 && !param_slots_.back().gather, "the held unit {} gathered twice", unit);
      return int(shared);
    }
    int best = -1;
    for (size_t i = 0; i < shared; ++i) {
      const ParamSlot& ps = param_slots_[i];
      if (ps.holds > 0) continue;
      if (ps.unit < 0) return int(i);
      if (best < 0 || ps.used < param_slots_[size_t(best)].used) best = int(i);
    }
    if (best >= 0 && param_slots_[size_t(best)].gather) {
      param_slots_[size_t(best)].gather->wait();
      param_slots_[size_t(best)].gather.reset();
    }
    return best;
  }

  // Starts gathering `unit`'s values into slot i (dropping the unit it held).
  void launch_gather(int unit, int i) {
    ParamSlot& ps = param_slots_[size_t(i)];
    if (ps.unit >= 0) param_slot_of_[size_t(ps.unit)] = -1;
    const Unit& u = state_[size_t(unit)];
    Tensor chunk = own_block(ps.full, u);  // in place: the rest of the slot is the other ranks'
    if (u.own.numel() < u.chunk_numel) kernels::fill_zero(chunk.flat(u.own.numel(), u.chunk_numel - u.own.numel()));
    // The owned fp32 values, rounded once where the pool is 16-bit (offloaded: read from the store).
    const int64_t n = u.own.numel();
    if (n > 0 && owned_values_) {
      const Tensor values = owned_params_buf_.tensor().flat(0, n);
      const Tensor host = owned_host_.data() ? owned_host_.tensor().flat(0, n) : values;
      owned_values_->take(unit, u.compact, host);
      if (owned_host_.data()) kernels::copy(values, host);
      kernels::convert(chunk.flat(0, n), values);
    } else if (n > 0) {
      kernels::convert(chunk.flat(0, n), owned_params_.flat(u.compact, n));
    }
    const int64_t padded = u.chunk_numel * shard_->size();
    ps.gather = shard_->all_gather_async(chunk, ps.full.flat(0, padded));
    count(padded, kernels::dtype_size(storage_));
    ps.unit = unit;
    ps.used = ++clock_;
    param_slot_of_[size_t(unit)] = i;
  }

  // One collective of `elements`, each moving `wire_size` bytes.
  void count(int64_t elements, size_t wire_size) {
    ++stats_.buckets;
    stats_.bytes += elements * static_cast<int64_t>(wire_size);
  }

  void rearm() {
    for (Unit& s : state_) s.pending = s.groups, s.slot = -1;
    std::fill(ready_.begin(), ready_.end(), 0);
    next_launch_ = 0;
    step_started_ = false;
  }

  // Completes the oldest launched reduction: its chunk (averaged over the replicas under hybrid
  // sharding) is added into the owned shard (stage 1: copied into the flat buffer's owned range)
  // and its slot freed.
  void retire_oldest() {
    const int i = in_flight_.front();
    in_flight_.erase(in_flight_.begin());
    Slot& sl = slots_[size_t(i)];
    const Unit& u = state_[size_t(sl.unit)];
    sl.scatter->wait();
    sl.scatter.reset();
    Tensor chunk = own_block(sl.full, u);
    if (replicas_->size() > 1) {
      replicas_->all_reduce_async(chunk, average_)->wait();
      count(u.chunk_numel, wire_element_size(average_, storage_));
    }
    if (u.own.numel() > 0 && stage_ == 1) {
      kernels::copy(flat_grads_.flat(u.own.begin, u.own.numel()), chunk.flat(0, u.own.numel()));
    } else if (u.own.numel() > 0) {
      Tensor acc = owned_grads_.flat(u.compact, u.own.numel());
      Tensor add = chunk.flat(0, u.own.numel());
      if (storage_ != kernels::DType::fp32) {
        kernels::convert(wide_chunk_.tensor().flat(0, u.own.numel()), add);
        add = wide_chunk_.tensor().flat(0, u.own.numel());
      }
      kernels::residual_forward(acc.view({1, u.own.numel()}), acc.view({1, u.own.numel()}),
                                add.view({1, u.own.numel()}), Tensor{});
    }
    sl.unit = -1;
    if (sl.last && reduced_hook_ && u.own.numel() > 0)
      reduced_hook_(stage_ == 1 ? u.own : FlatRange{u.compact, u.compact + u.own.numel()});
  }

  Tensor params_, flat_grads_;  // the flat buffers (flat_grads_: stage 1 only; params_: not stage 3)
  std::vector<std::vector<int>> groups_;
  int stage_ = 1;
  bool shard_params_ = false;
  std::vector<FlatRange> group_range_;  // per group: its first to its last element
  std::unique_ptr<Comm> shard_, replicas_;
  bool first_copy_ = false;
  std::vector<FlatRange> owned_;
  kernels::Buffer owned_buf_, pool_, wide_chunk_;
  kernels::DType storage_ = kernels::DType::fp32;  // of the pool (and the parameters at stage 2)
  Reduction average_ = ReduceOp::avg;              // of the gradients (GradSyncLayout::accumulate)
  Tensor owned_grads_;
  std::vector<Unit> state_;
  std::vector<Slot> slots_;
  std::vector<int> in_flight_;                     // slots whose reduce-scatter was launched, oldest first
  std::vector<int> gathering_;                     // gather_params' per-slot units
  std::vector<int> unit_of_;                       // per group
  std::vector<char> ready_;                        // stage 1: per group, final this step
  kernels::Buffer owned_params_buf_, param_pool_;  // stage 3 (offloaded: owned_params_buf_ is one chunk)
  Tensor owned_params_;
  OwnedValues* owned_values_ = nullptr;  // GradSyncLayout::owned_values
  kernels::Buffer owned_host_;           // offloaded on a device: the chunk's way there
  std::vector<ParamSlot> param_slots_;
  std::vector<int> param_slot_of_;  // per unit: the param slot holding it (-1: none)
  int held_unit_ = -1;              // the held group's unit (stages 2, 3), whose slot is the last of each pool
  uint64_t clock_ = 0;
  int next_launch_ = 0;
  bool step_started_ = false;
  bool last_micro_batch_ = false;                // of the latest group_ready
  std::function<void(FlatRange)> reduced_hook_;  // set_reduced_hook's
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

namespace {

// `max_slots` (or fewer other units) slots of the largest padded unit other than `held_unit`,
// and that unit's own padded size (none when it has no elements).
int64_t pool_numel(const std::vector<ShardUnit>& units, int shard_size, int max_slots, int held_unit) {
  int slots = 0;
  int64_t full = 0, held = 0;
  for (size_t k = 0; k < units.size(); ++k) {
    const ShardUnit& u = units[k];
    if (u.range.numel() == 0) continue;
    const int64_t padded = (u.range.numel() + shard_size - 1) / shard_size * shard_size;
    if (int(k) == held_unit) {
      held = padded;
      continue;
    }
    ++slots;
    full = std::max(full, padded);
  }
  return int64_t(std::min(slots, max_slots)) * full + held;
}

}  // namespace

int unit_of_group(const std::vector<ShardUnit>& units, int group) {
  for (size_t k = 0; k < units.size(); ++k)
    if (group >= units[k].first_group && group < units[k].end_group) return int(k);
  return -1;
}

int64_t grad_pool_numel(const std::vector<ShardUnit>& units, int shard_size, int held_unit) {
  return pool_numel(units, shard_size, kGradPoolSlots, held_unit);
}

int64_t param_pool_numel(const std::vector<ShardUnit>& units, int shard_size, int held_unit) {
  return pool_numel(units, shard_size, kParamPoolSlots, held_unit);
}

int64_t owned_numel(const std::vector<ShardUnit>& units, int shard_size, int shard_index) {
  int64_t owned = 0;
  for (const ShardUnit& u : units) {
    const int64_t n = u.range.numel(), chunk = (n + shard_size - 1) / shard_size;
    owned += std::max<int64_t>(0, std::min(n, int64_t(shard_index + 1) * chunk) - int64_t(shard_index) * chunk);
  }
  return owned;
}

namespace {

// [a ∩ b] of two ascending lists of disjoint ranges.
std::vector<FlatRange> intersect(const std::vector<FlatRange>& a, const std::vector<FlatRange>& b) {
  std::vector<FlatRange> out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].begin, b[j].begin), hi = std::min(a[i].end, b[j].end);
    if (lo < hi) out.push_back({lo, hi});
    (a[i].end < b[j].end ? i : j) += 1;
  }
  return out;
}

// make_expert_grad_sync's: two syncs, each over its own parameters of the same flat buffers.
class ExpertGradSync final : public GradSync {
 public:
  ExpertGradSync(std::unique_ptr<GradSync> dense, std::unique_ptr<GradSync> experts,
                 std::vector<FlatRange> expert_ranges, Tensor grads, int ep)
      : dense_(std::move(dense)),
        experts_(std::move(experts)),
        expert_ranges_(std::move(expert_ranges)),
        grads_(grads),
        ep_(ep) {
    const int64_t numel = grads.numel();
    LT_CHECK(ep >= 1, "ep {}", ep);
    LT_CHECK(!dense_->grads_compact() && !experts_->grads_compact() && !dense_->params_compact() &&
                 !experts_->params_compact(),
             "the expert-parallel sync at a ZeRO stage that holds compact shards");
    std::vector<FlatRange> rest;  // [0, numel) outside the experts' ranges
    int64_t at = 0;
    for (const FlatRange& r : expert_ranges_) {
      LT_CHECK(r.begin >= at && r.end >= r.begin && r.end <= numel, "expert range [{}, {}) after {} of {}", r.begin,
               r.end, at, numel);
      if (r.begin > at) rest.push_back({at, r.begin});
      at = r.end;
    }
    if (at < numel) rest.push_back({at, numel});
    owned_ = intersect(dense_->owned(), rest);
    const std::vector<FlatRange> mine = intersect(experts_->owned(), expert_ranges_);
    owned_.insert(owned_.end(), mine.begin(), mine.end());
    std::sort(owned_.begin(), owned_.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
    expert_owned_ = mine;
  }

  void group_ready(int group, bool last_micro_batch) override {
    dense_->group_ready(group, last_micro_batch);
    experts_->group_ready(group, last_micro_batch);
  }
  void progress() override {
    dense_->progress();
    experts_->progress();
  }
  void finish() override {
    dense_->finish();
    experts_->finish();
    // Each rank's expert gradient is its ep group's sum (every token of the group that chose the
    // expert); the edp average of those is ep times the dp × cp average a dense gradient gets.
    if (ep_ > 1)
      for (const FlatRange& r : expert_owned_) kernels::scale(grads_.flat(r.begin, r.numel()), 1.0f / float(ep_));
  }
  const std::vector<FlatRange>& owned() const override { return owned_; }
  bool shards_over_dp() const override { return true; }
  bool first_copy() const override { return dense_->first_copy(); }
  bool first_copy_at(int64_t offset) const override {
    return in_experts(offset) ? experts_->first_copy() : dense_->first_copy();
  }
  UnitShards shards_at(int64_t offset) const override {
    return (in_experts(offset) ? experts_ : dense_)->shards_at(offset);
  }
  void gather_params() override {
    dense_->gather_params();
    experts_->gather_params();
  }
  Tensor group_grads(int) override { return {}; }
  Tensor owned_grads() const override { return dense_->owned_grads(); }  // the flat gradient buffer
  bool grads_compact() const override { return false; }
  Tensor group_params(int, bool) override { return {}; }
  void group_params_done(int) override {}
  Tensor owned_params() const override { return {}; }
  bool params_compact() const override { return false; }
  const GradBucketStats& stats() const override {
    const GradBucketStats &a = dense_->stats(), &b = experts_->stats();
    stats_ = a;  // steps and spans: the dense sync's; launches, bytes and exposed time: both
    stats_.buckets += b.buckets;
    stats_.bytes += b.bytes;
    stats_.exposed_s += b.exposed_s;
    stats_.last_exposed_s += b.last_exposed_s;
    return stats_;
  }

 private:
  bool in_experts(int64_t offset) const {
    const auto at = std::upper_bound(expert_ranges_.begin(), expert_ranges_.end(), offset,
                                     [](int64_t x, const FlatRange& r) { return x < r.end; });
    return at != expert_ranges_.end() && at->begin <= offset;
  }
  std::unique_ptr<GradSync> dense_, experts_;
  std::vector<FlatRange> expert_ranges_;
  Tensor grads_;
  int ep_;
  std::vector<FlatRange> owned_, expert_owned_;
  mutable GradBucketStats stats_;
};

}  // namespace

std::unique_ptr<GradSync> make_expert_grad_sync(std::unique_ptr<GradSync> dense, std::unique_ptr<GradSync> experts,
                                                std::vector<FlatRange> expert_ranges, Tensor grads, int ep) {
  return std::make_unique<ExpertGradSync>(std::move(dense), std::move(experts), std::move(expert_ranges), grads, ep);
}

std::unique_ptr<GradSync> make_grad_sync(int zero_stage, Comm& dp, GradSyncLayout layout, double bucket_mb,
                                         int zero_group) {
  LT_CHECK(zero_stage >= 2 || layout.params.numel() == layout.grads.numel(), "parameters {} and gradients {}",
           layout.params.numel(), layout.grads.numel());
  LT_CHECK(zero_stage >= 0 && zero_stage <= 3, "parallel.zero {}", zero_stage);
  for (const auto& g : layout.groups)
    for (int p : g)
      LT_CHECK(p >= 0 && p < static_cast<int>(layout.param_ranges.size()), "parameter {} of {} in a group", p,
               layout.param_ranges.size());
  if (zero_stage == 0) return std::make_unique<AllReduceGradSync>(dp, std::move(layout), bucket_mb);
  LT_CHECK(zero_group >= 1 && dp.size() % zero_group == 0, "zero_group {} does not divide dp {}", zero_group,
           dp.size());
  return std::make_unique<GradShardSync>(dp, std::move(layout), bucket_mb, zero_group, zero_stage);
}

}  // namespace llmtrain::parallel
