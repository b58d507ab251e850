#include "trainer/loop/stop_agreement.h"

#include <cstdint>

#include "common/signals.h"

namespace llmtrain::trainer {

bool stop_agreed(parallel::Comm& world) {
  int32_t stop = stop_requested() ? 1 : 0;
  world.all_reduce(kernels::Tensor(&stop, kernels::DType::int32, {1}), parallel::ReduceOp::max);
  return stop != 0;
}

}  // namespace llmtrain::trainer
