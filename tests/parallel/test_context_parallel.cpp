// Context parallelism (parallel/context_parallel.h): the chunk split (rank i holds chunks i and
// 2·cp − 1 − i), and ring and Ulysses attention on thread ranks against the plain causal attention over the
// whole sequence — outputs, and the q, k and v gradients each rank gets for its rows — at cp 1, 2
// and 4, with multi-head and grouped-query heads, two samples per micro-batch.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "parallel/comm/comm_threads.h"
#include "parallel/context_parallel.h"

namespace llmtrain::parallel {
namespace {

using kernels::host_tensor;

TEST(ContextParallel, RankHoldsChunksIAndMirror) {
  EXPECT_EQ(cp_chunk(0, 0, 4), 0);
  EXPECT_EQ(cp_chunk(0, 1, 4), 7);
  EXPECT_EQ(cp_chunk(1, 1, 4), 6);
  EXPECT_EQ(cp_chunk(3, 0, 4), 3);
  EXPECT_EQ(cp_chunk(3, 1, 4), 4);
  // Two sequences of 16 tokens at cp 4: chunks of 2.
  std::vector<int32_t> in(32);
  for (int i = 0; i < 32; ++i) in[size_t(i)] = i;
  std::vector<int32_t> out(8);
  cp_take_rows(in.data(), out.data(), 2, 16, 4, 1);
  EXPECT_EQ(out, (std::vector<int32_t>{2, 3, 12, 13, 18, 19, 28, 29}));
  // Every token is on exactly one rank.
  std::vector<int> seen(32, 0);
  for (int r = 0; r < 4; ++r) {
    cp_take_rows(in.data(), out.data(), 2, 16, 4, r);
    for (int32_t v : out) ++seen[size_t(v)];
  }
  for (int s : seen) EXPECT_EQ(s, 1);
}

struct Shape {
  int b, t, heads, kv_heads, d;
};

// ‖a − b‖ / ‖b‖.
double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * double(a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / std::max(den, 1e-30));
}

// This rank's rows of a [B, T, w] tensor: chunks cp_chunk(rank, 0) and (rank, 1) of every sample.
std::vector<float> rows_of(const std::vector<float>& all, const Shape& s, int w, int cp, int rank) {
  const int t = s.t / cp, c = t / 2;
  std::vector<float> out(size_t(s.b) * t * w);
  for (int b = 0; b < s.b; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < c; ++i)
        for (int j = 0; j < w; ++j)
          out[(size_t(b) * t + size_t(h) * c + i) * w + j] =
              all[(size_t(b) * s.t + size_t(cp_chunk(rank, h, cp)) * c + i) * w + j];
  return out;
}

void check_against_whole(const Shape& s, int cp, bool ulysses) {
  const int w = (s.heads + 2 * s.kv_heads) * s.d, wo = s.heads * s.d;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> qkv(size_t(s.b) * s.t * w), dout(size_t(s.b) * s.t * wo);
  for (float& v : qkv) v = dist(rng);
  for (float& v : dout) v = dist(rng);
  // The reference: causal attention over each whole sequence.
  std::vector<float> out(dout.size()), lse(size_t(s.b) * s.heads * s.t), dqkv(qkv.size());
  kernels::attention_forward(host_tensor(out.data(), {s.b, s.t, s.heads, s.d}),
                             host_tensor(lse.data(), {s.b, s.heads, s.t}),
                             host_tensor(qkv.data(), {s.b, s.t, s.heads + 2 * s.kv_heads, s.d}), s.heads, s.kv_heads);
  kernels::attention_backward(host_tensor(dqkv.data(), {s.b, s.t, s.heads + 2 * s.kv_heads, s.d}),
                              host_tensor(dout.data(), {s.b, s.t, s.heads, s.d}),
                              host_tensor(qkv.data(), {s.b, s.t, s.heads + 2 * s.kv_heads, s.d}),
                              host_tensor(out.data(), {s.b, s.t, s.heads, s.d}),
                              host_tensor(lse.data(), {s.b, s.heads, s.t}), s.heads, s.kv_heads);

  run_ranks_in_threads(cp, [&](Comm& group) {
    const int r = group.rank(), t = s.t / cp;
    std::vector<float> my_qkv = rows_of(qkv, s, w, cp, r), my_dout = rows_of(dout, s, wo, cp, r);
    std::vector<float> my_out(my_dout.size()), my_lse(size_t(s.b) * s.heads * t), my_dqkv(my_qkv.size());
    const RingScratchSizes z = ring_scratch_sizes(s.b, t, s.heads, s.kv_heads, s.d);
    std::vector<float> kv0(size_t(z.kv)), kv1(size_t(z.kv)), dkv0(size_t(z.kv)), dkv1(size_t(z.kv));
    std::vector<float> po(size_t(z.part_out)), pl(size_t(z.part_lse)), dq(size_t(z.block)), dkv(size_t(z.block));
    RingScratch scratch;
    scratch.kv[0] = host_tensor(kv0.data(), {z.kv});
    scratch.kv[1] = host_tensor(kv1.data(), {z.kv});
    scratch.dkv[0] = host_tensor(dkv0.data(), {z.kv});
    scratch.dkv[1] = host_tensor(dkv1.data(), {z.kv});
    scratch.part_out = host_tensor(po.data(), {z.part_out});
    scratch.part_lse = host_tensor(pl.data(), {z.part_lse});
    scratch.dq_block = host_tensor(dq.data(), {z.block});
    scratch.dkv_block = host_tensor(dkv.data(), {z.block});
    const Tensor q4 = host_tensor(my_qkv.data(), {s.b, t, s.heads + 2 * s.kv_heads, s.d});
    const Tensor o = host_tensor(my_out.data(), {s.b * t, wo});
    const Tensor l = host_tensor(my_lse.data(), {int64_t(my_lse.size())});
    if (ulysses)
      ulysses_attention_forward(group, o, l, q4, s.heads, s.kv_heads, scratch);
    else
      ring_attention_forward(group, o, l, q4, s.heads, s.kv_heads, scratch);
    EXPECT_LE(rel(my_out, rows_of(out, s, wo, cp, r)), 1e-6)
        << "output, rank " << r << " of cp " << cp << (ulysses ? " (ulysses)" : "");
    const Tensor dq4 = host_tensor(my_dqkv.data(), {s.b, t, s.heads + 2 * s.kv_heads, s.d});
    const Tensor d = host_tensor(my_dout.data(), {s.b * t, wo});
    if (ulysses)
      ulysses_attention_backward(group, dq4, d, q4, o, l, s.heads, s.kv_heads, scratch);
    else
      ring_attention_backward(group, dq4, d, q4, o, l, s.heads, s.kv_heads, scratch);
    const std::vector<float> want = rows_of(dqkv, s, w, cp, r);
    // q, k and v gradients separately (each head group's norm).
    for (auto [first, count, what] :
         {std::tuple{0, s.heads, "dq"}, {s.heads, s.kv_heads, "dk"}, {s.heads + s.kv_heads, s.kv_heads, "dv"}}) {
      std::vector<float> got_part, want_part;
      for (size_t row = 0; row < my_dqkv.size() / size_t(w); ++row)
        for (int j = first * s.d; j < (first + count) * s.d; ++j) {
          got_part.push_back(my_dqkv[row * size_t(w) + size_t(j)]);
          want_part.push_back(want[row * size_t(w) + size_t(j)]);
        }
      EXPECT_LE(rel(got_part, want_part), 1e-5)
          << what << ", rank " << r << " of cp " << cp << (ulysses ? " (ulysses)" : "");
    }
  });
}

TEST(ContextParallel, RingAttentionMatchesWholeSequenceAttention) {
  for (int cp : {1, 2, 4}) {
    check_against_whole({2, 32, 2, 2, 8}, cp, false);  // multi-head
    check_against_whole({2, 32, 4, 2, 4}, cp, false);  // grouped-query: two query heads per kv head
  }
}

// Ulysses: every rank attends over the whole sequence for heads / cp of the heads.
TEST(ContextParallel, UlyssesAttentionMatchesWholeSequenceAttention) {
  for (int cp : {1, 2}) {
    check_against_whole({2, 32, 2, 2, 8}, cp, true);
    check_against_whole({2, 32, 4, 2, 4}, cp, true);
  }
  check_against_whole({2, 32, 8, 4, 4}, 4, true);  // cp 4: 2 query and 1 key/value head per rank
}

}  // namespace
}  // namespace llmtrain::parallel
