#include "trainer/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/checked_math.h"
#include "common/error.h"
#include "common/json_depth.h"

namespace llmtrain::trainer {

using kernels::DType;

namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // the reference implementation's limit

const struct {
  DType dtype;
  const char* name;
} kDTypes[] = {{DType::fp32, "F32"},   {DType::bf16, "BF16"}, {DType::fp16, "F16"}, {DType::int32, "I32"},
               {DType::uint16, "U16"}, {DType::int64, "I64"}, {DType::uint8, "U8"}};

uint64_t entry_bytes(const SafetensorsEntry& e) {
  const auto n = checked_product(e.shape);
  const auto bytes = n ? checked_mul(*n, int64_t(kernels::dtype_size(e.dtype))) : std::nullopt;
  LT_CHECK(bytes, "safetensors entry {} has a negative or overflowing shape", e.name);
  return uint64_t(*bytes);
}

std::string header_json(const std::vector<SafetensorsEntry>& entries,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    LT_CHECK(e.name != "__metadata__" && !h.contains(e.name), "safetensors entry name {} is reserved or repeated",
             e.name);
    const uint64_t bytes = entry_bytes(e);
    h[e.name] = {
        {"dtype", safetensors_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string s = h.dump();
  s.resize((s.size() + 7) / 8 * 8, ' ');
  return s;
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

bool safetensors_dtype_from_name(std::string_view name, DType* dtype) {
  for (const auto& d : kDTypes)
    if (name == d.name) {
      *dtype = d.dtype;
      return true;
    }
  return false;
}

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void safetensors_write(const std::vector<SafetensorsEntry>& entries, const std::map<std::string, std::string>& metadata,
                       const ByteSink& sink) {
  const std::string header = header_json(entries, metadata);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
  sink(len, 8);
  sink(header.data(), header.size());
  for (const SafetensorsEntry& e : entries) {
    const uint64_t bytes = entry_bytes(e);
    LT_CHECK(bytes == 0 || e.data || e.fill, "safetensors entry {} has no data", e.name);
    if (bytes == 0) continue;
    if (e.data) {
      sink(e.data, size_t(bytes));
      continue;
    }
    std::vector<char> bounce(size_t(std::min<uint64_t>(bytes, kFillBytes)));
    for (uint64_t at = 0; at < bytes; at += kFillBytes) {
      const size_t n = size_t(std::min<uint64_t>(kFillBytes, bytes - at));
      e.fill(at, bounce.data(), n);
      sink(bounce.data(), n);
    }
  }
}

uint64_t safetensors_size(const std::vector<SafetensorsEntry>& entries,
                          const std::map<std::string, std::string>& metadata) {
  uint64_t total = 8 + header_json(entries, metadata).size();
  for (const SafetensorsEntry& e : entries) total += entry_bytes(e);
  return total;
}

// ---- reader ---------------------------------------------------------------------------------

namespace {

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw Error(fmt::format("{}: not a valid safetensors file: {}", path, what),
              "the file is truncated or was not written as safetensors; re-create or re-download it");
}

// pread of exactly `count` bytes at `offset`, or false on a short read (end of file).
bool pread_all(int fd, void* dst, uint64_t count, uint64_t offset, int* err) {
  char* p = static_cast<char*>(dst);
  while (count > 0) {
    const ssize_t got = ::pread(fd, p, size_t(std::min<uint64_t>(count, 1u << 30)), off_t(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return false;
    }
    if (got == 0) {
      *err = 0;
      return false;
    }
    p += got;
    count -= uint64_t(got);
    offset += uint64_t(got);
  }
  return true;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO would block a plain open
  if (fd_ < 0)
    throw Error(fmt::format("cannot open {}: {}", path, std::strerror(errno)), "check the path and its permissions");
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw environment_error(fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
    if (!S_ISREG(st.st_mode)) bad_file(path, "not a regular file (a directory, a device or a pipe)");
    const uint64_t size = uint64_t(st.st_size);
    if (size < 8) bad_file(path, fmt::format("{} bytes, shorter than the 8-byte header length", size));
    uint8_t len[8];
    int err = 0;
    if (!pread_all(fd_, len, 8, 0, &err)) bad_file(path, "cannot read the header length");
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
    if (n > kMaxHeader) bad_file(path, fmt::format("header length {} exceeds the format's limit of {}", n, kMaxHeader));
    if (n > size - 8)
      bad_file(path, fmt::format("truncated: header length {} but only {} bytes follow it", n, size - 8));
    std::string header(size_t(n), '\0');
    if (!pread_all(fd_, header.data(), n, 8, &err)) bad_file(path, "cannot read the header");
    data_start_ = 8 + n;
    const uint64_t data_size = size - data_start_;

    nlohmann::json h;
    require_json_depth(header, path + ": the header");
    try {
      h = nlohmann::json::parse(header);
    } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
      bad_file(path, fmt::format("header is not valid JSON ({})", e.what()));
    }
    if (!h.is_object()) bad_file(path, "header is not a JSON object");
    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) bad_file(path, "__metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string()) bad_file(path, fmt::format("__metadata__ value of {} is not a string", m.key()));
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      auto bad_tensor = [&](const std::string& what) { bad_file(path, fmt::format("tensor {}: {}", name, what)); };
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        bad_tensor("needs dtype, shape and data_offsets");
      SafetensorsTensor t;
      t.name = name;
      if (!v["dtype"].is_string()) bad_tensor("dtype is not a string");
      const std::string dt = v["dtype"].get<std::string>();
      if (!safetensors_dtype_from_name(dt, &t.dtype))
        throw Error(fmt::format("{}: tensor {} has dtype {}, which llmtrain does not read", path, name, dt),
                    "supported dtypes: F32, BF16, F16, I32, U16, I64, U8");
      if (!v["shape"].is_array()) bad_tensor("shape is not an array");
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned())
          bad_tensor(fmt::format("shape {} has a non-integer or negative entry", v["shape"].dump()));
        if (d.get<uint64_t>() > uint64_t(INT64_MAX))
          bad_tensor(fmt::format("shape {} has a dimension beyond 2^63", v["shape"].dump()));
        t.shape.push_back(d.get<int64_t>());
      }
      // The element count and the bytes it needs, without wrapping: a product that overflows would
      // otherwise come out small (or 0, an "empty" tensor that every comparison passes).
      const auto numel = checked_product(t.shape);
      const auto need = numel ? checked_mul(*numel, int64_t(kernels::dtype_size(t.dtype))) : std::nullopt;
      if (!need) bad_tensor(fmt::format("shape {} has more elements than 64 bits can count", v["shape"].dump()));
      const auto& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        bad_tensor("data_offsets is not [begin, end]");
      t.begin = off[0].get<uint64_t>();
      t.end = off[1].get<uint64_t>();
      if (t.begin > t.end || t.end > data_size)
        bad_tensor(fmt::format("data_offsets [{}, {}] outside the {} data bytes", t.begin, t.end, data_size));
      const uint64_t expect = uint64_t(*need);
      if (t.end - t.begin != expect)
        bad_tensor(fmt::format("data_offsets [{}, {}] hold {} bytes, but {} {} needs {}", t.begin, t.end,
                               t.end - t.begin, dt, v["shape"].dump(), expect));
      tensors_.push_back(std::move(t));
    }
    std::sort(tensors_.begin(), tensors_.end(),
              [](const auto& a, const auto& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
    uint64_t at = 0;
    for (const SafetensorsTensor& t : tensors_) {
      if (t.begin != at)
        bad_file(path, fmt::format("tensor {} starts at data byte {}, expected {} (tensors must tile the data without "
                                   "gaps or overlaps)",
                                   t.name, t.begin, at));
      at = t.end;
    }
    if (at != data_size) bad_file(path, fmt::format("the tensors cover {} of the {} data bytes", at, data_size));
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      data_start_(o.data_start_),
      tensors_(std::move(o.tensors_)),
      metadata_(std::move(o.metadata_)) {}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  for (const SafetensorsTensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const SafetensorsTensor& SafetensorsFile::at(std::string_view name) const {
  if (const SafetensorsTensor* t = find(name)) return *t;
  throw Error(fmt::format("{}: no tensor named {}", path_, name), "the file holds a different model or layout");
}

void SafetensorsFile::read(const SafetensorsTensor& t, uint64_t offset, uint64_t count, void* dst) const {
  LT_CHECK(offset <= t.bytes() && count <= t.bytes() - offset, "read [{}, +{}) of tensor {} ({} bytes)", offset, count,
           t.name, t.bytes());
  int err = 0;
  if (!pread_all(fd_, dst, count, data_start_ + t.begin + offset, &err))
    throw environment_error(fmt::format("{}: reading tensor {} failed: {}", path_, t.name,
                                        err ? std::strerror(err) : "the file is shorter than when it was opened"));
}

}  // namespace llmtrain::trainer
