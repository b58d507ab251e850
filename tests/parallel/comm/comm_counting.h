// CountingComm: a Comm that forwards every call to another Comm and counts the bytes this rank
// sends, for communication-volume measurements: scripts/bench/tp_comm.sh and the planner's test
// of its tensor-parallel volumes. Test code: no product path counts bytes.
//
// Rules a reader could get wrong:
//  - The count is the bandwidth-optimal (ring) volume each rank sends, the measure Megatron-LM's
//    and NCCL's analyses use, not what the wrapped backend's algorithm happens to send: on n ranks
//    an all-reduce of B bytes counts 2·(n−1)/n·B, a reduce-scatter of a B-byte input and an
//    all-gather into a B-byte output (n−1)/n·B each, an all-to-all of a B-byte input (n−1)/n·B,
//    a broadcast B on the root, a send B; receives and barriers count nothing, and so does every
//    call on one rank. B counts the bytes the reduction moves: a 16-bit buffer reduced with
//    Accumulate::fp32 moves fp32 (wire_element_size), so B is twice its size.
//  - Calls count when they are started (a blocking call is its asynchronous form, waited for).
//    split() returns the wrapped Comm's split, uncounted.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "parallel/comm/comm.h"

namespace llmtrain::parallel {

class CountingComm final : public Comm {
 public:
  enum Op { all_reduce_op, reduce_scatter_op, all_gather_op, broadcast_op, send_op, all_to_all_op, kOps };

  explicit CountingComm(std::unique_ptr<Comm> inner);

  // Bytes this rank sent since construction or the last reset(), in all and per kind of call, and
  // how many calls of each kind were made.
  int64_t bytes_sent() const;
  int64_t bytes_sent(Op op) const { return bytes_[size_t(op)]; }
  int64_t calls(Op op) const { return calls_[size_t(op)]; }
  void reset();

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  void set_timeout(double seconds) override { inner_->set_timeout(seconds); }
  double timeout() const override { return inner_->timeout(); }
  void progress() override { inner_->progress(); }
  std::unique_ptr<Comm> split(int color, int key, std::string name) override;

  WorkHandle all_reduce_async(Tensor buf, Reduction op) override;
  WorkHandle reduce_scatter_async(Tensor in, Tensor out, Reduction op) override;
  WorkHandle all_gather_async(Tensor in, Tensor out) override;
  WorkHandle broadcast_async(Tensor buf, int root) override;
  WorkHandle send_async(Tensor buf, int peer, int tag = 0) override;
  WorkHandle recv_async(Tensor buf, int peer, int tag = 0) override;
  WorkHandle all_to_all_async(Tensor in, Tensor out) override;
  WorkHandle barrier_async() override;

 private:
  // Counts `num`/`den` of `bytes` (the ring share) for one call of `op`.
  void count(Op op, int64_t bytes, int64_t num, int64_t den);
  // Counts the ring share of `t` for `op`, each element moving `element_size` bytes.
  void ring(Op op, const Tensor& t, size_t element_size);

  std::unique_ptr<Comm> inner_;
  std::array<int64_t, kOps> bytes_{}, calls_{};
};

}  // namespace llmtrain::parallel
