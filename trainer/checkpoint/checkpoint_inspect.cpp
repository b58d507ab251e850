#include "trainer/checkpoint/checkpoint_inspect.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>

#include "common/checked_math.h"
#include "common/checkpoint_dir.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/host.h"
#include "common/json_depth.h"
#include "common/strings.h"
#include "parallel/comm/comm.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/model/model_spec.h"

namespace llmtrain::trainer {
namespace fs = std::filesystem;

std::string checkpoint_step_path(const std::string& path) {
  if (fs::exists(fs::path(path) / kManifestFile)) return path;
  const char* hint = "give a checkpoint: a step_<N>/ directory, a checkpoint directory or a run directory";
  if (!fs::is_directory(path)) throw Error(fmt::format("{} does not exist or is not a directory", path), hint);
  auto dirs = checkpoint_candidates(path);
  if (dirs.empty() && fs::is_directory(fs::path(path) / "ckpt"))
    dirs = checkpoint_candidates((fs::path(path) / "ckpt").string());
  if (dirs.empty())
    throw Error(fmt::format("{} holds no checkpoint (no manifest.json, no step_<N>/, no ckpt/)", path), hint);
  return dirs.front();
}

Manifest checkpoint_read_manifest(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / kManifestFile).string();
  if (!fs::exists(path))
    throw Error(fmt::format("{} is missing: {} is not a complete checkpoint", path, step_dir),
                "a checkpoint is a step_<N>/ directory holding manifest.json");
  const std::string text = read_file(path);
  require_json_depth(text, path);
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) throw Error(fmt::format("{} is not valid JSON", path), "the checkpoint is damaged");
  return manifest_from_json(j, path);
}

CheckpointReport checkpoint_inspect(const std::string& step_dir) {
  CheckpointReport r;
  r.path = step_dir;
  r.manifest = checkpoint_read_manifest(step_dir);
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;  // nullptr: could not be opened
  auto open = [&](const std::string& name) -> const SafetensorsFile* {
    auto it = files.find(name);
    if (it != files.end()) return it->second.get();
    std::unique_ptr<SafetensorsFile> f;
    const fs::path p = fs::path(step_dir) / name;
    if (!fs::exists(p)) {  // (manifest_from_json allows only plain file names)
      r.problems.push_back(fmt::format("{} is missing", p.string()));
    } else {
      try {
        f = std::make_unique<SafetensorsFile>(p.string());
      } catch (const Error& e) {
        r.problems.push_back(e.what());
      }
    }
    return files.emplace(name, std::move(f)).first->second.get();
  };
  std::vector<char> buf(static_cast<size_t>(kChecksumChunkBytes));
  for (const SavedTensor& t : r.manifest.tensors) {
    CheckpointTensorReport tr;
    tr.tensor = &t;
    const int64_t numel = checked_product(t.shape).value_or(-1);  // manifest_from_json refused an overflow
    for (const SavedSlice& s : t.slices) {
      ++r.slices;
      tr.covered = checked_add(tr.covered, s.slice.numel()).value_or(INT64_MAX);  // many slices of a crafted one
      const SafetensorsFile* f = open(s.file);
      if (!f) continue;
      const SafetensorsTensor* e = f->find(s.key);
      const std::string what = fmt::format("{} {} in {}", to_string(t.role), t.name, f->path());
      if (!e) {
        r.problems.push_back(fmt::format("{}: entry {} is missing", what, s.key));
        continue;
      }
      if (e->dtype != kernels::DType::fp32 || e->bytes() != uint64_t(s.slice.numel()) * sizeof(float)) {
        r.problems.push_back(fmt::format("{}: entry {} holds {} bytes of {}, the manifest says {} fp32 elements", what,
                                         s.key, e->bytes(), kernels::to_string(e->dtype), s.slice.numel()));
        continue;
      }
      const uint64_t chunks = (e->bytes() + kChecksumChunkBytes - 1) / kChecksumChunkBytes;
      if (s.chunk_crc32c.size() != chunks) {
        r.problems.push_back(
            fmt::format("{}: {} chunk checksums listed for {} chunks", what, s.chunk_crc32c.size(), chunks));
        continue;
      }
      uint32_t whole = 0;
      std::vector<std::string> bad;  // the damaged chunks' byte ranges
      for (uint64_t c = 0; c < chunks; ++c) {
        const uint64_t at = c * kChecksumChunkBytes, n = std::min<uint64_t>(kChecksumChunkBytes, e->bytes() - at);
        f->read(*e, at, n, buf.data());
        if (crc32c(buf.data(), n) != s.chunk_crc32c[c]) bad.push_back(fmt::format("{}..{}", at, at + n));
        whole = crc32c_extend(whole, buf.data(), n);
      }
      if (!bad.empty())
        r.problems.push_back(fmt::format("{}: checksum mismatch in bytes {}", what, fmt::join(bad, ", ")));
      else if (whole != s.crc32c)
        r.problems.push_back(fmt::format("{}: checksum mismatch over the slice (its chunks match)", what));
      tr.bytes += static_cast<int64_t>(e->bytes());
    }
    if (tr.covered != numel)
      r.problems.push_back(
          fmt::format("{} {}: the slices hold {} of its {} elements", to_string(t.role), t.name, tr.covered, numel));
    r.bytes += tr.bytes;
    r.tensors.push_back(tr);
  }
  r.files = static_cast<int64_t>(files.size());
  return r;
}

void checkpoint_check_model_fits(const std::string& step_dir, const Manifest& manifest, const ModelConfig& model,
                                 double copies, const std::string& what, double extra_bytes) {
  // Every layer has tensors of its own: a recipe of more layers than the manifest lists tensors is
  // refused before its parameter list (which grows with the layers) is even made.
  if (size_t(std::max(model.layers, 0)) > manifest.tensors.size())
    throw Error(fmt::format("{}: its recipe's model has {} layers, but the manifest lists {} tensors", step_dir,
                            model.layers, manifest.tensors.size()),
                "the checkpoint is damaged, or its recipe is not the one it was written with");
  int64_t need = 0;
  std::set<std::string> files;
  for (const ParamSpec& p : model_param_specs(model)) {
    const SavedTensor* t = manifest.find(p.name, TensorRole::param);
    if (!t)
      throw Error(
          fmt::format("{}: its recipe's model has a parameter {}, which the manifest does not list", step_dir, p.name),
          "the checkpoint is damaged, or its recipe is not the one it was written with");
    if (t->shape != p.shape)
      throw Error(fmt::format("{}: parameter {} is [{}] in the manifest, its recipe's model says [{}]", step_dir,
                              p.name, fmt::join(t->shape, ", "), fmt::join(p.shape, ", ")),
                  "the checkpoint is damaged, or its recipe is not the one it was written with");
    need = checked_add(need, checked_mul(p.numel(), int64_t(sizeof(float))).value_or(INT64_MAX)).value_or(INT64_MAX);
    for (const SavedSlice& s : t->slices) files.insert(s.file);
  }
  int64_t have = 0;
  for (const std::string& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(fs::path(step_dir) / f, ec);
    if (!ec) have = checked_add(have, int64_t(std::min<uintmax_t>(size, uintmax_t(INT64_MAX)))).value_or(INT64_MAX);
  }
  if (have < need)
    throw Error(
        fmt::format("{}: its recipe's model has {} parameters ({}), but the shard files holding them have {}", step_dir,
                    format_count(double(need / 4)), format_bytes(double(need)), format_bytes(double(have))),
        "the checkpoint is damaged or incomplete (or its manifest crafted): nothing was read");
  require_host_memory(int64_t(std::min(double(need) * copies + extra_bytes, 9e18)), what);
}

std::map<std::string, std::vector<float>> checkpoint_read_params(const std::string& step_dir,
                                                                 const ModelConfig& model) {
  std::map<std::string, std::vector<float>> out;
  std::vector<CheckpointSlice> slices;
  for (const ParamSpec& p : model_param_specs(model)) {
    std::vector<float>& v = out[p.name];
    v.resize(static_cast<size_t>(p.numel()));
    slices.push_back({p.name, TensorRole::param, p.shape, SliceSpec::whole(p.shape),
                      kernels::Tensor(v.data(), kernels::DType::fp32, {p.numel()}), false});
  }
  auto world = parallel::make_local_comm();
  checkpoint_load(step_dir, slices, *world);
  return out;
}

}  // namespace llmtrain::trainer
