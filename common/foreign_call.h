// Checking calls into foreign libraries (MPI today; CUDA, cuBLAS and NCCL with the CUDA work).
//
// One template, LT_FOREIGN_CHECK, generates every library's macro, as ggml's CUDA_CHECK_GEN does:
//
//   #define LT_MPI(call)    LT_FOREIGN_CHECK("MPI", call, MPI_SUCCESS, ::llmtrain::parallel::mpi_error_string)
//   #define LT_CUDA(call)   LT_FOREIGN_CHECK("CUDA", call, cudaSuccess, cudaGetErrorString)
//   #define LT_CUBLAS(call) LT_FOREIGN_CHECK("cuBLAS", call, CUBLAS_STATUS_SUCCESS, cublasGetStatusString)
//   #define LT_NCCL(call)   LT_FOREIGN_CHECK("NCCL", call, ncclSuccess, ncclGetErrorString)
//
// A call that does not return `success` throws llmtrain::Error (environment kind, exit status 1)
// naming the call as written, the library's text for the code, the rank, and file:line.
//
// Rule a reader could get wrong: each library's macro is defined beside the code that uses that
// library (parallel/comm/mpi_check.h, later kernels/cuda/ and parallel/nccl_*), never here, so that
// common/ includes no foreign header and a CPU-only build never sees a CUDA header.
#pragma once

#include <string>

namespace llmtrain {

// Throws the environment Error for a failed foreign call. `text` is the library's own description
// of `code` (an error code without text is a defect).
[[noreturn]] void foreign_call_failed(const char* library, const char* call, long long code, const std::string& text,
                                      const char* file, int line);

// "parallel/comm/comm_mpi.cpp" from a compiler's absolute __FILE__: the path relative to the source tree
// this binary was built from (unchanged when it lies elsewhere; a relative one without its leading
// "../" and "./").
const char* source_path(const char* file);

}  // namespace llmtrain

// The template: `error_text` is a function (or macro) from the library's status type to text.
#define LT_FOREIGN_CHECK(library, call, success, error_text)                                                      \
  do {                                                                                                            \
    const auto lt_status_ = (call);                                                                               \
    if (lt_status_ != (success)) [[unlikely]]                                                                     \
      ::llmtrain::foreign_call_failed(library, #call, static_cast<long long>(lt_status_), error_text(lt_status_), \
                                      __FILE__, __LINE__);                                                        \
  } while (0)
