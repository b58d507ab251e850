// Our cuBLASLt call sites (kernels/cuda/cublaslt.h) against a double-precision reference of
// cuBLASLt's documented semantics: column-major products with every transpose, accumulation, and
// every epilogue (bias, GELU with and without bias and aux output, the GELU gradient with and without
// the bias gradient, the bias gradients of A and B), in fp32, bf16 and fp16. In the SIM build this
// checks the simulator's model of cuBLASLt (kernels/cuda/sim/sim_cublaslt.cu) with its rules; in a
// GPU build the same cases run against NVIDIA's library (scripts/gpu_check.sh part 1), which is how
// the model's semantics are checked against the real thing. A product NVIDIA's library has no
// algorithm for is reported and skipped there; the model must take every one.
//
// Also here: the planted bug of the products on the legacy default stream (the simulator refuses
// it; allowed, the product reads its inputs before the compute stream has written them), and the
// model's rules that a wrong call breaks (a destroyed stream, another problem's algorithm, too
// little workspace, a misaligned pointer).
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/backend_info.h"
#include "kernels/buffer.h"
#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/stream.h"
#include "kernels/ops.h"

#if LLMTRAIN_TEST_CUDA_SIM
#include "kernels/cuda/sim/sim_rules.h"
#endif

namespace llmtrain::kernels::cuda {
namespace {

bool have_device() {
  const CudaInfo c = cuda_info();
  return c.built && !c.devices.empty();
}
bool simulator() { return cuda_info().simulator; }

Storage storage_of_dtype(DType d) {
  return d == DType::fp32 ? Storage::fp32 : d == DType::bf16 ? Storage::bf16 : Storage::fp16;
}

// Values rounded to `dtype` (so the reference sees what the device reads) and their device copy.
struct Matrix {
  std::vector<double> host;
  Buffer device;
};

Matrix make(std::mt19937_64& rng, int64_t elements, DType dtype, double scale = 1.0) {
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<size_t>(elements));
  for (float& x : v) x = float(scale) * normal(rng);
  Buffer wide(DType::fp32, {elements}), narrow(dtype, {elements});
  copy(wide.tensor(), host_tensor(v.data(), {elements}));
  convert(narrow.tensor(), wide.tensor());
  convert(wide.tensor(), narrow.tensor());  // the rounded values, for the reference
  Matrix m{std::vector<double>(v.size()), Buffer(dtype, {elements}, Device::cuda)};
  const float* r = wide.tensor().ptr<float>();
  for (size_t i = 0; i < v.size(); ++i) m.host[i] = r[i];
  copy(m.device.tensor(), narrow.tensor());
  return m;
}

std::vector<double> to_host(const Buffer& d) {
  const int64_t n = d.numel();
  Buffer narrow(d.dtype(), {n}), wide(DType::fp32, {n});
  copy(narrow.tensor(), d.tensor());
  convert(wide.tensor(), narrow.tensor());
  const float* p = wide.tensor().ptr<float>();
  return std::vector<double>(p, p + n);
}

double relative(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

struct Case {
  Epilogue epilogue;
  bool trans_a, trans_b, accumulate;
  DType dtype;
  std::string name() const {
    const char* e[] = {"none",          "bias",  "gelu",        "gelu_bias", "gelu_aux",
                       "gelu_aux_bias", "dgelu", "dgelu_bgrad", "bgrada",    "bgradb"};
    return std::string(e[int(epilogue)]) + (trans_a ? "_ta" : "") + (trans_b ? "_tb" : "") +
           (accumulate ? "_acc" : "") + "_" + to_string(dtype);
  }
};

// Runs one case (m × n from a k-deep product, padded leading dimensions) and compares D, aux and
// bias with the reference. Returns false when the library has no algorithm for it.
bool run_case(const Case& c) {
  constexpr int64_t m = 37, n = 29, k = 45;
  std::mt19937_64 rng(uint64_t(int(c.epilogue) * 131 + c.trans_a * 7 + c.trans_b * 3 + c.accumulate));
  // Stored shapes (column-major): A is m×k (k×m transposed), B k×n (n×k transposed); padded lds.
  const int64_t a_rows = c.trans_a ? k : m, a_cols = c.trans_a ? m : k, lda = a_rows + 3;
  const int64_t b_rows = c.trans_b ? n : k, b_cols = c.trans_b ? k : n, ldb = b_rows + 5;
  const int64_t ldd = m + 2, ldaux = 40;  // aux: a multiple of 8, at least m
  Matrix a = make(rng, lda * a_cols, c.dtype), b = make(rng, ldb * b_cols, c.dtype);
  Matrix d = make(rng, ldd * n, c.dtype);  // D's old contents: the accumulated C
  const bool bias_in =
      c.epilogue == Epilogue::bias || c.epilogue == Epilogue::gelu_bias || c.epilogue == Epilogue::gelu_aux_bias;
  const bool bias_out =
      c.epilogue == Epilogue::dgelu_bgrad || c.epilogue == Epilogue::bgrada || c.epilogue == Epilogue::bgradb;
  const bool aux_out = c.epilogue == Epilogue::gelu_aux || c.epilogue == Epilogue::gelu_aux_bias;
  const bool aux_in = c.epilogue == Epilogue::dgelu || c.epilogue == Epilogue::dgelu_bgrad;
  const int64_t bias_n = c.epilogue == Epilogue::bgradb ? n : m;
  Matrix bias = make(rng, bias_n, c.dtype), aux = make(rng, ldaux * n, c.dtype, 1.5);
  const std::vector<double> d_before = d.host;

  Product p{storage_of_dtype(c.dtype),
            d.device.data(),
            a.device.data(),
            b.device.data(),
            m,
            n,
            k,
            lda,
            ldb,
            ldd,
            c.trans_a,
            c.trans_b,
            c.accumulate,
            c.epilogue};
  if (bias_in || bias_out) p.bias = bias.device.data();
  if (aux_in || aux_out) {
    p.aux = aux.device.data();
    p.ldaux = ldaux;
  }
  if (!cublaslt_matmul(p)) return false;

  // The reference, on the rounded inputs, in double.
  auto A = [&](int64_t i, int64_t kk) {
    return c.trans_a ? a.host[size_t(kk + i * lda)] : a.host[size_t(i + kk * lda)];
  };
  auto B = [&](int64_t kk, int64_t j) {
    return c.trans_b ? b.host[size_t(j + kk * ldb)] : b.host[size_t(kk + j * ldb)];
  };
  std::vector<double> want_d = d_before, want_aux = aux.host, want_bias = bias.host;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      double v = 0;
      for (int64_t kk = 0; kk < k; ++kk) v += A(i, kk) * B(kk, j);
      if (c.accumulate) v += d_before[size_t(i + j * ldd)];
      if (bias_in) v += bias.host[size_t(i)];
      if (aux_out) want_aux[size_t(i + j * ldaux)] = v;
      if (c.epilogue == Epilogue::gelu || c.epilogue == Epilogue::gelu_bias || aux_out) v = gelu(v);
      if (aux_in) v *= gelu_grad(aux.host[size_t(i + j * ldaux)]);
      want_d[size_t(i + j * ldd)] = v;
    }
  if (c.epilogue == Epilogue::dgelu_bgrad)
    for (int64_t i = 0; i < m; ++i) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += want_d[size_t(i + j * ldd)];
      want_bias[size_t(i)] = s;
    }
  if (c.epilogue == Epilogue::bgrada)
    for (int64_t i = 0; i < m; ++i) {
      double s = 0;
      for (int64_t kk = 0; kk < k; ++kk) s += A(i, kk);
      want_bias[size_t(i)] = s;
    }
  if (c.epilogue == Epilogue::bgradb)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t kk = 0; kk < k; ++kk) s += B(kk, j);
      want_bias[size_t(j)] = s;
    }
  // Only D's m rows of each column are the product's; the padding must be untouched.
  const double tol = c.dtype == DType::fp32 ? 2e-6 : c.dtype == DType::bf16 ? 1.2e-2 : 2e-3;
  const std::vector<double> got_d = to_host(d.device);
  EXPECT_LE(relative(got_d, want_d), tol) << c.name() << ": D";
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = m; i < ldd; ++i)
      EXPECT_EQ(got_d[size_t(i + j * ldd)], d_before[size_t(i + j * ldd)]) << c.name() << ": D's padding";
  if (aux_out) {
    EXPECT_LE(relative(to_host(aux.device), want_aux), tol) << c.name() << ": aux";
  }
  if (bias_out) {
    EXPECT_LE(relative(to_host(bias.device), want_bias), tol) << c.name() << ": the bias gradient";
  }
  return true;
}

TEST(Cublaslt, EveryEpilogueTransposeAndDtypeMatchesTheReference) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device (build with -DLLMTRAIN_CUDA=SIM)";
  if (!gemm_uses_cublaslt()) GTEST_SKIP() << "LLMTRAIN_CUDA_GEMM=tiled";
  std::vector<std::string> unsupported;
  int ran = 0;
  for (int e = 0; e <= int(Epilogue::bgradb); ++e)
    for (DType dtype : {DType::fp32, DType::bf16, DType::fp16})
      for (int t = 0; t < 4; ++t) {
        const Case c{Epilogue(e), (t & 1) != 0, (t & 2) != 0, e == 0 && t == 3, dtype};
        if (run_case(c))
          ++ran;
        else
          unsupported.push_back(c.name());
      }
  // The model takes every product; NVIDIA's library may have no algorithm for some (reported).
  if (simulator()) {
    EXPECT_TRUE(unsupported.empty()) << unsupported.front();
  }
  std::string list;
  for (const std::string& u : unsupported) list += " " + u;
  std::printf("cuBLASLt: %d products checked; no algorithm for %zu:%s\n", ran, unsupported.size(), list.c_str());
}

// The product on the legacy default stream, the bug this file's header names.
TEST(Cublaslt, PlantedLegacyStreamProductIsCaught) {
  if (!have_device() || !simulator()) GTEST_SKIP() << "the planted bug is the simulator's to catch";
  std::mt19937_64 rng(5);
  constexpr int64_t n = 8, in = 64, out = 64;
  Matrix x = make(rng, n * in, DType::fp32), w = make(rng, out * in, DType::fp32);
  Buffer y(DType::fp32, {n, out}, Device::cuda), y_cpu(DType::fp32, {n, out});
  Buffer xs(DType::fp32, {n, in}, Device::cuda);
  std::vector<float> xh(x.host.begin(), x.host.end()), wh(w.host.begin(), w.host.end());
  Buffer w_cpu(DType::fp32, {out, in}), x_cpu(DType::fp32, {n, in});
  copy(w_cpu.tensor(), host_tensor(wh.data(), {out, in}));
  copy(x_cpu.tensor(), host_tensor(xh.data(), {n, in}));
  kernels::linear_forward(y_cpu.tensor(), x_cpu.tensor(), w_cpu.tensor(), Tensor{});
  // The product's input is written by a copy on the compute stream, queued and not yet run when the
  // product is called.
  auto run = [&] {
    kernels::copy(xs.tensor().view({n * in}), x.device.tensor());
    kernels::linear_forward(y.tensor(), xs.tensor(), w.device.tensor().view({out, in}), Tensor{});
    std::vector<float> got(size_t(n * out));
    kernels::copy(host_tensor(got.data(), {n, out}), y.tensor());
    const float* want = y_cpu.tensor().ptr<float>();
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      num += (got[i] - want[i]) * (got[i] - want[i]);
      den += want[i] * want[i];
    }
    return std::sqrt(num / den);
  };
  EXPECT_LE(run(), 1e-6) << "on the compute stream";
  plant_products_on_legacy_stream(true);
  // Refused: the simulator names the stream.
  try {
    run();
    ADD_FAILURE() << "a product on the legacy default stream was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("legacy default stream"), std::string::npos) << e.what();
  }
#if LLMTRAIN_TEST_CUDA_SIM
  {
    // Allowed (as CUDA allows it), the product runs at once, before the compute stream's copy of
    // its input: the result is wrong, as it would be, at random, on a GPU.
    kernels::fill_zero(xs.tensor());
    kernels::synchronize(Device::cuda);
    cuda_sim::LegacyStreamAllowed legacy;
    EXPECT_GT(run(), 0.5) << "the product read its input before it was written";
  }
#endif
  plant_products_on_legacy_stream(false);
  EXPECT_LE(run(), 1e-6);
}

#if LLMTRAIN_TEST_CUDA_SIM
// The model's rules: each wrong call is refused with its reason.
TEST(CublasltModel, WrongCallsAreRefusedWithTheirReason) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  cublasLtHandle_t handle = nullptr;
  ASSERT_EQ(cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc = nullptr;
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr, other = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 16, 8, 16), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 8, 4, 8), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 16, 4, 16), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&other, CUDA_R_32F, 16, 4, 24), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const uint64_t max_ws = 1 << 20;
  ASSERT_EQ(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws),
      CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref, 1, &result, &found),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  EXPECT_EQ(result.workspaceSize, max_ws);
  Buffer a(DType::fp32, {16 * 8}, Device::cuda), b(DType::fp32, {8 * 4}, Device::cuda),
      d(DType::fp32, {16 * 4 + 64}, Device::cuda), ws(DType::uint8, {int64_t(max_ws)}, Device::cuda);
  const float one = 1, zero = 0;
  Stream stream;
  auto matmul = [&](const void* dp, cublasLtMatrixLayout_t dl, size_t ws_bytes, cudaStream_t st) {
    return cublasLtMatmul(handle, desc, &one, a.data(), la, b.data(), lb, &zero, dp, dl, const_cast<void*>(dp), dl,
                          &result.algo, ws.data(), ws_bytes, st);
  };
  auto reason = [](cublasStatus_t s) { return std::string(cublasLtGetStatusString(s)); };
  EXPECT_EQ(matmul(d.data(), ld, max_ws, stream.get()), CUBLAS_STATUS_SUCCESS);
  cublasStatus_t s = matmul(d.data(), ld, max_ws, nullptr);
  EXPECT_EQ(s, CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(reason(s).find("legacy default stream"), std::string::npos) << reason(s);
  s = matmul(d.data(), other, max_ws, stream.get());
  EXPECT_EQ(s, CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(reason(s).find("chosen for another problem"), std::string::npos) << reason(s);
  s = matmul(d.data(), ld, max_ws / 2, stream.get());
  EXPECT_EQ(s, CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(reason(s).find("the algorithm needs"), std::string::npos) << reason(s);
  s = matmul(static_cast<float*>(d.data()) + 1, ld, max_ws, stream.get());
  EXPECT_EQ(s, CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(reason(s).find("4-byte aligned, the algorithm was chosen for 256"), std::string::npos) << reason(s);
  {
    cudaStream_t gone = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamDestroy(gone), cudaSuccess);
    s = matmul(d.data(), ld, max_ws, gone);
    EXPECT_EQ(s, CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_NE(reason(s).find("did not create, or has destroyed"), std::string::npos) << reason(s);
  }
  // An aux leading dimension that is not a multiple of 8 is refused by the heuristic.
  const uint32_t epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
  const int64_t aux_ld = 17;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld),
            CUBLAS_STATUS_SUCCESS);
  s = cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref, 1, &result, &found);
  EXPECT_EQ(s, CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(reason(s).find("multiple of 8"), std::string::npos) << reason(s);
  stream.synchronize();
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
  for (auto l : {la, lb, ld, other}) EXPECT_EQ(cublasLtMatrixLayoutDestroy(l), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtDestroy(handle), CUBLAS_STATUS_SUCCESS);
}
#endif

}  // namespace
}  // namespace llmtrain::kernels::cuda
