// LT_MPI(call): every MPI call is checked and a failure becomes an llmtrain::Error naming the
// call, MPI's text for the code, the rank, file and line (common/foreign_call.h is the template).
//
// Rule a reader could get wrong: MPI returns codes only where the communicator's error handler is
// MPI_ERRORS_RETURN. bootstrap() sets it on MPI_COMM_WORLD before anything is derived from it, and
// derived communicators inherit it; without that, MPI's default handler aborts the job instead.
#pragma once

#include <mpi.h>

#include <string>

#include "common/foreign_call.h"

namespace llmtrain::parallel {

// MPI_Error_string of `code` ("MPI_ERR_TRUNCATE: message truncated").
std::string mpi_error_string(int code);

}  // namespace llmtrain::parallel

#define LT_MPI(call) LT_FOREIGN_CHECK("MPI", call, MPI_SUCCESS, ::llmtrain::parallel::mpi_error_string)
