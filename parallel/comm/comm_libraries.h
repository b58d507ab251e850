// Versions of the communication libraries this binary links, for `llmtrain env`.
#pragma once

#include <string>

namespace llmtrain::parallel {

// MPI_Get_library_version (callable before MPI_Init): "Open MPI v4.1.4, ...".
std::string mpi_library_version();
// "2.28.3", or why there is none ("not built: ...").
std::string nccl_version();

}  // namespace llmtrain::parallel
