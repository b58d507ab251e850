// Megatron MMIDIDX reader (mmap + validation of every count and offset) and streaming writer;
// the layout and the rules live in indexed_dataset.h and docs/indexed-dataset-format.md.
#include "trainer/data/indexed_dataset.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/checked_math.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/strings.h"

namespace llmtrain::trainer {

namespace {

constexpr const char* kPrepHint = "(re)create it with `llmtrain prep` or Megatron-LM's preprocess_data.py";

struct Mapping {
  void* data = nullptr;
  size_t size = 0;
};

Mapping map_file(const std::string& path, const char* what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error(fmt::format("cannot open {} ({}): {}", path, what, std::strerror(errno)),
                fmt::format("a dataset PREFIX needs PREFIX.bin and PREFIX.idx; {}", kPrepHint));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw environment_error(fmt::format("cannot stat {}: {}", path, std::strerror(e)));
  }
  Mapping m;
  m.size = size_t(st.st_size);
  if (m.size > 0) {
    m.data = ::mmap(nullptr, m.size, PROT_READ, MAP_SHARED, fd, 0);
    if (m.data == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw environment_error(fmt::format("cannot memory-map {}: {}", path, std::strerror(e)));
    }
  }
  ::close(fd);
  return m;
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

size_t token_dtype_size(uint8_t code) {
  switch (code) {
    case 1:
    case 2:
      return 1;
    case 3:
    case 8:
      return 2;
    case 4:
    case 7:
      return 4;
    case 5:
    case 6:
      return 8;
    default:
      return 0;
  }
}

std::string_view token_dtype_name(uint8_t code) {
  static constexpr std::string_view names[] = {"?",     "uint8",   "int8",    "int16", "int32",
                                               "int64", "float64", "float32", "uint16"};
  return code < 9 ? names[code] : "?";
}

TokenDtype token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < kUint16VocabLimit ? TokenDtype::uint16 : TokenDtype::int32;
}

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  std::string idx_path = index_file(prefix), bin_path = data_file(prefix);
  Mapping idx = map_file(idx_path, "the index of an indexed dataset");
  idx_map_ = idx.data;
  idx_map_size_ = idx.size;
  // From here on the destructor must run on failure: a failed constructor does not call it.
  try {
    const auto* p = static_cast<const uint8_t*>(idx_map_);
    if (idx.size < kIndexHeaderSize)
      throw Error(fmt::format("{}: {} bytes, shorter than the {}-byte header of an indexed dataset index: truncated or "
                              "not an index",
                              idx_path, idx.size, kIndexHeaderSize),
                  kPrepHint);
    if (std::memcmp(p, kIndexMagic, 9) != 0) {
      bool old = std::memcmp(p, "TNTIDX\0\0", 8) == 0;
      throw Error(
          fmt::format("{}: not a Megatron-LM indexed dataset index (its first bytes are not \"MMIDIDX\\0\\0\"{})",
                      idx_path, old ? "; it is the older TNTIDX format" : ""),
          kPrepHint);
    }
    uint64_t version = load<uint64_t>(p + 9);
    if (version != kIndexVersion)
      throw Error(fmt::format("{}: index format version {}, expected {}", idx_path, version, kIndexVersion), kPrepHint);
    uint8_t code = p[17];
    token_size_ = token_dtype_size(code);
    if (token_size_ == 0 || code == uint8_t(TokenDtype::float32) || code == uint8_t(TokenDtype::float64))
      throw Error(fmt::format("{}: token dtype code {} ({}) is not an integer token type", idx_path, code,
                              token_dtype_name(code)),
                  kPrepHint);
    dtype_ = TokenDtype(code);
    uint64_t seqs = load<uint64_t>(p + 18), docs = load<uint64_t>(p + 26);
    // Sizes in 128 bits of headroom: a corrupt count must not wrap around and pass the check.
    unsigned __int128 need = kIndexHeaderSize + (unsigned __int128)seqs * 12 + (unsigned __int128)docs * 8;
    if ((unsigned __int128)idx.size == need + seqs && seqs > 0)
      throw Error(
          fmt::format("{}: not supported yet: multimodal indexed datasets (sequence modes after the index)", idx_path));
    if ((unsigned __int128)idx.size != need)
      throw Error(fmt::format("{}: {} bytes, but its header ({} sequences, {} document indices) needs {}: truncated or "
                              "corrupt",
                              idx_path, idx.size, seqs, docs, uint64_t(need)),
                  kPrepHint);
    num_sequences_ = int64_t(seqs);
    num_doc_indices_ = int64_t(docs);
    lengths_ = {p + kIndexHeaderSize};
    pointers_ = {p + kIndexHeaderSize + 4 * seqs};
    doc_indices_ = {p + kIndexHeaderSize + 12 * seqs};

    // Documents: 0 = doc[0] <= doc[1] <= ... <= doc[D-1] = S.
    if (num_doc_indices_ < 1 || doc_indices_[0] != 0 || doc_indices_[num_doc_indices_ - 1] != num_sequences_)
      throw Error(fmt::format("{}: document indices must run from 0 to the sequence count {}, found {} entries{}",
                              idx_path, num_sequences_, num_doc_indices_,
                              num_doc_indices_ > 0
                                  ? fmt::format(" from {} to {}", doc_indices_[0], doc_indices_[num_doc_indices_ - 1])
                                  : std::string()),
                  kPrepHint);
    for (int64_t i = 1; i < num_doc_indices_; ++i)
      if (doc_indices_[i] < doc_indices_[i - 1])
        throw Error(fmt::format("{}: document index {} ({}) is smaller than the one before ({})", idx_path, i,
                                doc_indices_[i], doc_indices_[i - 1]),
                    kPrepHint);
    // Sequences lie back to back from offset 0, as every Megatron writer puts them.
    int64_t expect = 0;
    for (int64_t i = 0; i < num_sequences_; ++i) {
      if (lengths_[i] < 0)
        throw Error(fmt::format("{}: sequence {} has negative length {}", idx_path, i, lengths_[i]), kPrepHint);
      if (pointers_[i] != expect)
        throw Error(fmt::format("{}: sequence {} starts at byte {}, expected {} (right after the sequence before): "
                                "not supported yet: sequences that are not back to back",
                                idx_path, i, pointers_[i], expect),
                    kPrepHint);
      const auto next = checked_add(expect, int64_t(lengths_[i]) * int64_t(token_size_));  // ≤ 2^34 each
      if (!next)
        throw Error(fmt::format("{}: the sequence lengths add up to more than 2^63 bytes of tokens", idx_path),
                    kPrepHint);
      expect = *next;
    }
    Mapping bin = map_file(bin_path, "the tokens of an indexed dataset");
    bin_map_ = bin.data;
    bin_map_size_ = bin.size;
    if (int64_t(bin.size) != expect)
      throw Error(
          fmt::format("{}: {} bytes, but {} describes {} bytes of tokens: {}", bin_path, bin.size, idx_path, expect,
                      int64_t(bin.size) < expect ? "the .bin is truncated" : "the two files do not belong together"),
          kPrepHint);
    tokens_ = static_cast<const uint8_t*>(bin_map_);
    num_tokens_ = expect / int64_t(token_size_);
  } catch (...) {
    if (idx_map_) ::munmap(idx_map_, idx_map_size_);
    if (bin_map_) ::munmap(bin_map_, bin_map_size_);
    throw;
  }
}

IndexedDataset::~IndexedDataset() {
  if (idx_map_) ::munmap(idx_map_, idx_map_size_);
  if (bin_map_) ::munmap(bin_map_, bin_map_size_);
}

void IndexedDataset::read_tokens(int64_t begin, int64_t n, int32_t* out) const {
  LT_CHECK(begin >= 0 && n >= 0 && begin + n <= num_tokens_, "tokens [{}, {}) outside [0, {}) of {}", begin, begin + n,
           num_tokens_, prefix_);
  const uint8_t* p = tokens_ + begin * int64_t(token_size_);
  switch (dtype_) {
    case TokenDtype::uint16:
      for (int64_t i = 0; i < n; ++i) out[i] = load<uint16_t>(p + 2 * i);
      break;
    case TokenDtype::int32:
      std::memcpy(out, p, size_t(n) * 4);
      break;
    case TokenDtype::uint8:
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      break;
    case TokenDtype::int8:
      for (int64_t i = 0; i < n; ++i) out[i] = int8_t(p[i]);
      break;
    case TokenDtype::int16:
      for (int64_t i = 0; i < n; ++i) out[i] = load<int16_t>(p + 2 * i);
      break;
    case TokenDtype::int64:
      for (int64_t i = 0; i < n; ++i) {
        int64_t v = load<int64_t>(p + 8 * i);
        if (v < INT32_MIN || v > INT32_MAX)
          throw Error(
              fmt::format("{}: token {} at position {} does not fit in 32 bits", data_file(prefix_), v, begin + i));
        out[i] = int32_t(v);
      }
      break;
    default:
      LT_CHECK(false, "unreachable dtype");
  }
}

void IndexedDataset::document_lengths(const int64_t* docs, size_t n, int64_t* out) const {
  constexpr size_t kBatch = 32;
  int64_t first[kBatch], last[kBatch];
  for (size_t b = 0; b < n; b += kBatch) {
    size_t m = std::min(kBatch, n - b);
    for (size_t i = 0; i < m; ++i) __builtin_prefetch(doc_indices_.at(docs[b + i]));
    for (size_t i = 0; i < m; ++i) {
      first[i] = doc_indices_[docs[b + i]];
      last[i] = doc_indices_[docs[b + i] + 1];
      if (last[i] - first[i] == 1)
        __builtin_prefetch(lengths_.at(first[i]));
      else if (last[i] > first[i])
        __builtin_prefetch(pointers_.at(first[i]));
    }
    for (size_t i = 0; i < m; ++i)
      out[b + i] = last[i] - first[i] == 1 ? int64_t(lengths_[first[i]])
                   : last[i] == first[i]   ? 0
                                           : sequence_token(last[i]) - sequence_token(first[i]);
  }
}

std::vector<int32_t> IndexedDataset::sequence(int64_t i) const {
  std::vector<int32_t> out(static_cast<size_t>(lengths_[i]));
  read_tokens(pointers_[i] / int64_t(token_size_), lengths_[i], out.data());
  return out;
}

std::vector<int32_t> IndexedDataset::document(int64_t d) const {
  std::vector<int32_t> out(size_t(document_length(d)));
  read_tokens(document_begin(d), int64_t(out.size()), out.data());
  return out;
}

uint32_t IndexedDataset::lengths_crc32c() const {
  return crc32c(lengths_.bytes, size_t(num_sequences_) * sizeof(int32_t));
}

std::string IndexedDataset::describe() const {
  return fmt::format("{}: {} documents, {} sequences, {} tokens ({})", prefix_, num_documents(), num_sequences_,
                     format_count(double(num_tokens_)), token_dtype_name(uint8_t(dtype_)));
}

// ---- writer ----

namespace {

// A new temporary `<base>.tmp.<random>` (created exclusively, never through a link: an output
// directory may be shared), its name in *path.
std::FILE* create_temp(const std::string& base, std::string* path) {
  int fd = -1;
  try {
    fd = create_temp_file(base, path);
  } catch (const Error& e) {
    throw Error(e.what(), "check that the output directory exists and is writable");
  }
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    const int error = errno;
    ::close(fd);
    std::remove(path->c_str());
    throw environment_error(fmt::format("cannot open {}: {}", *path, std::strerror(error)));
  }
  std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
  return f;
}

void close_file(std::FILE*& f) {
  if (f) std::fclose(f);
  f = nullptr;
}

}  // namespace

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, TokenDtype dtype)
    : prefix_(prefix), dtype_(dtype), token_size_(token_dtype_size(uint8_t(dtype))) {
  LT_CHECK(dtype == TokenDtype::uint16 || dtype == TokenDtype::int32, "writer dtype must be uint16 or int32");
  // Each temporary's name is set once it is created: abandon() removes only files made here.
  try {
    bin_ = create_temp(data_file(prefix), &bin_tmp_);
    lengths_ = create_temp(index_file(prefix) + ".lengths", &lengths_tmp_);
    docs_ = create_temp(index_file(prefix) + ".docs", &docs_tmp_);
    int64_t zero = 0;
    write(docs_, docs_tmp_, &zero, 8);
  } catch (...) {
    abandon();
    throw;
  }
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!committed_) abandon();
}

void IndexedDatasetWriter::write(std::FILE* f, const std::string& path, const void* data, size_t bytes) {
  if (bytes && std::fwrite(data, 1, bytes, f) != bytes)
    throw environment_error(fmt::format("cannot write {}: {}", path, std::strerror(errno)),
                            "is the disk full? Nothing was left behind: the output is written under temporary names");
}

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  LT_CHECK(!closed_, "add_sequence after close()");
  if (tokens.size() > size_t(INT32_MAX))
    throw Error(
        fmt::format("{}: a sequence of {} tokens does not fit the format's int32 lengths", prefix_, tokens.size()),
        "split the document");
  const void* data = tokens.data();
  if (dtype_ == TokenDtype::uint16) {
    convert_.resize(tokens.size() * 2);
    auto* out = reinterpret_cast<uint16_t*>(convert_.data());
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (uint32_t(tokens[i]) > 0xFFFF)
        throw Error(fmt::format("{}: token id {} does not fit the uint16 tokens of this dataset", prefix_, tokens[i]),
                    "the vocabulary is larger than the dtype the output was opened with");
      out[i] = uint16_t(tokens[i]);
    }
    data = convert_.data();
  }
  write(bin_, bin_tmp_, data, tokens.size() * token_size_);
  int32_t len = int32_t(tokens.size());
  write(lengths_, lengths_tmp_, &len, 4);
  ++num_sequences_;
  num_tokens_ += int64_t(tokens.size());
}

void IndexedDatasetWriter::end_document() {
  LT_CHECK(!closed_, "end_document after close()");
  write(docs_, docs_tmp_, &num_sequences_, 8);
  ++num_doc_indices_;
}

void IndexedDatasetWriter::close() {
  LT_CHECK(!closed_, "close() twice");
  auto finish = [&](std::FILE*& f, const std::string& path, bool sync) {
    if (std::fflush(f) != 0 || (sync && ::fsync(fileno(f)) != 0))
      throw environment_error(fmt::format("cannot write {}: {}", path, std::strerror(errno)), "is the disk full?");
    close_file(f);
  };
  finish(bin_, bin_tmp_, true);
  finish(lengths_, lengths_tmp_, false);
  finish(docs_, docs_tmp_, false);

  std::FILE* idx = create_temp(index_file(prefix_), &idx_tmp_);
  std::FILE* in = nullptr;
  try {
    uint8_t header[kIndexHeaderSize];
    std::memcpy(header, kIndexMagic, 9);
    uint64_t version = kIndexVersion, seqs = uint64_t(num_sequences_), docs = uint64_t(num_doc_indices_);
    std::memcpy(header + 9, &version, 8);
    header[17] = uint8_t(dtype_);
    std::memcpy(header + 18, &seqs, 8);
    std::memcpy(header + 26, &docs, 8);
    write(idx, idx_tmp_, header, sizeof header);
    // Lengths as they are, then the byte offsets they imply, then the document indices.
    std::vector<char> buf(1 << 20);
    auto copy = [&](const std::string& path) {
      in = std::fopen(path.c_str(), "rb");
      if (!in) throw environment_error(fmt::format("cannot reopen {}: {}", path, std::strerror(errno)));
      size_t n;
      while ((n = std::fread(buf.data(), 1, buf.size(), in)) > 0) write(idx, idx_tmp_, buf.data(), n);
      close_file(in);
    };
    copy(lengths_tmp_);
    in = std::fopen(lengths_tmp_.c_str(), "rb");
    if (!in) throw environment_error(fmt::format("cannot reopen {}: {}", lengths_tmp_, std::strerror(errno)));
    std::vector<int32_t> lens(1 << 16);
    std::vector<int64_t> ptrs(1 << 16);
    int64_t offset = 0;
    size_t n;
    while ((n = std::fread(lens.data(), 4, lens.size(), in)) > 0) {
      for (size_t i = 0; i < n; ++i) {
        ptrs[i] = offset;
        offset += int64_t(lens[i]) * int64_t(token_size_);
      }
      write(idx, idx_tmp_, ptrs.data(), n * 8);
    }
    close_file(in);
    copy(docs_tmp_);
    if (std::fflush(idx) != 0 || ::fsync(fileno(idx)) != 0)
      throw environment_error(fmt::format("cannot write {}: {}", idx_tmp_, std::strerror(errno)), "is the disk full?");
    close_file(idx);
  } catch (...) {
    close_file(in);
    close_file(idx);
    throw;
  }
  std::remove(lengths_tmp_.c_str());
  std::remove(docs_tmp_.c_str());
  closed_ = true;
}

void IndexedDatasetWriter::commit() {
  LT_CHECK(closed_ && !committed_, "commit() needs close() first, once");
  for (auto [from, to] : {std::pair{bin_tmp_, data_file(prefix_)}, std::pair{idx_tmp_, index_file(prefix_)}})
    if (std::rename(from.c_str(), to.c_str()) != 0)
      throw environment_error(fmt::format("cannot rename {} to {}: {}", from, to, std::strerror(errno)));
  committed_ = true;
}

void IndexedDatasetWriter::abandon() {
  close_file(bin_);
  close_file(lengths_);
  close_file(docs_);
  for (const auto& p : {bin_tmp_, idx_tmp_, lengths_tmp_, docs_tmp_})
    if (!p.empty()) std::remove(p.c_str());
}

}  // namespace llmtrain::trainer
