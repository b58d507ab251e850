// The tensor-parallel crossings (parallel/tensor_parallel.h): identities on a one-rank group; which
// side of each conjugate pair all-reduces, and the column layout of gather/scatter along the last
// dimension, with ranks as threads on the in-process communicator.
#include <gtest/gtest.h>

#include <vector>

#include "parallel/comm_threads.h"
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

}  // namespace
}  // namespace llmtrain::parallel
