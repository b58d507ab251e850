// Data-parallel gradient reduction without sharding (ZeRO stage 0): the gradients of one flat
// buffer are averaged over the dp group in buckets, each launched as an asynchronous all-reduce as
// soon as backward has finished every parameter in it, so that communication overlaps the rest of
// backward (PyTorch DDP's reducer, Megatron's grad buffer buckets).
//
// How buckets are formed: parameters are taken in the REVERSE of forward order (the order backward
// finishes them) and packed greedily into buckets of at least `bucket_mb` MiB; a parameter is
// never split, so a parameter larger than the cap is a bucket of its own. A bucket is one
// contiguous range of the flat buffer: a parameter that is not adjacent in memory to the bucket
// being filled starts a new one.
//
// Rules a reader could get wrong:
//  - Buckets are launched strictly in bucket order: a ready bucket waits until every bucket
//    before it was launched. Collectives must start in the same order on every rank, and ranks
//    may finish parameters in different orders; this makes the order the same.
//  - mark_ready(p) means p's gradient is final for this step (after the last micro-batch's
//    backward of p): the bucket may be sent at once, and its memory must not be written until
//    finish() returns.
//  - The result is exactly Comm::all_reduce(bucket, {avg, accumulate}): the MPI sum, then a
//    division by the dp size in fp32 (x / n, the same on every rank; with Accumulate::in_dtype on
//    16-bit gradients, the sum and the quotient rounded to 16 bits). With a one-rank group nothing
//    is sent.
//  - finish() marks any parameter not marked yet (its gradient is final by then), launches what is
//    left, waits for every bucket (each wait bounded by the group's timeout) and re-arms for the
//    next step.
//  - With a reduced hook (set_reduced_hook) a bucket is also reported once its average is in place:
//    progress() and mark_ready() poll the launched buckets in bucket order, and each that is done
//    is waited for (the compute stream then orders after its result; nothing blocks) and handed to
//    the hook; finish() waits for and reports the rest, in order. In a one-rank group, where
//    nothing is sent, each parameter is reported as it is marked (finish(): the unmarked ones). The hook may queue work
//    that reads the range on another stream behind the compute stream's work so far (the CPU update's gradient copies,
//    AdamW:: gradients_final).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "parallel/comm/comm.h"

namespace llmtrain::parallel {

// One parameter's gradient in the flat buffer, in elements.
struct ParamRange {
  int64_t offset = 0;
  int64_t numel = 0;
};

// What the benchmark reports: how much communication backward did not hide.
struct GradBucketStats {
  int64_t steps = 0;          // finish() calls
  int64_t buckets = 0;        // all-reduces launched, over all steps
  int64_t bytes = 0;          // bytes the collectives moved (wire_element_size), over all steps
  double exposed_s = 0;       // time spent in finish() (communication not hidden by backward)
  double span_s = 0;          // from each step's first mark_ready() to the end of its finish()
  double last_exposed_s = 0;  // the same two for the last step
  double last_span_s = 0;

  // Counts one finished step: `exposed` seconds in finish(), `span` from its first launch.
  void add_step(double exposed, double span) {
    ++steps;
    last_exposed_s = exposed, last_span_s = span;
    exposed_s += exposed, span_s += span;
  }
};

class GradBuckets {
 public:
  struct Bucket {
    int64_t offset = 0;  // elements of the flat buffer
    int64_t numel = 0;
    std::vector<int> params;  // indices into the forward-order list, in backward order
  };

  // `grads`: the flat gradient buffer (a float dtype: fp32, bf16, fp16; host memory for MPI).
  // `params`: every parameter's range in it, in forward order. `bucket_mb` > 0. The comm and the
  // buffer must outlive this object.
  // `accumulate`: how 16-bit gradients are summed (Accumulate::in_dtype: as 16-bit words).
  GradBuckets(Comm& dp, Tensor grads, std::vector<ParamRange> params, double bucket_mb,
              Accumulate accumulate = Accumulate::fp32);

  // Parameter `param` (forward-order index) has its final gradient for this step.
  void mark_ready(int param);
  // Lets launched all-reduces advance; call it between pieces of work when nothing is marked.
  void progress();
  // Waits until every bucket is averaged in place; re-arms for the next step.
  void finish();
  // hook(offset, numel): a bucket's range of the flat buffer holds this step's average.
  void set_reduced_hook(std::function<void(int64_t offset, int64_t numel)> hook) { reduced_hook_ = std::move(hook); }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const GradBucketStats& stats() const { return stats_; }

 private:
  void launch_ready();
  void start_step_clock();
  // Reports launched buckets to the reduced hook in order: those done (all of them with `wait`).
  void report_reduced(bool wait);

  Comm& comm_;
  Tensor grads_;
  std::vector<ParamRange> params_;
  Reduction average_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;    // per parameter
  std::vector<int> pending_;      // per bucket: parameters not yet ready
  std::vector<char> ready_;       // per parameter, this step
  std::vector<WorkHandle> work_;  // per bucket, this step
  int next_launch_ = 0;
  int next_reported_ = 0;  // the first bucket not yet handed to reduced_hook_
  std::function<void(int64_t, int64_t)> reduced_hook_;
  bool step_started_ = false;
  double step_start_ = 0;
  GradBucketStats stats_;
};

}  // namespace llmtrain::parallel
