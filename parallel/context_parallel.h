// Context parallelism: one sequence split over the cp ranks of a group, and attention across them
// as K/V blocks passed around a ring (ring attention), merged by log-sum-exp.
//
// The split (Megatron-Core's, balanced for causal attention): a sequence of T tokens is cut into
// 2·cp chunks of c = T / (2·cp) tokens; rank i holds chunk i and chunk 2·cp − 1 − i, in that
// order, as its T / cp local rows. cp_chunk() says which chunk a rank's half holds; token rows,
// targets, learned positions and RoPE positions all follow it.
//
// Ring attention, forward: each rank keeps its queries; at step s it holds the packed q|k|v rows of
// rank (i − s) mod cp, sends them on to rank i + 1 while it attends over them (the transfer of
// the next block overlaps the attention of this one), and merges each block's partial result into
// its output with the blocks' log-sum-exp (kernels::attention_merge). Query chunk q sees key chunk
// k when k ≤ q (causal within the diagonal chunk); other pairs are skipped.
// Backward: the K/V blocks go around the ring again, each with an accumulator of its K/V
// gradient that every rank adds its queries' share to; after cp transfers the accumulator is back
// at the rank that owns the block. The query gradient accumulates locally.
//
// Ulysses (all-to-all, DeepSpeed's): the heads and the sequence swap places around attention.
// Each rank sends every other rank its rows of that rank's heads / cp query heads (and kv_heads /
// cp key/value heads), attends over the whole sequence for its own head group (the plain causal
// attention), and the outputs swap back. Backward swaps the output gradient (and the output) the
// same way, and the q, k and v gradients back.
//
// Rules a reader could get wrong:
//  - Layouts: qkv [B, T, heads + 2·kv_heads, D] packed (this rank's rows: half 0 then half 1 of
//    each sample), out [B, T, heads, D]; lse is NOT the attention op's [B, heads, T]: it is
//    [B, 2, heads, c] (a block per sample and half), which only ring_attention_backward reads.
//  - Every rank of the cp group calls the same functions in the same order (they are collective
//    over `cp`); a one-rank group is the plain causal attention over both halves.
//  - Blocks travel as the whole packed q|k|v rows (the query heads ride along: no strided copy is
//    needed, at (heads + 2·kv_heads) / (2·kv_heads) times the K/V bytes).
#pragma once

#include <cstdint>

#include "parallel/comm/comm.h"

namespace llmtrain::parallel {

// The chunk (0 .. 2·cp − 1) that half `half` (0 or 1) of rank `rank`'s rows holds.
inline int cp_chunk(int rank, int half, int cp) { return half == 0 ? rank : 2 * cp - 1 - rank; }

// This rank's rows of `batch` sequences of `seq` values each (row-major [batch, seq]): out
// [batch, seq / cp] gets chunks cp_chunk(rank, 0) and cp_chunk(rank, 1) of each sequence, in that
// order. seq must divide by 2·cp.
void cp_take_rows(const int32_t* in, int32_t* out, int batch, int64_t seq, int cp, int rank);

// Buffers ring attention needs besides its operands, each in qkv's dtype unless said (sizes for
// B samples of T local rows): kv[0], kv[1] and dkv[0], dkv[1] B·T·(heads + 2·kv_heads)·D elements;
// part_out c·heads·D, part_lse (fp32) heads·c; dq, dkv_block c·(heads + 2·kv_heads)·D. The
// forward uses kv and part_*, the backward kv, dkv and the two block gradients.
struct RingScratch {
  Tensor kv[2], dkv[2];
  Tensor part_out, part_lse;
  Tensor dq_block, dkv_block;
};
// Elements of each RingScratch buffer, as listed above, for B samples of T local rows.
struct RingScratchSizes {
  int64_t kv = 0, part_out = 0, part_lse = 0, block = 0;
};
RingScratchSizes ring_scratch_sizes(int64_t batch, int64_t local_rows, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim);

// Causal attention of this rank's queries over every rank's keys and values (see above). out
// [B, T, heads, D] and lse (B·T·heads fp32, [B, 2, heads, c]) are written. sinks [heads] (gpt-oss's
// attention sinks, or undefined) join each row once: with the first block of the row's blocks.
void ring_attention_forward(Comm& cp, Tensor out, Tensor lse, Tensor qkv, int64_t heads, int64_t kv_heads,
                            const RingScratch& scratch, Tensor sinks = Tensor{});
// Its backward: dqkv (qkv's shape) is overwritten with this rank's rows' q, k and v gradients; dsinks
// (with sinks) accumulates this rank's rows' part of the sinks' gradient.
void ring_attention_backward(Comm& cp, Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t heads,
                             int64_t kv_heads, const RingScratch& scratch, Tensor dsinks = Tensor{},
                             Tensor sinks = Tensor{});

// Ulysses attention over the same layouts, heads and kv_heads divisible by cp. The forward
// REPLACES qkv's contents by this rank's head group over the whole sequence ([B, cp·T, (heads +
// 2·kv_heads) / cp, D], natural token order; the same element count), which the backward reads
// instead of the rows; lse is that attention's ([B, heads / cp, cp·T]). out gets this rank's
// rows of every head. Scratch: kv[0], kv[1], dkv[0], dkv[1] as for the ring.
// With sinks [heads], this rank's head group takes its own.
void ulysses_attention_forward(Comm& cp, Tensor out, Tensor lse, Tensor qkv, int64_t heads, int64_t kv_heads,
                               const RingScratch& scratch, Tensor sinks = Tensor{});
// dqkv (qkv's shape) is overwritten with this rank's rows' gradients; qkv, out and lse as the
// forward left them; dsinks (with sinks) accumulates the gradient of this rank's head group's sinks
// over the whole sequence (the other heads' entries are the other ranks').
void ulysses_attention_backward(Comm& cp, Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t heads,
                                int64_t kv_heads, const RingScratch& scratch, Tensor dsinks = Tensor{},
                                Tensor sinks = Tensor{});

}  // namespace llmtrain::parallel
