// Micro-batches as the model reads them: the samples the sampler assigns to this data-parallel
// rank, staged as [micro_batch, seq_len] token and target tensors. Samples are seq_len + 1 tokens;
// the first seq_len are the input and the last seq_len the next-token targets.
//
// Rule a reader could get wrong: the tensors returned by read() are host staging buffers, reused by
// the next read(). The model copies them into its own (device) buffers with a kernels op as its
// forward starts; nothing here knows where the model lives. Token ids are checked against the
// vocabulary by the dataset as it reads them (GptDataset::sample).
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/data/gpt_dataset.h"
#include "trainer/data/sampler.h"
#include "trainer/model/model.h"

namespace llmtrain::trainer {

// Context parallelism: this rank's share of each sequence (parallel/context_parallel.h): chunks
// cp_chunk(rank, 0) and cp_chunk(rank, 1) of 2·cp, tokens and targets alike.
struct ContextSplit {
  int cp = 1, rank = 0;
};

class MicroBatchReader {
 public:
  // `data` and `sampler` must outlive the reader. With split.cp > 1 read() gives [micro_batch,
  // seq_len / cp] tensors of this rank's two chunks (seq_len divisible by 2·cp).
  MicroBatchReader(const GptDataset& data, const Sampler& sampler, int seq_len, ContextSplit split = {});

  // Micro-batch `micro` of the step that starts after `consumed_samples`.
  MicroBatch read(int64_t consumed_samples, int micro);

 private:
  const GptDataset& data_;
  const Sampler& sampler_;
  int b_, t_;
  ContextSplit split_;
  std::vector<int32_t> sample_, tokens_, targets_, local_tokens_, local_targets_;
  std::vector<int64_t> indices_;
};

}  // namespace llmtrain::trainer
