#include "trainer/data/micro_batches.h"

#include <algorithm>

#include "common/error.h"
#include "parallel/context_parallel.h"

namespace llmtrain::trainer {

MicroBatchReader::MicroBatchReader(const GptDataset& data, const Sampler& sampler, int seq_len, ContextSplit split)
    : data_(data),
      sampler_(sampler),
      b_(sampler.micro_batch()),
      t_(seq_len),
      split_(split),
      sample_(size_t(seq_len) + 1),
      tokens_(size_t(b_) * seq_len),
      targets_(size_t(b_) * seq_len),
      indices_(size_t(b_)) {
  LT_CHECK(split.cp >= 1 && split.rank >= 0 && split.rank < split.cp && seq_len % (2 * split.cp) == 0,
           "context split cp {} rank {} of seq_len {}", split.cp, split.rank, seq_len);
  if (split.cp > 1) {
    local_tokens_.resize(tokens_.size() / size_t(split.cp));
    local_targets_.resize(targets_.size() / size_t(split.cp));
  }
}

MicroBatch MicroBatchReader::read(int64_t consumed_samples, int micro) {
  sampler_.micro_batch_indices(consumed_samples, micro, indices_.data());
  for (int b = 0; b < b_; ++b) {
    data_.sample(indices_[size_t(b)], sample_.data());
    std::copy(sample_.begin(), sample_.end() - 1, tokens_.begin() + size_t(b) * t_);
    std::copy(sample_.begin() + 1, sample_.end(), targets_.begin() + size_t(b) * t_);
  }
  if (split_.cp > 1) {
    parallel::cp_take_rows(tokens_.data(), local_tokens_.data(), b_, t_, split_.cp, split_.rank);
    parallel::cp_take_rows(targets_.data(), local_targets_.data(), b_, t_, split_.cp, split_.rank);
    const int local = t_ / split_.cp;
    return {kernels::host_tensor(local_tokens_.data(), {b_, local}),
            kernels::host_tensor(local_targets_.data(), {b_, local})};
  }
  return {kernels::host_tensor(tokens_.data(), {b_, t_}), kernels::host_tensor(targets_.data(), {b_, t_})};
}

}  // namespace llmtrain::trainer
