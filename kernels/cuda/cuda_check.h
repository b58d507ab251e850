// Checking every CUDA runtime call (common/foreign_call.h's template): LT_CUDA(cudaMalloc(...))
// throws an llmtrain::Error naming the call, CUDA's name and text for the code, the rank and
// file:line; LT_CUDA_LAUNCHED("kernel") does the same for the launch just made (CUDA reports a bad
// launch configuration only through cudaGetLastError).
//
// The rule a reader could get wrong: a kernel launch is a foreign call too. Every LT_LAUNCH is
// followed by LT_CUDA_LAUNCHED, or a bad grid silently computes nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/foreign_call.h"

namespace llmtrain::kernels::cuda {

// "cudaErrorInvalidValue: invalid argument"
std::string cuda_error_text(cudaError_t e);
void check_launch(const char* kernel, const char* file, int line);

}  // namespace llmtrain::kernels::cuda

#define LT_CUDA(call) LT_FOREIGN_CHECK("CUDA", call, cudaSuccess, ::llmtrain::kernels::cuda::cuda_error_text)
#define LT_CUDA_LAUNCHED(kernel) ::llmtrain::kernels::cuda::check_launch(kernel, __FILE__, __LINE__)
