#include "common/error.h"

#include <cstdio>
#include <cstdlib>

#include "common/log.h"
#include "common/strings.h"

namespace llmtrain {

std::string format_error(const Error& e) {
  // Messages quote names and paths from files we did not write: printed escaped (common/strings.h).
  std::string out = fmt::format("error: {}", printable(e.what(), /*keep_newlines=*/true));
  if (!e.hint().empty()) out += fmt::format("\n  hint: {}", printable(e.hint(), /*keep_newlines=*/true));
  return out;
}

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "%sinternal error at %s:%d: check failed: %s%s%s\n", log_prefix().c_str(), file, line, cond,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace llmtrain
