// The data-parallel sampler's index arithmetic; the contract is in sampler.h.
#include "trainer/data/sampler.h"

#include <fmt/format.h>

#include "common/error.h"

namespace llmtrain::trainer {

Sampler::Sampler(int64_t global_batch, int micro_batch, int dp_rank, int dp_size)
    : global_batch_(global_batch), micro_batch_(micro_batch), dp_rank_(dp_rank), dp_size_(dp_size) {
  if (micro_batch < 1 || dp_size < 1 || global_batch < 1)
    throw Error(fmt::format("global batch {}, micro batch {} and dp {} must all be positive", global_batch, micro_batch,
                            dp_size));
  if (dp_rank < 0 || dp_rank >= dp_size)
    throw Error(fmt::format("data-parallel rank {} is outside [0, dp {})", dp_rank, dp_size));
  int64_t round = int64_t(micro_batch) * dp_size;
  if (global_batch % round != 0)
    throw Error(fmt::format("global batch {} is not divisible by micro batch {} × dp {} = {}", global_batch,
                            micro_batch, dp_size, round),
                "make train.global_batch a multiple of train.micro_batch × the data-parallel size");
  micro_batches_ = int(global_batch / round);
}

void Sampler::micro_batch_indices(int64_t consumed_samples, int micro, int64_t* out) const {
  LT_CHECK(consumed_samples >= 0 && micro >= 0 && micro < micro_batches_, "consumed {} micro {} of {}",
           consumed_samples, micro, micro_batches_);
  int64_t first = consumed_samples + int64_t(micro) * micro_batch_ * dp_size_ + int64_t(dp_rank_) * micro_batch_;
  for (int i = 0; i < micro_batch_; ++i) out[i] = first + i;
}

std::vector<int64_t> Sampler::micro_batch_indices(int64_t consumed_samples, int micro) const {
  std::vector<int64_t> out(static_cast<size_t>(micro_batch_));
  micro_batch_indices(consumed_samples, micro, out.data());
  return out;
}

std::vector<int64_t> Sampler::step_indices(int64_t consumed_samples) const {
  std::vector<int64_t> out(size_t(micro_batch_) * size_t(micro_batches_));
  for (int m = 0; m < micro_batches_; ++m)
    micro_batch_indices(consumed_samples, m, out.data() + size_t(m) * size_t(micro_batch_));
  return out;
}

}  // namespace llmtrain::trainer
