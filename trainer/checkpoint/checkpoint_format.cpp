#include "trainer/checkpoint/checkpoint_format.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <set>

#include "common/checked_math.h"
#include "common/enum_names.h"
#include "common/error.h"
#include "common/json_integer.h"
#include "common/strings.h"

namespace llmtrain::trainer {

using nlohmann::json;

std::string checkpoint_shard_file(int world_rank) { return fmt::format("rank_{:05}.safetensors", world_rank); }

namespace {
constexpr EnumName<TensorRole> kTensorRoles[] = {{"param", TensorRole::param},
                                                 {"master", TensorRole::master},
                                                 {"adam_m", TensorRole::adam_m},
                                                 {"adam_v", TensorRole::adam_v},
                                                 {"muon_momentum", TensorRole::muon_momentum}};
}  // namespace

const char* to_string(TensorRole role) { return enum_name(kTensorRoles, role); }

TensorRole tensor_role_from_string(const std::string& s) {
  if (const std::optional<TensorRole> r = enum_value(kTensorRoles, s)) return *r;
  throw Error(fmt::format("unknown tensor role \"{}\" in a checkpoint manifest", s),
              "the checkpoint was written by another program or version");
}

int64_t SliceSpec::block_numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SliceSpec SliceSpec::whole(const std::vector<int64_t>& shape) {
  SliceSpec s;
  s.offset.assign(shape.size(), 0);
  s.shape = shape;
  s.begin = 0;
  s.end = s.block_numel();
  return s;
}

SliceSpec SliceSpec::block(const std::vector<int64_t>& shape, int dim, int64_t start, int64_t extent) {
  SliceSpec s = whole(shape);
  LT_CHECK(dim >= 0 && dim < static_cast<int>(shape.size()) && start >= 0 && start + extent <= shape[dim],
           "block dim {} [{}, +{}) of a rank-{} tensor", dim, start, extent, shape.size());
  s.offset[dim] = start;
  s.shape[dim] = extent;
  s.end = s.block_numel();
  return s;
}

const SavedTensor* Manifest::find(const std::string& name, TensorRole role) const {
  for (const auto& t : tensors)
    if (t.name == name && t.role == role) return &t;
  return nullptr;
}

json manifest_to_json(const Manifest& m) {
  json tensors = json::array();
  for (const auto& t : m.tensors) {
    json slices = json::array();
    for (const auto& s : t.slices)
      slices.push_back({{"file", s.file},
                        {"key", s.key},
                        {"offset", s.slice.offset},
                        {"shape", s.slice.shape},
                        {"begin", s.slice.begin},
                        {"end", s.slice.end},
                        {"crc32c", s.crc32c},
                        {"chunk_crc32c", s.chunk_crc32c}});
    tensors.push_back(
        {{"name", t.name}, {"role", to_string(t.role)}, {"shape", t.shape}, {"dtype", t.dtype}, {"slices", slices}});
  }
  json mesh = {{"tp", m.mesh.tp}, {"pp", m.mesh.pp}, {"dp", m.mesh.dp}, {"zero", m.mesh.zero}};
  if (m.mesh.zero > 0) mesh["zero_group"] = m.mesh.zero_group;
  if (m.mesh.cp > 1) mesh["cp"] = m.mesh.cp;
  return {{"format", kCheckpointFormatName},
          {"version", m.version},
          {"step", m.step},
          {"consumed_samples", m.consumed_samples},
          {"rng", m.rng},
          {"extra", m.extra},
          {"mesh", mesh},
          {"tokenizer", {{"kind", m.tokenizer_kind}, {"file", m.tokenizer}}},
          {"recipe", m.recipe_yaml},
          {"chunk_bytes", kChecksumChunkBytes},
          {"tensors", tensors}};
}

int64_t manifest_integer(const json& v, std::string_view what, int64_t lo, int64_t hi) {
  return json_integer(v, what, "the manifest is damaged", lo, hi);
}

namespace {

int64_t integer(const json& v, std::string_view what, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
  return manifest_integer(v, what, lo, hi);
}

std::vector<int64_t> integers(const json& v, std::string_view what, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
  if (!v.is_array()) throw Error(fmt::format("{} is not a list", what), "the manifest is damaged");
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (const json& x : v) out.push_back(integer(x, what, lo, hi));
  return out;
}

}  // namespace

Manifest manifest_from_json(const json& j, const std::string& path) {
  Manifest m;
  try {
    if (!j.is_object() || j.value("format", "") != kCheckpointFormatName)
      throw Error(
          fmt::format("{} is not an llmtrain checkpoint manifest (no \"format\": \"{}\")", path, kCheckpointFormatName),
          "point checkpoint.resume at a step_<N> directory written by llmtrain");
    m.version = int(integer(j.at("version"), path + ": version", INT_MIN, INT_MAX));
    if (m.version > kCheckpointFormatVersion)
      throw Error(fmt::format("{} has checkpoint format version {}, newer than this build reads ({})", path, m.version,
                              kCheckpointFormatVersion),
                  "load it with the llmtrain version that wrote it, or a newer one");
    const int64_t chunk_bytes =
        j.contains("chunk_bytes") ? integer(j["chunk_bytes"], path + ": chunk_bytes") : kChecksumChunkBytes;
    if (chunk_bytes != kChecksumChunkBytes)
      throw Error(fmt::format("{}: unsupported checksum chunk size {}", path, chunk_bytes),
                  "the checkpoint was written by another llmtrain version");
    m.step = integer(j.at("step"), path + ": step", 0);
    m.consumed_samples = integer(j.at("consumed_samples"), path + ": consumed_samples", 0);
    m.rng = j.value("rng", json::object());
    m.extra = j.value("extra", json::object());
    const json& mesh = j.at("mesh");
    auto mesh_int = [&](const char* key) { return int(integer(mesh.at(key), path + ": mesh." + key, 0, INT_MAX)); };
    m.mesh = {mesh_int("tp"),
              mesh_int("pp"),
              mesh_int("dp"),
              mesh_int("zero"),
              mesh.contains("zero_group") ? mesh_int("zero_group") : 0,
              mesh.contains("cp") ? int(integer(mesh.at("cp"), path + ": mesh.cp", 1, INT_MAX)) : 1};
    m.tokenizer_kind = j.at("tokenizer").at("kind").get<std::string>();
    m.tokenizer = j.at("tokenizer").at("file").get<std::string>();
    if (!is_plain_file_name(m.tokenizer))
      throw Error(
          fmt::format("{}: the tokenizer file \"{}\" is not a file name inside the checkpoint", path, m.tokenizer),
          "the manifest is damaged (or crafted): a checkpoint only names files of its own directory");
    m.recipe_yaml = j.at("recipe").get<std::string>();
    std::set<std::pair<std::string, std::string>> entries;  // (file, key) of every slice
    for (const json& jt : j.at("tensors")) {
      SavedTensor t;
      t.name = jt.at("name").get<std::string>();
      t.role = tensor_role_from_string(jt.at("role").get<std::string>());
      t.shape = integers(jt.at("shape"), path + ": shape of " + t.name, 0);
      if (!checked_product(t.shape))
        throw Error(fmt::format("{}: the shape [{}] of {} has more elements than 64 bits can count", path,
                                fmt::join(t.shape, ", "), t.name),
                    "the manifest is damaged");
      t.dtype = jt.at("dtype").get<std::string>();
      for (const json& js : jt.at("slices")) {
        SavedSlice s;
        s.file = js.at("file").get<std::string>();
        if (!is_plain_file_name(s.file))
          throw Error(
              fmt::format("{}: slice file \"{}\" of {} is not a file name inside the checkpoint", path, s.file, t.name),
              "the manifest is damaged (or crafted): a checkpoint only names files of its own directory");
        s.key = js.at("key").get<std::string>();
        s.slice.offset = integers(js.at("offset"), path + ": slice offset of " + t.name);
        s.slice.shape = integers(js.at("shape"), path + ": slice shape of " + t.name);
        s.slice.begin = integer(js.at("begin"), path + ": slice begin of " + t.name);
        s.slice.end = integer(js.at("end"), path + ": slice end of " + t.name);
        s.crc32c = uint32_t(integer(js.at("crc32c"), path + ": crc32c of " + t.name, 0, UINT32_MAX));
        for (int64_t c : integers(js.at("chunk_crc32c"), path + ": chunk_crc32c of " + t.name, 0, UINT32_MAX))
          s.chunk_crc32c.push_back(uint32_t(c));
        // In 64 bits that cannot wrap: a block inside the tensor has no more elements than it.
        bool ok = s.slice.offset.size() == t.shape.size() && s.slice.shape.size() == t.shape.size();
        for (size_t d = 0; ok && d < t.shape.size(); ++d) {
          const auto block_end = checked_add(s.slice.offset[d], s.slice.shape[d]);
          ok = s.slice.offset[d] >= 0 && s.slice.shape[d] >= 0 && block_end && *block_end <= t.shape[d];
        }
        ok = ok && s.slice.begin >= 0 && s.slice.begin <= s.slice.end && s.slice.end <= s.slice.block_numel();
        if (!ok)
          throw Error(fmt::format("{}: slice {} of {} lies outside the tensor's shape", path, s.key, t.name),
                      "the manifest is damaged");
        // Each entry of a shard file holds one slice: an entry listed twice would be read (and
        // counted) once per listing.
        if (!entries.insert({s.file, s.key}).second)
          throw Error(fmt::format("{}: entry {} of {} is listed twice", path, s.key, s.file),
                      "the manifest is damaged (or crafted): every slice is an entry of its own");
        t.slices.push_back(std::move(s));
      }
      m.tensors.push_back(std::move(t));
    }
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: malformed checkpoint manifest: {}", path, e.what()), "the manifest is damaged");
  }
  return m;
}

std::vector<CopyRun> slice_overlap(const SliceSpec& want, const SliceSpec& have) {
  const size_t rank = want.shape.size();
  LT_CHECK(have.shape.size() == rank && want.offset.size() == rank && have.offset.size() == rank,
           "slices of different ranks");
  std::vector<CopyRun> runs;
  if (want.numel() <= 0 || have.numel() <= 0) return runs;
  if (rank == 0) {  // a scalar: one element, both blocks hold it
    runs.push_back({0, 0, 1});
    return runs;
  }
  // The intersection of the two blocks.
  std::vector<int64_t> lo(rank), hi(rank);
  for (size_t d = 0; d < rank; ++d) {
    lo[d] = std::max(want.offset[d], have.offset[d]);
    hi[d] = std::min(want.offset[d] + want.shape[d], have.offset[d] + have.shape[d]);
    if (lo[d] >= hi[d]) return runs;
  }
  // Row-major strides of each block.
  auto strides = [&](const std::vector<int64_t>& shape) {
    std::vector<int64_t> s(rank, 1);
    for (size_t d = rank - 1; d > 0; --d) s[d - 1] = s[d] * shape[d];
    return s;
  };
  const auto ws = strides(want.shape), hs = strides(have.shape);
  const int64_t len = hi[rank - 1] - lo[rank - 1];

  // Walk the rows (every index of the leading dimensions) of the intersection.
  std::vector<int64_t> idx(lo.begin(), lo.end());
  while (true) {
    int64_t w = 0, h = 0;
    for (size_t d = 0; d < rank; ++d) {
      w += (idx[d] - want.offset[d]) * ws[d];
      h += (idx[d] - have.offset[d]) * hs[d];
    }
    // This row is want-block elements [w, w+len) and have-block elements [h, h+len); clip both
    // to their flat ranges.
    int64_t s = std::max<int64_t>({0, want.begin - w, have.begin - h});
    int64_t e = std::min<int64_t>({len, want.end - w, have.end - h});
    if (s < e) {
      CopyRun r{h + s - have.begin, w + s - want.begin, e - s};
      if (!runs.empty() && runs.back().have_at + runs.back().count == r.have_at &&
          runs.back().want_at + runs.back().count == r.want_at)
        runs.back().count += r.count;
      else
        runs.push_back(r);
    }
    // Next row: increment the leading dimensions like an odometer.
    if (rank == 1) break;
    size_t d = rank - 1;
    while (d > 0) {
      --d;
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
      if (d == 0) return runs;
    }
  }
  return runs;
}

}  // namespace llmtrain::trainer
