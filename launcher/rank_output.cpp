#include "launcher/rank_output.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <cstring>
#include <ctime>
#include <filesystem>

#include "common/error.h"
#include "common/file_io.h"
#include "common/strings.h"
#include "parallel/progress.h"

namespace llmtrain::launcher {
namespace {

std::string timestamp() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// One file per rank can mean thousands of open files on the node that supervises a large job.
void raise_open_file_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

}  // namespace

TaggedLine parse_tagged_line(OutputTags tags, std::string_view line, bool from_stderr) {
  TaggedLine out;
  out.is_stderr = from_stderr;
  if (tags == OutputTags::mpirun_tag_output) {
    // "[<jobid>,<rank>]<stdout>:text"
    if (line.size() > 4 && line[0] == '[') {
      auto comma = line.find(',');
      auto close = line.find(']');
      if (comma != std::string_view::npos && close != std::string_view::npos && comma < close) {
        std::string_view rest = line.substr(close + 1);
        const std::optional<int> rank = parse_small_count(line.substr(comma + 1, close - comma - 1));
        for (std::string_view stream : {"<stdout>:", "<stderr>:", "<stddiag>:"}) {
          if (rest.starts_with(stream) && rank) {
            out.rank = *rank;
            out.is_stderr = stream != "<stdout>:";
            out.text = std::string(rest.substr(stream.size()));
            return out;
          }
        }
      }
    }
  } else {
    // "3: text", the number right-aligned to the width of the largest one.
    size_t i = 0;
    while (i < line.size() && line[i] == ' ') ++i;
    size_t digits = i;
    while (digits < line.size() && line[digits] >= '0' && line[digits] <= '9') ++digits;
    const std::optional<int> rank = digits > i && digits < line.size() && line[digits] == ':'
                                        ? parse_small_count(line.substr(i, digits - i))
                                        : std::nullopt;
    if (rank) {
      std::string_view rest = line.substr(digits + 1);
      if (rest.starts_with(" ")) rest.remove_prefix(1);
      // slurmstepd's notes about the step arrive labelled with task 0; they are the launcher's.
      if (rest.starts_with("slurmstepd")) {
        out.text = std::string(rest);
        return out;
      }
      out.rank = *rank;
      out.text = std::string(rest);
      return out;
    }
  }
  out.text = std::string(line);
  return out;
}

std::string rank_log_name(int rank) { return fmt::format("rank_{:05d}.log", rank); }

RankOutput::RankOutput(std::string logs_dir, OutputTags tags, bool console)
    : logs_dir_(std::move(logs_dir)), tags_(tags), console_(console) {
  if (logs_dir_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(logs_dir_, ec);
  if (ec)
    throw environment_error(fmt::format("cannot create the log folder {}: {}", logs_dir_, ec.message()),
                            "check log.dir and its permissions");
  raise_open_file_limit();
  launcher_log_path_ = logs_dir_ + "/launcher.log";
  launcher_file_ = open_append(launcher_log_path_);
  if (!launcher_file_)
    throw environment_error(fmt::format("cannot open {} for appending", launcher_log_path_),
                            "check log.dir and its permissions");
}

RankOutput::~RankOutput() {
  flush();
  for (auto& [rank, f] : rank_files_) std::fclose(f);
  if (launcher_file_) std::fclose(launcher_file_);
}

void RankOutput::begin_attempt(const std::string& header, int ranks) {
  flush();
  ++attempt_;
  header_ = header;
  for (int r = 0; r < ranks; ++r) rank_file(r);
}

std::FILE* RankOutput::rank_file(int rank) {
  if (logs_dir_.empty()) return nullptr;
  auto it = rank_files_.find(rank);
  std::FILE* f = nullptr;
  if (it == rank_files_.end()) {
    std::string path = logs_dir_ + "/" + rank_log_name(rank);
    f = open_append(path);
    if (!f) {
      launcher_log(fmt::format("cannot open {}; rank {}'s output goes to the console only", path, rank));
      rank_files_[rank] = nullptr;
      return nullptr;
    }
    std::setvbuf(f, nullptr, _IOLBF, 0);
    rank_files_[rank] = f;
  } else {
    f = it->second;
  }
  if (f && header_seen_[rank] != attempt_) {
    header_seen_[rank] = attempt_;
    if (!header_.empty()) std::fprintf(f, "--- %s %s ---\n", timestamp().c_str(), header_.c_str());
  }
  return f;
}

void RankOutput::launcher_log(const std::string& text) {
  if (!launcher_file_) return;
  std::fprintf(launcher_file_, "%s %s\n", timestamp().c_str(), text.c_str());
  std::fflush(launcher_file_);
}

void RankOutput::emit_launcher_line(const std::string& text, bool is_stderr) {
  if (console_) {
    std::fprintf(is_stderr ? stderr : stdout, "%s\n", text.c_str());
    std::fflush(is_stderr ? stderr : stdout);
  }
  launcher_log(text);
}

// Open MPI's message boxes start and end with a line of dashes. A box that only says ranks exited
// non-zero is dropped from the console while stopping (set_stopping); any other is shown whole.
void RankOutput::end_banner() {
  bool noise = false;
  for (const TaggedLine& l : banner_)
    noise = noise || l.text.find("terminated normally, but") != std::string::npos ||
            l.text.find("exited with non-zero status") != std::string::npos;
  for (const TaggedLine& l : banner_) {
    if (stopping_ && noise)
      launcher_log(l.text);
    else
      emit_launcher_line(l.text, l.is_stderr);
  }
  banner_.clear();
  in_banner_ = false;
}

void RankOutput::emit(const TaggedLine& line) {
  if (line.rank < 0) {
    const bool dashes = line.text.size() >= 20 && line.text.find_first_not_of('-') == std::string::npos;
    if (!in_banner_ && !dashes) return emit_launcher_line(line.text, line.is_stderr);
    banner_.push_back(line);
    if (!in_banner_)
      in_banner_ = true;
    else if (dashes || banner_.size() > 64)  // closed (or not a box after all: shown as it came)
      end_banner();
    return;
  }
  std::string_view text = line.text;
  if (const size_t at = text.find(parallel::kProgressMarker); sink_ && at != std::string_view::npos) {
    sink_(line.rank, text.substr(at + std::strlen(parallel::kProgressMarker)));
    if (at == 0) return;
    text = text.substr(0, at);
  }
  std::string own_prefix = fmt::format("[rank {}] ", line.rank);
  if (text.starts_with(own_prefix)) text.remove_prefix(own_prefix.size());
  if (console_) {
    std::FILE* out = line.is_stderr ? stderr : stdout;
    std::fprintf(out, "%s%.*s\n", own_prefix.c_str(), static_cast<int>(text.size()), text.data());
    std::fflush(out);
  }
  if (std::FILE* f = rank_file(line.rank)) std::fprintf(f, "%.*s\n", static_cast<int>(text.size()), text.data());
}

void RankOutput::feed(bool is_stderr, std::string_view bytes) {
  std::string& pending = pending_[is_stderr ? 1 : 0];
  pending.append(bytes);
  size_t start = 0;
  for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1)
    emit(parse_tagged_line(tags_, std::string_view(pending).substr(start, nl - start), is_stderr));
  pending.erase(0, start);
}

void RankOutput::flush() {
  for (int s = 0; s < 2; ++s) {
    if (pending_[s].empty()) continue;
    emit(parse_tagged_line(tags_, pending_[s], s == 1));
    pending_[s].clear();
  }
  if (in_banner_) {  // a box that did not close: shown as it came
    const bool was = stopping_;
    stopping_ = false;
    end_banner();
    stopping_ = was;
  }
}

void RankOutput::launcher_message(const std::string& text) {
  if (console_) {
    std::fprintf(stderr, "[launcher] %s\n", text.c_str());
    std::fflush(stderr);
  }
  launcher_log(text);
}

}  // namespace llmtrain::launcher
