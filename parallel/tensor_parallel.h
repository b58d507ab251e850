// Tensor-parallel crossings as forward/backward pairs (Megatron-LM's tensor_parallel/mappings.py).
// The model calls one pair at every point where activations enter or leave a tensor-parallel
// region; with a one-rank tp communicator every function is the identity (or a copy between two
// different buffers).
//
//   copy_to_tp_region       forward: identity          backward: all-reduce (sum)   ("f")
//   reduce_from_tp_region   forward: all-reduce (sum)  backward: identity           ("g")
//   gather_from_tp_region   forward: all-gather along the last dimension
//                           backward: keep this rank's slice of the last dimension
//   scatter_to_tp_region    forward: keep this rank's slice   backward: all-gather
//
// Rules a reader could get wrong:
//  - Activations and gradients are in the model's storage dtype (fp32, bf16 or fp16) and cross in
//    it: 16-bit all-gathers move 16-bit words, 16-bit all-reduces and reduce-scatters sum in fp32
//    and round once (parallel/comm/comm.h). Every tensor of one call shares that dtype, except the
//    vocab-parallel cross-entropy's statistics (below), which are fp32.
//  - "last dimension" gathers are of [rows, cols_local] slices into [rows, tp·cols_local] with rank
//    r's columns at [r·cols_local, (r+1)·cols_local); Comm::all_gather concatenates along the
//    FIRST dimension, so these functions rearrange through `scratch` (tp·rows·cols_local elements
//    of local's dtype; may be absent when tp = 1).
//  - A bias that is replicated across a row-parallel layer is added after reduce_from_tp_region,
//    never before (it would be counted tp times).
//
//   vocab_parallel_cross_entropy   forward: softmax cross-entropy over logits split by vocabulary
//                                  columns (Megatron's): all-reduce max of the row maxima, then one
//                                  all-reduce sum of [Σ exp, target logit]; every rank ends with the
//                                  same losses and lse. No rank holds the full logits.
//                                  backward: local (softmax − one-hot on this rank's columns)
//  - Rank r's logits [N, V/tp] hold the columns [r·V/tp, (r+1)·V/tp); columns >= vocab are
//    padding, excluded exactly as in kernels::cross_entropy_forward. scratch holds 3·N floats
//    (fp32 whatever the logits' dtype: the row maxima and the [Σ exp, target logit] sums cross in
//    fp32, as do losses and lse).
//
//   replicated_grads               forward: identity (every rank of `group` holds the same copy)
//                                  backward: all-reduce (sum) of what this backward added to the
//                                  copies' gradients — each rank computed only its part of them
//  - For parameters replicated over a group while their uses are split (key/value heads replicated
//    over tp / kv_heads ranks; with sequence parallelism, norm weights and biases over tp).
//    Gradients accumulate over micro-batches, so only this backward's increment is reduced:
//    replicated_grads_begin saves the gradients so far into `saved` and zeroes them; backward adds
//    this micro-batch's part; replicated_grads_end all-reduces that part (several tensors packed
//    into one all-reduce) and adds the saved gradients back (identical on every rank, as they were
//    reduced before). `saved` holds their elements once (one tensor) or twice (several: the pack),
//    in the gradients' dtype (with 16-bit gradients the increment is rounded to 16 bits, reduced in
//    fp32 and added to the saved gradients with one more rounding). Undefined tensors in the list
//    are skipped.
//
// Sequence parallelism (Megatron's), along the first dimension (token rows, rank r holding rows
// [r·N/tp, (r+1)·N/tp)):
//   gather_from_sequence_parallel_region          forward: all-gather   backward: reduce-scatter (sum)
//   reduce_scatter_to_sequence_parallel_region    forward: reduce-scatter (sum)   backward: all-gather
//  - The gather replaces copy_to_tp_region before a column-parallel linear, the reduce-scatter
//    replaces reduce_from_tp_region after a row-parallel one; `local` and `full` never alias.
#pragma once

#include <span>

#include "parallel/comm/comm.h"

namespace llmtrain::parallel {

void copy_to_tp_region_forward(Comm& tp, Tensor x);
void copy_to_tp_region_backward(Comm& tp, Tensor dx);

void reduce_from_tp_region_forward(Comm& tp, Tensor x);
void reduce_from_tp_region_backward(Comm& tp, Tensor dx);

// No layer calls the gather/scatter pair today (the vocab-parallel loss keeps the logits split); they
// complete Megatron's set for a column-parallel output that must be whole, and are tested as such.
void gather_from_tp_region_forward(Comm& tp, Tensor local, Tensor full, Tensor scratch);
void gather_from_tp_region_backward(Comm& tp, Tensor dfull, Tensor dlocal);

void scatter_to_tp_region_forward(Comm& tp, Tensor full, Tensor local);
void scatter_to_tp_region_backward(Comm& tp, Tensor dlocal, Tensor dfull, Tensor scratch);

void vocab_parallel_cross_entropy_forward(Comm& tp, Tensor losses, Tensor lse, Tensor logits, Tensor targets,
                                          int64_t vocab, int32_t ignore_index, Tensor scratch);
void vocab_parallel_cross_entropy_backward(Comm& tp, Tensor dlogits, Tensor logits, Tensor lse, Tensor targets,
                                           int64_t vocab, int32_t ignore_index, float loss_scale, Tensor count);

void replicated_grads_begin(Comm& group, std::span<const Tensor> grads, Tensor saved);
void replicated_grads_end(Comm& group, std::span<const Tensor> grads, Tensor saved);

void gather_from_sequence_parallel_region_forward(Comm& tp, Tensor local, Tensor full);
void gather_from_sequence_parallel_region_backward(Comm& tp, Tensor dfull, Tensor dlocal);

void reduce_scatter_to_sequence_parallel_region_forward(Comm& tp, Tensor full, Tensor local);
void reduce_scatter_to_sequence_parallel_region_backward(Comm& tp, Tensor dlocal, Tensor dfull);

}  // namespace llmtrain::parallel
