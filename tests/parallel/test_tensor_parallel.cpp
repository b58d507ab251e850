// The tensor-parallel crossings (parallel/tensor_parallel.h): identities on a one-rank group, and
// the column layout of gather/scatter along the last dimension with a scripted two-rank group.
#include <gtest/gtest.h>

#include <vector>

#include "parallel/tensor_parallel.h"

namespace llmtrain::parallel {
namespace {

using kernels::host_tensor;

// Rank `rank` of two; the peer's contribution to a gather is the caller's data plus 1000, and an
// all-reduce adds the peer's copy (equal to ours) — enough to check layouts and call pairing.
class ScriptedPair final : public Comm {
 public:
  explicit ScriptedPair(int rank) : rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  const std::string& name() const override { return name_; }
  void all_reduce(Tensor buf, ReduceOp) override {
    ++all_reduces;
    float* p = buf.ptr<float>();
    for (int64_t i = 0; i < buf.numel(); ++i) p[i] *= 2;
  }
  void all_gather(Tensor in, Tensor out) override {
    const float* a = in.ptr<float>();
    float* o = out.ptr<float>();
    for (int r = 0; r < 2; ++r)
      for (int64_t i = 0; i < in.numel(); ++i) o[r * in.numel() + i] = a[i] + (r == rank_ ? 0.0f : 1000.0f);
  }
  void reduce_scatter(Tensor, Tensor, ReduceOp) override { FAIL(); }
  void broadcast(Tensor, int) override { FAIL(); }
  void send(Tensor, int, int) override { FAIL(); }
  void recv(Tensor, int, int) override { FAIL(); }
  void all_to_all(Tensor, Tensor) override { FAIL(); }
  void barrier() override {}
  WorkHandle all_reduce_async(Tensor, ReduceOp) override { return nullptr; }
  WorkHandle reduce_scatter_async(Tensor, Tensor, ReduceOp) override { return nullptr; }
  WorkHandle all_gather_async(Tensor, Tensor) override { return nullptr; }
  WorkHandle send_async(Tensor, int, int) override { return nullptr; }
  WorkHandle recv_async(Tensor, int, int) override { return nullptr; }
  void set_timeout(double) override {}
  double timeout() const override { return 0; }
  void progress() override {}
  std::unique_ptr<Comm> split(int, int, std::string) override { return nullptr; }
  WorkHandle broadcast_async(Tensor, int) override { return nullptr; }
  WorkHandle all_to_all_async(Tensor, Tensor) override { return nullptr; }
  WorkHandle barrier_async() override { return nullptr; }
  int all_reduces = 0;

 private:
  int rank_;
  std::string name_ = "tp";
};

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
  ScriptedPair tp(0);
  std::vector<float> x = {1, 2};
  copy_to_tp_region_forward(tp, host_tensor(x.data(), {2}));
  EXPECT_EQ(tp.all_reduces, 0);
  copy_to_tp_region_backward(tp, host_tensor(x.data(), {2}));
  EXPECT_EQ(tp.all_reduces, 1);
  reduce_from_tp_region_forward(tp, host_tensor(x.data(), {2}));
  EXPECT_EQ(tp.all_reduces, 2);
  reduce_from_tp_region_backward(tp, host_tensor(x.data(), {2}));
  EXPECT_EQ(tp.all_reduces, 2);
}

TEST(TensorParallel, GatherAndScatterAlongTheLastDimension) {
  for (int rank = 0; rank < 2; ++rank) {
    ScriptedPair tp(rank);
    std::vector<float> local = {1, 2, 3, 4, 5, 6};  // [2 rows, 3 columns] on this rank
    std::vector<float> full(12), scratch(12), back(6);
    gather_from_tp_region_forward(tp, host_tensor(local.data(), {2, 3}), host_tensor(full.data(), {2, 6}),
                                  host_tensor(scratch.data(), {12}));
    // Row i holds rank 0's 3 columns, then rank 1's.
    const float mine = 0, peer = 1000;
    const std::vector<float> want =
        rank == 0 ? std::vector<float>{1, 2, 3, 1 + peer, 2 + peer, 3 + peer, 4, 5, 6, 4 + peer, 5 + peer, 6 + peer}
                  : std::vector<float>{1 + peer, 2 + peer, 3 + peer, 1, 2, 3, 4 + peer, 5 + peer, 6 + peer, 4, 5, 6};
    (void)mine;
    EXPECT_EQ(full, want) << "rank " << rank;
    // The backward of the gather (and the forward of the scatter) keeps this rank's columns.
    gather_from_tp_region_backward(tp, host_tensor(full.data(), {2, 6}), host_tensor(back.data(), {2, 3}));
    EXPECT_EQ(back, local) << "rank " << rank;
  }
}

}  // namespace
}  // namespace llmtrain::parallel
