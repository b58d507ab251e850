// Matrix products through cuBLASLt (kernels/cuda/cublaslt.h): NVIDIA's library in a GPU build, the
// simulator's model of it (kernels/cuda/sim/sim_cublaslt.cu) in the SIM build — the same code here.
//
// One plan per distinct product (shape, transposes, dtype, epilogue, pointer alignments): its matmul
// descriptor, the three layouts and the algorithm cuBLASLt's heuristic chose, made on first use
// and reused, so a training step asks the heuristic nothing after the first. Compute type fp32
// without TF32, so fp32 products keep fp32's accuracy; bf16/fp16 operands accumulate in fp32.
//
// Rules a reader could get wrong: the heuristic picks algorithms by the pointers' alignment (256
// bytes unless told otherwise), and the bias and aux pointers are read for that too. A plan
// therefore belongs to the alignments it was made for, and they are part of its key. Every product
// goes on the calling thread's compute stream (its workspace is that thread's, so products that
// share it run one after another there).
#include "kernels/cuda/cublaslt.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include "common/error.h"
#include "common/foreign_call.h"
#include "kernels/buffer.h"
#include "kernels/op_profile.h"

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

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::none:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu:
      return CUBLASLT_EPILOGUE_GELU;
    case Epilogue::gelu_bias:
      return CUBLASLT_EPILOGUE_GELU_BIAS;
    case Epilogue::gelu_aux:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::gelu_aux_bias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::dgelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::dgelu_bgrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case Epilogue::bgrada:
      return CUBLASLT_EPILOGUE_BGRADA;
    case Epilogue::bgradb:
      return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool takes_bias(Epilogue e) {
  return e != Epilogue::none && e != Epilogue::gelu && e != Epilogue::gelu_aux && e != Epilogue::dgelu;
}
bool takes_aux(Epilogue e) {
  return e == Epilogue::gelu_aux || e == Epilogue::gelu_aux_bias || e == Epilogue::dgelu || e == Epilogue::dgelu_bgrad;
}

struct Key {
  Storage storage;
  int64_t m, n, k, lda, ldb, ldd, ldaux;
  bool trans_a, trans_b;
  Epilogue epilogue;
  uint32_t align_a, align_b, align_d, align_bias, align_aux;
  auto operator<=>(const Key&) const = default;
};

std::atomic<bool> g_legacy_stream_planted{false};

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

  const Plan& plan(const Key& key, const void* bias, const void* aux) {
    std::unique_ptr<Plan>& slot = plans_[key];
    if (!slot) slot = make_plan(key, bias, aux);
    return *slot;
  }
  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() { return workspace_.data(); }

 private:
  std::unique_ptr<Plan> make_plan(const Key& key, const void* bias, const void* aux) {
    auto p = std::make_unique<Plan>();
    const cudaDataType_t type = data_type(key.storage);
    LT_CUBLASLT(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    if (key.epilogue != Epilogue::none) set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(key.epilogue));
    if (takes_bias(key.epilogue)) {
      set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type);
      set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    }
    if (takes_aux(key.epilogue)) {
      set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, type);
      set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, key.ldaux);
      set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
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
#if LLMTRAIN_CUBLASLT_SIMULATED
  return fmt::format(
      "the simulator's cuBLASLt model (cuBLASLt {}.{}.{}'s API; LLMTRAIN_CUDA_GEMM=tiled for llmtrain's own kernel)",
      v / 10000, (v / 100) % 100, v % 100);
#else
  return fmt::format("cuBLASLt {}.{}.{} (LLMTRAIN_CUDA_GEMM=tiled for llmtrain's own kernel)", v / 10000,
                     (v / 100) % 100, v % 100);
#endif
}

bool cublaslt_matmul(const Product& p) {
  if (p.m == 0 || p.n == 0) return true;
  if (p.k == 0) return false;  // D = bias (+ D): our kernel does that without a product
  LT_CHECK(takes_bias(p.epilogue) == (p.bias != nullptr) && takes_aux(p.epilogue) == (p.aux != nullptr),
           "cublaslt_matmul: the epilogue's bias and aux pointers");
  Context& c = context();
  const Key key{p.storage,
                p.m,
                p.n,
                p.k,
                p.lda,
                p.ldb,
                p.ldd,
                p.ldaux,
                p.trans_a,
                p.trans_b,
                p.epilogue,
                alignment(p.a),
                alignment(p.b),
                alignment(p.d),
                p.bias ? alignment(p.bias) : 0,
                p.aux ? alignment(p.aux) : 0};
  const Plan& plan = c.plan(key, p.bias, p.aux);
  if (!plan.supported) return false;
  if (p.bias) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(p.bias));
  if (p.aux) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(p.aux));
  const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  const cudaStream_t stream = g_legacy_stream_planted.load() ? nullptr : compute_stream();
  ProfileScope scope("cuBLASLt matmul");  // a row of its own inside the op's (log.profile: ops)
  LT_CUBLASLT(cublasLtMatmul(c.handle(), plan.desc, &alpha, p.a, plan.a, p.b, plan.b, &beta, p.d, plan.d, p.d, plan.d,
                             &plan.algo, c.workspace(), kWorkspaceBytes, stream));
  return true;
}

void plant_products_on_legacy_stream(bool on) { g_legacy_stream_planted = on; }

}  // namespace llmtrain::kernels::cuda
