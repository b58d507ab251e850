// The safetensors file format (Hugging Face), shared by its writer and its reader:
//
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  a JSON object, padded with spaces to a multiple of 8 bytes:
//                "__metadata__": {string: string, ...}          (optional)
//                "<tensor name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
//   [rest]     the tensors' raw little-endian bytes; data_offsets are relative to the start of
//              this section, and the tensors tile it exactly (no gaps, no overlaps).
//
// dtypes: F32, BF16, F16, I32, U16, I64, U8 (kernels::DType's storage types). Checkpoint shards,
// exported models and the PyTorch parity tests all use this format.
//
// Rules a reader could get wrong:
//  - The writer streams through a caller-supplied sink (the checkpoint code writes through a
//    fault-injectable file layer); it never opens files itself.
//  - The reader validates the whole header when it opens a file and throws llmtrain::Error naming
//    the file (and the tensor) on anything malformed; afterwards reads are plain pread()s of byte
//    ranges, so resharding can read just the slice of a tensor it needs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "kernels/tensor.h"

namespace llmtrain::trainer {

// "F32", "BF16", ... and back (nullopt-like: returns false for names llmtrain does not store).
const char* safetensors_dtype_name(kernels::DType dtype);
bool safetensors_dtype_from_name(std::string_view name, kernels::DType* dtype);

struct SafetensorsEntry {
  std::string name;
  kernels::DType dtype = kernels::DType::fp32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // host memory, numel · dtype size bytes
  // Or, without `data`, the bytes streamed: fill(offset, out, n) writes the entry's bytes
  // [offset, offset + n) to `out` (safetensors_write asks for at most kFillBytes at a time).
  std::function<void(uint64_t offset, void* out, size_t bytes)> fill = {};
};
inline constexpr size_t kFillBytes = size_t(4) << 20;

using ByteSink = std::function<void(const void* data, size_t bytes)>;

// Writes a complete file through `sink`: length, header, then each entry's bytes in order.
void safetensors_write(const std::vector<SafetensorsEntry>& entries, const std::map<std::string, std::string>& metadata,
                       const ByteSink& sink);

// The number of bytes safetensors_write produces for these entries and metadata.
uint64_t safetensors_size(const std::vector<SafetensorsEntry>& entries,
                          const std::map<std::string, std::string>& metadata);

struct SafetensorsTensor {
  std::string name;
  kernels::DType dtype = kernels::DType::fp32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets: byte range within the data section

  int64_t numel() const;
  uint64_t bytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  // Opens and validates `path`; throws llmtrain::Error naming it when it is not a valid file.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Tensors in the order of their data in the file.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsTensor* find(std::string_view name) const;  // nullptr when absent
  const SafetensorsTensor& at(std::string_view name) const;    // Error naming file and tensor when absent

  // Bytes [offset, offset + count) of a tensor's data into dst.
  void read(const SafetensorsTensor& t, uint64_t offset, uint64_t count, void* dst) const;
  // A whole tensor into dst (t.bytes() bytes).
  void read(const SafetensorsTensor& t, void* dst) const { read(t, 0, t.bytes(), dst); }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;  // 8 + header length
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace llmtrain::trainer
