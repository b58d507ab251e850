// Which samples each data-parallel rank reads, step after step.
//
// A step consumes one global batch: the global_batch consecutive sample indices that follow the
// samples consumed so far, [consumed, consumed + global_batch). Each micro-batch round takes the
// next micro_batch × dp of them, and rank r reads its micro_batch at offset r × micro_batch
// (Megatron's MegatronPretrainingSampler layout). So:
//  (a) the samples of every step are the same for any dp size (only who reads which changes);
//  (b) resuming from a consumed-samples count (kept in checkpoints) continues exactly where the
//      run left off, whatever dp the resumed run has.
//
// Rule a reader could get wrong: positions are counted in samples, not steps, so a run whose
// global batch changes (or a fine-tune that restarts the data at 0) stays well-defined.
#pragma once

#include <cstdint>
#include <vector>

namespace llmtrain::trainer {

class Sampler {
 public:
  // Throws llmtrain::Error unless global_batch is a positive multiple of micro_batch × dp_size and
  // 0 <= dp_rank < dp_size, naming every factor.
  Sampler(int64_t global_batch, int micro_batch, int dp_rank, int dp_size);

  int64_t global_batch() const { return global_batch_; }
  int micro_batch() const { return micro_batch_; }
  // Micro-batches each rank runs per step: global_batch / (micro_batch × dp_size).
  int micro_batches_per_step() const { return micro_batches_; }

  // The micro_batch global sample indices this rank reads in micro-batch `micro`
  // (0 <= micro < micro_batches_per_step()) of the step that starts after `consumed_samples`.
  void micro_batch_indices(int64_t consumed_samples, int micro, int64_t* out) const;
  std::vector<int64_t> micro_batch_indices(int64_t consumed_samples, int micro) const;
  // All of this rank's indices for that step, micro-batch after micro-batch.
  std::vector<int64_t> step_indices(int64_t consumed_samples) const;

 private:
  int64_t global_batch_;
  int micro_batch_, dp_rank_, dp_size_, micro_batches_;
};

}  // namespace llmtrain::trainer
