#include "trainer/checkpoint/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

#include "common/crc32c.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/json_depth.h"
#include "common/log.h"
#include "common/recipe/recipe_changes.h"
#include "common/strings.h"
#include "kernels/ops.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/data/tokenizer.h"

namespace llmtrain::trainer {
namespace fs = std::filesystem;
using kernels::DType;
using kernels::Tensor;
using nlohmann::json;

namespace {

// ---- collective helpers ----

// Every rank's string, in rank order.
std::vector<std::string> gather_strings(parallel::Comm& world, const std::string& mine) {
  const int n = world.size();
  if (n == 1) return {mine};
  int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(n);
  world.all_gather(Tensor(&len, DType::int64, {1}), Tensor(lens.data(), DType::int64, {n}));
  int64_t width = *std::max_element(lens.begin(), lens.end());
  std::string padded = mine;
  padded.resize(width);
  std::string all(static_cast<size_t>(width * n), '\0');
  world.all_gather(Tensor(padded.data(), DType::uint8, {width}), Tensor(all.data(), DType::uint8, {width * n}));
  std::vector<std::string> out(n);
  for (int r = 0; r < n; ++r) out[r] = all.substr(static_cast<size_t>(r * width), static_cast<size_t>(lens[r]));
  return out;
}

// An error on one rank, in a form that crosses ranks: kind, message, hint.
std::string encode_error(const Error& e) {
  // A message may hold a path that is not UTF-8: replaced, never a throw (the writer thread's
  // failures pass through here, where an exception would end the process).
  return json{{"user", e.kind() == Error::Kind::user}, {"message", e.what()}, {"hint", e.hint()}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

// Every rank learns whether any rank failed; if one did, every rank throws the first failure
// (naming its rank when it is not this one). `local` is "" when this rank succeeded.
void agree(parallel::Comm& world, const std::string& local) {
  int32_t failed = local.empty() ? 0 : 1;
  world.all_reduce(Tensor(&failed, DType::int32, {1}), parallel::ReduceOp::max);
  if (!failed) return;
  auto all = gather_strings(world, local);
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    if (all[r].empty()) continue;
    json j = json::parse(all[r]);
    std::string msg = j.at("message").get<std::string>();
    if (r != world.rank()) msg = fmt::format("rank {}: {}", r, msg);
    throw Error(msg, j.at("hint").get<std::string>(),
                j.at("user").get<bool>() ? Error::Kind::user : Error::Kind::environment);
  }
}

// Runs `fn`, catching an llmtrain::Error (or std::exception) for agree().
template <typename Fn>
std::string capture(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return encode_error(e);
  } catch (const std::exception& e) {
    return encode_error(environment_error(e.what()));
  } catch (...) {
    return encode_error(environment_error("an unknown exception"));
  }
  return {};
}

std::string entry_key(const CheckpointSlice& s) { return fmt::format("{}/{}", to_string(s.role), s.name); }

bool whole_block(const SliceSpec& s) { return s.begin == 0 && s.end == s.block_numel(); }

std::vector<uint32_t> chunk_checksums(const void* data, uint64_t bytes) {
  std::vector<uint32_t> out;
  const auto* p = static_cast<const uint8_t*>(data);
  for (uint64_t at = 0; at < bytes; at += kChecksumChunkBytes)
    out.push_back(crc32c(p + at, std::min<uint64_t>(kChecksumChunkBytes, bytes - at)));
  return out;
}

// The slice descriptions a rank wrote, for rank 0's manifest.
json describe_written(const std::vector<CheckpointSlice>& slices, const std::string& file) {
  json out = json::array();
  for (const auto& s : slices) {
    if (!s.write) continue;
    uint64_t bytes = s.data.bytes();
    uint32_t crc = 0;
    std::vector<uint32_t> chunks;
    if (s.fetch) {  // streamed, a checksum chunk at a time
      const int64_t per_chunk = kChecksumChunkBytes / int64_t(sizeof(float));
      std::vector<float> bounce(size_t(std::min(per_chunk, s.data.numel())));
      for (int64_t at = 0; at < s.data.numel(); at += per_chunk) {
        const int64_t n = std::min(per_chunk, s.data.numel() - at);
        s.fetch(at, kernels::host_tensor(bounce.data(), {n}));
        chunks.push_back(crc32c(bounce.data(), uint64_t(n) * sizeof(float)));
        crc = crc32c_extend(crc, bounce.data(), uint64_t(n) * sizeof(float));
      }
    } else {
      crc = crc32c(s.data.data, bytes);
      chunks = chunk_checksums(s.data.data, bytes);
    }
    out.push_back({{"name", s.name},
                   {"role", to_string(s.role)},
                   {"shape", s.global_shape},
                   {"file", file},
                   {"key", entry_key(s)},
                   {"offset", s.slice.offset},
                   {"slice_shape", s.slice.shape},
                   {"begin", s.slice.begin},
                   {"end", s.slice.end},
                   {"crc32c", crc},
                   {"chunk_crc32c", chunks}});
  }
  return out;
}

void write_shard(FileSystem& fsys, const std::string& path, const std::vector<CheckpointSlice>& slices) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& s : slices) {
    if (!s.write) continue;
    LT_CHECK(s.data.dtype == DType::fp32 && s.data.device == kernels::Device::cpu, "checkpoint slice {} not host fp32",
             s.name);
    std::vector<int64_t> shape = whole_block(s.slice) ? s.slice.shape : std::vector<int64_t>{s.slice.numel()};
    SafetensorsEntry e{entry_key(s), DType::fp32, shape, s.data.data};
    if (s.fetch)
      e.fill = [&s](uint64_t offset, void* out, size_t bytes) {
        s.fetch(int64_t(offset / sizeof(float)), kernels::host_tensor(static_cast<float*>(out), {int64_t(bytes / 4)}));
      };
    entries.push_back(std::move(e));
  }
  if (entries.empty()) return;
  auto file = fsys.create(path);
  safetensors_write(entries, {{"format", kCheckpointFormatName}},
                    [&](const void* data, size_t bytes) { file->append(data, bytes); });
  file->sync();
  file->close();
}

Manifest assemble_manifest(const CheckpointMeta& meta, const std::vector<std::string>& per_rank) {
  Manifest m;
  m.step = meta.step;
  m.consumed_samples = meta.consumed_samples;
  m.rng = meta.rng;
  m.extra = meta.extra;
  m.recipe_yaml = meta.recipe_yaml;
  m.mesh = meta.mesh;
  m.tokenizer_kind = meta.tokenizer_kind;
  m.tokenizer = meta.tokenizer_kind == kTokenizerKindByte ? "byte" : checkpoint_tokenizer_file(meta.tokenizer_kind);
  std::map<std::pair<std::string, std::string>, size_t> index;
  for (const auto& text : per_rank) {
    for (const json& j : json::parse(text)) {
      auto key = std::make_pair(j.at("name").get<std::string>(), j.at("role").get<std::string>());
      auto it = index.find(key);
      if (it == index.end()) {
        it = index.emplace(key, m.tensors.size()).first;
        m.tensors.push_back(
            {key.first, tensor_role_from_string(key.second), j.at("shape").get<std::vector<int64_t>>(), "F32", {}});
      }
      SavedSlice s;
      s.file = j.at("file").get<std::string>();
      s.key = j.at("key").get<std::string>();
      s.slice.offset = j.at("offset").get<std::vector<int64_t>>();
      s.slice.shape = j.at("slice_shape").get<std::vector<int64_t>>();
      s.slice.begin = j.at("begin").get<int64_t>();
      s.slice.end = j.at("end").get<int64_t>();
      s.crc32c = j.at("crc32c").get<uint32_t>();
      s.chunk_crc32c = j.at("chunk_crc32c").get<std::vector<uint32_t>>();
      m.tensors[it->second].slices.push_back(std::move(s));
    }
  }
  return m;
}

// Retention by lineage: of the step directories at or below `step` (the one just committed, which
// `latest` names), the oldest beyond `keep` are deleted. Directories above it are another line — a
// run rolled back with checkpoint.resume: <older> leaves its abandoned future there — and are never
// deleted, nor are `.partial` directories (another job's save in progress looks the same).
void retain(FileSystem& fsys, const std::string& dir, int64_t step, int keep) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = checkpoint_parse_step_dir(e.path().filename().string());
    if (s >= 0 && s <= step) steps.emplace_back(s, e.path().string());
  }
  std::sort(steps.rbegin(), steps.rend());
  for (size_t i = static_cast<size_t>(keep); i < steps.size(); ++i) fsys.remove_all(steps[i].second);
}

// ---- loading ----

// Reads what `want` needs from one saved slice, checking checksums of everything read.
int64_t read_overlap(const SafetensorsFile& file, const SavedSlice& have, const CheckpointSlice& want,
                     const std::string& dir) {
  auto runs = slice_overlap(want.slice, have.slice);
  if (runs.empty()) return 0;
  const SafetensorsTensor& t = file.at(have.key);
  const uint64_t elem = sizeof(float);
  if (t.dtype != DType::fp32)
    throw Error(fmt::format("{}: tensor {} is {}, not F32", file.path(), have.key, kernels::to_string(t.dtype)),
                "not supported yet: checkpoints whose tensors are not fp32");
  if (t.bytes() != static_cast<uint64_t>(have.slice.numel()) * elem)
    throw Error(fmt::format("{}: tensor {} holds {} bytes, the manifest says {} elements", file.path(), have.key,
                            t.bytes(), have.slice.numel()),
                "the checkpoint is damaged");
  // The chunks the runs touch, read as one span from the first to the last.
  const uint64_t first_byte = static_cast<uint64_t>(runs.front().have_at) * elem;
  uint64_t last_byte = 0;
  for (const auto& r : runs) last_byte = std::max<uint64_t>(last_byte, uint64_t(r.have_at + r.count) * elem);
  const uint64_t c0 = first_byte / kChecksumChunkBytes,
                 c1 = (last_byte + kChecksumChunkBytes - 1) / kChecksumChunkBytes;
  const uint64_t span_begin = c0 * kChecksumChunkBytes,
                 span_end = std::min<uint64_t>(c1 * kChecksumChunkBytes, t.bytes());
  std::vector<char> buf(span_end - span_begin);
  file.read(t, span_begin, buf.size(), buf.data());
  if (have.chunk_crc32c.size() != (t.bytes() + kChecksumChunkBytes - 1) / kChecksumChunkBytes)
    throw Error(fmt::format("{}/{}: slice {} lists {} chunk checksums for {} bytes", dir, kManifestFile, have.key,
                            have.chunk_crc32c.size(), t.bytes()),
                "the checkpoint is damaged");
  uint32_t whole = 0;
  for (uint64_t c = c0; c < c1; ++c) {
    uint64_t at = c * kChecksumChunkBytes - span_begin;
    uint64_t n = std::min<uint64_t>(kChecksumChunkBytes, buf.size() - at);
    uint32_t crc = crc32c(buf.data() + at, n);
    if (crc != have.chunk_crc32c[c])
      throw Error(fmt::format("{}: checksum mismatch in tensor {} (bytes {}..{}): the data is damaged", file.path(),
                              have.key, span_begin + at, span_begin + at + n),
                  "the checkpoint is damaged; resume from an older one (checkpoint.resume: <path>)");
    whole = crc32c_extend(whole, buf.data() + at, n);
  }
  if (span_begin == 0 && span_end == t.bytes() && whole != have.crc32c)
    throw Error(fmt::format("{}: checksum mismatch in tensor {}", file.path(), have.key), "the checkpoint is damaged");
  float* dst = static_cast<float*>(want.data.data);
  int64_t copied = 0;
  for (const auto& r : runs) {
    char* src = buf.data() + (uint64_t(r.have_at) * elem - span_begin);
    if (want.store)  // offloaded state: into its store
      want.store(r.want_at, kernels::host_tensor(reinterpret_cast<float*>(src), {r.count}));
    else
      std::memcpy(dst + r.want_at, src, uint64_t(r.count) * elem);
    copied += r.count;
  }
  return copied;
}

LoadedCheckpoint load_local(const std::string& path, const std::vector<CheckpointSlice>& slices) {
  LoadedCheckpoint out;
  out.path = path;
  std::string manifest_path = (fs::path(path) / kManifestFile).string();
  if (!fs::exists(manifest_path))
    throw Error(fmt::format("{} is missing: {} is not a complete checkpoint", manifest_path, path),
                "a checkpoint directory is step_<N>/ holding manifest.json; .partial directories are incomplete");
  const std::string manifest_text = read_file(manifest_path);
  require_json_depth(manifest_text, manifest_path);
  json j = json::parse(manifest_text, nullptr, false);
  if (j.is_discarded()) throw Error(fmt::format("{} is not valid JSON", manifest_path), "the checkpoint is damaged");
  out.manifest = manifest_from_json(j, manifest_path);

  std::map<std::string, SafetensorsFile> files;
  auto open = [&](const std::string& name) -> const SafetensorsFile& {
    auto it = files.find(name);
    if (it != files.end()) return it->second;
    std::string fp = (fs::path(path) / name).string();
    if (!fs::exists(fp))
      throw Error(fmt::format("{} is missing (listed in {})", fp, manifest_path), "the checkpoint is damaged");
    return files.emplace(name, SafetensorsFile(fp)).first->second;
  };
  for (const auto& want : slices) {
    const SavedTensor* saved = out.manifest.find(want.name, want.role);
    if (!saved)
      throw Error(fmt::format("{} has no {} tensor {}", path, to_string(want.role), want.name),
                  want.role == TensorRole::param
                      ? "the recipe's model differs from the checkpoint's (compare model: in both)"
                      : "the checkpoint has no optimizer state: resume it with checkpoint.load_weights_only: true");
    if (saved->shape != want.global_shape)
      throw Error(fmt::format("{}: tensor {} has shape [{}] in the checkpoint, the model expects [{}]", path, want.name,
                              fmt::join(saved->shape, ", "), fmt::join(want.global_shape, ", ")),
                  "the recipe's model differs from the checkpoint's (compare model: in both)");
    int64_t filled = 0;
    for (const auto& have : saved->slices) filled += read_overlap(open(have.file), have, want, path);
    if (filled != want.slice.numel())
      throw Error(fmt::format("{}: the slices of {} {} cover {} of the {} elements needed", path, to_string(want.role),
                              want.name, filled, want.slice.numel()),
                  "the checkpoint is incomplete or its slices overlap");
  }
  return out;
}

// The `model:` keys of two recipes whose values differ: "model.hidden is 64 there, 128 in this
// recipe".
std::string recipe_model_differences(const std::string& theirs, const std::string& ours) {
  std::vector<std::string> out;
  for (const RecipeChange& c : recipe_changes(theirs, ours))
    if (c.key.starts_with("model."))
      out.push_back(fmt::format("{} is {} there, {} in this recipe", c.key, c.saved, c.now));
  return join(out, ", ");
}

// Why the checkpoint at `path` holds another model than the one `slices` are of: "" when its
// parameters are this model's (every one present, with its shape), or when its manifest cannot be
// read (loading it says what is wrong).
std::string other_model(const std::string& path, const std::vector<CheckpointSlice>& slices,
                        const std::string& recipe_yaml) {
  Manifest m;
  try {
    const std::string manifest_path = (fs::path(path) / kManifestFile).string();
    const std::string text = read_file(manifest_path);
    require_json_depth(text, manifest_path);
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded()) return "";
    m = manifest_from_json(j, manifest_path);
  } catch (const Error&) {
    return "";
  }
  std::string tensor;
  for (const CheckpointSlice& want : slices) {
    if (want.role != TensorRole::param) continue;
    const SavedTensor* saved = m.find(want.name, TensorRole::param);
    if (!saved) {
      tensor = fmt::format("it has no parameter {}", want.name);
      break;
    }
    if (saved->shape != want.global_shape) {
      tensor = fmt::format("its {} is [{}], this model's [{}]", want.name, fmt::join(saved->shape, ", "),
                           fmt::join(want.global_shape, ", "));
      break;
    }
  }
  if (tensor.empty()) return "";
  const std::string keys = recipe_yaml.empty() ? "" : recipe_model_differences(m.recipe_yaml, recipe_yaml);
  return fmt::format("{} is an intact checkpoint of another model, not damaged: {}{}", path,
                     keys.empty() ? "" : keys + "; ", tensor);
}

}  // namespace

std::string checkpoint_tokenizer_file(const std::string& kind) {
  if (kind == kTokenizerKindHfJson) return "tokenizer.json";
  if (kind == kTokenizerKindGpt2Files) return "tokenizer-gpt2-vocab-merges.bin";
  return "";
}

std::vector<CheckpointSlice> checkpoint_slices(const Model& model, const AdamW* opt, bool dense_params,
                                               bool dense_moments, bool moments, const ExpertWriters* experts) {
  std::vector<CheckpointSlice> out;
  const bool master = opt && opt->has_master();
  for (const ModelParam& p : model.parameters()) {
    const bool write_params = experts && p.expert_shard ? experts->params : dense_params;
    const bool write_moments = experts && p.expert_shard ? experts->moments : dense_moments;
    const int dim = p.spec.tp_split_dim;
    SliceSpec block = dim >= 0 && p.shape[dim] != p.spec.shape[dim]
                          ? SliceSpec::block(p.spec.shape, dim, p.shard_begin, p.shape[dim])
                          : SliceSpec::whole(p.spec.shape);
    if (master) {
      // The fp32 master of the owned ranges (below, with the moments).
    } else if (!model.options().external_params) {
      CheckpointSlice s{p.spec.name, TensorRole::param, p.spec.shape,
                        block,       p.value,           write_params && !p.tied_copy && !p.tp_replica};
      if (p.value.dtype != DType::fp32) {  // bf16 without a master (optimizer.master false): widened
        s.data = kernels::Tensor(nullptr, DType::fp32, p.value.shape);
        s.fetch = [v = p.value](int64_t begin, kernels::Tensor host) {
          kernels::copy_convert(host, v.flat(begin, host.numel()));
        };
        s.store = [v = p.value](int64_t begin, kernels::Tensor host) {
          kernels::copy_convert(v.flat(begin, host.numel()), host);
        };
      }
      out.push_back(std::move(s));
    } else {
      // ZeRO 3: the values of the owned element ranges, from the param shard, written by the ranks
      // that write the moments.
      for (const parallel::FlatRange& own : model.param_shard_ranges()) {
        const int64_t lo = std::max(p.offset, own.begin), hi = std::min(p.offset + p.numel(), own.end);
        if (lo >= hi) continue;
        SliceSpec part = block;
        part.begin = lo - p.offset;
        part.end = hi - p.offset;
        out.push_back({p.spec.name, TensorRole::param, p.spec.shape, part,
                       model.param_shard().flat(model.param_shard_offset(lo), hi - lo),
                       write_moments && !p.tied_copy && !p.tp_replica});
      }
    }
    if (!opt || (!moments && !master)) continue;
    // The part of this parameter's flat range the optimizer owns: at most one owned range meets a
    // parameter (ZeRO owns one chunk of each sharding unit, a union of whole parameter groups), so a rank has at most
    // one slice of each moment.
    bool seen = false;
    for (const parallel::FlatRange& own : opt->owned()) {
      const int64_t lo = std::max(p.offset, own.begin), hi = std::min(p.offset + p.numel(), own.end);
      if (lo >= hi) continue;
      LT_CHECK(!seen, "parameter {} meets two owned ranges of the optimizer", p.spec.name);
      seen = true;
      SliceSpec part = block;
      part.begin = lo - p.offset;
      part.end = hi - p.offset;
      const bool write = write_moments && !p.tied_copy && !p.tp_replica;
      const int64_t at = opt->state_offset(lo);
      auto state = [&](TensorRole role, AdamW::State which) {
        CheckpointSlice s{p.spec.name, role, p.spec.shape, part, {}, write};
        // Offloaded, or bf16 moments: through read_state / write_state, which convert to fp32.
        if (opt->offload_store() || (which != AdamW::State::master && opt->state_dtype() != kernels::DType::fp32)) {
          s.data = kernels::Tensor(nullptr, kernels::DType::fp32, {hi - lo});
          s.fetch = [opt, which, at](int64_t begin, kernels::Tensor host) { opt->read_state(which, at + begin, host); };
          s.store = [opt, which, at](int64_t begin, kernels::Tensor host) {
            opt->write_state(which, at + begin, host);
          };
        } else {
          s.data = which == AdamW::State::master    ? opt->master().flat(at, hi - lo)
                   : which == AdamW::State::exp_avg ? opt->exp_avg().flat(at, hi - lo)
                                                    : opt->exp_avg_sq().flat(at, hi - lo);
        }
        out.push_back(std::move(s));
      };
      if (master) state(TensorRole::param, AdamW::State::master);
      if (!moments) continue;
      if (opt->muon_owns(lo)) {  // a hidden matrix of Muon's: its momentum only
        state(TensorRole::muon_momentum, AdamW::State::exp_avg);
        continue;
      }
      state(TensorRole::adam_m, AdamW::State::exp_avg);
      state(TensorRole::adam_v, AdamW::State::exp_avg_sq);
    }
  }
  return out;
}

void slice_to_host(const CheckpointSlice& s, kernels::Tensor host) {
  if (s.fetch)
    s.fetch(0, host);
  else
    kernels::copy(host, s.data);
}

HostStagedSlices::HostStagedSlices(std::vector<CheckpointSlice> slices) : slices_(std::move(slices)) {
  for (CheckpointSlice& s : slices_) {
    if (s.data.device == kernels::Device::cpu) continue;
    kernels::Buffer host(s.data.dtype, s.data.shape, kernels::Device::cpu, kernels::MemoryKind::other);
    staged_.push_back({s.data, host.tensor()});
    s.data = host.tensor();
    host_.push_back(std::move(host));
  }
}

void HostStagedSlices::to_host() const {
  for (const auto& [device, host] : staged_) kernels::copy(host, device);
}

void HostStagedSlices::from_host() const {
  for (const auto& [device, host] : staged_) kernels::copy(device, host);
}

void checkpoint_collective(parallel::Comm& world, const std::function<void()>& fn) { agree(world, capture(fn)); }

std::string checkpoint_save_prepare(FileSystem& fsys, const std::string& dir, int64_t step, parallel::Comm& world) {
  const std::string partial = (fs::path(dir) / checkpoint_step_dir(step)).string() + kPartialSuffix;
  agree(world, capture([&] {
          if (world.rank() != 0) return;
          fsys.make_dirs(dir);
          fsys.remove_all(partial);
          fsys.make_dirs(partial);
        }));
  return partial;
}

ShardWrite checkpoint_save_write(FileSystem& fsys, const std::string& partial, const CheckpointMeta& meta,
                                 const std::vector<CheckpointSlice>& slices, int rank,
                                 const std::function<void()>& before) noexcept {
  ShardWrite out;
  out.error = capture([&] {
    if (before) before();
    const std::string shard = checkpoint_shard_file(rank);
    write_shard(fsys, (fs::path(partial) / shard).string(), slices);
    out.written = describe_written(slices, shard).dump();
    if (rank == 0 && !meta.tokenizer_bytes.empty())
      write_file_atomic(fsys, (fs::path(partial) / checkpoint_tokenizer_file(meta.tokenizer_kind)).string(),
                        meta.tokenizer_bytes);
  });
  if (!out.error.empty()) out.written.clear();
  return out;
}

std::string checkpoint_save_commit(FileSystem& fsys, const std::string& dir, const CheckpointMeta& meta,
                                   const ShardWrite& mine, parallel::Comm& world, int keep) {
  const std::string final_dir = (fs::path(dir) / checkpoint_step_dir(meta.step)).string();
  const std::string partial = final_dir + kPartialSuffix;
  const bool root = world.rank() == 0;
  agree(world, mine.error);
  auto per_rank = gather_strings(world, mine.written);
  agree(world, capture([&] {
          if (!root) return;
          Manifest m = assemble_manifest(meta, per_rank);
          write_file_atomic(fsys, (fs::path(partial) / kManifestFile).string(), manifest_to_json(m).dump(1));
          fsys.sync_dir(partial);
          // The commit: the complete directory takes its name. A step saved again (a resumed or
          // rolled-back run) swaps with the old one atomically, so one of the two is always there.
          const bool again = fs::exists(final_dir);
          if (again)
            fsys.exchange(partial, final_dir);
          else
            fsys.rename(partial, final_dir);
          fsys.sync_dir(dir);
          // After the commit, nothing can undo it: a failure is a warning (the checkpoint is
          // there; a restart that finds `latest` stale scans for it).
          try {
            if (again) fsys.remove_all(partial);  // the old contents of the step, swapped out
            write_file_atomic(fsys, (fs::path(dir) / kLatestFile).string(), checkpoint_step_dir(meta.step) + "\n");
            retain(fsys, dir, meta.step, keep);
          } catch (const Error& e) {
            log_warn("checkpoint {} is written, but tidying up after it failed: {}", final_dir, e.what());
          }
        }));
  return final_dir;
}

std::string checkpoint_save(FileSystem& fsys, const std::string& dir, const CheckpointMeta& meta,
                            const std::vector<CheckpointSlice>& slices, parallel::Comm& world, int keep) {
  const HostStagedSlices staged(slices);
  agree(world, capture([&] { staged.to_host(); }));  // an offload file's failure ends every rank's save
  const std::string partial = checkpoint_save_prepare(fsys, dir, meta.step, world);
  ShardWrite mine = checkpoint_save_write(fsys, partial, meta, staged.slices(), world.rank());
  return checkpoint_save_commit(fsys, dir, meta, mine, world, keep);
}

LoadedCheckpoint checkpoint_load(const std::string& path, const std::vector<CheckpointSlice>& slices,
                                 parallel::Comm& world) {
  const HostStagedSlices staged(slices);
  LoadedCheckpoint out;
  agree(world, capture([&] { out = load_local(path, staged.slices()); }));
  agree(world, capture([&] { staged.from_host(); }));
  return out;
}

std::optional<LoadedCheckpoint> checkpoint_resume(const std::string& dir_or_path, bool explicit_path,
                                                  const std::vector<CheckpointSlice>& slices, parallel::Comm& world,
                                                  const std::string& recipe_yaml) {
  // Another model's checkpoint is intact: an error of its own, and no fallback past it (that would
  // only meet more of them).
  auto same_model = [&](const std::string& path) {
    agree(world, capture([&] {
            const std::string why = other_model(path, slices, recipe_yaml);
            if (!why.empty())
              throw Error(why,
                          "resume it with the recipe it was written with (its manifest.json holds it), or give this "
                          "run another checkpoint.dir (or name), or checkpoint.resume: none to start from step 0");
          }));
  };
  if (explicit_path && fs::exists(fs::path(dir_or_path) / kManifestFile)) {
    same_model(dir_or_path);
    return checkpoint_load(dir_or_path, slices, world);
  }
  if (explicit_path && !fs::is_directory(dir_or_path))
    throw Error(fmt::format("checkpoint.resume: {} does not exist", dir_or_path),
                "give a step_<N> directory, a checkpoint directory, auto or none");
  auto candidates = checkpoint_candidates(dir_or_path);
  if (explicit_path && candidates.empty())
    throw Error(fmt::format("checkpoint.resume: {} holds no checkpoint (no manifest.json, no step_<N>/)", dir_or_path),
                "give a step_<N> directory written by llmtrain");
  for (const auto& path : candidates) {
    same_model(path);
    try {
      return checkpoint_load(path, slices, world);
    } catch (const Error& e) {
      if (explicit_path && candidates.size() == 1) throw;
      log_warn("skipping damaged checkpoint {}: {}", path, e.what());
    }
  }
  if (!candidates.empty())
    throw Error(fmt::format("no intact checkpoint among the {} in {}", candidates.size(), dir_or_path),
                "see the warnings above; set checkpoint.resume: none (or another checkpoint.dir) to start from step 0");
  return std::nullopt;
}

}  // namespace llmtrain::trainer
