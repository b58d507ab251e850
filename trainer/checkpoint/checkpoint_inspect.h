// Reading a checkpoint outside training, on one process: `llmtrain ckpt inspect` (every checksum
// verified) and `llmtrain export` (the whole parameters, assembled from any layout's slices).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/recipe/recipe.h"
#include "trainer/checkpoint/checkpoint_format.h"

namespace llmtrain::trainer {

struct CheckpointTensorReport {
  const SavedTensor* tensor = nullptr;
  int64_t covered = 0;  // elements the slices hold (the tensor's numel when complete)
  int64_t bytes = 0;
};

struct CheckpointReport {
  std::string path;  // the step directory
  Manifest manifest;
  std::vector<CheckpointTensorReport> tensors;  // in the manifest's order
  int64_t slices = 0, files = 0, bytes = 0;
  std::vector<std::string> problems;  // every damaged, missing or incomplete part; empty when intact
};

// Reads `step_dir`'s manifest and every byte of every slice it lists, verifying the checksums of each
// slice and each 1 MiB chunk, the safetensors headers, and that the slices cover each tensor. A
// missing or malformed manifest throws llmtrain::Error; damage to the data is listed in problems.
CheckpointReport checkpoint_inspect(const std::string& step_dir);

// The step directory a user means by `path`: a step_<N>/ (holding manifest.json) as it is; a
// checkpoint directory's or a run directory's (its ckpt/) newest. Throws naming `path` otherwise.
std::string checkpoint_step_path(const std::string& path);

// The manifest of `step_dir` and the recipe it was written with (its model section parsed by the
// caller: trainer/ cannot parse YAML, so this returns the text).
Manifest checkpoint_read_manifest(const std::string& step_dir);

// Before a tool allocates the model a checkpoint's recipe describes (export, generate): every
// parameter of `model` is a tensor of `manifest` with its shape, the shard files its slices name
// hold at least the model's bytes, and `copies` times those plus `extra_bytes` (a KV cache, say) fit
// this host's memory (`what` needs them).
// Throws llmtrain::Error naming the tensor, the files or the sizes: a manifest claiming a 200B
// model beside a small file fails here, having allocated nothing.
void checkpoint_check_model_fits(const std::string& step_dir, const Manifest& manifest, const ModelConfig& model,
                                 double copies, const std::string& what, double extra_bytes = 0);

// Every parameter of `model` as a whole fp32 tensor (global shape, name -> values), read from the
// checkpoint at `step_dir` whatever layout wrote it, checksums verified.
std::map<std::string, std::vector<float>> checkpoint_read_params(const std::string& step_dir, const ModelConfig& model);

}  // namespace llmtrain::trainer
