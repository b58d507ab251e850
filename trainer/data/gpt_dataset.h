// GPT training samples over Megatron indexed datasets: sample i is a window of seq_len + 1 tokens
// (inputs = the first seq_len, targets = the last seq_len) of documents concatenated as stored.
//
// Layout of the sample space (docs/data.md has the full story):
//  - Each source (one PREFIX) is read in epochs. In epoch e its documents are concatenated in an
//    order shuffled by a seeded permutation of the documents; the epoch's stream of T tokens (every
//    document, end-of-document tokens included as stored) gives S = (T - 1) / seq_len samples, sample
//    k starting at token k * seq_len (consecutive windows share one token, as in Megatron). The tail
//    that does not fill a window is not used in that epoch (other epochs place other documents there).
//  - The S samples of an epoch are visited in an order shuffled by a second seeded permutation.
//    Source sample j is sample j % S of epoch j / S: epochs are added as far as a run needs.
//  - Several sources are blended by weight: global sample g goes to the source whose share is
//    furthest behind its weight (Megatron's greedy rule), so after n samples every source has had
//    weight * n of them, within one.
//
// Nothing is materialized per sample: permutations are computed (trainer/data/permutation.h), and each
// epoch of a source keeps one int64 per 16 documents (token offsets along its shuffled order) for
// the two most recently used epochs: 0.5 byte per document. Building it is one pass over the
// document sizes in shuffled order the first time an epoch is touched (measured: 0.04 s per million
// documents of 300 tokens, 0.7 s for ten million tiny ones); a sample then costs a binary search,
// one batch of at most 16 size lookups and the token copy (about 4 µs for 257 tokens).
//
// Rules a reader could get wrong:
//  - The order is a pure function of (seed, sources in order, weights, seq_len, the datasets'
//    document sizes). It does not depend on the number of ranks: the Sampler picks which global
//    indices a rank reads; this class maps an index to tokens.
//  - sample() checks every token against the vocabulary when one is given: data made with another
//    tokenizer is a clear error, not an out-of-range embedding lookup.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/recipe/recipe.h"
#include "trainer/data/indexed_dataset.h"
#include "trainer/data/permutation.h"

namespace llmtrain::trainer {

// Where a global sample comes from (for tests, debugging and logs).
struct GptSampleLocation {
  int source = 0;             // which of the sources
  int64_t source_sample = 0;  // index among that source's samples
  int64_t epoch = 0;          // epoch of that source
  int64_t epoch_sample = 0;   // position of the window in the epoch's stream, in windows
  int64_t token_offset = 0;   // = epoch_sample * seq_len: first token in the epoch's stream
};

class GptDataset {
 public:
  // Opens every source (data.train: [{path, weight}] or data.valid). seq_len: the model's context;
  // samples have seq_len + 1 tokens. vocab_size > 0: tokens must be below it. Throws
  // llmtrain::Error naming the dataset for a missing/damaged file, a non-positive weight, or a source
  // with fewer than seq_len + 1 tokens.
  GptDataset(const std::vector<DataSource>& sources, int seq_len, uint64_t seed, int32_t vocab_size = 0);
  ~GptDataset();

  int seq_len() const { return seq_len_; }
  int sample_tokens() const { return seq_len_ + 1; }

  // Writes the seq_len + 1 tokens of global sample `index` (any index >= 0) to out. Thread-safe.
  void sample(int64_t index, int32_t* out) const;
  // Convenience for tests and tools.
  std::vector<int32_t> sample(int64_t index) const;

  GptSampleLocation locate(int64_t index) const;

  size_t num_sources() const { return sources_.size(); }
  const IndexedDataset& source(size_t s) const;
  double weight(size_t s) const;  // normalized: the weights sum to 1
  int64_t samples_per_epoch(size_t s) const;
  // Document at position k of the shuffled order of source s in epoch e.
  int64_t document_at(size_t s, int64_t epoch, int64_t k) const;

  std::string describe() const;

 private:
  struct Source;
  struct EpochIndex;
  std::pair<int, int64_t> blend(int64_t index) const;
  const EpochIndex& epoch_index(Source& s, int64_t epoch) const;

  int seq_len_;
  uint64_t seed_;
  int32_t vocab_size_;
  std::vector<std::unique_ptr<Source>> sources_;

  // Blending (more than one source): counts per source at every kBlendChunk-th sample, extended
  // lazily, and the last chunks' assignments.
  static constexpr int64_t kBlendChunk = 4096;
  mutable std::mutex blend_mu_;
  mutable std::vector<std::vector<int64_t>> blend_checkpoints_;
  struct BlendChunk {
    int64_t chunk = -1;
    std::vector<std::pair<int, int64_t>> assignment;
  };
  mutable std::deque<BlendChunk> blend_cache_;
};

}  // namespace llmtrain::trainer
