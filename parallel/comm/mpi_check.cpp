#include "parallel/comm/mpi_check.h"

#include <fmt/format.h>

namespace llmtrain::parallel {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS || len <= 0) return fmt::format("MPI error code {}", code);
  return std::string(text, len);
}

}  // namespace llmtrain::parallel
