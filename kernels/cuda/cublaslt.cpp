// Matrix products through cuBLASLt (kernels/cuda/cublaslt.h). Built only for a GPU: the simulator
// has no cuBLASLt, and runs our tiled GEMM instead.
//
// One plan per distinct product (shape, transposes, dtype, bias, pointer alignments): its matmul
// descriptor, the three layouts and the algorithm cuBLASLt's heuristic chose, made on first use
// and reused, so a training step asks the heuristic nothing after the first. Compute type fp32
// without TF32, so fp32 products keep fp32's accuracy; bf16/fp16 operands accumulate in fp32.
//
// The rule a reader could get wrong: the heuristic picks algorithms by the pointers' alignment
// (256 bytes unless told otherwise), and the bias pointer is read for that too. A plan therefore
// belongs to the alignments it was made for, and they are part of its key.
#include "kernels/cuda/cublaslt.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include "common/error.h"
#include "common/foreign_call.h"
#include "kernels/buffer.h"

namespace llmtrain::kernels::cuda {
namespace {

std::string cublas_status_text(cublasStatus_t s) {
  return std::string(cublasLtGetStatusName(s)) + ": " + cublasLtGetStatusString(s);
}
#define LT_CUBLASLT(call) LT_FOREIGN_CHECK("cuBLASLt", call, CUBLAS_STATUS_SUCCESS, cublas_status_text)

// cuBLAS recommends 32 MiB of workspace on Hopper; smaller GPUs take what they need of it.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

cudaDataType_t data_type(Storage s) {
  switch (s) {
    case Storage::fp32:
      return CUDA_R_32F;
    case Storage::bf16:
      return CUDA_R_16BF;
    case Storage::fp16:
      return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

uint32_t alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

struct Key {
  Storage storage;
  int64_t m, n, k, lda, ldb, ldd;
  bool trans_a, trans_b, bias;
  uint32_t align_a, align_b, align_d, align_bias;
  auto operator<=>(const Key&) const = default;
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool supported = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  LT_CUBLASLT(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

class Context {
 public:
  Context() : workspace_(DType::uint8, {int64_t(kWorkspaceBytes)}, Device::cuda) {
    LT_CUBLASLT(cublasLtCreate(&handle_));
  }
  ~Context() {
    plans_.clear();
    cublasLtDestroy(handle_);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Plan& plan(const Key& key, const void* bias) {
    std::unique_ptr<Plan>& slot = plans_[key];
    if (!slot) slot = make_plan(key, bias);
    return *slot;
  }
  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() { return workspace_.data(); }

 private:
  std::unique_ptr<Plan> make_plan(const Key& key, const void* bias) {
    auto p = std::make_unique<Plan>();
    const cudaDataType_t type = data_type(key.storage);
    LT_CUBLASLT(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    if (key.bias) {
      set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
      set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type);
      set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    }
    // Layouts of the stored matrices (before op), column-major.
    LT_CUBLASLT(cublasLtMatrixLayoutCreate(&p->a, type, uint64_t(key.trans_a ? key.k : key.m),
                                           uint64_t(key.trans_a ? key.m : key.k), key.lda));
    LT_CUBLASLT(cublasLtMatrixLayoutCreate(&p->b, type, uint64_t(key.trans_b ? key.n : key.k),
                                           uint64_t(key.trans_b ? key.k : key.n), key.ldb));
    LT_CUBLASLT(cublasLtMatrixLayoutCreate(&p->d, type, uint64_t(key.m), uint64_t(key.n), key.ldd));

    cublasLtMatmulPreference_t pref = nullptr;
    LT_CUBLASLT(cublasLtMatmulPreferenceCreate(&pref));
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)>
        pref_owner(pref, cublasLtMatmulPreferenceDestroy);
    const uint64_t workspace = kWorkspaceBytes;
    LT_CUBLASLT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                     sizeof(workspace)));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
    for (const auto& [attribute, bytes] : alignments)
      LT_CUBLASLT(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof(bytes)));

    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->d, p->d, pref, 1, &result, &found);
    // No algorithm for this product (an alignment or shape cuBLASLt does not take): the caller runs
    // our tiled GEMM for it.
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && found == 0)) return p;
    LT_CUBLASLT(status);
    p->algo = result.algo;
    p->supported = true;
    return p;
  }

  cublasLtHandle_t handle_ = nullptr;
  Buffer workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

Context& context() {
  thread_local Context c;
  return c;
}

}  // namespace

bool gemm_uses_cublaslt() {
  static const bool use = [] {
    const char* v = std::getenv("LLMTRAIN_CUDA_GEMM");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "cublaslt") == 0) return true;
    if (std::strcmp(v, "tiled") == 0) return false;
    throw Error(fmt::format("LLMTRAIN_CUDA_GEMM={}: expected cublaslt or tiled", v),
                "unset it for cuBLASLt, or set it to tiled for llmtrain's own GEMM kernel");
  }();
  return use;
}

std::string gemm_backend_name() {
  if (!gemm_uses_cublaslt()) return "llmtrain's tiled GEMM (LLMTRAIN_CUDA_GEMM=tiled)";
  const size_t v = cublasLtGetVersion();  // e.g. 130100 for 13.1.0
  return fmt::format("cuBLASLt {}.{}.{} (LLMTRAIN_CUDA_GEMM=tiled for llmtrain's own kernel)", v / 10000,
                     (v / 100) % 100, v % 100);
}

bool cublaslt_matmul(Storage s, void* d, const void* a, const void* b, const void* bias, int64_t m, int64_t n,
                     int64_t k, int64_t lda, int64_t ldb, int64_t ldd, bool trans_a, bool trans_b, bool accumulate) {
  if (m == 0 || n == 0) return true;
  if (k == 0) return false;  // D = bias (+ D): our kernel does that without a product
  Context& c = context();
  const Key key{s,
                m,
                n,
                k,
                lda,
                ldb,
                ldd,
                trans_a,
                trans_b,
                bias != nullptr,
                alignment(a),
                alignment(b),
                alignment(d),
                bias ? alignment(bias) : 0};
  const Plan& p = c.plan(key, bias);
  if (!p.supported) return false;
  if (bias) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  LT_CUBLASLT(cublasLtMatmul(c.handle(), p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.d, d, p.d, &p.algo, c.workspace(),
                             kWorkspaceBytes, nullptr));
  return true;
}

}  // namespace llmtrain::kernels::cuda
