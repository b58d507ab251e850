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
//  - "last dimension" gathers are of [rows, cols_local] slices into [rows, tp·cols_local] with rank
//    r's columns at [r·cols_local, (r+1)·cols_local); Comm::all_gather concatenates along the
//    FIRST dimension, so these functions rearrange through `scratch` (tp·rows·cols_local floats;
//    may be absent when tp = 1).
//  - A bias that is replicated across a row-parallel layer is added after reduce_from_tp_region,
//    never before (it would be counted tp times).
//
//   vocab_parallel_cross_entropy   forward: softmax cross-entropy over logits split by vocabulary
//                                  columns (Megatron's): all-reduce max of the row maxima, then one
//                                  all-reduce sum of [Σ exp, target logit]; every rank ends with the
//                                  same losses and lse. No rank holds the full logits.
//                                  backward: local (softmax − one-hot on this rank's columns)
//  - Rank r's logits [N, V/tp] hold the columns [r·V/tp, (r+1)·V/tp); columns >= vocab are
//    padding, excluded exactly as in kernels::cross_entropy_forward. scratch holds 3·N floats.
//
//   replicated_grad                forward: identity (every rank of `group` holds the same copy)
//                                  backward: all-reduce (sum) of what this backward added to the
//                                  copy's gradient — each rank computed only its part of it
//  - For a parameter replicated over a group while its uses are split (key/value heads replicated
//    over tp / kv_heads ranks; with sequence parallelism, norm weights and biases over tp).
//    Gradients accumulate over micro-batches, so only this backward's increment is reduced:
//    replicated_grad_begin saves the gradient so far into `saved` and zeroes it; backward adds
//    this micro-batch's part; replicated_grad_end all-reduces that part and adds the saved
//    gradient back (identical on every rank, as it was reduced before).
#pragma once

#include "parallel/comm.h"

namespace llmtrain::parallel {

void copy_to_tp_region_forward(Comm& tp, Tensor x);
void copy_to_tp_region_backward(Comm& tp, Tensor dx);

void reduce_from_tp_region_forward(Comm& tp, Tensor x);
void reduce_from_tp_region_backward(Comm& tp, Tensor dx);

void gather_from_tp_region_forward(Comm& tp, Tensor local, Tensor full, Tensor scratch);
void gather_from_tp_region_backward(Comm& tp, Tensor dfull, Tensor dlocal);

void scatter_to_tp_region_forward(Comm& tp, Tensor full, Tensor local);
void scatter_to_tp_region_backward(Comm& tp, Tensor dlocal, Tensor dfull, Tensor scratch);

void vocab_parallel_cross_entropy_forward(Comm& tp, Tensor losses, Tensor lse, Tensor logits, Tensor targets,
                                          int64_t vocab, int32_t ignore_index, Tensor scratch);
void vocab_parallel_cross_entropy_backward(Comm& tp, Tensor dlogits, Tensor logits, Tensor lse, Tensor targets,
                                           int64_t vocab, int32_t ignore_index, float loss_scale, Tensor count);

void replicated_grad_begin(Comm& group, Tensor grad, Tensor saved);
void replicated_grad_end(Comm& group, Tensor grad, Tensor saved);

}  // namespace llmtrain::parallel
