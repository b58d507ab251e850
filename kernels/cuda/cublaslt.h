// Matrix products through cuBLASLt on a GPU (docs/cuda.md, "Matrix products"). The linear layer
// (linear.cu) calls this when gemm_uses_cublaslt(); otherwise, and always in the simulator, our
// tiled GEMM (linear.cu) runs instead.
//
// The rule a reader could get wrong: cuBLASLt is column-major. The caller states the product in
// cuBLAS's terms (D[m, n] = op(A)·op(B), leading dimensions in elements); a row-major product is the
// same call with the operands swapped (linear.cu spells out each of the linear layer's three).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda/storage.h"

namespace llmtrain::kernels::cuda {

// True in a GPU build unless the environment says LLMTRAIN_CUDA_GEMM=tiled (our kernel, for
// comparisons and as a fallback). Any other value of the variable is an error naming it.
bool gemm_uses_cublaslt();
// "cuBLASLt 13.1.0", or why our tiled GEMM takes the products.
std::string gemm_backend_name();

// D[m, n] (leading dimension ldd) = op(A)·op(B) (+ bias[m] broadcast over columns) (+ D itself when
// accumulate), every matrix of Storage s, fp32 accumulation (no TF32), one rounding per element.
// op(A) is m×k (A stored k×m when trans_a), op(B) is k×n (B stored n×k when trans_b). Returns false,
// having done nothing, for a product cuBLASLt has no algorithm for (or k = 0): the caller runs our
// tiled GEMM then.
bool cublaslt_matmul(Storage s, void* d, const void* a, const void* b, const void* bias, int64_t m, int64_t n,
                     int64_t k, int64_t lda, int64_t ldb, int64_t ldd, bool trans_a, bool trans_b, bool accumulate);

}  // namespace llmtrain::kernels::cuda
