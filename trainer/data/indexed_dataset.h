// Megatron-LM's indexed dataset ("MMIDIDX"), the one on-disk format of tokenized training data:
// PREFIX.bin holds the tokens, PREFIX.idx says where each sequence and document is. This header is
// shared by the reader (IndexedDataset, memory-mapped) and the writer (IndexedDatasetWriter, used by
// `llmtrain prep`); docs/indexed-dataset-format.md is the byte-level spec beside it.
//
//   .idx = magic "MMIDIDX\0\0" (9 bytes) | version u64 = 1 | dtype code u8 |
//          sequence count S u64 | document index count D u64 |
//          sequence lengths i32[S] | sequence byte offsets into .bin i64[S] | document indices i64[D]
//   .bin = the tokens of every sequence, back to back, in the dtype (little-endian)
//
// Rules a reader could get wrong:
//  - D counts the entries of document_indices, which start with 0 and end with S: a dataset of N
//    documents has D = N + 1. Document d is sequences [doc[d], doc[d+1]).
//  - Offsets in the .idx are in bytes, lengths in tokens.
//  - Tokens are uint16 when the vocabulary has fewer than 65500 ids, else int32 (Megatron's
//    DType.optimal_dtype; 65500, not 65536).
#pragma once

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace llmtrain::trainer {

static_assert(std::endian::native == std::endian::little, "the indexed dataset format is little-endian");

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr size_t kIndexHeaderSize = 9 + 8 + 1 + 8 + 8;  // 34
inline constexpr int64_t kUint16VocabLimit = 65500;

// Megatron's DType codes.
enum class TokenDtype : uint8_t {
  uint8 = 1,
  int8 = 2,
  int16 = 3,
  int32 = 4,
  int64 = 5,
  float64 = 6,
  float32 = 7,
  uint16 = 8
};

// Bytes per token of a dtype code; 0 for a code Megatron does not define.
size_t token_dtype_size(uint8_t code);
std::string_view token_dtype_name(uint8_t code);
// uint16 when vocab_size < 65500, else int32.
TokenDtype token_dtype_for_vocab(int64_t vocab_size);

inline std::string index_file(const std::string& prefix) { return prefix + ".idx"; }
inline std::string data_file(const std::string& prefix) { return prefix + ".bin"; }

// A memory-mapped dataset. Opening checks the header, every count and offset against the two
// files' lengths and each other, and throws llmtrain::Error naming the file that is wrong
// (missing, truncated, foreign, or not belonging with its partner). Read-only; thread-safe.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  TokenDtype dtype() const { return dtype_; }
  size_t token_size() const { return token_size_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_doc_indices_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }

  int32_t sequence_length(int64_t i) const { return lengths_[i]; }
  int64_t sequence_pointer(int64_t i) const { return pointers_[i]; }
  // document_indices[i], 0 <= i <= num_documents().
  int64_t document_index(int64_t i) const { return doc_indices_[i]; }

  // Token range of document d in the .bin, in tokens: [begin, end).
  int64_t document_begin(int64_t d) const { return sequence_token(doc_indices_[d]); }
  int64_t document_end(int64_t d) const { return sequence_token(doc_indices_[d + 1]); }
  int64_t document_length(int64_t d) const { return document_end(d) - document_begin(d); }

  // Lengths in tokens of documents docs[0..n), into out. Documents are visited in shuffled order,
  // so this batches the random index lookups (prefetching each stage) instead of paying one
  // memory latency after another.
  void document_lengths(const int64_t* docs, size_t n, int64_t* out) const;

  // Copies tokens [begin, begin + n) of the .bin into out, as int32.
  void read_tokens(int64_t begin, int64_t n, int32_t* out) const;
  std::vector<int32_t> sequence(int64_t i) const;
  std::vector<int32_t> document(int64_t d) const;

  std::string describe() const;
  // CRC-32C of the .idx's sequence lengths: with the counts, what identifies the data wherever it
  // lies (a checkpoint records it; resume refuses other data).
  uint32_t lengths_crc32c() const;

 private:
  int64_t sequence_token(int64_t s) const {
    return s < num_sequences_ ? pointers_[s] / int64_t(token_size_) : num_tokens_;
  }

  std::string prefix_;
  TokenDtype dtype_ = TokenDtype::uint16;
  size_t token_size_ = 2;
  int64_t num_sequences_ = 0, num_doc_indices_ = 0, num_tokens_ = 0;
  // The .idx arrays start at byte 34 (lengths) and 34 + 4·S: not aligned for their types, so they
  // are read through memcpy (one unaligned load on x86), never through a typed pointer (UB).
  template <typename T>
  struct Unaligned {
    const uint8_t* bytes = nullptr;
    T operator[](int64_t i) const {
      T v;
      std::memcpy(&v, bytes + i * int64_t(sizeof(T)), sizeof(T));
      return v;
    }
    const uint8_t* at(int64_t i) const { return bytes + i * int64_t(sizeof(T)); }
  };
  Unaligned<int32_t> lengths_;
  Unaligned<int64_t> pointers_;
  Unaligned<int64_t> doc_indices_;
  const uint8_t* tokens_ = nullptr;
  void* idx_map_ = nullptr;
  size_t idx_map_size_ = 0;
  void* bin_map_ = nullptr;
  size_t bin_map_size_ = 0;
};

// Writes PREFIX.bin / PREFIX.idx as Megatron's IndexedDatasetBuilder does, byte for byte, with
// memory bounded whatever the size: tokens stream to the .bin and the index arrays to temporary
// files, assembled into the .idx at the end. Everything goes to new temporaries of unpredictable
// names (PREFIX.bin.tmp.<random>, created exclusively: common/file_io.h) that close() completes and
// fsyncs and commit() renames into place (.bin first, .idx last);
// a writer destroyed before commit() removes its temporaries, so a failure leaves no partial output.
class IndexedDatasetWriter {
 public:
  // Throws llmtrain::Error when the files cannot be created (naming them). dtype: uint16 or int32.
  IndexedDatasetWriter(const std::string& prefix, TokenDtype dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One sequence that is a whole document (what prep writes; Megatron without --split-sentences).
  void add_document(std::span<const int32_t> tokens) {
    add_sequence(tokens);
    end_document();
  }
  // Megatron's add_item / end_document, for documents of several sequences.
  void add_sequence(std::span<const int32_t> tokens);
  void end_document();

  // Writes the .idx from the temporaries and fsyncs both files, still under temporary names.
  void close();
  // Renames the temporaries to PREFIX.bin and PREFIX.idx. Call after close().
  void commit();
  // Removes the temporaries (also what the destructor does before commit()).
  void abandon();

  const std::string& prefix() const { return prefix_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_doc_indices_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  void write(std::FILE* f, const std::string& path, const void* data, size_t bytes);

  std::string prefix_, bin_tmp_, idx_tmp_, lengths_tmp_, docs_tmp_;
  TokenDtype dtype_;
  size_t token_size_;
  std::FILE* bin_ = nullptr;
  std::FILE* lengths_ = nullptr;
  std::FILE* docs_ = nullptr;
  int64_t num_sequences_ = 0, num_doc_indices_ = 1, num_tokens_ = 0;
  std::vector<uint8_t> convert_;
  bool closed_ = false, committed_ = false;
};

}  // namespace llmtrain::trainer
