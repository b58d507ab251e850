// Memory ops on host tensors: zero fill, copy and dtype conversion (the scalar rules live in
// kernels/dtype_convert.h).
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dtype_convert.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace llmtrain::kernels::cpu {

void fill_zero(Tensor x) {
  const size_t bytes = x.bytes();
  char* p = static_cast<char*>(x.data);
  if (bytes < (size_t(1) << 20)) {
    std::memset(p, 0, bytes);
    return;
  }
  // Large buffers (flat gradients) are zeroed by all threads: one thread cannot saturate memory.
  const size_t chunk = size_t(1) << 18;
#pragma omp parallel for schedule(static)
  for (size_t off = 0; off < bytes; off += chunk) std::memset(p + off, 0, std::min(chunk, bytes - off));
}

void copy(Tensor out, Tensor in) {
  if (out.data != in.data && in.bytes() > 0) std::memmove(out.data, in.data, in.bytes());
}

namespace {

// One loop per (from, to) pair, so that each compiles to straight-line (vectorizable) code: the
// 16-bit operands of every op pass through here twice (kernels/dispatch.cpp).
template <typename From, typename To, typename Fn>
void convert_loop(const void* in, void* out, int64_t n, Fn fn) {
  const From* src = static_cast<const From*>(in);
  To* dst = static_cast<To*>(out);
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dst[i] = fn(src[i]);
}

// fp16 <-> fp32 with the F16C instructions where the build has them (x86-64-v3 does): the same
// IEEE round-to-nearest-even results as dtype_convert.h's scalar code (subnormals, inf, quiet
// NaN), eight at a time; the scalar code branches too much to vectorize.
template <bool kToFp32>
void fp16_loop(const void* in, void* out, int64_t n) {
  constexpr int64_t kBlock = 4096;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = std::min(n, b + kBlock);
    int64_t i = b;
    if constexpr (kToFp32) {
      const uint16_t* s = static_cast<const uint16_t*>(in);
      float* d = static_cast<float*>(out);
#if defined(__F16C__)
      for (; i + 8 <= end; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
      for (; i < end; ++i) d[i] = fp16_to_fp32(s[i]);
    } else {
      const float* s = static_cast<const float*>(in);
      uint16_t* d = static_cast<uint16_t*>(out);
#if defined(__F16C__)
      for (; i + 8 <= end; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
      for (; i < end; ++i) d[i] = fp32_to_fp16(s[i]);
    }
  }
}

}  // namespace

void convert(Tensor out, Tensor in) {
  const int64_t n = in.numel();
  if (out.dtype == in.dtype) {
    if (out.data != in.data) std::memmove(out.data, in.data, in.bytes());
    return;
  }
  // Every conversion among fp32, bf16 and fp16 is exact into fp32 and rounds once out of it.
  const DType a = in.dtype, b = out.dtype;
  if (a == DType::bf16 && b == DType::fp32)
    return convert_loop<uint16_t, float>(in.data, out.data, n, [](uint16_t x) { return bf16_to_fp32(x); });
  if (a == DType::fp16 && b == DType::fp32) return fp16_loop<true>(in.data, out.data, n);
  if (a == DType::fp32 && b == DType::bf16)
    return convert_loop<float, uint16_t>(in.data, out.data, n, [](float x) { return fp32_to_bf16(x); });
  if (a == DType::fp32 && b == DType::fp16) return fp16_loop<false>(in.data, out.data, n);
  if (a == DType::bf16 && b == DType::fp16)
    return convert_loop<uint16_t, uint16_t>(in.data, out.data, n,
                                            [](uint16_t h) { return fp32_to_fp16(bf16_to_fp32(h)); });
  if (a == DType::fp16 && b == DType::bf16)
    return convert_loop<uint16_t, uint16_t>(in.data, out.data, n,
                                            [](uint16_t h) { return fp32_to_bf16(fp16_to_fp32(h)); });
  LT_CHECK(false, "convert: {} to {}", to_string(a), to_string(b));
}

}  // namespace llmtrain::kernels::cpu
