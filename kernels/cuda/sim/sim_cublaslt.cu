// The simulator's cuBLASLt: the part of NVIDIA's cublasLt.h API that llmtrain calls, with the
// library's semantics, so that the SIM build runs our real call sites (kernels/cuda/cublaslt.cpp)
// instead of a substitute. Compiled as C++ against the simulator (the LLMTRAIN_CUDA=SIM build);
// a GPU build links NVIDIA's libcublasLt instead.
//
// What it models (docs/cuda.md, "The simulator's cuBLASLt"):
//  - column-major matrices described by layouts (type, rows, columns, leading dimension), the
//    transposes, alpha and beta (host pointers, fp32), C read and D written (C may be D only with the
//    same layout), fp32 accumulation through the tiled GEMM (kernels/cuda/gemm_tile.cuh), one rounding
//    per stored element; A/B of one type and C/D of one type (fp32, bf16, fp16);
//  - the epilogues: bias (a vector of D's rows, D's type), GELU (tanh form) with or without bias and
//    with its aux output (the GELU's input, leading dimension a multiple of 8 at least D's rows), the
//    GELU gradient (D ⊙ GELU'(aux)) with or without the bias gradient (D's row sums), and the bias
//    gradients of A (BGRADA: A's row sums over k) and of B (BGRADB: B's column sums over k). With a
//    bias on 16-bit D the product is rounded to D's type before the bias is added, as measured on an
//    H100 (docs/cuda.md, "Matrix products");
//  - the heuristic: one algorithm for a problem it takes, which records the problem (types,
//    shapes, transposes, epilogue) and the alignments it was chosen for (the preference's minimums,
//    256 bytes by default, and the bias and aux pointers' own) and needs min(4 MiB, the
//    preference's maximum) of workspace; other problems are CUBLAS_STATUS_NOT_SUPPORTED with found 0
//    (batched layouts, other orders, compute or scale types);
//  - cublasLtMatmul's rules: a valid handle, descriptors and layouts; the algorithm chosen for this
//    problem; every pointer at least as aligned as the algorithm assumed; the workspace at least what
//    the algorithm needs, in device memory; every matrix inside one device allocation; and the
//    stream: one the runtime created and has not destroyed. The legacy default stream is refused
//    (sim_rules.h) — on a GPU a product there is not ordered against the non-blocking compute stream.
//    The product runs on that stream, ordered like any kernel there.
// A refusal returns CUBLAS_STATUS_INVALID_VALUE (or NOT_SUPPORTED, NOT_INITIALIZED) and
// cublasLtGetStatusString says why, after cuBLASLt's own text, on the failing thread.
//
// The rule a reader could get wrong: nothing here runs at the call; the kernels are queued on the
// stream and run when the host next needs that stream's work (kernels/cuda/sim/sim_streams.cpp).
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "kernels/cuda/gemm_tile.cuh"
#include "kernels/cuda/sim/sim_internal.h"

namespace llmtrain::kernels::cuda {
namespace {

using gemm::kPer;
using gemm::kSide;
using gemm::kTile;

constexpr uint64_t kAlgoMagic = 0x4c54534d434c4254ull;  // "LTSMCLBT"
constexpr size_t kAlgoWorkspace = size_t(4) << 20;

struct DescState {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // -1: D's type
  const void* aux = nullptr;
  int64_t aux_ld = 0;
  int32_t aux_type = -1;  // -1: D's type
};

struct LayoutState {
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
};

struct PrefState {
  uint64_t max_workspace = 0;
  uint32_t min_align[4] = {256, 256, 256, 256};  // A, B, C, D
};

struct Registry {
  std::mutex mutex;
  std::set<const void*> handles;
  std::map<const void*, DescState> descs;
  std::map<const void*, LayoutState> layouts;
  std::map<const void*, PrefState> prefs;
};

Registry& registry() {
  static Registry r;
  return r;
}

thread_local cublasStatus_t tl_reason_status = CUBLAS_STATUS_SUCCESS;
thread_local std::string tl_reason;

cublasStatus_t refuse(cublasStatus_t status, std::string why) {
  tl_reason_status = status;
  tl_reason = "(simulator: " + std::move(why) + ")";
  return status;
}

// A descriptor's life: its opaque struct made and its state registered (what later calls check it
// against); destroyed and forgotten, so that a use after destroy is refused, not undefined.
template <class Opaque, class State>
cublasStatus_t create(Opaque** out, std::map<const void*, State> Registry::*states, State state, const char* call) {
  if (out == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string(call) + " with a null pointer");
  *out = new Opaque{};
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  (r.*states)[*out] = std::move(state);
  return CUBLAS_STATUS_SUCCESS;
}

template <class Opaque, class State>
cublasStatus_t destroy(Opaque* p, std::map<const void*, State> Registry::*states, const char* call) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if ((r.*states).erase(p) == 0) return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string(call) + " of an unknown one");
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}

size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
bool type_taken(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F; }

uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t n = 256;
  while (n > 1 && a % n != 0) n /= 2;
  return n;
}

bool known_epilogue(uint32_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU_AUX:
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DGELU:
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
    case CUBLASLT_EPILOGUE_BGRADA:
    case CUBLASLT_EPILOGUE_BGRADB:
      return true;
    default:
      return false;
  }
}
bool adds_bias(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool writes_bias_gradient(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}
bool uses_bias(uint32_t e) { return adds_bias(e) || writes_bias_gradient(e); }
bool uses_aux(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU ||
         e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}
bool applies_gelu(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX ||
         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool applies_dgelu(uint32_t e) { return e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }

// The problem an algorithm is chosen for: everything of the descriptor and layouts but the pointers.
uint64_t problem_hash(const DescState& d, const LayoutState* const (&l)[4]) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  mix(uint64_t(d.compute));
  mix(uint64_t(d.scale));
  mix(uint64_t(d.trans_a));
  mix(uint64_t(d.trans_b));
  mix(d.epilogue);
  mix(uint64_t(uint32_t(d.bias_type)));
  mix(uint64_t(d.aux_ld));
  mix(uint64_t(uint32_t(d.aux_type)));
  for (const LayoutState* x : l) {
    mix(uint64_t(x->type));
    mix(x->rows);
    mix(x->cols);
    mix(uint64_t(x->ld));
  }
  return h;
}

// The algorithm's words: magic, workspace, problem hash, then the alignments it assumed (A, B, C, D,
// bias, aux), a byte each as log2.
struct AlgoWords {
  uint64_t workspace = 0, hash = 0;
  uint32_t align[6] = {1, 1, 1, 1, 1, 1};
};
void encode(cublasLtMatmulAlgo_t* algo, const AlgoWords& w) {
  std::memset(algo, 0, sizeof(*algo));
  algo->data[0] = kAlgoMagic;
  algo->data[1] = w.workspace;
  algo->data[2] = w.hash;
  for (int i = 0; i < 6; ++i) algo->data[3] |= uint64_t(__builtin_ctz(w.align[i])) << (8 * i);
}
bool decode(const cublasLtMatmulAlgo_t* algo, AlgoWords& w) {
  if (algo == nullptr || algo->data[0] != kAlgoMagic) return false;
  w.workspace = algo->data[1];
  w.hash = algo->data[2];
  for (int i = 0; i < 6; ++i) w.align[i] = 1u << ((algo->data[3] >> (8 * i)) & 0xff);
  return true;
}

// ---- the kernels ---------------------------------------------------------------------------------

// cuBLASLt's GELU: the tanh form, x·½(1 + tanh(√(2/π)(x + 0.044715x³))), and its derivative.
__device__ __forceinline__ float gelu_tanh(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  const float t = tanhf(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
}

struct Problem {
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0, ldd = 0, ld_aux = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1, beta = 0;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
};

// D(i, j) = epilogue(alpha·Σ_k op(A)(i, k)·op(B)(k, j) + beta·C(i, j)), column-major: X(i, j) at
// x[i + j·ld]. op(A)(i, k) = A(i, k), or A(k, i) transposed; op(B)(k, j) likewise.
template <class TAB, class TCD>
__global__ void lt_matmul_kernel(TCD* d, const TAB* __restrict__ a, const TAB* __restrict__ b, const TCD* c,
                                 const TCD* __restrict__ bias, TCD* aux, Problem p) {
  const int64_t m0 = int64_t(blockIdx.x) * kTile, n0 = int64_t(blockIdx.y) * kTile;
  float acc[kPer][kPer];
  gemm::gemm_zero(acc);
  gemm::gemm_tile(acc, gemm::Operand<TAB>{a, p.trans_a ? p.lda : 1, p.trans_a ? 1 : p.lda, p.m}, m0,
                  gemm::Operand<TAB>{b, p.trans_b ? 1 : p.ldb, p.trans_b ? p.ldb : 1, p.n}, n0, 0, p.k);
  for (int i = 0; i < kPer; ++i) {
    const int64_t row = m0 + gemm::tile_row(i);
    if (row >= p.m) continue;
    for (int j = 0; j < kPer; ++j) {
      const int64_t col = n0 + gemm::tile_col(j);
      if (col >= p.n) continue;
      float v = p.alpha * acc[i][j];
      if (p.beta != 0.0f) v += p.beta * load(c, row + col * p.ldc);
      if (adds_bias(p.epilogue)) {
        // The product is rounded to D's type before the bias is added (fp32: no rounding).
        TCD rounded;
        store(&rounded, 0, v);
        v = load(&rounded, 0) + load(bias, row);
      }
      if (applies_gelu(p.epilogue)) {
        if (aux != nullptr) store(aux, row + col * p.ld_aux, v);
        v = gelu_tanh(v);
      } else if (applies_dgelu(p.epilogue)) {
        v *= gelu_tanh_grad(load(aux, row + col * p.ld_aux));
      }
      store(d, row + col * p.ldd, v);
    }
  }
}

// grad[i] = Σ_j X(i, j) over `count` columns (column-major, leading dimension ld), one thread per i in
// order: the bias gradient of D (DGELU_BGRAD) or of op(A) (BGRADA); of op(B) (BGRADB) the same over
// op(B)ᵀ. X(i, j) = x[i·stride_i + j·stride_j].
template <class TX, class TG>
__global__ void lt_row_sums_kernel(TG* grad, const TX* x, int64_t rows, int64_t count, int64_t stride_i,
                                   int64_t stride_j) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  float sum = 0;
  for (int64_t j = 0; j < count; ++j) sum += load(x, i * stride_i + j * stride_j);
  store(grad, i, sum);
}

template <class T>
void with_type(cudaDataType_t t, T&& f) {
  if (t == CUDA_R_32F) f(float{});
  if (t == CUDA_R_16BF) f(__nv_bfloat16{});
  if (t == CUDA_R_16F) f(__half{});
}

bool inside_device(const void* p, const LayoutState& l) {
  if (l.rows == 0 || l.cols == 0) return true;
  const uint64_t elements = (l.cols - 1) * uint64_t(l.ld) + l.rows;
  return cuda_sim::is_device_range(p, size_t(elements * type_bytes(l.type)));
}

}  // namespace
}  // namespace llmtrain::kernels::cuda

using namespace llmtrain::kernels::cuda;

extern "C" {

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    default:
      return "CUBLAS_STATUS_UNKNOWN";
  }
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  const char* base = "an unknown status";
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      base = "the operation completed successfully";
      break;
    case CUBLAS_STATUS_NOT_INITIALIZED:
      base = "the library was not initialized";
      break;
    case CUBLAS_STATUS_INVALID_VALUE:
      base = "an invalid value was used as an argument";
      break;
    case CUBLAS_STATUS_NOT_SUPPORTED:
      base = "the functionality requested is not supported";
      break;
    case CUBLAS_STATUS_EXECUTION_FAILED:
      base = "the GPU program failed to execute";
      break;
    default:
      break;
  }
  if (status != tl_reason_status || tl_reason.empty()) return base;
  thread_local std::string text;
  text = std::string(base) + " " + tl_reason;
  return text.c_str();
}

size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate with a null handle pointer");
  // The handle is an address of our own; nothing of it is read.
  static std::atomic<uintptr_t> next{0x1000};
  *handle = reinterpret_cast<cublasLtHandle_t>(next.fetch_add(16));
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.handles.insert(*handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (r.handles.erase(handle) == 0)
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy of an unknown handle");
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  DescState d;
  d.compute = compute;
  d.scale = scale;
  return create(desc, &Registry::descs, d, "cublasLtMatmulDescCreate");
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  return destroy(desc, &Registry::descs, "cublasLtMatmulDescDestroy");
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                                              const void* buf, size_t bytes) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.descs.find(desc);
  if (it == r.descs.end()) return refuse(CUBLAS_STATUS_INVALID_VALUE, "an attribute of an unknown matmul descriptor");
  DescState& d = it->second;
  auto take = [&](auto& field) {
    if (buf == nullptr || bytes != sizeof(field))
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "matmul descriptor attribute " + std::to_string(int(attribute)) +
                                                     " given " + std::to_string(bytes) + " bytes, expected " +
                                                     std::to_string(sizeof(field)));
    std::memcpy(&field, buf, sizeof(field));
    return CUBLAS_STATUS_SUCCESS;
  };
  switch (attribute) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return take(d.trans_a);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return take(d.trans_b);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
      const cublasStatus_t s = take(d.epilogue);
      if (s == CUBLAS_STATUS_SUCCESS && !known_epilogue(d.epilogue))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "epilogue " + std::to_string(d.epilogue) + " is not modelled");
      return s;
    }
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      return take(d.pointer_mode);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return take(d.bias);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return take(d.bias_type);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return take(d.aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return take(d.aux_ld);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      return take(d.aux_type);
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                    "matmul descriptor attribute " + std::to_string(int(attribute)) + " is not modelled");
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (ld < 0 || (rows > 0 && uint64_t(ld) < rows))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "a layout of " + std::to_string(rows) + " rows with leading dimension " +
                                                   std::to_string(ld) + " (it must be at least the rows)");
  return create(layout, &Registry::layouts, LayoutState{type, rows, cols, ld}, "cublasLtMatrixLayoutCreate");
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  return destroy(layout, &Registry::layouts, "cublasLtMatrixLayoutDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return create(pref, &Registry::prefs, PrefState{}, "cublasLtMatmulPreferenceCreate");
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return destroy(pref, &Registry::prefs, "cublasLtMatmulPreferenceDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attribute, const void* buf,
                                                    size_t bytes) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.prefs.find(pref);
  if (it == r.prefs.end()) return refuse(CUBLAS_STATUS_INVALID_VALUE, "an attribute of an unknown preference");
  PrefState& p = it->second;
  const int slot = attribute == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES   ? 0
                   : attribute == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES ? 1
                   : attribute == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES ? 2
                   : attribute == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES ? 3
                                                                             : -1;
  if (attribute == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    if (buf == nullptr || bytes != sizeof(p.max_workspace))
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "MAX_WORKSPACE_BYTES takes a uint64_t");
    std::memcpy(&p.max_workspace, buf, sizeof(p.max_workspace));
    return CUBLAS_STATUS_SUCCESS;
  }
  if (slot >= 0) {
    uint32_t v = 0;
    if (buf == nullptr || bytes != sizeof(v))
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "MIN_ALIGNMENT takes a uint32_t");
    std::memcpy(&v, buf, sizeof(v));
    if (v == 0 || (v & (v - 1)) != 0 || v > 256)
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    "an alignment of " + std::to_string(v) + " bytes (a power of two up to 256)");
    p.min_align[slot] = v;
    return CUBLAS_STATUS_SUCCESS;
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                "preference attribute " + std::to_string(int(attribute)) + " is not modelled");
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t adesc, cublasLtMatrixLayout_t bdesc,
                                              cublasLtMatrixLayout_t cdesc, cublasLtMatrixLayout_t ddesc,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* found) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (r.handles.count(handle) == 0)
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "the heuristic with an unknown handle");
  auto d = r.descs.find(desc);
  auto p = r.prefs.find(pref);
  auto la = r.layouts.find(adesc), lb = r.layouts.find(bdesc), lc = r.layouts.find(cdesc), ld = r.layouts.find(ddesc);
  if (d == r.descs.end() || p == r.prefs.end() || la == r.layouts.end() || lb == r.layouts.end() ||
      lc == r.layouts.end() || ld == r.layouts.end())
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "the heuristic with an unknown descriptor, layout or preference");
  if (requested < 1 || results == nullptr || found == nullptr)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "the heuristic asked for no result");
  *found = 0;
  const DescState& ds = d->second;
  const LayoutState &a = la->second, &b = lb->second, &c = lc->second, &dd = ld->second;
  const bool taken = (ds.compute == CUBLAS_COMPUTE_32F || ds.compute == CUBLAS_COMPUTE_32F_PEDANTIC) &&
                     ds.scale == CUDA_R_32F && type_taken(a.type) && a.type == b.type && type_taken(dd.type) &&
                     c.type == dd.type && (ds.bias_type == -1 || ds.bias_type == int32_t(dd.type)) &&
                     (ds.aux_type == -1 || ds.aux_type == int32_t(dd.type));
  if (!taken) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm for these compute, scale and data types");
  const uint64_t m = ds.trans_a == CUBLAS_OP_T ? a.cols : a.rows, k = ds.trans_a == CUBLAS_OP_T ? a.rows : a.cols;
  const uint64_t kb = ds.trans_b == CUBLAS_OP_T ? b.cols : b.rows, n = ds.trans_b == CUBLAS_OP_T ? b.rows : b.cols;
  if (k != kb || m != dd.rows || n != dd.cols || c.rows != dd.rows || c.cols != dd.cols)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "op(A) is " + std::to_string(m) + "×" + std::to_string(k) + ", op(B) " +
                                                   std::to_string(kb) + "×" + std::to_string(n) + ", D " +
                                                   std::to_string(dd.rows) + "×" + std::to_string(dd.cols) +
                                                   ": the shapes do not make a product");
  if (uses_aux(ds.epilogue) && (ds.aux_ld < int64_t(dd.rows) || ds.aux_ld % 8 != 0))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "the epilogue's aux leading dimension " + std::to_string(ds.aux_ld) +
                                                   " must be a multiple of 8 and at least D's " +
                                                   std::to_string(dd.rows) + " rows");
  AlgoWords w;
  w.workspace = std::min<uint64_t>(kAlgoWorkspace, p->second.max_workspace);
  w.hash = problem_hash(ds, {&a, &b, &c, &dd});
  for (int i = 0; i < 4; ++i) w.align[i] = p->second.min_align[i];
  // The bias and aux pointers are read for their alignment only (cuBLASLt's rule).
  w.align[4] = uses_bias(ds.epilogue) && ds.bias != nullptr ? alignment_of(ds.bias) : 1;
  w.align[5] = uses_aux(ds.epilogue) && ds.aux != nullptr ? alignment_of(ds.aux) : 1;
  std::memset(&results[0], 0, sizeof(results[0]));
  encode(&results[0].algo, w);
  results[0].workspaceSize = w.workspace;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
                              cublasLtMatrixLayout_t adesc, const void* b, cublasLtMatrixLayout_t bdesc,
                              const void* beta, const void* c, cublasLtMatrixLayout_t cdesc, void* d,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  DescState ds;
  LayoutState la, lb, lc, ld;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    if (r.handles.count(handle) == 0)
      return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtMatmul with an unknown handle");
    auto di = r.descs.find(desc);
    auto ai = r.layouts.find(adesc), bi = r.layouts.find(bdesc), ci = r.layouts.find(cdesc), dl = r.layouts.find(ddesc);
    if (di == r.descs.end() || ai == r.layouts.end() || bi == r.layouts.end() || ci == r.layouts.end() ||
        dl == r.layouts.end())
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul with an unknown descriptor or layout");
    ds = di->second;
    la = ai->second;
    lb = bi->second;
    lc = ci->second;
    ld = dl->second;
  }
  if (std::string why = llmtrain::cuda_sim::stream_problem(stream); !why.empty())
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul on " + why);
  AlgoWords w;
  if (!decode(algo, w))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul without an algorithm of the heuristic's");
  if (w.hash != problem_hash(ds, {&la, &lb, &lc, &ld}))
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "the algorithm was chosen for another problem (the descriptor or a layout changed)");
  if (workspace_bytes < w.workspace)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "a workspace of " + std::to_string(workspace_bytes) +
                                                   " bytes, the algorithm needs " + std::to_string(w.workspace));
  if (w.workspace > 0 && !llmtrain::cuda_sim::is_device_range(workspace, w.workspace))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "the workspace is not device memory of the size given");
  if (ds.pointer_mode != CUBLASLT_POINTER_MODE_HOST || alpha == nullptr || beta == nullptr)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "alpha and beta must be host pointers here");
  float al = 0, be = 0;
  std::memcpy(&al, alpha, sizeof al);
  std::memcpy(&be, beta, sizeof be);
  const void* bias = ds.bias;
  const struct {
    const void* p;
    const char* name;
    int slot;
  } pointers[] = {{a, "A", 0}, {b, "B", 1}, {c, "C", 2}, {d, "D", 3}, {bias, "the bias", 4}, {ds.aux, "the aux", 5}};
  for (const auto& x : pointers) {
    if ((x.slot == 4 && !uses_bias(ds.epilogue)) || (x.slot == 5 && !uses_aux(ds.epilogue)) ||
        (x.slot == 2 && be == 0.0f))
      continue;
    if (alignment_of(x.p) < w.align[x.slot])
      return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string(x.name) + " is " + std::to_string(alignment_of(x.p)) +
                                                     "-byte aligned, the algorithm was chosen for " +
                                                     std::to_string(w.align[x.slot]));
  }
  if (!inside_device(a, la) || !inside_device(b, lb) || !inside_device(d, ld) || (be != 0.0f && !inside_device(c, lc)))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "a matrix is not inside one device allocation");
  // C may be D (in place) only with D's layout.
  if (be != 0.0f && c == d && (lc.ld != ld.ld || lc.type != ld.type))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "C is D with another layout");
  Problem p;
  p.trans_a = ds.trans_a == CUBLAS_OP_T;
  p.trans_b = ds.trans_b == CUBLAS_OP_T;
  p.m = int64_t(ld.rows);
  p.n = int64_t(ld.cols);
  p.k = int64_t(p.trans_a ? la.rows : la.cols);
  p.lda = la.ld;
  p.ldb = lb.ld;
  p.ldc = lc.ld;
  p.ldd = ld.ld;
  p.ld_aux = ds.aux_ld;
  p.alpha = al;
  p.beta = be;
  p.epilogue = ds.epilogue;
  const size_t d_bytes = type_bytes(ld.type);
  if (uses_bias(ds.epilogue)) {
    const int64_t length = ds.epilogue == CUBLASLT_EPILOGUE_BGRADB ? p.n : p.m;
    if (!llmtrain::cuda_sim::is_device_range(bias, size_t(length) * d_bytes))
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    "the bias pointer is not a device vector of " + std::to_string(length) + " elements");
  }
  if (uses_aux(ds.epilogue) && (p.m > 0 && p.n > 0) &&
      !llmtrain::cuda_sim::is_device_range(ds.aux, size_t((p.n - 1) * p.ld_aux + p.m) * d_bytes))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "the aux pointer is not a device matrix of D's shape");
  if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
  cudaError_t launched = cudaSuccess;
  with_type(la.type, [&](auto ab) {
    using TAB = decltype(ab);
    with_type(ld.type, [&](auto cd) {
      using TCD = decltype(cd);
      const dim3 grid(unsigned((p.m + kTile - 1) / kTile), unsigned((p.n + kTile - 1) / kTile));
      const bool gelu_aux = ds.epilogue == CUBLASLT_EPILOGUE_GELU_AUX || ds.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
      LT_LAUNCH(grid, dim3(kSide, kSide), 0, stream, lt_matmul_kernel<TAB, TCD>)
      (static_cast<TCD*>(d), static_cast<const TAB*>(a), static_cast<const TAB*>(b), static_cast<const TCD*>(c),
       static_cast<const TCD*>(adds_bias(ds.epilogue) ? bias : nullptr),
       static_cast<TCD*>(gelu_aux || applies_dgelu(ds.epilogue) ? const_cast<void*>(ds.aux) : nullptr), p);
      if ((launched = cudaGetLastError()) != cudaSuccess) return;
      if (!writes_bias_gradient(ds.epilogue)) return;
      TCD* grad = static_cast<TCD*>(const_cast<void*>(bias));
      constexpr int kThreads = 128;
      if (ds.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {  // D's row sums, D's type
        LT_LAUNCH(unsigned((p.m + kThreads - 1) / kThreads), kThreads, 0, stream, lt_row_sums_kernel<TCD, TCD>)
        (grad, static_cast<const TCD*>(d), p.m, p.n, int64_t(1), p.ldd);
      } else if (ds.epilogue == CUBLASLT_EPILOGUE_BGRADA) {  // op(A)(i, k) summed over k
        LT_LAUNCH(unsigned((p.m + kThreads - 1) / kThreads), kThreads, 0, stream, lt_row_sums_kernel<TAB, TCD>)
        (grad, static_cast<const TAB*>(a), p.m, p.k, p.trans_a ? p.lda : int64_t(1), p.trans_a ? int64_t(1) : p.lda);
      } else {  // BGRADB: op(B)(k, j) summed over k, per column j
        LT_LAUNCH(unsigned((p.n + kThreads - 1) / kThreads), kThreads, 0, stream, lt_row_sums_kernel<TAB, TCD>)
        (grad, static_cast<const TAB*>(b), p.n, p.k, p.trans_b ? int64_t(1) : p.ldb, p.trans_b ? p.ldb : int64_t(1));
      }
      launched = cudaGetLastError();
    });
  });
  if (launched != cudaSuccess)
    return refuse(CUBLAS_STATUS_EXECUTION_FAILED, std::string("the launch failed: ") + cudaGetErrorString(launched));
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
