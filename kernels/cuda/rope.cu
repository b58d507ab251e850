// Rotary position embedding on the device (kernels/cpu/rope.cpp is the reference): the table in
// double from kernels/rope_math.h, as on the CPU, and the rotation of each (i, i + D/2) pair by one
// thread, in place.
#include "kernels/cuda/storage.cuh"
#include "kernels/rope_math.h"

namespace llmtrain::kernels::cuda {
namespace {

__global__ void rope_table_kernel(float* __restrict__ table, int64_t p, int64_t half, double theta,
                                  RopeScaling scaling) {
  const int64_t d = 2 * half;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < p * half; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pos = k / half, i = k % half;
    const double angle = double(pos) * scaled_inv_freq(i, d, theta, scaling), scale = rope_table_scale(scaling);
    table[pos * d + i] = float(scale * cos(angle));
    table[pos * d + half + i] = float(scale * sin(angle));
  }
}

template <class T>
__global__ void rope_kernel(T* x, const float* __restrict__ table, int64_t rows, int64_t t, int64_t heads,
                            int64_t rotary_heads, int64_t half, int64_t pos_begin, float sign) {
  const int64_t d = 2 * half, total = rows * rotary_heads * half;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, h = k / half % rotary_heads, row = k / (half * rotary_heads);
    const float* cs = table + (pos_begin + row % t) * d;
    const float c = cs[i], s = sign * cs[half + i];
    const int64_t lo = (row * heads + h) * d + i, hi = lo + half;
    const float a = load(x, lo), b = load(x, hi);
    store(x, lo, a * c - b * s);
    store(x, hi, b * c + a * s);
  }
}

}  // namespace

void rope_table(Tensor table, double theta, RopeScaling scaling) {
  const int64_t p = table.shape[0], half = table.shape[2];
  if (p * half == 0) return;
  LT_LAUNCH(blocks_for(p * half, 128), 128, 0, compute_stream(), rope_table_kernel)
  (table.ptr<float>(), p, half, theta, scaling);
  LT_CUDA_LAUNCHED("rope_table_kernel");
}

namespace {

// x [b, t, heads, d] rotated in place (sign -1: the inverse rotation).
void rope(Tensor x, Tensor table, int64_t rotary_heads, int64_t pos_begin, float sign) {
  const int64_t b = x.shape[0], t = x.shape[1], heads = x.shape[2], d = x.shape[3];
  const int64_t total = b * t * rotary_heads * (d / 2);
  if (total == 0) return;
  with_storage(x, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(total, 256), 256, 0, compute_stream(), rope_kernel<T>)
    (data<T>(x), table.ptr<float>(), b * t, t, heads, rotary_heads, d / 2, pos_begin, sign);
  });
  LT_CUDA_LAUNCHED("rope_kernel");
}

}  // namespace

void rope_forward(Tensor x, Tensor table, int64_t rotary_heads, int64_t pos_begin) {
  rope(x, table, rotary_heads, pos_begin, 1.0f);
}

void rope_backward(Tensor dx, Tensor table, int64_t rotary_heads, int64_t pos_begin) {
  rope(dx, table, rotary_heads, pos_begin, -1.0f);
}

}  // namespace llmtrain::kernels::cuda
