// Gradient synchronization over the data-parallel group: one interface, one implementation per
// ZeRO stage (llm.c's zero.cuh: one call decides all-reduce or reduce-scatter). The model, the
// pipeline schedule and the training step never ask which stage is in use.
//
// One optimizer step, as the training step drives it:
//   group_ready(g, last)   backward has finished parameter group g for a micro-batch; `last` when
//                          it was the step's last micro-batch (g's gradient is then final)
//   progress()             between pieces of work: lets launched reductions advance
//   finish()               every reduction of the step completes; the owned() ranges of the
//                          gradient buffer then hold the data-parallel average
//   (the optimizer updates the owned() ranges of the parameter buffer)
//   gather_params()        every rank's whole parameter buffer is current again
//
// At stage 2 backward also asks group_grads(g) where to write group g's gradients for the current
// micro-batch (the model's grad-storage hook) before it writes any of them, and the gradients the
// optimizer reads after finish() are owned_grads(), compact.
//
// At stage 3 forward and backward also ask group_params(g, backward) for group g's values before
// they read them (the model's param-storage hook) and say group_params_done(g) after; the values
// the optimizer updates are owned_params(), compact (packed as owned_grads()), and gather_params()
// moves no data.
//
// Rules a reader could get wrong:
//  - Parameter groups are numbered in the order backward completes them, and every rank marks the
//    same groups; a group is a set of parameters (indices into the forward-order list), e.g. one
//    transformer block. The grouping is the trainer's (trainer/loop/train_step.cpp), the buckets are ours.
//  - owned() is the list of flat ranges of the parameter and gradient buffers this rank's optimizer
//    updates (and holds optimizer state for), ascending and disjoint: one range, the whole buffer,
//    at stage 0; under ZeRO one chunk of every sharding unit (see make_grad_sync). Outside
//    owned(), gradients after finish() are unspecified.
//  - shards_over_dp(): whether data-parallel ranks hold different parts of the gradient after
//    finish(). The global gradient norm sums squares of owned() over the model-parallel group, and
//    also over the data-parallel group when this is true.
//  - first_copy(): whether this rank is the lowest data-parallel rank holding its owned() ranges
//    (dp rank 0 at stage 0; a rank of the first shard group under ZeRO). Only such ranks count
//    their squares in the global norm when shards_over_dp(), and write their optimizer state to a
//    checkpoint: every element then counts once per model replica.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "parallel/comm/comm.h"
#include "parallel/grad_buckets.h"

namespace llmtrain::parallel {

// [begin, end) in elements of a flat buffer.
struct FlatRange {
  int64_t begin = 0, end = 0;
  int64_t numel() const { return end - begin; }
  bool operator==(const FlatRange&) const = default;
};

class GradSync {
 public:
  virtual ~GradSync() = default;

  virtual void group_ready(int group, bool last_micro_batch) = 0;
  virtual void progress() = 0;
  virtual void finish() = 0;
  virtual const std::vector<FlatRange>& owned() const = 0;
  virtual bool shards_over_dp() const = 0;
  virtual bool first_copy() const = 0;
  // Whether this rank is the first copy of the owned element at flat `offset` (first_copy(), except
  // in the expert-parallel sync, whose experts' first copies are those of their own replicas).
  virtual bool first_copy_at(int64_t offset) const {
    (void)offset;
    return first_copy();
  }
  virtual void gather_params() = 0;
  // Under ZeRO, the sharding unit holding flat element `offset`: the shard group whose ranks own its
  // chunks, and each rank's chunk of it (rank order; together the unit), whether this rank owns any
  // of `offset`'s or not. Group null where this rank owns its units whole (stage 0, a shard group of
  // one). Muon gathers a cut matrix's update over it (trainer/optim/muon.h).
  struct UnitShards {
    Comm* group = nullptr;
    std::vector<FlatRange> chunks;
  };
  virtual UnitShards shards_at(int64_t offset) const {
    (void)offset;
    return {};
  }

  // Stage 2: a zeroed view of pooled scratch, in the parameter buffer's dtype (fp32, or 16-bit:
  // reduced as 16-bit, widened into the fp32 owned shard), covering group g's flat range (its first to its
  // last element) for the current micro-batch, valid until group_ready(g, ...). Undefined at
  // stages 0 and 1: backward accumulates into the model's flat gradient buffer.
  virtual Tensor group_grads(int group) = 0;
  // What the optimizer and the norm read after finish(): the flat gradient buffer (stages 0 and 1),
  // or, when grads_compact(), only the owned() ranges, packed (owned()[0]'s elements, then
  // owned()[1]'s, ...), as AdamW packs its moments.
  virtual Tensor owned_grads() const = 0;
  virtual bool grads_compact() const = 0;

  // Stage 3: a view of group g's values (its flat range) all-gathered into a pool slot, valid
  // until the matching group_params_done(g). `backward`: the caller walks the groups in group
  // order (backward), else in the reverse (forward); the next unit's gather is launched before
  // this returns, when a slot is free. Undefined at stages 0-2: the model has its own values.
  virtual Tensor group_params(int group, bool backward) = 0;
  virtual void group_params_done(int group) = 0;
  // Where the values live at stage 3: the owned() ranges, packed as owned_grads() (params_compact());
  // undefined at stages 0-2 (the layout's flat parameter buffer).
  virtual Tensor owned_params() const = 0;
  virtual bool params_compact() const = 0;

  // Communication that backward did not hide (the time spent in finish()), for the metrics.
  virtual const GradBucketStats& stats() const = 0;

  // hook(r): range r of owned_grads() (in its coordinates: flat at stages 0 and 1, packed at 2 and
  // 3) holds this step's final average — a bucket's (stage 0) or a unit's chunk (stages 1-3, after
  // the last micro-batch's reduction) — and the work that made it is queued on the compute stream
  // before the call. Called during backward as reductions complete (progress(), group_ready()) and
  // for the rest in finish(), in order; every owned element is reported once per step. The hook
  // may queue reads of r on another stream that waits for the compute stream (the CPU update's
  // gradient copies). Returns false where gradients still change in finish() after their reduction
  // (the expert-parallel sync divides its experts'): nothing is reported.
  virtual bool set_reduced_hook(std::function<void(FlatRange)> hook) {
    (void)hook;
    return false;
  }
};

// Where stage 3 finds its owned values when they are not in the sync's memory (GradSyncLayout::
// owned_values). The sync takes a unit's chunk of the compact owned values when it gathers the
// unit (and, on a device, copies it there), says beforehand which unit it will gather after the
// current one so that its chunk can be read ahead, and says when the values are about to change.
class OwnedValues {
 public:
  virtual ~OwnedValues() = default;
  // Unit `unit`'s chunk, elements [begin, begin + n) of the compact owned values, may be read now:
  // the sync takes it after the unit it gathers now.
  virtual void ahead(int unit, int64_t begin, int64_t n) = 0;
  // Unit `unit`'s chunk [begin, begin + out.numel()) into the host fp32 tensor `out`.
  virtual void take(int unit, int64_t begin, Tensor out) = 0;
  // The values change next (finish(): the optimizer's update comes; gather_params(): it came):
  // nothing read before may be taken after.
  virtual void drop() = 0;
};

struct GradSyncLayout {
  Tensor params;                                  // the flat parameter buffer (undefined at stage 3)
  Tensor grads;                                   // the flat gradient buffer, same layout (undefined at stages 2, 3)
  std::vector<ParamRange> param_ranges;           // every parameter's range, in forward order
  std::vector<std::vector<int>> groups;           // group -> parameters (indices into param_ranges)
  kernels::Device device = kernels::Device::cpu;  // where stages 2 and 3 allocate their shards and pools
  // The model's parameter and gradient dtype: stages 2 and 3 pool (and gather) in it; their owned
  // gradient shard and stage 3's owned values (the fp32 master) stay fp32.
  kernels::DType dtype = kernels::DType::fp32;
  // How 16-bit gradients are averaged (parallel.grad_reduce_dtype): widened and summed in fp32, or
  // (Accumulate::in_dtype) as 16-bit words, each addition rounded (half the bytes).
  Accumulate accumulate = Accumulate::fp32;
  // A group whose unit holds its pool slots through a whole forward or backward (-1: none): a tied
  // word embedding's where this stage holds both ends (trainer::held_group). At stages 2 and 3 that
  // unit gets a slot of its own in each pool, of its own size, so that the two shared slots still
  // give every other unit one in use and one in flight.
  int held_group = -1;
  // Stage 3 with parallel.offload_params: the owned values live elsewhere (the optimizer's offload
  // store, trainer/optim/value_reader.h), not in the sync's memory; owned_params() is then undefined.
  // Not owned: it must outlive the sync.
  OwnedValues* owned_values = nullptr;
};

// The implementation of `zero_stage` over the data-parallel group `dp` (which, like the buffers,
// must outlive it). Collective over `dp` (stage 1 splits it).
//  - Stage 0: bucketed all-reduces launched as groups complete (GradBuckets).
//  - Stage 1: optimizer state sharded within shard groups of `zero_group` consecutive dp ranks
//    (0 = the whole dp group; it must divide dp). Parameter groups are merged into sharding units
//    as stage 0 packs buckets (shard_units: consecutive groups whose flat ranges are adjacent,
//    until a unit holds `bucket_mb` MiB). Each unit's flat range is padded to a multiple of
//    zero_group and cut in zero_group equal chunks; a rank owns chunk (its index in the shard
//    group) of every unit. When a unit's gradient is final, it is copied into a slot of a small
//    pool of kGradPoolSlots unit-sized slots (grad_pool_numel, communication memory) and
//    reduce-scattered (avg) over the shard group in place (the result lands in this rank's own
//    block of the slot), then (zero_group < dp: hybrid sharding) that chunk is all-reduced (avg)
//    over the dp / zero_group ranks of the same index in the other shard groups, and copied back
//    into the owned range of the flat gradient buffer; gather_params() all-gathers every unit's
//    chunks over the shard group through the same slots, in place (this rank's chunk is written
//    into its own block of the slot). Units start strictly in unit order; a unit waits (never
//    blocking backward) until a slot is free.
//  - Stage 2: stage 1's units, chunks, ownership and pool, but no flat gradient buffer: each unit's
//    gradient for one micro-batch is written straight into a slot of the pool, reduce-
//    scattered (then hybrid all-reduced) as soon as backward completes the unit, on every
//    micro-batch, and its chunk added into the owned shard (owned_grads), which is all the gradient
//    memory a rank keeps between micro-batches. A unit waits for a slot when every slot is taken
//    (the oldest reduction is then completed first). gather_params() all-gathers through the pool.
//    The held group's unit (GradSyncLayout::held_group: a tied embedding's, written from the head's
//    backward until the embedding's) has a slot of its own beside the kGradPoolSlots shared ones.
//  - Stage 3: stage 2, and the parameters sharded the same way: the sync owns the values of its
//    owned() ranges (owned_params(), which AdamW updates in place) and no rank holds the whole
//    buffer. group_params(g) all-gathers g's unit over the shard group (in place: this rank's chunk
//    is written into its own block of the slot) into a slot of a pool of kParamPoolSlots unit-sized
//    slots (param_pool_numel; the held group's unit has its own slot beside them) and launches the
//    gather of the next unit in the caller's direction into a free slot, so that it overlaps g's
//    compute (FSDP's two: the unit in use and the one prefetched); a slot is free
//    once every group of its unit is done, and keeps its unit's values (a later request for the
//    same unit gathers nothing) until the slot is reused or gather_params() drops them after the
//    optimizer's update. Under hybrid sharding the replicas update identical shards, so gathers
//    run over the shard group only. Every rank requests the same groups in the same order, so
//    the collectives start in the same order everywhere.
// `dp` is every rank holding the same parameters (the dp × cp group with context parallelism).
// `zero_group`: the consecutive ranks of it one shard group spans at stages 1-3 (Layout::shard_group:
// the whole group unless the recipe's parallel.zero_group says fewer dp ranks, times cp); ignored at
// stage 0.
std::unique_ptr<GradSync> make_grad_sync(int zero_stage, Comm& dp, GradSyncLayout layout, double bucket_mb,
                                         int zero_group);

// Expert parallelism with sharded experts (Layout::experts_sharded): the one sync of two over the
// same flat buffers — `dense` over dp × cp (every parameter but the experts') and `experts` over the
// expert-data-parallel group (this rank's experts, which its dp × cp peers of other ep indices do
// not hold). Stages 0 and 1 only (the model keeps both flat buffers). Each group is passed to both
// (a group's parameters are in one of the two, each knowing its own); owned() is dense's owned
// elements outside `expert_ranges` and experts' inside them, ascending; shards_over_dp() is true
// (ranks of one dp × cp group hold different experts) and first_copy_at() answers with the owning
// sync's first_copy(); first_copy() is dense's. `expert_ranges`: the experts' flat ranges,
// ascending and disjoint, inside the flat gradient buffer `grads`. finish() divides the owned
// expert gradients by `ep`: each rank's is the sum over its ep group's tokens, so their edp average
// is ep times the dp × cp average of a dense gradient.
std::unique_ptr<GradSync> make_expert_grad_sync(std::unique_ptr<GradSync> dense, std::unique_ptr<GradSync> experts,
                                                std::vector<FlatRange> expert_ranges, Tensor grads, int ep);

// Stage 1's sharding units: groups [first_group, end_group) (consecutive in group order) and the
// flat range they cover. A group's range runs from its first to its last element; a group joins
// the unit before it while that unit holds less than `bucket_mb` MiB of `element_size` elements
// and the group's range ends where the unit's begins (or either is empty).
struct ShardUnit {
  FlatRange range;
  int first_group = 0, end_group = 0;
  bool operator==(const ShardUnit&) const = default;
};
std::vector<ShardUnit> shard_units(const std::vector<ParamRange>& param_ranges,
                                   const std::vector<std::vector<int>>& groups, double bucket_mb, size_t element_size);

// The unit holding group `group` (-1: none, or the group is -1), e.g. GradSyncLayout::held_group's.
int unit_of_group(const std::vector<ShardUnit>& units, int group);

// In elements: the gradient pool of stages 1-3 (communication memory), and the owned shard of rank
// `shard_index` in its shard group (stage 2's and 3's gradient memory, and stage 3's parameter
// memory). The pool is kGradPoolSlots (or fewer units) slots each of the largest unit padded to a
// multiple of `shard_size` (collectives run in place: a rank's chunk is its own block of the slot),
// and, when `held_unit` >= 0 (stages 2 and 3 with a held group: unit_of_group(units,
// held_group)), one more slot of that unit's own padded size, the largest then taken over the
// others. The memory plan counts exactly these.
inline constexpr int kGradPoolSlots = 2;
int64_t grad_pool_numel(const std::vector<ShardUnit>& units, int shard_size, int held_unit);
int64_t owned_numel(const std::vector<ShardUnit>& units, int shard_size, int shard_index);

// Stage 3's gathered parameters, in elements: kParamPoolSlots (or fewer units) slots of the largest
// padded unit, plus the held unit's own slot as in grad_pool_numel (communication memory, like the
// gradient pool: the ZeRO paper's model states are the owned shards). The memory plan counts
// exactly these.
inline constexpr int kParamPoolSlots = 2;
int64_t param_pool_numel(const std::vector<ShardUnit>& units, int shard_size, int held_unit);

}  // namespace llmtrain::parallel
