// The CUDA backend's ops (kernels/cuda/cuda_ops.h): each unpacks its Tensors (already checked by
// kernels/dispatch.cpp) into the plain arguments of its launcher (kernels/cuda/launch.h, defined in
// the op family's .cu file) and checks the launch.
//
// The rule a reader could get wrong: nothing here touches tensor memory; a Tensor's data pointer
// is device memory and only travels to the kernels.
#include "kernels/cuda/cuda_ops.h"

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"

namespace llmtrain::kernels::cuda {
namespace {

Storage storage(const Tensor& t) {
  switch (t.dtype) {
    case DType::fp32:
      return Storage::fp32;
    case DType::bf16:
      return Storage::bf16;
    case DType::fp16:
      return Storage::fp16;
    default:
      break;
  }
  LT_CHECK(false, "CUDA op: {} is not a float storage dtype", to_string(t.dtype));
  __builtin_unreachable();
}

const void* data_or_null(const Tensor& t) { return t.defined() ? t.data : nullptr; }

}  // namespace

void convert(Tensor out, Tensor in) {
  if (out.dtype == in.dtype) {
    if (out.bytes() > 0 && out.data != in.data)
      LT_CUDA(cudaMemcpyAsync(out.data, in.data, out.bytes(), cudaMemcpyDeviceToDevice, nullptr));
    return;
  }
  convert_launch(out.data, storage(out), in.data, storage(in), out.numel());
  LT_CUDA_LAUNCHED("convert_kernel");
}

void residual_forward(Tensor out, Tensor a, Tensor b, Tensor bias) {
  const int64_t total = out.numel(), c = bias.defined() ? bias.numel() : (total ? total : 1);
  residual_forward_launch(storage(out), out.data, a.data, b.data, data_or_null(bias), total / c, c);
  LT_CUDA_LAUNCHED("residual_forward_kernel");
}

void residual_backward(Tensor dbias, Tensor dout) {
  const int64_t c = dbias.numel();
  residual_backward_launch(storage(dbias), dbias.data, dout.data, c ? dout.numel() / c : 0, c);
  LT_CUDA_LAUNCHED("column_sum_add_kernel");
}

}  // namespace llmtrain::kernels::cuda
