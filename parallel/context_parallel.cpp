#include "parallel/context_parallel.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "common/error.h"
#include "kernels/ops.h"

namespace llmtrain::parallel {

namespace k = kernels;

namespace {

// Tags of the two kinds of ring transfer (K/V blocks, their gradient accumulators): every rank
// posts them in the same order; distinct tags keep a block from ever matching an accumulator.
constexpr int kKvTag = 1;
constexpr int kDkvTag = 2;

// One rank's rows, cut into (sample, half) blocks of c rows.
struct Blocks {
  int64_t batch = 0, rows = 0, c = 0, heads = 0, kv_heads = 0, width = 0, head_dim = 0;

  Blocks(const Tensor& qkv, int64_t h, int64_t kv) : heads(h), kv_heads(kv) {
    LT_CHECK(qkv.shape.rank() == 4 && qkv.shape[2] == h + 2 * kv, "ring attention: qkv {} for {} + 2·{} heads",
             qkv.shape.str(), h, kv);
    batch = qkv.shape[0], rows = qkv.shape[1], head_dim = qkv.shape[3];
    LT_CHECK(rows % 2 == 0, "ring attention: {} local rows are not two chunks", rows);
    c = rows / 2, width = qkv.shape[2];
  }
  // Packed q|k|v (or its gradient) rows of (b, half): [1, c, heads + 2·kv_heads, D].
  Tensor packed(const Tensor& t, int64_t b, int half) const {
    return t.flat((b * rows + half * c) * width * head_dim, c * width * head_dim).view({1, c, width, head_dim});
  }
  Tensor packed_rows(const Tensor& t, int64_t b, int half) const {
    return t.flat((b * rows + half * c) * width * head_dim, c * width * head_dim).view({c, width * head_dim});
  }
  Tensor out(const Tensor& t, int64_t b, int half) const {
    return t.flat((b * rows + half * c) * heads * head_dim, c * heads * head_dim).view({1, c, heads, head_dim});
  }
  Tensor lse(const Tensor& t, int64_t b, int half) const {
    return t.flat((b * 2 + half) * heads * c, heads * c).view({1, heads, c});
  }
  k::AttentionSpec spec(int q_chunk, int kv_chunk) const {
    return {.heads = heads,
            .kv_heads = kv_heads,
            .q_head = 0,
            .k_head = heads,
            .v_head = heads + kv_heads,
            .q_begin = q_chunk * c,
            .kv_begin = kv_chunk * c,
            .causal = true};
  }
};

// The ring's neighbours: blocks go to the next rank and come from the previous one.
WorkHandle pass_on(Comm& cp, Tensor send, Tensor recv, int tag) {
  const int p = cp.size(), r = cp.rank();
  return cp.exchange_async(
      {{Transfer::Kind::send, send, (r + 1) % p, tag}, {Transfer::Kind::recv, recv, (r + p - 1) % p, tag}});
}

}  // namespace

void cp_take_rows(const int32_t* in, int32_t* out, int batch, int64_t seq, int cp, int rank) {
  LT_CHECK(cp >= 1 && rank >= 0 && rank < cp && seq % (2 * cp) == 0, "cp_take_rows: seq {} cp {} rank {}", seq, cp,
           rank);
  const int64_t c = seq / (2 * cp), local = seq / cp;
  for (int b = 0; b < batch; ++b)
    for (int half = 0; half < 2; ++half) {
      const int32_t* from = in + int64_t(b) * seq + cp_chunk(rank, half, cp) * c;
      std::copy(from, from + c, out + int64_t(b) * local + half * c);
    }
}

RingScratchSizes ring_scratch_sizes(int64_t batch, int64_t local_rows, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim) {
  const int64_t c = local_rows / 2, width = heads + 2 * kv_heads;
  return {.kv = batch * local_rows * width * head_dim,
          .part_out = c * heads * head_dim,
          .part_lse = heads * c,
          .block = c * width * head_dim};
}

void ring_attention_forward(Comm& cp, Tensor out, Tensor lse, Tensor qkv, int64_t heads, int64_t kv_heads,
                            const RingScratch& scratch, Tensor sinks) {
  const Blocks bl(qkv, heads, kv_heads);
  const int p = cp.size(), r = cp.rank();
  Tensor cur = qkv;
  for (int s = 0; s < p; ++s) {
    const int src = (r - s + p) % p;
    const Tensor next = scratch.kv[s % 2];
    WorkHandle moving = s + 1 < p ? pass_on(cp, cur, next, kKvTag) : nullptr;
    const Tensor part_out = scratch.part_out.view({1, bl.c, heads, bl.head_dim});
    const Tensor part_lse = scratch.part_lse.view({1, heads, bl.c});
    for (int64_t b = 0; b < bl.batch; ++b)
      for (int qh = 0; qh < 2; ++qh)
        for (int kh = 0; kh < 2; ++kh) {
          const int qc = cp_chunk(r, qh, p), kc = cp_chunk(src, kh, p);
          if (kc > qc) continue;  // every key after every query: nothing to see
          const Tensor kv = bl.packed(cur, b, kh);
          // Step 0's first visible block (this rank's chunk 0 or the earlier one) starts the result,
          // with the sinks (once per row).
          if (s == 0 && kh == 0) {
            k::attention_forward(bl.out(out, b, qh), bl.lse(lse, b, qh), bl.packed(qkv, b, qh), kv, kv, sinks,
                                 bl.spec(qc, kc));
          } else {
            k::attention_forward(part_out, part_lse, bl.packed(qkv, b, qh), kv, kv, Tensor{}, bl.spec(qc, kc));
            k::attention_merge(bl.out(out, b, qh), bl.lse(lse, b, qh), part_out, part_lse);
          }
          if (moving) cp.progress();
        }
    if (moving) moving->wait();
    cur = next;
  }
}

void ring_attention_backward(Comm& cp, Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t heads,
                             int64_t kv_heads, const RingScratch& scratch, Tensor dsinks, Tensor sinks) {
  const Blocks bl(qkv, heads, kv_heads);
  LT_CHECK(dqkv.shape == qkv.shape, "ring attention backward: dqkv {} for qkv {}", dqkv.shape.str(), qkv.shape.str());
  const int p = cp.size(), r = cp.rank();
  const Tensor dq_block = scratch.dq_block.view({1, bl.c, bl.width, bl.head_dim});
  const Tensor dkv_block = scratch.dkv_block.view({1, bl.c, bl.width, bl.head_dim});
  const Tensor dq_rows = scratch.dq_block.view({bl.c, bl.width * bl.head_dim});
  const Tensor dkv_rows = scratch.dkv_block.view({bl.c, bl.width * bl.head_dim});
  k::fill_zero(dqkv);
  Tensor cur = qkv, acc = scratch.dkv[0];
  k::fill_zero(acc);
  WorkHandle acc_moving;
  for (int s = 0; s < p; ++s) {
    const int src = (r - s + p) % p;
    const Tensor next = scratch.kv[s % 2];
    WorkHandle moving = s + 1 < p ? pass_on(cp, cur, next, kKvTag) : nullptr;
    if (acc_moving) acc_moving->wait();  // the accumulator of block src, from the previous rank
    for (int64_t b = 0; b < bl.batch; ++b)
      for (int qh = 0; qh < 2; ++qh)
        for (int kh = 0; kh < 2; ++kh) {
          const int qc = cp_chunk(r, qh, p), kc = cp_chunk(src, kh, p);
          if (kc > qc) continue;
          // attention_backward overwrites the heads it names: the other heads stay 0, so whole rows add.
          k::fill_zero(scratch.dq_block);
          k::fill_zero(scratch.dkv_block);
          const Tensor kv = bl.packed(cur, b, kh);
          // The sinks' gradient with the block the forward passed them with.
          const bool first = s == 0 && kh == 0;
          k::attention_backward(dq_block, dkv_block, dkv_block, first ? dsinks : Tensor{}, bl.out(dout, b, qh),
                                bl.packed(qkv, b, qh), kv, kv, bl.out(out, b, qh), bl.lse(lse, b, qh),
                                first ? sinks : Tensor{}, bl.spec(qc, kc));
          const Tensor dq = bl.packed_rows(dqkv, b, qh), dkv = bl.packed_rows(acc, b, kh);
          k::residual_forward(dq, dq, dq_rows, Tensor{});
          k::residual_forward(dkv, dkv, dkv_rows, Tensor{});
          if (moving) cp.progress();
        }
    if (p > 1) {
      // Block src's K/V gradient goes on with the block: the next rank adds its share at step s + 1,
      // and after the last step it arrives at its owner.
      const Tensor acc_next = scratch.dkv[(s + 1) % 2];
      acc_moving = pass_on(cp, acc, acc_next, kDkvTag);
      acc = acc_next;
    }
    if (moving) moving->wait();
    cur = next;
  }
  if (acc_moving) acc_moving->wait();
  // acc holds this rank's own block's K/V gradient (its query heads are 0).
  const int64_t n = bl.batch * bl.rows, w = bl.width * bl.head_dim;
  const Tensor all = dqkv.view({n, w});
  k::residual_forward(all, all, acc.flat(0, n * w).view({n, w}), Tensor{});
}

namespace {

// Ulysses' rearrangements. A "head piece" is a run of heads of the packed rows that splits over
// the cp ranks: rank j's share is heads [first + j·count, first + (j + 1)·count) of the whole
// rows, and the pieces follow one another in the block each rank receives.
struct HeadPiece {
  int64_t first = 0, count = 0;
};

// rows × whole heads (width_whole) <-> cp blocks of rows × per-rank heads (width_part), head dim d.
// to_blocks: whole → blocks; else blocks → whole (each rank's heads written back in place).
void heads_and_blocks(Tensor whole, Tensor blocks, int64_t rows, int64_t width_whole, int64_t d, int p,
                      std::initializer_list<HeadPiece> pieces, bool to_blocks) {
  int64_t width_part = 0;
  for (const HeadPiece& h : pieces) width_part += h.count;
  for (int j = 0; j < p; ++j) {
    const int64_t block = int64_t(j) * rows * width_part * d;
    for (int64_t n = 0; n < rows; ++n) {
      int64_t at = 0;
      for (const HeadPiece& h : pieces) {
        const Tensor w = whole.flat((n * width_whole + h.first + j * h.count) * d, h.count * d);
        const Tensor b = blocks.flat(block + (n * width_part + at) * d, h.count * d);
        if (to_blocks)
          k::copy(b, w);
        else
          k::copy(w, b);
        at += h.count;
      }
    }
  }
}

// cp blocks of [B, T_local, width] rows (block s: rank s's rows, its two chunks) <-> [B, cp·T_local,
// width] in token order.
void blocks_and_sequence(Tensor blocks, Tensor seq, int64_t batch, int64_t local_rows, int64_t width, int p,
                         bool to_sequence) {
  const int64_t c = local_rows / 2, total = local_rows * p;
  for (int s = 0; s < p; ++s)
    for (int64_t b = 0; b < batch; ++b)
      for (int h = 0; h < 2; ++h) {
        const Tensor x = blocks.flat(((int64_t(s) * batch + b) * local_rows + h * c) * width, c * width);
        const Tensor y = seq.flat((b * total + cp_chunk(s, h, p) * c) * width, c * width);
        if (to_sequence)
          k::copy(y, x);
        else
          k::copy(x, y);
      }
}

struct UlyssesDims {
  int p = 1;
  int64_t batch = 0, rows = 0, heads = 0, kv_heads = 0, d = 0, hj = 0, kvj = 0;
  UlyssesDims(Comm& cp, const Tensor& qkv, int64_t h, int64_t kv) : p(cp.size()), heads(h), kv_heads(kv) {
    LT_CHECK(qkv.shape.rank() == 4 && qkv.shape[2] == h + 2 * kv && h % p == 0 && kv % p == 0,
             "ulysses attention: qkv {} for {} + 2·{} heads over cp {}", qkv.shape.str(), h, kv, p);
    batch = qkv.shape[0], rows = qkv.shape[1], d = qkv.shape[3], hj = h / p, kvj = kv / p;
  }
  int64_t width() const { return heads + 2 * kv_heads; }
  int64_t width_part() const { return hj + 2 * kvj; }
  int64_t qkv_numel() const { return batch * rows * width() * d; }
  int64_t out_numel() const { return batch * rows * heads * d; }
};

}  // namespace

void ulysses_attention_forward(Comm& cp, Tensor out, Tensor lse, Tensor qkv, int64_t heads, int64_t kv_heads,
                               const RingScratch& scratch, Tensor sinks) {
  const UlyssesDims u(cp, qkv, heads, kv_heads);
  const int64_t n = u.batch * u.rows, total = u.rows * u.p;
  const Tensor send = scratch.kv[0].flat(0, u.qkv_numel()), recv = scratch.kv[1].flat(0, u.qkv_numel());
  heads_and_blocks(qkv, send, n, u.width(), u.d, u.p, {{0, u.hj}, {heads, u.kvj}, {heads + kv_heads, u.kvj}}, true);
  cp.all_to_all(send, recv);
  // This rank's head group over the whole sequence, in qkv's own storage.
  blocks_and_sequence(recv, qkv, u.batch, u.rows, u.width_part() * u.d, u.p, true);
  const Tensor whole_out = scratch.dkv[0].flat(0, u.out_numel());
  const Tensor whole_qkv = qkv.view({u.batch, total, u.width_part(), u.d});
  k::attention_forward(whole_out.view({u.batch, total, u.hj, u.d}), lse.view({u.batch, u.hj, total}), whole_qkv,
                       whole_qkv, whole_qkv, sinks.defined() ? sinks.flat(cp.rank() * u.hj, u.hj) : Tensor{},
                       k::AttentionSpec::packed(u.hj, u.kvj));
  const Tensor send_out = scratch.kv[0].flat(0, u.out_numel()), recv_out = scratch.kv[1].flat(0, u.out_numel());
  blocks_and_sequence(send_out, whole_out, u.batch, u.rows, u.hj * u.d, u.p, false);
  cp.all_to_all(send_out, recv_out);
  heads_and_blocks(out, recv_out, n, heads, u.d, u.p, {{0, u.hj}}, false);
}

void ulysses_attention_backward(Comm& cp, Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t heads,
                                int64_t kv_heads, const RingScratch& scratch, Tensor dsinks, Tensor sinks) {
  const UlyssesDims u(cp, qkv, heads, kv_heads);
  LT_CHECK(dqkv.shape == qkv.shape, "ulysses attention backward: dqkv {} for qkv {}", dqkv.shape.str(),
           qkv.shape.str());
  const int64_t n = u.batch * u.rows, total = u.rows * u.p;
  const Tensor send = scratch.kv[0].flat(0, u.out_numel()), recv = scratch.kv[1].flat(0, u.out_numel());
  // The output's gradient and the output itself, as this rank's head group over the sequence.
  const Tensor whole_dout = scratch.dkv[0].flat(0, u.out_numel()), whole_out = scratch.dkv[1].flat(0, u.out_numel());
  for (auto [local, whole] : {std::pair{dout, whole_dout}, {out, whole_out}}) {
    heads_and_blocks(local, send, n, heads, u.d, u.p, {{0, u.hj}}, true);
    cp.all_to_all(send, recv);
    blocks_and_sequence(recv, whole, u.batch, u.rows, u.hj * u.d, u.p, true);
  }
  const Tensor dwhole = scratch.kv[0].flat(0, u.qkv_numel());
  const Tensor dw = dwhole.view({u.batch, total, u.width_part(), u.d}),
               whole_qkv = qkv.view({u.batch, total, u.width_part(), u.d});
  auto mine = [&](const Tensor& t) { return t.defined() ? t.flat(cp.rank() * u.hj, u.hj) : Tensor{}; };
  k::attention_backward(dw, dw, dw, mine(dsinks), whole_dout.view({u.batch, total, u.hj, u.d}), whole_qkv, whole_qkv,
                        whole_qkv, whole_out.view({u.batch, total, u.hj, u.d}), lse.view({u.batch, u.hj, total}),
                        mine(sinks), k::AttentionSpec::packed(u.hj, u.kvj));
  const Tensor send_back = scratch.kv[1].flat(0, u.qkv_numel()), recv_back = scratch.dkv[0].flat(0, u.qkv_numel());
  blocks_and_sequence(send_back, dwhole, u.batch, u.rows, u.width_part() * u.d, u.p, false);
  cp.all_to_all(send_back, recv_back);
  heads_and_blocks(dqkv, recv_back, n, u.width(), u.d, u.p, {{0, u.hj}, {heads, u.kvj}, {heads + kv_heads, u.kvj}},
                   false);
}

}  // namespace llmtrain::parallel
