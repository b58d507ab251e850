// Tensor parallelism inside the model, checked in one process: two threads each hold a tp = 2
// shard and talk through a small in-process communicator; their loss must equal the unsharded
// model's, and every gradient shard must equal its slice of the unsharded gradient (replicated
// parameters: the whole gradient on every rank). This pins the placement of every crossing
// (vocab-parallel embedding, column/row-parallel linears, biases after the all-reduce, gathered
// logits). The MPI/NCCL communicators and multi-process runs are tested with the parallel code.
#include <gtest/gtest.h>
#include <omp.h>

#include <barrier>
#include <cmath>
#include <random>
#include <thread>

#include "parallel/comm.h"
#include "trainer/model/model.h"

namespace llmtrain::trainer {
namespace {

using parallel::ReduceOp;
using parallel::WorkHandle;

// Collectives over threads of one process (sum all-reduce and all-gather are all the model uses).
struct ThreadGroup {
  explicit ThreadGroup(int n) : size(n), barrier(n), ptrs(size_t(n)) {}
  int size;
  std::barrier<> barrier;
  std::vector<const void*> ptrs;
};

class ThreadComm final : public parallel::Comm {
 public:
  ThreadComm(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size; }
  const std::string& name() const override { return name_; }
  void all_reduce(kernels::Tensor buf, ReduceOp op) override {
    EXPECT_EQ(op, ReduceOp::sum);
    float* p = buf.ptr<float>();
    g_.ptrs[size_t(rank_)] = p;
    g_.barrier.arrive_and_wait();
    std::vector<float> sum(size_t(buf.numel()), 0.0f);
    for (int r = 0; r < g_.size; ++r)  // every rank adds in rank order: identical results
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += static_cast<const float*>(g_.ptrs[size_t(r)])[i];
    g_.barrier.arrive_and_wait();
    std::copy(sum.begin(), sum.end(), p);
  }
  void all_gather(kernels::Tensor in, kernels::Tensor out) override {
    g_.ptrs[size_t(rank_)] = in.data;
    g_.barrier.arrive_and_wait();
    for (int r = 0; r < g_.size; ++r)
      std::copy_n(static_cast<const float*>(g_.ptrs[size_t(r)]), in.numel(), out.ptr<float>() + r * in.numel());
    g_.barrier.arrive_and_wait();
  }
  void reduce_scatter(kernels::Tensor, kernels::Tensor, ReduceOp) override { unused(); }
  void broadcast(kernels::Tensor, int) override { unused(); }
  void send(kernels::Tensor, int, int) override { unused(); }
  void recv(kernels::Tensor, int, int) override { unused(); }
  void all_to_all(kernels::Tensor, kernels::Tensor) override { unused(); }
  void barrier() override { g_.barrier.arrive_and_wait(); }
  WorkHandle all_reduce_async(kernels::Tensor, ReduceOp) override { unused(); }
  WorkHandle reduce_scatter_async(kernels::Tensor, kernels::Tensor, ReduceOp) override { unused(); }
  WorkHandle all_gather_async(kernels::Tensor, kernels::Tensor) override { unused(); }
  WorkHandle send_async(kernels::Tensor, int, int) override { unused(); }
  WorkHandle recv_async(kernels::Tensor, int, int) override { unused(); }
  void set_timeout(double) override {}
  double timeout() const override { return 0; }
  void progress() override {}
  std::unique_ptr<Comm> split(int, int, std::string) override { unused(); }
  WorkHandle broadcast_async(kernels::Tensor, int) override { unused(); }
  WorkHandle all_to_all_async(kernels::Tensor, kernels::Tensor) override { unused(); }
  WorkHandle barrier_async() override { unused(); }

 private:
  [[noreturn]] static void unused() { std::abort(); }
  ThreadGroup& g_;
  int rank_;
  std::string name_ = "tp";
};

double rel_diff(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Case {
  ModelFamily family;
  bool tied;
};

class ModelTensorParallel : public ::testing::TestWithParam<Case> {};

TEST_P(ModelTensorParallel, TwoShardsMatchTheWholeModel) {
  ModelConfig m;
  m.family = GetParam().family;
  m.layers = 2, m.hidden = 32, m.heads = 4, m.kv_heads = m.family == ModelFamily::llama ? 2 : 4;
  m.ffn_hidden = 64, m.vocab = 60, m.vocab_pad = 32, m.seq_len = 9, m.max_positions = 12, m.init_std = 0.2;
  m.tie_embeddings = GetParam().tied;
  const int b = 2;
  std::vector<int32_t> tokens, targets;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0, m.vocab - 1);
  for (int i = 0; i < b * m.seq_len; ++i) {
    tokens.push_back(tok(rng));
    targets.push_back(tok(rng));
  }
  const MicroBatch mb{kernels::host_tensor(tokens.data(), {b, m.seq_len}),
                      kernels::host_tensor(targets.data(), {b, m.seq_len})};

  auto one = parallel::make_local_comm("tp");
  Model whole(m, ModelOptions{.micro_batch = b}, *one);
  whole.init_parameters(17);
  const float want = whole.forward_backward(mb, 1.0f);

  ThreadGroup group(2);
  float losses[2] = {0, 0};
  std::vector<std::string> failures[2];
  auto rank_main = [&](int rank) {
    omp_set_num_threads(1);
    ThreadComm comm(group, rank);
    Model shard(m, ModelOptions{.micro_batch = b}, comm);
    shard.init_parameters(17);
    losses[rank] = shard.forward_backward(mb, 1.0f);
    for (const ModelParam& p : shard.parameters()) {
      const ModelParam& w = whole.parameter(p.spec.name);
      std::vector<float> slice(size_t(p.numel()));
      for_each_shard_run(
          p, [&](int64_t l, int64_t g, int64_t n) { std::copy_n(w.grad.ptr<float>() + g, n, slice.data() + l); });
      const double err = rel_diff(p.grad.ptr<float>(), slice.data(), p.numel());
      if (!(err <= 2e-6)) failures[rank].push_back(p.spec.name + " gradient differs by " + std::to_string(err));
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(losses[r], want, 1e-6 * std::abs(want)) << "rank " << r;
    for (const std::string& f : failures[r]) ADD_FAILURE() << "rank " << r << ": " << f;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ModelTensorParallel,
                         ::testing::Values(Case{ModelFamily::gpt2, true}, Case{ModelFamily::gpt2, false},
                                           Case{ModelFamily::llama, false}, Case{ModelFamily::llama, true}),
                         [](const auto& info) {
                           return std::string(to_string(info.param.family)) + (info.param.tied ? "_tied" : "_untied");
                         });

}  // namespace
}  // namespace llmtrain::trainer
