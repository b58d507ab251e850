#include "trainer/data/micro_batches.h"

#include <algorithm>

namespace llmtrain::trainer {

MicroBatchReader::MicroBatchReader(const GptDataset& data, const Sampler& sampler, int seq_len)
    : data_(data),
      sampler_(sampler),
      b_(sampler.micro_batch()),
      t_(seq_len),
      sample_(size_t(seq_len) + 1),
      tokens_(size_t(b_) * seq_len),
      targets_(size_t(b_) * seq_len),
      indices_(size_t(b_)) {}

MicroBatch MicroBatchReader::read(int64_t consumed_samples, int micro) {
  sampler_.micro_batch_indices(consumed_samples, micro, indices_.data());
  for (int b = 0; b < b_; ++b) {
    data_.sample(indices_[size_t(b)], sample_.data());
    std::copy(sample_.begin(), sample_.end() - 1, tokens_.begin() + size_t(b) * t_);
    std::copy(sample_.begin() + 1, sample_.end(), targets_.begin() + size_t(b) * t_);
  }
  return {kernels::host_tensor(tokens_.data(), {b_, t_}), kernels::host_tensor(targets_.data(), {b_, t_})};
}

}  // namespace llmtrain::trainer
