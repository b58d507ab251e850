#include "common/error.h"

#include <cstdio>
#include <cstdlib>

#include "common/log.h"

namespace llmtrain {

std::string format_error(const Error& e) {
  std::string out = fmt::format("error: {}", e.what());
  if (!e.hint().empty()) out += fmt::format("\n  hint: {}", e.hint());
  return out;
}

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "%sinternal error at %s:%d: check failed: %s%s%s\n", log_prefix().c_str(), file, line, cond,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace llmtrain
