// Attention on the tensor cores (kernels/cuda/attention_tc.cu), which kernels/cuda/attention.cu's
// entry points call for the tensors it takes; the arguments are those entry points' (the op table's).
#pragma once

#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llmtrain::kernels::cuda {

// Whether the tensor-core kernels take attention over q [B, T, width, D]
// (kernels::cuda_attention_on_tensor_cores, kernels/backend_info.h).
bool attention_tc_takes(const Tensor& q);
void attention_tc_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor sinks,
                          const AttentionSpec& spec);
void attention_tc_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                           Tensor lse, const AttentionSpec& spec);

}  // namespace llmtrain::kernels::cuda
