#include <mpi.h>

#include "common/strings.h"
#include "parallel/comm/comm_libraries.h"

namespace llmtrain::parallel {

std::string mpi_library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(buf, &len) != MPI_SUCCESS) return "unknown";
  // Open MPI's string is long and multi-line; its first line is the useful part.
  std::string s(buf, len);
  return trim(s.substr(0, s.find('\n')));
}

}  // namespace llmtrain::parallel
