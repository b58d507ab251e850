// The tensor-parallel crossings (parallel/tensor_parallel.h): identities on a one-rank group; which
// side of each conjugate pair all-reduces, the column layout of gather/scatter along the last
// dimension, sequence parallelism's row gather/reduce-scatter, replicated gradients reduced once per
// backward, the vocab-parallel cross-entropy against the whole-vocabulary one, and the same
// crossings on bf16 and fp16 tensors, with ranks as threads on the in-process communicator.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "parallel/comm/comm_threads.h"
#include "parallel/tensor_parallel.h"

namespace llmtrain::parallel {
namespace {

using kernels::host_tensor;

TEST(TensorParallel, OneRankCrossingsAreIdentities) {
  auto tp = make_local_comm("tp");
  std::vector<float> x = {1, 2, 3, 4, 5, 6}, keep = x, other(6);
  copy_to_tp_region_forward(*tp, host_tensor(x.data(), {2, 3}));
  copy_to_tp_region_backward(*tp, host_tensor(x.data(), {2, 3}));
  reduce_from_tp_region_forward(*tp, host_tensor(x.data(), {2, 3}));
  reduce_from_tp_region_backward(*tp, host_tensor(x.data(), {2, 3}));
  EXPECT_EQ(x, keep);
  gather_from_tp_region_forward(*tp, host_tensor(x.data(), {2, 3}), host_tensor(other.data(), {2, 3}), Tensor{});
  EXPECT_EQ(other, keep);
  std::fill(other.begin(), other.end(), 0.0f);
  scatter_to_tp_region_forward(*tp, host_tensor(x.data(), {2, 3}), host_tensor(other.data(), {2, 3}));
  EXPECT_EQ(other, keep);
}

TEST(TensorParallel, ConjugatePairsReduceOnOppositeSides) {
  // Two ranks with different values: a step that all-reduces makes them equal (the sum), a step
  // that does not leaves each rank's own; once equal, a second all-reduce would double them.
  run_ranks_in_threads(2, [](Comm& tp) {
    const float r = float(tp.rank());
    std::vector<float> x = {1 + 10 * r, 2 + 10 * r};
    copy_to_tp_region_forward(tp, host_tensor(x.data(), {2}));
    EXPECT_EQ(x, (std::vector<float>{1 + 10 * r, 2 + 10 * r})) << "f forward is the identity";
    copy_to_tp_region_backward(tp, host_tensor(x.data(), {2}));
    EXPECT_EQ(x, (std::vector<float>{12, 14})) << "f backward all-reduces";
    reduce_from_tp_region_forward(tp, host_tensor(x.data(), {2}));
    EXPECT_EQ(x, (std::vector<float>{24, 28})) << "g forward all-reduces";
    reduce_from_tp_region_backward(tp, host_tensor(x.data(), {2}));
    EXPECT_EQ(x, (std::vector<float>{24, 28})) << "g backward is the identity";
  });
}

TEST(TensorParallel, GatherAndScatterAlongTheLastDimension) {
  for (int n : {2, 3}) {
    run_ranks_in_threads(n, [n](Comm& tp) {
      const int rank = tp.rank();
      // [2 rows, 3 columns] on each rank: 1..6, plus 1000 per rank.
      auto local_of = [](int r) {
        std::vector<float> v = {1, 2, 3, 4, 5, 6};
        for (float& x : v) x += 1000.0f * float(r);
        return v;
      };
      std::vector<float> local = local_of(rank);
      std::vector<float> full(size_t(6 * n)), scratch(size_t(6 * n)), back(6);
      gather_from_tp_region_forward(tp, host_tensor(local.data(), {2, 3}), host_tensor(full.data(), {2, 3 * n}),
                                    host_tensor(scratch.data(), {6 * n}));
      // Row i holds rank 0's 3 columns of row i, then rank 1's, ...
      std::vector<float> want;
      for (int row = 0; row < 2; ++row)
        for (int r = 0; r < n; ++r)
          for (int c = 0; c < 3; ++c) want.push_back(local_of(r)[size_t(row * 3 + c)]);
      EXPECT_EQ(full, want) << "rank " << rank << " of " << n;
      // The backward of the gather (and the forward of the scatter) keeps this rank's columns.
      gather_from_tp_region_backward(tp, host_tensor(full.data(), {2, 3 * n}), host_tensor(back.data(), {2, 3}));
      EXPECT_EQ(back, local) << "rank " << rank << " of " << n;
      // The backward of the scatter gathers them again.
      std::fill(full.begin(), full.end(), 0.0f);
      scatter_to_tp_region_backward(tp, host_tensor(back.data(), {2, 3}), host_tensor(full.data(), {2, 3 * n}),
                                    host_tensor(scratch.data(), {6 * n}));
      EXPECT_EQ(full, want) << "rank " << rank << " of " << n;
    });
  }
}

// Sequence parallelism along rows: the gather concatenates every rank's rows in rank order and its
// backward reduce-scatters (sums, keeps own rows); the reduce-scatter is the gather's conjugate.
TEST(TensorParallel, SequenceParallelGatherAndReduceScatterAlongRows) {
  run_ranks_in_threads(2, [](Comm& tp) {
    const float r = float(tp.rank());
    std::vector<float> local = {1 + 10 * r, 2 + 10 * r, 3 + 10 * r, 4 + 10 * r}, full(8), back(4);
    gather_from_sequence_parallel_region_forward(tp, host_tensor(local.data(), {2, 2}),
                                                 host_tensor(full.data(), {4, 2}));
    EXPECT_EQ(full, (std::vector<float>{1, 2, 3, 4, 11, 12, 13, 14}));
    gather_from_sequence_parallel_region_backward(tp, host_tensor(full.data(), {4, 2}),
                                                  host_tensor(back.data(), {2, 2}));
    EXPECT_EQ(back, (std::vector<float>{2 + 20 * r, 4 + 20 * r, 6 + 20 * r, 8 + 20 * r})) << "summed, own rows";
    std::vector<float> partial = {1, 2, 3, 4, 5, 6, 7, 8};
    for (float& x : partial) x += r;
    reduce_scatter_to_sequence_parallel_region_forward(tp, host_tensor(partial.data(), {4, 2}),
                                                       host_tensor(back.data(), {2, 2}));
    EXPECT_EQ(back, r == 0 ? (std::vector<float>{3, 5, 7, 9}) : (std::vector<float>{11, 13, 15, 17}));
    reduce_scatter_to_sequence_parallel_region_backward(tp, host_tensor(back.data(), {2, 2}),
                                                        host_tensor(full.data(), {4, 2}));
    EXPECT_EQ(full, (std::vector<float>{3, 5, 7, 9, 11, 13, 15, 17}));
  });
}

// A replicated parameter's gradient accumulates over micro-batches: only each backward's increment
// is summed over the group, so a second micro-batch does not count the first one twice (one
// tensor in place, several packed; undefined ones skipped).
TEST(TensorParallel, ReplicatedGradsReduceOnlyThisBackwardsIncrement) {
  run_ranks_in_threads(2, [](Comm& tp) {
    const float r = float(tp.rank());
    std::vector<float> a = {0, 0}, b = {0}, saved(6);
    const std::array<Tensor, 3> grads = {host_tensor(a.data(), {2}), Tensor{}, host_tensor(b.data(), {1})};
    const std::array<Tensor, 1> one = {host_tensor(a.data(), {2})};
    for (int micro = 0; micro < 2; ++micro) {
      replicated_grads_begin(tp, grads, host_tensor(saved.data(), {6}));
      a[0] += 1 + r, a[1] += 10 * (1 + r), b[0] += 100 * (1 + r);  // this rank's part: 1 or 2 times
      replicated_grads_end(tp, grads, host_tensor(saved.data(), {6}));
    }
    EXPECT_EQ(a, (std::vector<float>{6, 60}));
    EXPECT_EQ(b, (std::vector<float>{600}));
    replicated_grads_begin(tp, one, host_tensor(saved.data(), {6}));
    a[0] += 1, a[1] += 1;
    replicated_grads_end(tp, one, host_tensor(saved.data(), {6}));
    EXPECT_EQ(a, (std::vector<float>{8, 62}));
  });
}

// Logits [6 rows, 16 padded columns] of a vocabulary of 13, split over 2 and 4 ranks (rank 3 of 4
// holds only padding): every rank's losses and lse equal the unsplit kernel's, and each rank's
// gradient is its columns of the unsplit gradient; ignored rows, padding and a non-finite logit
// behave as unsplit.
TEST(TensorParallel, VocabParallelCrossEntropyMatchesTheWholeVocabulary) {
  constexpr int64_t rows = 6, vp = 16, vocab = 13;
  std::mt19937 rng(4);
  std::normal_distribution<float> z(0.0f, 3.0f);
  std::vector<float> logits(rows * vp);
  for (float& x : logits) x = z(rng);
  std::vector<int32_t> targets = {0, 12, -100, 5, 8, 3};
  for (bool nonfinite : {false, true}) {
    std::vector<float> x = logits;
    if (nonfinite) x[3 * vp + 9] = INFINITY;
    std::vector<float> want_loss(rows), want_lse(rows), want_grad(rows * vp), mean(1);
    std::vector<int32_t> count(1);
    const Tensor t = host_tensor(targets.data(), {rows});
    kernels::cross_entropy_forward(host_tensor(want_loss.data(), {rows}), host_tensor(want_lse.data(), {rows}),
                                   host_tensor(x.data(), {rows, vp}), t, vocab, -100);
    kernels::loss_mean_forward(host_tensor(mean.data(), {1}), host_tensor(count.data(), {1}),
                               host_tensor(want_loss.data(), {rows}), t, -100);
    kernels::cross_entropy_backward(host_tensor(want_grad.data(), {rows, vp}), host_tensor(x.data(), {rows, vp}),
                                    host_tensor(want_lse.data(), {rows}), t, vocab, -100, 0.5f,
                                    host_tensor(count.data(), {1}));
    for (int n : {2, 4}) {
      run_ranks_in_threads(n, [&](Comm& tp) {
        const int64_t vl = vp / n, begin = tp.rank() * vl;
        std::vector<float> local(rows * vl), loss(rows), lse(rows), grad(rows * vl), scratch(3 * rows);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < vl; ++j) local[size_t(i * vl + j)] = x[size_t(i * vp + begin + j)];
        const Tensor lt = host_tensor(local.data(), {rows, vl});
        vocab_parallel_cross_entropy_forward(tp, host_tensor(loss.data(), {rows}), host_tensor(lse.data(), {rows}), lt,
                                             t, vocab, -100, host_tensor(scratch.data(), {3 * rows}));
        vocab_parallel_cross_entropy_backward(tp, host_tensor(grad.data(), {rows, vl}), lt,
                                              host_tensor(lse.data(), {rows}), t, vocab, -100, 0.5f,
                                              host_tensor(count.data(), {1}));
        for (int64_t i = 0; i < rows; ++i) {
          SCOPED_TRACE(::testing::Message() << "tp " << n << " rank " << tp.rank() << " row " << i);
          if (nonfinite && i == 3) {
            EXPECT_TRUE(std::isnan(loss[size_t(i)])) << "a non-finite logit makes the loss NaN";
            continue;
          }
          EXPECT_NEAR(loss[size_t(i)], want_loss[size_t(i)], 1e-5 * std::abs(want_loss[size_t(i)]) + 1e-6);
          EXPECT_NEAR(lse[size_t(i)], want_lse[size_t(i)], 1e-5 * std::abs(want_lse[size_t(i)]));
          for (int64_t j = 0; j < vl; ++j)
            EXPECT_NEAR(grad[size_t(i * vl + j)], want_grad[size_t(i * vp + begin + j)], 1e-6)
                << "column " << begin + j;
        }
      });
    }
  }
}

// 16-bit storage: the crossings move bf16 and fp16 tensors in their dtype (a 16-bit reduction sums
// in fp32 and rounds once), the replicated gradients save and reduce in the gradients' dtype, and
// the vocab-parallel cross-entropy over 16-bit logits gives exactly what the fp32 one gives on the
// same (widened) logits, its gradient rounded once: the kernels widen the logits exactly, and the
// row maxima and sums cross in fp32.
TEST(TensorParallel, SixteenBitCrossings) {
  using kernels::DType;
  for (const DType dtype : {DType::bf16, DType::fp16}) {
    SCOPED_TRACE(kernels::to_string(dtype));
    auto narrow = [dtype](const std::vector<float>& v) {
      std::vector<uint16_t> out(v.size());
      kernels::convert(Tensor(out.data(), dtype, {int64_t(v.size())}),
                       host_tensor(const_cast<float*>(v.data()), {int64_t(v.size())}));
      return out;
    };
    auto wide = [dtype](std::vector<uint16_t>& v) {
      std::vector<float> out(v.size());
      kernels::convert(host_tensor(out.data(), {int64_t(v.size())}), Tensor(v.data(), dtype, {int64_t(v.size())}));
      return out;
    };
    run_ranks_in_threads(2, [&](Comm& tp) {
      const float r = float(tp.rank());
      auto t = [dtype](std::vector<uint16_t>& v, kernels::Shape s) { return Tensor(v.data(), dtype, s); };
      // 1 + 1/128 is a bf16 and an fp16; so are the sums below.
      std::vector<uint16_t> local = narrow({1 + r, 1.0078125f, 3, 4 + r}), full(8), back(4);
      gather_from_sequence_parallel_region_forward(tp, t(local, {2, 2}), t(full, {4, 2}));
      EXPECT_EQ(wide(full), (std::vector<float>{1, 1.0078125f, 3, 4, 2, 1.0078125f, 3, 5}));
      gather_from_sequence_parallel_region_backward(tp, t(full, {4, 2}), t(back, {2, 2}));
      EXPECT_EQ(wide(back),
                r == 0 ? (std::vector<float>{2, 2.015625f, 6, 8}) : (std::vector<float>{4, 2.015625f, 6, 10}));
      // Along the last dimension, through a 16-bit scratch: row i is rank 0's columns, then rank 1's.
      std::vector<uint16_t> columns(8), scratch(8);
      gather_from_tp_region_forward(tp, t(local, {2, 2}), t(columns, {2, 4}), t(scratch, {8}));
      EXPECT_EQ(wide(columns), (std::vector<float>{1, 1.0078125f, 2, 1.0078125f, 3, 4, 3, 5}));
      copy_to_tp_region_backward(tp, t(local, {4}));
      EXPECT_EQ(wide(local), (std::vector<float>{3, 2.015625f, 6, 9}));
      // Replicated gradients: only this backward's increment is summed.
      std::vector<uint16_t> g = narrow({0.5f, 1}), saved(4);
      const std::array<Tensor, 1> one = {t(g, {2})};
      replicated_grads_begin(tp, one, t(saved, {4}));
      std::vector<float> inc = wide(g);
      inc[0] += 1 + r, inc[1] += 2 * (1 + r);
      const std::vector<uint16_t> added = narrow(inc);
      std::copy(added.begin(), added.end(), g.begin());  // in place: `one` views g's memory
      replicated_grads_end(tp, one, t(saved, {4}));
      EXPECT_EQ(wide(g), (std::vector<float>{3.5f, 7}));
    });
    // Vocab-parallel cross-entropy: 4 rows, 8 padded columns of a vocabulary of 7, over 2 ranks.
    constexpr int64_t rows = 4, vp = 8, vocab = 7;
    std::mt19937 rng(9);
    std::normal_distribution<float> z(0.0f, 2.0f);
    std::vector<float> logits(rows * vp);
    for (float& x : logits) x = z(rng);
    std::vector<uint16_t> half = narrow(logits);
    logits = wide(half);  // the values the 16-bit logits hold
    std::vector<int32_t> targets = {0, 6, -100, 3}, count = {3};
    run_ranks_in_threads(2, [&](Comm& tp) {
      const int64_t vl = vp / 2, begin = tp.rank() * vl;
      std::vector<float> local(rows * vl);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < vl; ++j) local[size_t(i * vl + j)] = logits[size_t(i * vp + begin + j)];
      std::vector<uint16_t> local16 = narrow(local), grad16(local.size());
      std::vector<float> loss(rows), lse(rows), grad(local.size()), scratch(3 * rows);
      std::vector<float> loss16(rows), lse16(rows);
      const Tensor tt = host_tensor(targets.data(), {rows}), ct = host_tensor(count.data(), {1});
      vocab_parallel_cross_entropy_forward(tp, host_tensor(loss.data(), {rows}), host_tensor(lse.data(), {rows}),
                                           host_tensor(local.data(), {rows, vl}), tt, vocab, -100,
                                           host_tensor(scratch.data(), {3 * rows}));
      vocab_parallel_cross_entropy_backward(tp, host_tensor(grad.data(), {rows, vl}),
                                            host_tensor(local.data(), {rows, vl}), host_tensor(lse.data(), {rows}), tt,
                                            vocab, -100, 0.5f, ct);
      const Tensor l16(local16.data(), dtype, {rows, vl});
      vocab_parallel_cross_entropy_forward(tp, host_tensor(loss16.data(), {rows}), host_tensor(lse16.data(), {rows}),
                                           l16, tt, vocab, -100, host_tensor(scratch.data(), {3 * rows}));
      vocab_parallel_cross_entropy_backward(tp, Tensor(grad16.data(), dtype, {rows, vl}), l16,
                                            host_tensor(lse16.data(), {rows}), tt, vocab, -100, 0.5f, ct);
      // The same fp32 arithmetic (up to the order a vectorised sum takes on other addresses), and the
      // gradient rounded once: within half the 16-bit spacing.
      const double roundoff = dtype == DType::bf16 ? 0x1p-8 : 0x1p-11;  // half the spacing, relative
      const std::vector<float> g16 = wide(grad16);
      for (int64_t i = 0; i < rows; ++i) {
        EXPECT_NEAR(loss16[size_t(i)], loss[size_t(i)], 1e-6 * std::abs(loss[size_t(i)]));
        EXPECT_NEAR(lse16[size_t(i)], lse[size_t(i)], 1e-6 * std::abs(lse[size_t(i)]));
      }
      for (size_t i = 0; i < grad.size(); ++i)
        EXPECT_NEAR(g16[i], grad[i], roundoff * std::abs(grad[i]) + 1e-7) << "element " << i;
    });
  }
}

}  // namespace
}  // namespace llmtrain::parallel
