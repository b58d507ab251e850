// The simulator's WMMA model (kernels/cuda/sim/sim_wmma.h) and the 48 KiB dynamic shared memory
// opt-in: products give CUDA's documented result in every layout, element-wise work on fragments
// stays correct, the element mapping changes between launches, and each misuse of CUDA's contract
// gives a wrong result (a kernel assuming a layout) or kills the process naming the call.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/sim/sim_rules.h"
#include "tests/kernels/sim/device_array.h"
#include "tests/kernels/sim/sim_wmma_test_kernels.h"

namespace llmtrain::cuda_sim_test {
namespace {

// Values a 16-bit type holds exactly: rounded on the host, with their bits for the device.
struct Rounded {
  std::vector<float> value;
  std::vector<uint16_t> bits;
};

Rounded round_to(WmmaInput input, const std::vector<float>& v) {
  Rounded r{std::vector<float>(v.size()), std::vector<uint16_t>(v.size())};
  for (size_t i = 0; i < v.size(); ++i) {
    if (input == WmmaInput::bf16) {
      const __nv_bfloat16 h = __float2bfloat16_rn(v[i]);
      r.value[i] = __bfloat162float(h);
      std::memcpy(&r.bits[i], &h, 2);
    } else {
      const __half h = __float2half_rn(v[i]);
      r.value[i] = __half2float(h);
      std::memcpy(&r.bits[i], &h, 2);
    }
  }
  return r;
}

// Reproducible values in [-2, 2).
std::vector<float> values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = float(seed >> 8) / float(1u << 24) * 4.0f - 2.0f;
  }
  return v;
}

// The bound on an fp32 sum of `terms` exact terms, in any order: terms · 2^-24 · Σ|term|.
double fp32_sum_bound(int terms, double magnitude) { return terms * std::ldexp(1.0, -24) * magnitude; }

const char* name(WmmaInput input) { return input == WmmaInput::bf16 ? "bf16" : "f16"; }

class CudaSimWmma : public ::testing::Test {
  cuda_sim::LegacyStreamAllowed legacy_;
};

TEST_F(CudaSimWmma, TileProductInEveryLayoutAndDtype) {
  // Leading dimensions other than the width (CUDA's multiples: 8 for 16-bit elements, 4 for float),
  // and d's padding must stay untouched.
  const unsigned lda = 24, ldb = 16, ldc = 20, ldd = 20;
  for (WmmaInput input : {WmmaInput::bf16, WmmaInput::f16}) {
    const Rounded a = round_to(input, values(256, 1)), b = round_to(input, values(256, 2));
    const std::vector<float> c = values(256, 3);
    for (int layouts = 0; layouts < 16; ++layouts) {
      const bool a_col = layouts & 1, b_col = layouts & 2, c_col = layouts & 4, d_col = layouts & 8;
      std::vector<uint16_t> ha(16 * lda), hb(16 * ldb);
      std::vector<float> hc(16 * ldc);
      for (unsigned r = 0; r < 16; ++r)
        for (unsigned k = 0; k < 16; ++k) {
          ha[a_col ? k * lda + r : r * lda + k] = a.bits[r * 16 + k];
          hb[b_col ? k * ldb + r : r * ldb + k] = b.bits[r * 16 + k];  // b's row r is k's index
          hc[c_col ? k * ldc + r : r * ldc + k] = c[r * 16 + k];
        }
      DeviceArray<uint16_t> da(ha), db(hb);
      DeviceArray<float> dc(hc), dd(std::vector<float>(16 * ldd, -7.0f));
      ASSERT_EQ(wmma_tile_product(input, a_col, b_col, c_col, d_col, da.get(), lda, db.get(), ldb, dc.get(), ldc,
                                  dd.get(), ldd),
                cudaSuccess);
      const std::vector<float> d = dd.host();
      for (unsigned r = 0; r < 16; ++r) {
        for (unsigned col = 0; col < 16; ++col) {
          double ref = c[r * 16 + col], magnitude = std::fabs(ref);
          for (unsigned k = 0; k < 16; ++k) {
            const double p = double(a.value[r * 16 + k]) * double(b.value[k * 16 + col]);
            ref += p;
            magnitude += std::fabs(p);
          }
          ASSERT_NEAR(d[d_col ? col * ldd + r : r * ldd + col], ref, fp32_sum_bound(17, magnitude))
              << name(input) << " layouts " << layouts << " (" << r << "," << col << ")";
        }
        for (unsigned pad = 16; pad < ldd; ++pad) ASSERT_EQ(d[r * ldd + pad], -7.0f) << "store wrote padding";
      }
    }
  }
}

TEST_F(CudaSimWmma, TiledGemmFromGlobalAndFromSharedMemory) {
  const int m = 48, n = 32, k = 64;  // 6 warps, 4 k-steps
  for (WmmaInput input : {WmmaInput::bf16, WmmaInput::f16}) {
    const Rounded a = round_to(input, values(size_t(m * k), 4)), b = round_to(input, values(size_t(k * n), 5));
    const std::vector<float> c = values(size_t(m * n), 6);
    for (bool shared : {false, true}) {
      DeviceArray<uint16_t> da(a.bits), db(b.bits);
      DeviceArray<float> dc(c), dd(size_t(m * n));
      ASSERT_EQ(wmma_gemm(input, shared, da.get(), db.get(), dc.get(), dd.get(), m, n, k), cudaSuccess);
      const std::vector<float> d = dd.host();
      for (int r = 0; r < m; ++r)
        for (int col = 0; col < n; ++col) {
          double ref = c[size_t(r * n + col)], magnitude = std::fabs(ref);
          for (int kk = 0; kk < k; ++kk) {
            const double p = double(a.value[size_t(r * k + kk)]) * double(b.value[size_t(kk * n + col)]);
            ref += p;
            magnitude += std::fabs(p);
          }
          ASSERT_NEAR(d[size_t(r * n + col)], ref, fp32_sum_bound(k + 1, magnitude))
              << name(input) << (shared ? " shared" : " global") << " (" << r << "," << col << ")";
        }
    }
  }
}

TEST_F(CudaSimWmma, FillAndElementWiseWorkAreRightUnderAnyMapping) {
  const Rounded a = round_to(WmmaInput::bf16, values(256, 7)), b = round_to(WmmaInput::bf16, values(256, 8));
  std::vector<float> m(256);
  for (int i = 0; i < 256; ++i) m[size_t(i)] = float(i % 29 - 14) * 0.25f;  // 2m + 1 is exact
  DeviceArray<uint16_t> da(a.bits), db(b.bits);
  DeviceArray<float> dm(m), filled(256), affine(256), scaled(256);
  ASSERT_EQ(wmma_elementwise(da.get(), db.get(), dm.get(), filled.get(), affine.get(), scaled.get()), cudaSuccess);
  const std::vector<float> f = filled.host(), af = affine.host(), s = scaled.host();
  for (int i = 0; i < 256; ++i) {
    ASSERT_EQ(f[size_t(i)], 3.0f) << i;
    ASSERT_EQ(af[size_t(i)], 2.0f * m[size_t(i)] + 1.0f) << i;
  }
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col) {
      double ref = 0, magnitude = 0;
      for (int k = 0; k < 16; ++k) {
        const double p = 2.0 * a.value[size_t(r * 16 + k)] * b.value[size_t(k * 16 + col)];
        ref += p;
        magnitude += std::fabs(p);
      }
      ASSERT_NEAR(s[size_t(r * 16 + col)], ref, fp32_sum_bound(16, magnitude)) << r << "," << col;
    }
}

// Every value 0..255 exactly once.
bool is_permutation(const std::vector<float>& v) {
  std::vector<int> seen(256, 0);
  for (size_t i = 0; i < 256; ++i) {
    const int x = int(v[i]);
    if (float(x) != v[i] || x < 0 || x > 255 || seen[size_t(x)]++ != 0) return false;
  }
  return true;
}

TEST_F(CudaSimWmma, TheElementMappingIsAPermutationThatChangesBetweenLaunches) {
  std::vector<float> first[3];
  for (int launch = 0; launch < 2; ++launch) {
    DeviceArray<float> acc(256), a(512), b(512);
    DeviceArray<int> count(1);
    ASSERT_EQ(wmma_holders(acc.get(), a.get(), b.get(), count.get()), cudaSuccess);
    ASSERT_EQ(count.host()[0], 8);  // the simulator's num_elements (CUDA promises none)
    std::vector<float> now[3] = {acc.host(), a.host(), b.host()};
    for (int kind = 0; kind < 3; ++kind) {
      now[kind].resize(256);
      ASSERT_TRUE(is_permutation(now[kind])) << "kind " << kind;
      if (launch == 0) first[kind] = now[kind];
      if (launch == 1) {
        EXPECT_NE(now[kind], first[kind]) << "kind " << kind << ": the same mapping twice";
      }
    }
    if (launch == 0) {
      EXPECT_NE(now[1], now[2]) << "matrix_a and matrix_b map alike";
    }
  }
}

TEST_F(CudaSimWmma, PlantedRowAssumptionGivesAWrongAnswer) {
  // scale_rows_assuming_layout_kernel scales x[] by a row it assumes lane L holds (L / 2): under a
  // mapping CUDA does not promise, most elements get another row's factor.
  std::vector<float> m(256);
  for (int i = 0; i < 256; ++i) m[size_t(i)] = float(1 + i % 7);
  DeviceArray<float> dm(m), dout(256);
  ASSERT_EQ(wmma_scale_rows_assuming_layout(dm.get(), dout.get()), cudaSuccess);
  const std::vector<float> out = dout.host();
  int wrong = 0;
  for (int i = 0; i < 256; ++i) wrong += out[size_t(i)] != m[size_t(i)] * float(i / 16 + 1);
  EXPECT_GT(wrong, 128);
}

TEST_F(CudaSimWmma, PlantedMissingSyncwarpAroundLoadAndStoreReadsStaleData) {
  // A lane's load reads when it arrives, its store writes when it leaves: without the __syncwarp
  // before the load (or after the store) some lanes read shared memory the others have not written
  // yet (poison, NaN).
  std::vector<float> m(256);
  for (int i = 0; i < 256; ++i) m[size_t(i)] = float(i);
  for (int missing = 0; missing < 3; ++missing) {
    DeviceArray<float> dm(m), dout(256);
    ASSERT_EQ(wmma_shared_round_trip(dm.get(), dout.get(), missing), cudaSuccess);
    const std::vector<float> out = dout.host();
    int wrong = 0;
    for (int i = 0; i < 256; ++i) wrong += out[size_t(i)] != m[size_t(i)];
    if (missing == 0) {
      EXPECT_EQ(wrong, 0);
    } else {
      EXPECT_GT(wrong, 0) << "no __syncwarp " << (missing == 1 ? "before the load" : "after the store");
    }
  }
}

TEST_F(CudaSimWmma, DynamicSharedMemoryBeyond48KiBNeedsTheOptIn) {
  DeviceArray<float> out(std::vector<float>(256, -1.0f));
  const auto counts = [&out] {
    const std::vector<float> h = out.host();
    for (int t = 0; t < 256; ++t)
      if (h[size_t(t)] != float(t)) return false;
    return true;
  };
  ASSERT_EQ(shared_without_opt_in(48 * 1024, out.get()), cudaSuccess);
  EXPECT_TRUE(counts());

  DeviceArray<float> untouched(std::vector<float>(256, -1.0f));
  EXPECT_EQ(shared_without_opt_in(64 * 1024, untouched.get()), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorInvalidValue)).find("cudaFuncSetAttribute"), std::string::npos)
      << cudaGetErrorString(cudaErrorInvalidValue);
  EXPECT_EQ(untouched.host()[0], -1.0f);  // nothing ran

  ASSERT_EQ(shared_with_opt_in(64 * 1024, 64 * 1024, out.get()), cudaSuccess);
  EXPECT_TRUE(counts());
  EXPECT_EQ(shared_with_opt_in(64 * 1024, 80 * 1024, out.get()), cudaErrorInvalidValue);   // beyond the attribute
  EXPECT_EQ(shared_with_opt_in(228 * 1024, 64 * 1024, out.get()), cudaErrorInvalidValue);  // beyond the device's
  cudaGetLastError();
}

class CudaSimWmmaDeathTest : public ::testing::Test {
  cuda_sim::LegacyStreamAllowed legacy_;
};

TEST_F(CudaSimWmmaDeathTest, ALaneThatReturnsBeforeTheCallIsNamed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Whichever happens first: the lane exits while others wait, or a lane arrives after it exited.
  EXPECT_DEATH(wmma_lane_returns_before(0, 5),
               "thread 5 exited while lanes of its warp wait for it in wmma::mma_sync|"
               "wmma::mma_sync at .*: lane 5 of its warp \\(thread 5\\) has exited");
  EXPECT_DEATH(wmma_lane_returns_before(1, 0),
               "thread 0 exited while lanes of its warp wait for it in wmma::load_matrix_sync|"
               "wmma::load_matrix_sync at .*: lane 0 of its warp \\(thread 0\\) has exited");
}

TEST_F(CudaSimWmmaDeathTest, LanesPassingDifferentArgumentsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(wmma_lanes_disagree(0), "wmma::load_matrix_sync at .*: lane 7 passes ldm 24, lane 0 16");
  EXPECT_DEATH(wmma_lanes_disagree(1), "wmma::load_matrix_sync at .*: lane 3 passes mptr .*same mptr");
}

TEST_F(CudaSimWmmaDeathTest, MisalignedPointersAndBadLeadingDimensionsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(wmma_bad_memory(0), "wmma::load_matrix_sync at .*: mptr .* is not 256-bit \\(32-byte\\) aligned");
  EXPECT_DEATH(wmma_bad_memory(1), "wmma::load_matrix_sync at .*: ldm 12 is not a multiple of 8");
  EXPECT_DEATH(wmma_bad_memory(2), "wmma::store_matrix_sync at .*: ldm 6 is not a multiple of 4");
}

TEST_F(CudaSimWmmaDeathTest, APartialWarpAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(wmma_partial_warp(), "wmma::load_matrix_sync at .*: its warp has 16 threads");
}

TEST_F(CudaSimWmmaDeathTest, LanesWaitingElsewhereAreADeadlockNamingTheCall) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(wmma_lanes_wait_elsewhere(), "deadlock.*0:__syncthreads.*16:wmma::load_matrix_sync at ");
}

}  // namespace
}  // namespace llmtrain::cuda_sim_test
