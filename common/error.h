// Errors. Two kinds, never mixed:
//  - llmtrain::Error: a user's mistake or an environment failure (bad recipe, missing file,
//    failed MPI call). It carries a message and a hint; only cli/ and a rank's top level catch
//    it, print it and exit with kExitUserError (or kExitFailure for environment failures).
//  - LT_CHECK: a broken internal invariant. It prints file, line and message and aborts.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace llmtrain {

// Process exit codes, documented in README.md ("Exit codes").
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;       // the job failed (environment, crash of a rank)
inline constexpr int kExitUserError = 2;     // the user must fix something (recipe, data, flags)
inline constexpr int kExitInterrupted = 75;  // SIGTERM/SIGINT: checkpoint written, not finished

class Error : public std::runtime_error {
 public:
  enum class Kind { user, environment };

  explicit Error(std::string message, std::string hint = {}, Kind kind = Kind::user)
      : std::runtime_error(std::move(message)), hint_(std::move(hint)), kind_(kind) {}

  const std::string& hint() const { return hint_; }
  Kind kind() const { return kind_; }
  int exit_code() const { return kind_ == Kind::user ? kExitUserError : kExitFailure; }

 private:
  std::string hint_;
  Kind kind_;
};

// A failure of the environment (I/O, MPI, CUDA) rather than of the user's input.
inline Error environment_error(std::string message, std::string hint = {}) {
  return Error(std::move(message), std::move(hint), Error::Kind::environment);
}

// Formats "error: <message>\n  hint: <hint>" for printing.
std::string format_error(const Error& e);

[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace llmtrain

// LT_CHECK(cond) or LT_CHECK(cond, "fmt {}", args...): internal invariant; aborts when false.
#define LT_CHECK(cond, ...)                                                               \
  do {                                                                                    \
    if (!(cond)) [[unlikely]]                                                             \
      ::llmtrain::check_failed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
  } while (0)
