// GPT samples over indexed datasets: lazily built epoch indices, Feistel shuffles, greedy blending.
// The sample-space layout (what must never change silently) is described in gpt_dataset.h.
#include "trainer/data/gpt_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/strings.h"

namespace llmtrain::trainer {

namespace {

constexpr int64_t kBlock = 16;  // documents per stored offset in an epoch index
constexpr size_t kCachedEpochs = 2;
// Labels of what a key shuffles.
constexpr uint64_t kShuffleDocuments = 1, kShuffleSamples = 2;

}  // namespace

struct GptDataset::EpochIndex {
  int64_t epoch = -1;
  Permutation documents;
  Permutation samples;
  std::vector<int64_t> block_start;  // tokens before shuffled position b * kBlock
};

struct GptDataset::Source {
  std::unique_ptr<IndexedDataset> data;
  double weight = 1.0;
  int64_t documents = 0, tokens = 0, samples_per_epoch = 0;
  uint64_t index = 0;
  std::mutex mu;
  std::deque<EpochIndex> epochs;  // most recently used first
};

GptDataset::GptDataset(const std::vector<DataSource>& sources, int seq_len, uint64_t seed, int32_t vocab_size)
    : seq_len_(seq_len), seed_(seed), vocab_size_(vocab_size) {
  if (seq_len < 1) throw Error(fmt::format("seq_len must be at least 1, found {}", seq_len));
  if (sources.empty()) throw Error("no training data: data.train lists no dataset", "give data.train a PREFIX");
  double total = 0;
  for (const auto& s : sources) {
    if (!(s.weight > 0) || !std::isfinite(s.weight))
      throw Error(fmt::format("dataset {}: weight {} must be a positive number", s.path, s.weight));
    total += s.weight;
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    auto src = std::make_unique<Source>();
    src->data = std::make_unique<IndexedDataset>(sources[i].path);
    src->weight = sources[i].weight / total;
    src->index = i;
    src->documents = src->data->num_documents();
    src->tokens = src->data->num_tokens();
    if (src->tokens < int64_t(seq_len) + 1)
      throw Error(fmt::format("dataset {} has {} tokens, but one sample needs seq_len + 1 = {}", sources[i].path,
                              src->tokens, seq_len + 1),
                  "use more data, or a shorter model.seq_len");
    src->samples_per_epoch = (src->tokens - 1) / seq_len;
    sources_.push_back(std::move(src));
  }
  if (sources_.size() > 1) blend_checkpoints_.push_back(std::vector<int64_t>(sources_.size(), 0));
}

GptDataset::~GptDataset() = default;

const IndexedDataset& GptDataset::source(size_t s) const { return *sources_.at(s)->data; }
double GptDataset::weight(size_t s) const { return sources_.at(s)->weight; }
int64_t GptDataset::samples_per_epoch(size_t s) const { return sources_.at(s)->samples_per_epoch; }

const GptDataset::EpochIndex& GptDataset::epoch_index(Source& s, int64_t epoch) const {
  // Called with s.mu held.
  for (auto it = s.epochs.begin(); it != s.epochs.end(); ++it)
    if (it->epoch == epoch) {
      if (it != s.epochs.begin()) {
        EpochIndex e = std::move(*it);
        s.epochs.erase(it);
        s.epochs.push_front(std::move(e));
      }
      return s.epochs.front();
    }
  EpochIndex e;
  e.epoch = epoch;
  e.documents = Permutation(uint64_t(s.documents), derive_key(seed_, s.index, kShuffleDocuments, uint64_t(epoch)));
  e.samples = Permutation(uint64_t(s.samples_per_epoch), derive_key(seed_, s.index, kShuffleSamples, uint64_t(epoch)));
  e.block_start.reserve(size_t(s.documents / kBlock + 1));
  int64_t offset = 0;
  constexpr int64_t kBatch = 64 * kBlock;
  std::vector<int64_t> docs(kBatch), lengths(kBatch);
  for (int64_t k0 = 0; k0 < s.documents; k0 += kBatch) {
    int64_t n = std::min(kBatch, s.documents - k0);
    for (int64_t i = 0; i < n; ++i) docs[size_t(i)] = int64_t(e.documents(uint64_t(k0 + i)));
    s.data->document_lengths(docs.data(), size_t(n), lengths.data());
    for (int64_t i = 0; i < n; ++i) {
      if ((k0 + i) % kBlock == 0) e.block_start.push_back(offset);
      offset += lengths[size_t(i)];
    }
  }
  LT_CHECK(offset == s.tokens, "epoch stream of {} has {} tokens, expected {}", s.data->prefix(), offset, s.tokens);
  s.epochs.push_front(std::move(e));
  if (s.epochs.size() > kCachedEpochs) s.epochs.pop_back();
  return s.epochs.front();
}

std::pair<int, int64_t> GptDataset::blend(int64_t index) const {
  if (sources_.size() == 1) return {0, index};
  std::lock_guard<std::mutex> lock(blend_mu_);
  int64_t chunk = index / kBlendChunk;
  for (const auto& c : blend_cache_)
    if (c.chunk == chunk) return c.assignment[size_t(index % kBlendChunk)];
  size_t n = sources_.size();
  // Greedy: sample i goes to the source with the largest weight * (i + 1) - count (lowest index on
  // ties). Replay from the last checkpoint at or before this chunk; record checkpoints on the way.
  auto run_chunk = [&](int64_t c, std::vector<int64_t>& counts, std::vector<std::pair<int, int64_t>>* out) {
    for (int64_t i = c * kBlendChunk; i < (c + 1) * kBlendChunk; ++i) {
      size_t best = 0;
      double best_err = -1e300;
      for (size_t d = 0; d < n; ++d) {
        double err = sources_[d]->weight * double(i + 1) - double(counts[d]);
        if (err > best_err) best_err = err, best = d;
      }
      if (out) out->push_back({int(best), counts[best]});
      ++counts[best];
    }
  };
  while (int64_t(blend_checkpoints_.size()) <= chunk) {
    std::vector<int64_t> counts = blend_checkpoints_.back();
    run_chunk(int64_t(blend_checkpoints_.size()) - 1, counts, nullptr);
    blend_checkpoints_.push_back(std::move(counts));
  }
  BlendChunk bc;
  bc.chunk = chunk;
  bc.assignment.reserve(size_t(kBlendChunk));
  std::vector<int64_t> counts = blend_checkpoints_[size_t(chunk)];
  run_chunk(chunk, counts, &bc.assignment);
  blend_cache_.push_front(std::move(bc));
  if (blend_cache_.size() > 2) blend_cache_.pop_back();
  return blend_cache_.front().assignment[size_t(index % kBlendChunk)];
}

GptSampleLocation GptDataset::locate(int64_t index) const {
  LT_CHECK(index >= 0, "negative sample index {}", index);
  auto [s, j] = blend(index);
  Source& src = *sources_[size_t(s)];
  GptSampleLocation loc;
  loc.source = s;
  loc.source_sample = j;
  loc.epoch = j / src.samples_per_epoch;
  std::lock_guard<std::mutex> lock(src.mu);
  const EpochIndex& e = epoch_index(src, loc.epoch);
  loc.epoch_sample = int64_t(e.samples(uint64_t(j % src.samples_per_epoch)));
  loc.token_offset = loc.epoch_sample * seq_len_;
  return loc;
}

void GptDataset::sample(int64_t index, int32_t* out) const {
  GptSampleLocation loc = locate(index);
  Source& src = *sources_[size_t(loc.source)];
  const IndexedDataset& data = *src.data;
  int64_t need = int64_t(seq_len_) + 1;
  {
    std::lock_guard<std::mutex> lock(src.mu);
    const EpochIndex& e = epoch_index(src, loc.epoch);
    // The shuffled position k whose document holds token_offset: a block by binary search, then the
    // block's documents and lengths in one batch (the lookups are random: batched, they overlap).
    auto it = std::upper_bound(e.block_start.begin(), e.block_start.end(), loc.token_offset);
    int64_t k = int64_t(it - e.block_start.begin() - 1) * kBlock;
    int64_t start = *(it - 1);
    int64_t docs[kBlock], lengths[kBlock];
    int64_t n = std::min(kBlock, src.documents - k);
    for (int64_t i = 0; i < n; ++i) docs[i] = int64_t(e.documents(uint64_t(k + i)));
    data.document_lengths(docs, size_t(n), lengths);
    int64_t i = 0;
    while (start + lengths[i] <= loc.token_offset) start += lengths[i++];
    k += i;
    int64_t doc = docs[i];
    int64_t len = lengths[i];
    int64_t in_doc = loc.token_offset - start;
    int64_t filled = 0;
    while (filled < need) {
      int64_t take = std::min(len - in_doc, need - filled);
      data.read_tokens(data.document_begin(doc) + in_doc, take, out + filled);
      filled += take;
      if (filled < need) {
        LT_CHECK(k + 1 < src.documents, "sample {} runs past the end of epoch {} of {}", index, loc.epoch,
                 data.prefix());
        doc = int64_t(e.documents(uint64_t(++k)));
        len = data.document_length(doc);
        in_doc = 0;
      }
    }
  }
  if (vocab_size_ > 0)
    for (int64_t i = 0; i < need; ++i)
      if (out[i] < 0 || out[i] >= vocab_size_)
        throw Error(fmt::format("dataset {}: token id {} is outside the vocabulary of {} ids (sample {}, epoch {}, "
                                "token {} of the epoch's stream)",
                                data.prefix(), out[i], vocab_size_, index, loc.epoch, loc.token_offset + i),
                    "the data was made with another tokenizer than data.tokenizer: re-run `llmtrain prep` with it, or "
                    "point data.tokenizer at the one used");
}

std::vector<int32_t> GptDataset::sample(int64_t index) const {
  std::vector<int32_t> out(size_t(seq_len_) + 1);
  sample(index, out.data());
  return out;
}

int64_t GptDataset::document_at(size_t s, int64_t epoch, int64_t k) const {
  Source& src = *sources_.at(s);
  LT_CHECK(k >= 0 && k < src.documents, "document position {} outside [0, {})", k, src.documents);
  std::lock_guard<std::mutex> lock(src.mu);
  return int64_t(epoch_index(src, epoch).documents(uint64_t(k)));
}

std::string GptDataset::describe() const {
  std::string out = fmt::format("{} source{}, seq_len {}, seed {}", sources_.size(), sources_.size() == 1 ? "" : "s",
                                seq_len_, seed_);
  for (const auto& s : sources_)
    out += fmt::format("\n  {} (weight {:.3f}): {} documents, {} tokens, {} samples per epoch", s->data->prefix(),
                       s->weight, s->documents, format_count(double(s->tokens)), s->samples_per_epoch);
  return out;
}

}  // namespace llmtrain::trainer
