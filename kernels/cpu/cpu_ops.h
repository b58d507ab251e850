// The CPU backend's ops: every op of the table (kernels/op_table.def) with its signature, called
// only by kernels/dispatch.cpp after it has checked shapes, dtypes and devices, always on fp32
// storage (dispatch widens 16-bit operands). One file per op family in this folder.
#pragma once

#include "kernels/ops.h"

namespace llmtrain::kernels::cpu {

#define LT_OP LT_OP_DECLARE
#include "kernels/op_table.def"
#undef LT_OP

// Host to host (kernels/ops.h's copy, when both sides are on the CPU).
void copy(Tensor out, Tensor in);

// Which form attention's block products take: automatic picks the widest vector form the CPU and
// the head dim allow (AVX-512 when the head dim is a multiple of 16, AVX2 for multiples of 8,
// else OpenBLAS). Tests pin each form in turn; nothing else should call this.
enum class AttentionIsa { automatic, blas, avx2, avx512 };
void set_attention_isa(AttentionIsa isa);
bool cpu_has_avx512();

}  // namespace llmtrain::kernels::cpu
