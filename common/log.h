// Logging to stderr (stdout is for a command's result, e.g. the resolved recipe). Every line
// carries the rank prefix once a job has more than one rank, so interleaved output stays readable.
#pragma once

#include <fmt/format.h>

#include <string>

namespace llmtrain {

enum class LogLevel { debug, info, warn, error };

// Set once at rank start-up; "" for single-process commands.
void log_set_rank(int rank, int world_size);
const std::string& log_prefix();
// The rank given to log_set_rank, or -1 before (error messages name it).
int log_rank();
// The level is LLMTRAIN_LOG's (debug) or info; programs that embed the library may change it (the
// fuzz targets keep only errors).
void log_set_level(LogLevel level);
bool log_enabled(LogLevel level);
void log_write(LogLevel level, const std::string& message);
// A line drawn in place on stderr's terminal (a progress bar) is there (true) or gone (false): the
// next line logged clears it first, so that no message is written after the bar.
void log_inplace_line(bool drawn);
// Also appends every line written from now on to `path` (the run directory's log); "" stops.
// Throws llmtrain::Error when the file cannot be opened.
void log_open_file(const std::string& path);

// Progress messages of a job (what it is doing, its figures) come from one rank: the others set
// this false at start-up and log_progress() prints nothing there. Warnings and errors come from
// every rank. The setting is the calling thread's (ranks as threads of one process each set their
// own) and the process's default for threads that never set one (a rank's background writers).
void log_set_progress(bool enabled);
bool log_progress_enabled();

template <typename... Args>
void log_progress(fmt::format_string<Args...> f, Args&&... args) {
  if (log_progress_enabled() && log_enabled(LogLevel::info))
    log_write(LogLevel::info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::info)) log_write(LogLevel::info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::warn)) log_write(LogLevel::warn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::debug)) log_write(LogLevel::debug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace llmtrain
