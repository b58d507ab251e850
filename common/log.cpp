#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "common/error.h"
#include "common/file_io.h"
#include "common/strings.h"

namespace llmtrain {
namespace {

std::string g_prefix;
int g_rank = -1;
LogLevel g_level = [] {
  const char* env = std::getenv("LLMTRAIN_LOG");
  if (env && std::string_view(env) == "debug") return LogLevel::debug;
  return LogLevel::info;
}();
std::mutex g_mutex;
std::FILE* g_file = nullptr;
bool g_inplace_line = false;         // log_inplace_line
std::atomic<bool> g_progress{true};  // threads that set none
thread_local int t_progress = -1;    // this thread's: -1 unset, else 0 or 1

}  // namespace

void log_set_rank(int rank, int world_size) {
  g_rank = rank;
  g_prefix = world_size > 1 ? fmt::format("[rank {}] ", rank) : std::string();
}

const std::string& log_prefix() { return g_prefix; }

int log_rank() { return g_rank; }

void log_set_progress(bool enabled) {
  g_progress = enabled;
  t_progress = enabled ? 1 : 0;
}

bool log_progress_enabled() { return t_progress >= 0 ? t_progress == 1 : g_progress.load(); }

void log_set_level(LogLevel level) { g_level = level; }

void log_inplace_line(bool drawn) {
  std::lock_guard lock(g_mutex);
  g_inplace_line = drawn;
}

bool log_enabled(LogLevel level) { return level >= g_level; }

void log_write(LogLevel level, const std::string& message) {
  const char* tag = level == LogLevel::warn ? "warning: " : level == LogLevel::error ? "error: " : "";
  // Messages quote names and paths from files we did not write: escaped, so that no control
  // sequence of theirs reaches the terminal (lines of ours stay lines).
  const std::string text = printable(message, /*keep_newlines=*/true);
  std::lock_guard lock(g_mutex);
  // A progress bar drawn in place on the terminal: the line is cleared first, and the bar is
  // redrawn at its next update (trainer/report/progress_bar.h).
  if (g_inplace_line) std::fputs("\r\033[K", stderr);
  g_inplace_line = false;
  std::fprintf(stderr, "%s%s%s\n", g_prefix.c_str(), tag, text.c_str());
  std::fflush(stderr);
  if (g_file) {
    std::fprintf(g_file, "%s%s%s\n", g_prefix.c_str(), tag, text.c_str());
    std::fflush(g_file);
  }
}

void log_open_file(const std::string& path) {
  std::lock_guard lock(g_mutex);
  if (g_file) std::fclose(g_file);
  g_file = nullptr;
  if (path.empty()) return;
  g_file = open_append(path);  // never through a link planted at the name
  if (!g_file) throw environment_error(fmt::format("cannot open the log file {}", path), "check the run directory");
}

}  // namespace llmtrain
