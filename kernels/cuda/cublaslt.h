// Matrix products through cuBLASLt (docs/cuda.md, "Matrix products"): NVIDIA's library on a GPU,
// the simulator's model of it in the SIM build (kernels/cuda/sim/sim_cublaslt.cu, the same calls
// with cuBLASLt's rules). The linear layer (linear.cu) calls this when gemm_uses_cublaslt();
// otherwise, and for a product cuBLASLt has no algorithm for, our tiled GEMM (linear.cu) runs.
//
// Rules a reader could get wrong:
//  - cuBLASLt is column-major. A product is stated in cuBLAS's terms (D[m, n] = op(A)·op(B), leading
//    dimensions in elements); a row-major product is the same call with the operands swapped
//    (linear.cu spells out each of the linear layer's three).
//  - Every product runs on the calling thread's compute stream (compute_stream(), kernels/cuda/storage.h),
//    ordered with every other op there; never on the legacy default stream, which is not ordered
//    against a non-blocking stream (the simulator refuses it).
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

// What cuBLASLt does after the product (its epilogues), on D's m × n elements:
//   bias           D += bias[i] (bias: m elements)
//   gelu           D = GELU(D) (the tanh form); gelu_bias: D = GELU(D + bias)
//   gelu_aux       aux = D, D = GELU(D); gelu_aux_bias: aux = D + bias, D = GELU(aux)
//   dgelu          D = D ⊙ GELU'(aux); dgelu_bgrad: also bias[i] = Σ_j D(i, j) (written)
//   bgrada         bias[i] = Σ_k op(A)(i, k) (written; m elements)
//   bgradb         bias[j] = Σ_k op(B)(k, j) (written; n elements)
// A bias on 16-bit D is added to the product rounded to D's type (cuBLASLt's order, measured).
enum class Epilogue : uint8_t {
  none,
  bias,
  gelu,
  gelu_bias,
  gelu_aux,
  gelu_aux_bias,
  dgelu,
  dgelu_bgrad,
  bgrada,
  bgradb
};

// D[m, n] (leading dimension ldd) = op(A)·op(B) (+ D itself when accumulate), then the epilogue;
// every matrix of Storage `storage`, fp32 accumulation (no TF32), one rounding per element. op(A)
// is m×k (A stored k×m when trans_a), op(B) is k×n (B stored n×k when trans_b).
struct Product {
  Storage storage = Storage::fp32;
  void* d = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;
  bool trans_a = false, trans_b = false, accumulate = false;
  Epilogue epilogue = Epilogue::none;
  void* bias = nullptr;  // the epilogue's bias (read) or bias gradient (written)
  void* aux = nullptr;   // gelu_aux*: written; dgelu*: read; m × n with leading dimension ldaux
  int64_t ldaux = 0;     // a multiple of 8, at least m (cuBLASLt's rule)
};

// Runs `p` on the compute stream. Returns false, having done nothing, for a product cuBLASLt has no
// algorithm for (or k = 0): the caller runs our tiled GEMM then.
bool cublaslt_matmul(const Product& p);

// For tests only: while set, products go to the legacy default stream (stream 0) instead of the
// compute stream — the bug of docs/cuda.md "What it catches", planted to show that the simulator
// catches it (it refuses stream 0; allowed, the product reads its inputs before they are written).
void plant_products_on_legacy_stream(bool on);

}  // namespace llmtrain::kernels::cuda
