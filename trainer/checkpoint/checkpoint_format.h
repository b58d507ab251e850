// The checkpoint format, shared by the writer and the reader (spec: docs/checkpoint-format.md).
//
// A checkpoint is a directory `step_<8 digits>/` holding safetensors shard files (each written by
// one rank, holding the slices that rank owns) and `manifest.json`, which says for every tensor
// (the parameters, fp32 — the optimizer's master with 16-bit training —, and both AdamW moments)
// its global name, shape and dtype, and which slice of it each shard file holds, with CRC-32C
// checksums.
//
// Rule a reader could get wrong: a slice is a block of the *global* tensor (offset and shape in
// every dimension) and, within that block in row-major order, the element range [begin, end).
// Tensor parallelism cuts blocks; ZeRO's flat sharding cuts element ranges. A shard file entry
// holds exactly the elements [begin, end) of its block, flattened, in that order.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/checkpoint_dir.h"  // the directory layout: step_<N>/, manifest.json, latest
#include "common/error.h"

namespace llmtrain::trainer {

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kCheckpointFormatName = "llmtrain-checkpoint";
// Checksums also cover fixed-size chunks of each slice, so that a reader of part of a slice (a
// different layout) verifies what it reads without reading the rest.
inline constexpr int64_t kChecksumChunkBytes = int64_t(1) << 20;

// "rank_00003.safetensors"
std::string checkpoint_shard_file(int world_rank);

// What a tensor entry is.
// muon_momentum: Muon's momentum buffer of a hidden matrix (optimizer.name muon), in adam_m's place.
enum class TensorRole { param, master, adam_m, adam_v, muon_momentum };
const char* to_string(TensorRole role);
TensorRole tensor_role_from_string(const std::string& s);  // throws llmtrain::Error

struct SliceSpec {
  std::vector<int64_t> offset;  // block start in every dimension of the global tensor
  std::vector<int64_t> shape;   // block extent in every dimension
  int64_t begin = 0;            // element range within the block, row-major
  int64_t end = 0;

  int64_t block_numel() const;
  int64_t numel() const { return end - begin; }
  // The whole of a tensor of `shape`.
  static SliceSpec whole(const std::vector<int64_t>& shape);
  // Rows [row_begin, row_end) of dimension `dim` of a tensor of `shape` (a tensor-parallel shard).
  static SliceSpec block(const std::vector<int64_t>& shape, int dim, int64_t start, int64_t extent);
};

struct SavedSlice {
  SliceSpec slice;
  std::string file;                    // shard file name inside the step directory
  std::string key;                     // safetensors entry name inside that file
  uint32_t crc32c = 0;                 // of the slice's bytes
  std::vector<uint32_t> chunk_crc32c;  // of each kChecksumChunkBytes chunk of them (last one short)
};

struct SavedTensor {
  std::string name;  // global parameter name (Hugging Face's, model_spec.h)
  TensorRole role = TensorRole::param;
  std::vector<int64_t> shape;  // global shape
  std::string dtype;           // safetensors dtype name: "F32", "BF16", ...
  std::vector<SavedSlice> slices;
};

struct CheckpointMesh {
  int tp = 1, pp = 1, dp = 1, zero = 0;
  int zero_group = 0;  // with zero ≥ 1: dp ranks per shard group (manifest key only then; 0 otherwise)
  int cp = 1;          // context parallelism (manifest key only when > 1): parameters are replicated over it
};

struct Manifest {
  int version = kCheckpointFormatVersion;
  int64_t step = 0;
  int64_t consumed_samples = 0;  // training samples consumed (the data loader's position)
  nlohmann::json rng;            // RNG state (seed and counters) to continue exactly
  nlohmann::json extra;          // loop state: skipped-step counters, loss scale, ...
  std::string recipe_yaml;       // the resolved recipe it was written with
  CheckpointMesh mesh;
  std::string tokenizer;       // "byte", or the name of a tokenizer file copied into the directory
  std::string tokenizer_kind;  // how to rebuild it (trainer/data/tokenizer.h)
  std::vector<SavedTensor> tensors;

  const SavedTensor* find(const std::string& name, TensorRole role) const;
};

nlohmann::json manifest_to_json(const Manifest& m);
// An integer of a manifest we did not write (its fields, the loop state in `extra`): json_integer
// (common/json_integer.h: a JSON integer in [lo, hi], never a float cast) with the manifest's hint.
// Throws llmtrain::Error naming `what`.
int64_t manifest_integer(const nlohmann::json& v, std::string_view what, int64_t lo = INT64_MIN,
                         int64_t hi = INT64_MAX);
// Throws llmtrain::Error naming `path` for a malformed manifest or a newer format version.
Manifest manifest_from_json(const nlohmann::json& j, const std::string& path);

// One contiguous copy from a saved slice into a wanted slice: `count` elements starting at
// element `have_at` of the saved slice's data and element `want_at` of the wanted slice's data.
struct CopyRun {
  int64_t have_at = 0;
  int64_t want_at = 0;
  int64_t count = 0;
};

// The elements two slices of one tensor share, as copy runs in increasing order (adjacent runs
// merged). Empty when they do not overlap.
std::vector<CopyRun> slice_overlap(const SliceSpec& want, const SliceSpec& have);

}  // namespace llmtrain::trainer
