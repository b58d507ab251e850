// AdamW over ranges of the flat parameter/gradient buffers, and the global gradient norm for
// clipping. Under ZeRO a rank runs the same code on the ranges it owns (GradSync::owned()).
//
// Rules a reader could get wrong:
//  - Weight decay is decoupled (p -= lr·wd·p) and applies only to ranges whose parameters'
//    ParamSpec says weight_decay (matrices and embeddings; not biases or norm weights).
//  - The step count is the number of updates taken; the k-th update (k = 1, 2, ...) uses bias
//    corrections 1 - β^k, exactly as torch.optim.AdamW.
//  - Clipping multiplies the gradient inside the update (grad_scale); the gradient buffer itself
//    is not modified.
//  - optimizer.state_dtype bf16: the moments are bf16 arrays, each element read into fp32, updated
//    there and stored rounded to nearest even (kernels::adamw_rows); the master stays fp32.
//  - optimizer.master false (bf16 parameters only, not at ZeRO 3 nor offloaded): no master; the
//    update reads each bf16 parameter into fp32 and stores it back rounded stochastically, with
//    random bits hashed from the seed (set_rounding: train.seed), the update count and the
//    element's index (RoundingRange: by parameter name, so every copy of a value rounds alike;
//    kernels/adamw_math.h), so a run is the same bits for a given recipe and layout and resumes
//    bitwise. Checkpoints hold the bf16 values widened to fp32.
//  - 16-bit parameters (train.precision bf16/fp16): AdamW keeps an fp32 MASTER copy of the owned
//    ranges, packed like the moments (so ZeRO 1 shards it with them). step() updates the master
//    from the gradients (16-bit or fp32) and writes it, rounded once, into the owned ranges of the
//    parameter buffer; the caller then gathers the parameters as for fp32. Checkpoints save the
//    master (checkpoint_slices). With fp32 parameters there is no master: the parameters are it;
//    nor at ZeRO 3, whose compact owned values (GradSync::owned_params) are fp32 and are the master.
//  - Offloaded (parallel.offload, trainer/optim/offload.h) the moments and the master live in an
//    OffloadStore, not in Buffers: step() and the master's conversions go through it a unit at a
//    time (the same arithmetic element by element: bitwise the in-memory update), exp_avg(),
//    exp_avg_sq() and master() do not exist, and checkpoints move the state with read_state and
//    write_state. With OffloadConfig::params (ZeRO 3, parallel.offload_params) the owned parameter
//    values themselves are the store's third array, in the master's place: has_master() is true,
//    step() ignores `params` (the update goes to the store; there is nothing to round into), and the
//    gradient sync reads a unit's values from the store when it gathers it. With
//    OffloadConfig::cpu_update (`host` on a cuda rank) the update runs on the CPU: every unit's
//    gradients are copied into page-locked memory, AdamW (the CPU kernel, all cores) updates the
//    page-locked state unit by unit as its gradients arrive, and each unit's updated values go back
//    to the device behind it; such an AdamW always keeps a master (fp32 training too: the
//    parameters' fp32 copy on the host). The copies of a unit start during backward once the
//    gradient sync reports all of its gradients reduced (gradients_final); the update itself waits
//    for step() unless the step armed update_as_gradients_arrive, whose thread then updates each
//    unit as it arrives. That thread touches only units whose gradients are final: their parameters
//    are not read again in the step, so their values may go up while backward runs.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/recipe/recipe.h"
#include "kernels/buffer.h"
#include "parallel/grad_sync.h"
#include "trainer/model/model.h"
#include "trainer/optim/muon.h"
#include "trainer/optim/offload.h"

namespace llmtrain::kernels {
struct AdamWStep;
}

namespace llmtrain::trainer {

// A contiguous range [begin, end) of the flat buffers whose parameters share one decay setting.
struct DecayRange {
  int64_t begin = 0, end = 0;
  bool decay = false;
};

// The model's parameters as maximal decay ranges, in flat-buffer order, covering every element.
std::vector<DecayRange> decay_ranges(const std::vector<ModelParam>& params);

// optimizer.master false: where each parameter's stochastic-rounding indices start. Element
// `begin + i` of the flat buffer rounds with index `base + i`, `base` hashed from the parameter's
// name and its tensor-parallel shard, so that every copy of a value — data-parallel and
// tensor-parallel replicas, and a tied embedding's copy on the last pipeline stage, which sits at
// another flat offset — takes the same random bits and the copies stay equal.
struct RoundingRange {
  int64_t begin = 0, end = 0;
  uint64_t base = 0;
};
std::vector<RoundingRange> rounding_ranges(const std::vector<ModelParam>& params);

class AdamW {
 public:
  // Owns the moments of the `owned` ranges of the flat buffers (ascending, disjoint), kept compact:
  // the moments of owned[0], then of owned[1], ... `ranges` describe the whole buffer (from
  // decay_ranges).
  // `param_dtype`: the parameter buffer's dtype; a 16-bit one gets an fp32 master copy (unless
  // config.master is false: then it is bf16, updated in place).
  // `device`: where the moments and the master live (the parameters' and gradients' device).
  // `offload`: where the moments and the master live instead (kind none: `device`).
  AdamW(const OptimizerConfig& config, std::vector<DecayRange> ranges, std::vector<parallel::FlatRange> owned,
        kernels::DType param_dtype = kernels::DType::fp32, kernels::Device device = kernels::Device::cpu,
        const OffloadConfig& offload = {});
  ~AdamW();

  // One update of the owned ranges: params and grads are the WHOLE flat buffers (only the owned
  // ranges are read or written), or with compact_grads (ZeRO 2) grads holds only the owned ranges,
  // packed as the moments are, and with compact_params (ZeRO 3) params too. grad_scale multiplies
  // the gradients first (clip factor, or 1). One kernels::adamw_rows call: every (owned range,
  // decay range) overlap, cut at kernels::kSquaresChunk, as a table built at the first step (and
  // again only if the compact flags change).
  void step(kernels::Tensor params, kernels::Tensor grads, double lr, float grad_scale, bool compact_grads = false,
            bool compact_params = false);

  // optimizer.name muon: these matrices (ascending, each inside one owned range, whole) take Muon's
  // update (trainer/optim/muon.h) at step()'s lr and optimizer.weight_decay, their momentum in
  // exp_avg() at their state offsets (and their fp32 master in master()); the other ranges take
  // AdamW's at lr · adamw_lr_ratio and adamw_weight_decay. exp_avg_sq() still spans the matrices
  // (4 bytes an element of fp32 state Muon does not use: its compaction is not built yet).
  // `tp`: where the partial sums of tensor-parallel matrices are reduced (MuonMatrix::split).
  // `shards` (empty, or one per matrix): under ZeRO the shard group and chunks of matrix i's sharding
  // unit (GradSync::shards_at; group null: owned whole). Such a matrix may meet the owned ranges in
  // one piece or none; each shard group's cut matrices take muon_sharded_step in batches of the
  // group's size, every rank of it taking part in each.
  void set_muon(const MuonSettings& settings, std::vector<MuonMatrix> matrices, double adamw_lr_ratio,
                double adamw_weight_decay, const MuonGroup& tp = {},
                std::vector<parallel::GradSync::UnitShards> shards = {});
  // Whether flat element `at` belongs to one of Muon's matrices.
  bool muon_owns(int64_t at) const;
  bool uses_muon() const { return !muon_.empty(); }
  // optimizer.master false: the seed of the bf16 parameters' stochastic rounding, and where each
  // parameter's indices start (without ranges, an element's index is its flat offset).
  void set_rounding(uint64_t seed, std::vector<RoundingRange> ranges);
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }  // when restoring a checkpoint
  kernels::Tensor exp_avg() const;                   // first moment, [owned_numel()], compact (not offloaded)
  kernels::Tensor exp_avg_sq() const;                // second moment
  // The moments' dtype in memory (optimizer.state_dtype): fp32, or bf16 (read_state and write_state
  // convert to and from fp32).
  kernels::DType state_dtype() const;
  const std::vector<parallel::FlatRange>& owned() const { return owned_; }
  int64_t owned_numel() const { return numel_; }
  // 16-bit parameters: the fp32 master of the owned ranges, [owned_numel()] packed as the moments.
  bool has_master() const { return has_master_; }
  // The master's array is ZeRO 3's owned parameter values (OffloadConfig::params).
  bool params_offloaded() const { return params_offloaded_; }
  // The update runs on the CPU over page-locked state (OffloadConfig::cpu_update).
  bool updates_on_cpu() const { return cpu_update_; }
  // cpu_update: [begin, end) of `grads` holds this step's final gradients (reduced: the gradient
  // sync's reduced hook, parallel::GradSync::set_reduced_hook), made by work queued on the compute
  // stream so far. `params`, `grads` and the flags are what step() will get. Each unit whose
  // gradients are then all final starts down to page-locked memory at once, on a copy stream of its
  // own, overlapped with the rest of backward; step() only waits for those.
  void gradients_final(int64_t begin, int64_t end, kernels::Tensor params, kernels::Tensor grads, bool compact_grads,
                       bool compact_params);
  // Before a step's backward: nothing final yet (copies a skipped step started are waited for).
  void gradients_begin();
  // cpu_update, when the coming step() is known before backward ends — no clipping (grad_scale 1),
  // no loss scaling, and a non-finite step stops the run (it is never skipped): `lr` and the
  // arguments step() will get. Each unit whose gradients reach page-locked memory is updated at once
  // by a CPU thread of the optimizer's own, overlapped with the rest of backward, and its values go
  // up behind it; step() updates what is left and waits. Bitwise the update step() alone would make.
  // For the coming step only (called after gradients_begin).
  void update_as_gradients_arrive(kernels::Tensor params, kernels::Tensor grads, double lr, bool compact_grads,
                                  bool compact_params);
  // This step's units updated so far by update_as_gradients_arrive's thread (their values on their
  // way up).
  int64_t units_updated() const;
  // cpu_update: how many units' gradients are on their way down this step (gradients_final started
  // them; the update copies the others itself).
  int64_t units_streamed() const;
  kernels::Tensor master() const;
  // The state offloaded (parallel.offload): its store, or null.
  OffloadStore* offload_store() const { return store_.get(); }
  // Elements [at, at + n) of one of the state's arrays (its packed offsets, as state_offset gives) to
  // or from a host fp32 tensor of n elements, offloaded or not (checkpoints).
  enum class State { exp_avg = 0, exp_avg_sq = 1, master = 2 };
  void read_state(State which, int64_t at, kernels::Tensor host) const;
  void write_state(State which, int64_t at, kernels::Tensor host) const;  // the state, not the object: as exp_avg()
  // The master from the owned ranges of the WHOLE flat parameter buffer (after initialisation),
  // and back, rounded (after loading the master from a checkpoint). No-ops without a master.
  void master_from_params(kernels::Tensor params);
  void params_from_master(kernels::Tensor params);
  // Where flat element `at` (inside an owned range) has its moments in exp_avg(); -1 outside.
  int64_t state_offset(int64_t at) const;

 private:
  OptimizerConfig config_;
  std::vector<DecayRange> ranges_;
  std::vector<parallel::FlatRange> owned_;
  int64_t steps_ = 0, numel_ = 0;
  uint64_t rounding_seed_ = 0;
  std::vector<RoundingRange> rounding_;  // ascending by begin
  bool has_master_ = false, params_offloaded_ = false, cpu_update_ = false;
  bool rounds_stochastically_ = false;  // bf16 parameters without a master: rows cut at rounding_
  double timeout_s_ = 300;
  struct HostUpdate;
  std::unique_ptr<HostUpdate> host_;  // cpu_update: the page-locked gradients and values, and their copies
  kernels::Device device_;
  kernels::Buffer m_, v_, master_;       // in memory
  std::unique_ptr<OffloadStore> store_;  // or offloaded: arrays State::exp_avg, exp_avg_sq (, master)
  bool master_set_ = false;              // by master_from_params or params_from_master, before the first step
  kernels::Buffer rows_;                 // adamw_rows' table, int64 [rows, 6] on the moments' device
  int rows_for_ = -1;                    // the compact flags it was built for (compact_grads + 2 · compact_params)
  int64_t row_count_ = 0;                // its rows (the buffer holds at least one)
  std::vector<MuonMatrix> muon_;         // set_muon's matrices, ascending
  // And the cut ones by shard group, in the order of their first matrix: the group, and the matrices
  // (indices into muon_) with every rank's piece of each.
  struct MuonShardGroup {
    parallel::Comm* group = nullptr;
    std::vector<size_t> matrices;
    std::vector<std::vector<parallel::FlatRange>> pieces;
  };
  std::vector<MuonShardGroup> muon_sharded_;
  std::vector<bool> muon_cut_;  // per matrix of muon_: in muon_sharded_
  MuonSettings muon_settings_;
  MuonGroup muon_tp_;
  double adamw_lr_ratio_ = 1, adamw_weight_decay_ = 0;
  std::unique_ptr<MuonWorkspace> workspace_;
  // Offloaded: rows_ cut at the store's units, unit u's rows from unit_first_[u] to unit_first_[u+1],
  // their state (and master) offsets counted from the unit's first element.
  std::vector<int64_t> unit_first_;

  const kernels::Buffer& rows(bool compact_grads, bool compact_params, int64_t params_numel, int64_t grads_numel);
  kernels::Tensor state_tensor(State which) const;
  void cpu_step(kernels::Tensor params, kernels::Tensor grads, const kernels::AdamWStep& s);
  void cpu_update_unit(int64_t u, const kernels::AdamWStep& s);  // unit u's state and values, on the CPU
  void wait_arrived(int64_t u) const;
  void copy_down(int64_t u, kernels::Tensor grads);  // unit u's gradients, on the compute stream
  void end_cpu_update();
  void eager_step_end(kernels::Tensor grads, const kernels::AdamWStep& s);
  void muon_step(kernels::Tensor params, kernels::Tensor grads, double lr, float grad_scale, bool compact_grads,
                 bool compact_params);
  // The flat elements [begin, end) of [lo, hi) this rank owns: one piece of at most one owned range.
  parallel::FlatRange owned_piece(int64_t lo, int64_t hi) const;
  // fn(state offset, flat offset, n) for the owned elements whose state lies in [begin, end).
  template <typename Fn>
  void for_each_owned(int64_t begin, int64_t end, Fn&& fn) const;
};

// Σ g² over this rank's gradients, counting each global parameter element once per model
// replica: tensor-parallel replicated parameters only on tp rank 0 (and replicated key/value
// heads only on the first rank holding them: ModelParam::tp_replica), and the last stage's copy of
// a tied embedding not at all (its gradient equals the first stage's after their all-reduce).
// Only elements inside `owned` count (the ranges this rank's optimizer updates; under ZeRO each
// data-parallel rank holds the reduced gradient of its shard only). The caller all-reduces the sum
// over every group that splits parameters (parallel/grad_sync.h), then takes the square root.
// `compact_grads`, when defined, holds the owned ranges' gradients packed (ZeRO 2:
// GradSync::owned_grads()) and is read in place of the parameters' gradient views.
//
// The sum comes in pieces, one per counted parameter and owned range, each Σ g² in fp32; the host
// adds them in double, in order (sum_pieces). A training step's GradNormPlan writes every piece
// into parts[0, pieces()) on the gradients' device in one kernels::sum_squares_chunks call (each
// piece cut at kernels::kSquaresChunk; the table, int64 on `device`, built once) without waiting,
// so that the step reads them with its losses in one copy: `grads` is the flat gradient buffer, or
// with `compact` the owned ranges' gradients packed (GradSync::owned_grads at ZeRO 2 and 3).
// grad_sum_squares sums the same pieces one kernels::sum_squares and one read each (the parity
// tools'; bitwise the plan's on the CPU).
double sum_pieces(std::span<const float> parts);
class GradNormPlan {
 public:
  GradNormPlan(const std::vector<ModelParam>& params, int tp_rank, const std::vector<parallel::FlatRange>& owned,
               bool compact, kernels::Device device);
  int64_t pieces() const { return pieces_; }
  void sum_squares_into(kernels::Tensor parts, kernels::Tensor grads) const;

 private:
  int64_t pieces_ = 0, end_ = 0;  // the pieces, and the end of the last in the gradients read
  kernels::Buffer chunks_, first_;
};
double grad_sum_squares(const std::vector<ModelParam>& params, int tp_rank,
                        const std::vector<parallel::FlatRange>& owned = {{0, INT64_MAX}},
                        kernels::Tensor compact_grads = {});

// PyTorch's clip_grad_norm_: max_norm / (norm + 1e-6) when that is below 1, else 1. max_norm 0
// means no clipping.
float clip_factor(double norm, double max_norm);

}  // namespace llmtrain::trainer
