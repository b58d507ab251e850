// Stage 3's offloaded owned values (parallel.offload_params): the gradient sync's OwnedValues
// (parallel/grad_sync.h) over the optimizer's offload store. The chunk of the unit the sync will
// gather after the current one is read on a thread of its own while the units before it compute,
// and its gather takes it from there. Offload code: it lives with the store (trainer/optim/), and
// the TrainStep hands it to the sync.
//
// Rules a reader could get wrong:
//  - One read at a time, and never beside one on the caller's thread (the store's reads share
//    their buffers): take() waits for a read in flight before it reads another unit itself.
//  - A read ahead that is not the unit take() asks for is forgotten and the unit read at once;
//    ahead() does nothing while a read is in flight or done and not yet taken.
//  - drop() before the values change (the optimizer's update): nothing read before an update is
//    used after it.
//  - Every wait is bounded by `timeout_s` (parallel.timeout); a failed read is rethrown on the
//    caller's thread by the next take() or drop().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "kernels/buffer.h"
#include "parallel/grad_sync.h"

namespace llmtrain::trainer {

class ValueReader final : public parallel::OwnedValues {
 public:
  // `read(begin, host)`: the owned values [begin, begin + host.numel()) into the host fp32 tensor.
  // `chunk`: the most values one unit holds.
  ValueReader(std::function<void(int64_t, kernels::Tensor)> read, int64_t chunk, double timeout_s);
  ~ValueReader() override;
  ValueReader(const ValueReader&) = delete;
  ValueReader& operator=(const ValueReader&) = delete;

  // Starts reading unit `unit`'s n values at `begin`, unless a read is in flight or done unused.
  void ahead(int unit, int64_t begin, int64_t n) override;
  // Unit `unit`'s n = out.numel() values at `begin` into the host tensor `out`.
  void take(int unit, int64_t begin, kernels::Tensor out) override;
  // Before the values change: waits for a read in flight and forgets it.
  void drop() override;

 private:
  void run();
  void wait_idle(std::unique_lock<std::mutex>& lock, int unit);

  std::function<void(int64_t, kernels::Tensor)> read_;
  kernels::Buffer host_;
  double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  int unit_ = -1;  // the unit read ahead (in flight while busy_), -1: none
  int64_t begin_ = 0, n_ = 0;
  bool busy_ = false, quit_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once everything it reads exists
};

}  // namespace llmtrain::trainer
