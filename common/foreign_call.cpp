#include "common/foreign_call.h"

#include <fmt/format.h>

#include <string_view>

#include "common/error.h"
#include "common/log.h"

namespace llmtrain {

const char* source_path(const char* file) {
#ifdef LLMTRAIN_SOURCE_ROOT
  constexpr std::string_view kRoot = LLMTRAIN_SOURCE_ROOT;  // with a trailing '/'
  if (std::string_view(file).starts_with(kRoot)) return file + kRoot.size();
#endif
  // A relative __FILE__ (ccache with base_dir rewrites paths relative to the build folder,
  // "../../parallel/comm/comm_mpi.cpp"): the path below the build folder's parents.
  while (std::string_view(file).starts_with("../") || std::string_view(file).starts_with("./"))
    file += file[1] == '.' ? 3 : 2;
  return file;
}

void foreign_call_failed(const char* library, const char* call, long long code, const std::string& text,
                         const char* file, int line) {
  std::string where = log_rank() >= 0 ? fmt::format("rank {}", log_rank()) : std::string("this process");
  throw environment_error(
      fmt::format("{} call failed on {}: {} returned {} ({}) at {}:{}", library, where, call, code,
                  text.empty() ? "no description" : text, source_path(file), line),
      fmt::format("this is a failure of {} or of the machine, not of the recipe; the other ranks' output usually says "
                  "which rank or link failed first",
                  library));
}

}  // namespace llmtrain
