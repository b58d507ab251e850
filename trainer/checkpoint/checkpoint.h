// Saving and loading checkpoints (format: trainer/checkpoint/checkpoint_format.h, docs/checkpoint-format.md).
//
// Every rank calls checkpoint_save and checkpoint_load together (they are collective over the
// world communicator). A rank describes what it holds as CheckpointSlices: for each tensor (a
// parameter, or one of its AdamW moments) the slice of the global tensor this rank has, and
// whether it is the one rank that writes it (data-parallel replicas write a slice once).
//
// Rules a reader could get wrong:
//  - A save that fails anywhere (any rank, any file) leaves the previous complete checkpoint and
//    `latest` as they were and throws on every rank; nothing waits for a rank that failed.
//  - Loading is by slice intersection, not by file: a checkpoint written with any tp/pp/dp/ZeRO
//    layout loads into any other, reading only the byte ranges (rounded out to checksum chunks)
//    that overlap what this rank needs, and checking the checksums of what it reads.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/file_io.h"
#include "kernels/buffer.h"
#include "kernels/tensor.h"
#include "parallel/comm/comm.h"
#include "trainer/checkpoint/checkpoint_format.h"
#include "trainer/model/model.h"
#include "trainer/optim/optimizer.h"

namespace llmtrain::trainer {

struct CheckpointSlice {
  std::string name;  // global tensor name
  TensorRole role = TensorRole::param;
  std::vector<int64_t> global_shape;
  SliceSpec slice;       // which part of the global tensor `data` holds
  kernels::Tensor data;  // host fp32, slice.numel() elements
  bool write = false;    // this rank writes it (false: another rank writes the same slice)
  // Offloaded optimizer state (trainer/optim/offload.h): `data` has the shape and no memory, and
  // these move elements [begin, begin + host.numel()) of the slice between its store and a host
  // fp32 tensor. A save streams such a slice through a bounce buffer and a load stores what it
  // reads piece by piece: the state never needs room in memory as a whole.
  std::function<void(int64_t begin, kernels::Tensor host)> fetch = {}, store = {};
};

// Copies a slice's values into `host` (host fp32 of its shape): from its device, or its store.
void slice_to_host(const CheckpointSlice& s, kernels::Tensor host);

// The slices as the checkpoint code reads and writes them, host fp32: those on a device get host
// buffers of their own, filled by to_host (before a save) and copied back by from_host (after a
// load); offloaded ones (fetch/store) stream and are left as they are. checkpoint_save and
// checkpoint_load stage their slices so; the asynchronous writer snapshots whole slices through
// slice_to_host instead.
class HostStagedSlices {
 public:
  explicit HostStagedSlices(std::vector<CheckpointSlice> slices);
  const std::vector<CheckpointSlice>& slices() const { return slices_; }
  void to_host() const;
  void from_host() const;

 private:
  std::vector<CheckpointSlice> slices_;
  std::vector<kernels::Buffer> host_;
  std::vector<std::pair<kernels::Tensor, kernels::Tensor>> staged_;  // (on the device, its host copy)
};

// The slices of a model and its optimizer state held by this rank: the parameters, and the moments
// of the flat ranges the optimizer owns (AdamW::owned()). Who writes: parameters where
// `write_params` (data-parallel rank 0), moments where `write_moments` (GradSync::first_copy(): dp
// rank 0 without ZeRO; with ZeRO every rank of the first shard group, each for the ranges it owns).
// With a model's external_params (ZeRO 3) the parameters are the element ranges of its param shard,
// written as the moments are. Tied copies of an embedding are never written, nor tensor-parallel
// replicas (ModelParam::tp_replica: the lowest tp rank holding a slice writes it).
// 16-bit parameters (an optimizer with an fp32 master): the parameters are the master's owned
// ranges, written as the moments are, so a checkpoint is fp32 whatever the precision; after loading,
// CheckpointedStep::params_from_master rounds them into the model. `moments` = false leaves the moments
// out (loading weights only). Sharded experts (ModelParam::expert_shard) are written where
// `experts` says: their parameters by the first rank of their expert-data-parallel group, their
// moments by the expert sync's first copies (without it, as every other parameter).
struct ExpertWriters {
  bool params = false, moments = false;
};
std::vector<CheckpointSlice> checkpoint_slices(const Model& model, const AdamW* optimizer, bool write_params,
                                               bool write_moments, bool moments = true,
                                               const ExpertWriters* experts = nullptr);

// Everything besides tensors that a checkpoint records.
struct CheckpointMeta {
  int64_t step = 0;
  int64_t consumed_samples = 0;
  nlohmann::json rng;
  nlohmann::json extra;
  std::string recipe_yaml;
  CheckpointMesh mesh;
  std::string tokenizer_kind;   // trainer/data/tokenizer.h TokenizerSource::kind
  std::string tokenizer_bytes;  // the tokenizer file's bytes ("" for byte)
};

// Writes step `meta.step` into `dir` (created if needed) and keeps the newest `keep` complete
// checkpoints. Collective over `world`. Returns the step directory's path.
std::string checkpoint_save(FileSystem& fs, const std::string& dir, const CheckpointMeta& meta,
                            const std::vector<CheckpointSlice>& slices, parallel::Comm& world, int keep);

// checkpoint_save's three stages, for the asynchronous writer (async_checkpoint.h), which runs the
// second on a background thread and the other two on the training thread:
//  1. prepare (collective): rank 0 makes `<dir>/step_<N>.partial/` afresh; returns its path.
//  2. write (this rank alone, no communication, never throws): its shard file, fsynced, and on rank
//     0 the tokenizer's copy; the result carries the descriptions of what it wrote, or its failure.
//  3. commit (collective): when any rank's write failed, every rank throws that failure and nothing
//     is committed; else rank 0 writes the manifest, renames the directory into place, replaces
//     `latest` and applies retention.
struct ShardWrite {
  std::string written;  // the slices written, as JSON, for rank 0's manifest
  std::string error;    // "" or this rank's failure, encoded for the agreement
  bool failed() const { return !error.empty(); }
};
std::string checkpoint_save_prepare(FileSystem& fs, const std::string& dir, int64_t step, parallel::Comm& world);
// `before` (a test hook) runs first; what it throws is the write's failure.
ShardWrite checkpoint_save_write(FileSystem& fs, const std::string& partial, const CheckpointMeta& meta,
                                 const std::vector<CheckpointSlice>& slices, int rank,
                                 const std::function<void()>& before = {}) noexcept;
std::string checkpoint_save_commit(FileSystem& fs, const std::string& dir, const CheckpointMeta& meta,
                                   const ShardWrite& mine, parallel::Comm& world, int keep);

struct LoadedCheckpoint {
  std::string path;  // the step directory
  Manifest manifest;
};

// Fills every slice from the checkpoint at `path` (a step directory). Throws llmtrain::Error
// naming the file for a missing or damaged file, a checksum mismatch, a tensor missing or of
// another shape. Collective: every rank succeeds, or every rank throws (with the first failing
// rank's message).
LoadedCheckpoint checkpoint_load(const std::string& path, const std::vector<CheckpointSlice>& slices,
                                 parallel::Comm& world);

// resume: auto — the newest intact checkpoint in `dir`, falling back past damaged ones and saying
// so (nullopt when there is none); a path — that checkpoint (a step directory, or a checkpoint
// directory whose newest intact one is taken), any damage being an error. A checkpoint of another
// model (a parameter missing or of another shape) is not damaged, and not skipped: an error says
// so, naming the `model:` keys where its recipe and `recipe_yaml` (this run's, when given) differ.
std::optional<LoadedCheckpoint> checkpoint_resume(const std::string& dir_or_path, bool explicit_path,
                                                  const std::vector<CheckpointSlice>& slices, parallel::Comm& world,
                                                  const std::string& recipe_yaml = "");

// The tokenizer file name a checkpoint uses for a tokenizer kind ("" for byte).
std::string checkpoint_tokenizer_file(const std::string& kind);

// Runs `fn` on every rank of `world`; when it throws on any rank, every rank throws that error
// (naming the rank), so a failure one rank sees stops them all at the same point.
void checkpoint_collective(parallel::Comm& world, const std::function<void()>& fn);

}  // namespace llmtrain::trainer
