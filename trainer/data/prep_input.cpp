// Cutting input files (plain or gzip) into documents through a fixed buffer; see prep_input.h.
#include "trainer/data/prep_input.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/strings.h"

namespace llmtrain::trainer {

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string strip_gz(const std::string& name) {
  return ends_with(name, ".gz") ? name.substr(0, name.size() - 3) : name;
}

}  // namespace

std::vector<InputFile> prep_resolve_inputs(const std::vector<std::string>& paths, const std::string& format) {
  if (paths.empty()) throw Error("no input files", "pass --input FILE...");
  if (format != "auto" && format != "text" && format != "jsonl")
    throw Error(fmt::format("--format {}: expected auto, text or jsonl", format));
  std::vector<InputFile> out;
  for (const auto& p : paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0)
      throw Error(fmt::format("cannot read input {}: {}", p, std::strerror(errno)), "check the --input paths");
    if (S_ISDIR(st.st_mode))
      throw Error(fmt::format("input {} is a directory", p), fmt::format("pass its files, e.g. --input {}/*", p));
    if (::access(p.c_str(), R_OK) != 0)
      throw Error(fmt::format("cannot read input {}: {}", p, std::strerror(errno)), "check its permissions");
    InputFile f;
    f.path = p;
    f.disk_bytes = int64_t(st.st_size);
    std::string base = strip_gz(p);
    bool jsonl_name = ends_with(base, ".jsonl") || ends_with(base, ".json") || ends_with(base, ".ndjson");
    f.format = format == "jsonl" || (format == "auto" && jsonl_name) ? InputFormat::jsonl : InputFormat::text;
    out.push_back(std::move(f));
  }
  return out;
}

DocumentReader::DocumentReader(const InputFile& file, uint32_t index, const std::optional<std::string>& separator,
                               int64_t max_document_bytes)
    : file_(file), index_(index), separator_(separator), max_bytes_(max_document_bytes), buf_(size_t(1) << 20) {
  gz_ = gzopen(file.path.c_str(), "rb");
  if (!gz_) throw Error(fmt::format("cannot open input {}: {}", file.path, std::strerror(errno ? errno : ENOMEM)));
  gzbuffer(gz_, 1 << 18);
}

DocumentReader::~DocumentReader() {
  if (gz_) gzclose(gz_);
}

int64_t DocumentReader::disk_offset() const { return gz_ ? int64_t(gzoffset(gz_)) : 0; }

bool DocumentReader::fill() {
  if (eof_) return false;
  int n = gzread(gz_, buf_.data(), unsigned(buf_.size()));
  if (n < 0) {
    int err = 0;
    const char* msg = gzerror(gz_, &err);
    throw Error(fmt::format("cannot read input {}: {}", file_.path,
                            err == Z_ERRNO ? std::strerror(errno) : std::string(msg ? msg : "read error")),
                "is the file complete (a truncated or corrupt .gz)?");
  }
  if (n == 0) {
    int err = 0;
    gzerror(gz_, &err);
    if (err != Z_OK && err != Z_STREAM_END)
      throw Error(fmt::format("cannot read input {}: {}", file_.path, gzerror(gz_, &err)),
                  "is the file complete (a truncated or corrupt .gz)?");
    eof_ = true;
    return false;
  }
  pos_ = 0;
  end_ = size_t(n);
  return true;
}

bool DocumentReader::read_line(std::string& s) {
  if (pos_ == end_ && !fill()) return false;
  ++line_;
  line_too_long_ = false;
  size_t start_size = s.size();
  for (;;) {
    const char* b = buf_.data() + pos_;
    const void* nl = std::memchr(b, '\n', end_ - pos_);
    size_t take = nl ? size_t(static_cast<const char*>(nl) - b) + 1 : end_ - pos_;
    if (int64_t(s.size() - start_size + take) <= max_bytes_)
      s.append(b, take);
    else
      line_too_long_ = true;  // keep consuming the line, but not its bytes
    pos_ += take;
    if (nl) return true;
    if (!fill()) return true;  // last line without a newline
  }
}

bool DocumentReader::next(Record& out) {
  out.text.clear();
  out.error.clear();
  out.file = index_;
  out.line = 0;
  auto too_large = [&](int64_t line) {
    out.text.clear();
    out.error = fmt::format("{}{}: document larger than --max-doc-mib {} MiB", file_.path,
                            line ? fmt::format(":{}", line) : std::string(), max_bytes_ >> 20);
  };

  if (file_.format == InputFormat::jsonl) {
    for (;;) {
      if (!read_line(out.text)) return false;
      out.line = line_;
      if (line_too_long_) {
        too_large(line_);
        return true;
      }
      if (trim(out.text).empty()) {  // blank line
        out.text.clear();
        continue;
      }
      return true;
    }
  }

  if (!separator_) {  // the whole file is one document
    if (eof_ && pos_ == end_) return false;
    bool any = false;
    while (pos_ < end_ || fill()) {
      any = true;
      size_t take = end_ - pos_;
      if (int64_t(out.text.size() + take) <= max_bytes_)
        out.text.append(buf_.data() + pos_, take);
      else
        out.error = "too large";
      pos_ = end_;
    }
    if (!out.error.empty()) too_large(0);
    return any;
  }

  // Documents separated by lines equal to the separator.
  std::string line;
  bool started = false;
  for (;;) {
    line.clear();
    if (!read_line(line)) return started;
    std::string_view body(line);
    if (!body.empty() && body.back() == '\n') body.remove_suffix(1);
    if (!body.empty() && body.back() == '\r') body.remove_suffix(1);
    if (body == *separator_) {
      if (started) return true;
      continue;  // separators before the first document, or repeated: no empty documents
    }
    if (!started) {
      started = true;
      out.line = line_;
    }
    if (!out.error.empty()) continue;  // already too large: drop the rest of it
    if (line_too_long_ || int64_t(out.text.size() + line.size()) > max_bytes_) {
      int64_t first = out.line;
      too_large(first);
      out.line = first;
      continue;
    }
    out.text += line;
  }
}

}  // namespace llmtrain::trainer
