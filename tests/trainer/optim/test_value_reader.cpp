// ValueReader (trainer/optim/value_reader.h), the gradient sync's OwnedValues over the offload
// store: a unit announced ahead is read on the reader's own thread and taken from there; a take of
// another unit reads at once; drop() forgets what was read before the values change; a failed read
// is rethrown on the caller's thread. (The sync's side of it: tests/parallel/test_grad_sync.cpp.)
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/error.h"
#include "trainer/optim/value_reader.h"

namespace llmtrain::trainer {
namespace {

struct Store {
  std::mutex mu;
  std::vector<float> values;
  std::atomic<int> reads{0}, reads_elsewhere{0};
  std::thread::id caller = std::this_thread::get_id();
  bool fail = false;
  void read(int64_t begin, kernels::Tensor host) {
    std::lock_guard lock(mu);
    if (fail) throw std::runtime_error("EIO from the disk");
    std::copy_n(values.begin() + begin, host.numel(), host.ptr<float>());
    ++reads;
    reads_elsewhere += std::this_thread::get_id() != caller;
  }
};

std::vector<float> take(ValueReader& r, int unit, int64_t begin, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  r.take(unit, begin, kernels::host_tensor(out.data(), {n}));
  return out;
}

TEST(ValueReader, ReadsAheadOnItsThreadAndForgetsBeforeAnUpdate) {
  Store s;
  s.values = {0, 1, 2, 3, 4, 5, 6, 7};
  ValueReader r([&](int64_t b, kernels::Tensor h) { s.read(b, h); }, 4, 10.0);
  r.ahead(1, 4, 4);
  EXPECT_EQ(take(r, 1, 4, 4), (std::vector<float>{4, 5, 6, 7}));
  EXPECT_EQ(s.reads_elsewhere.load(), 1) << "the announced unit was not read on the reader's thread";
  // Announced one unit, asked for another: read at once, on the caller's thread.
  r.ahead(1, 4, 4);
  EXPECT_EQ(take(r, 0, 0, 4), (std::vector<float>{0, 1, 2, 3}));
  // The values change after a drop: nothing read before is taken after.
  r.ahead(0, 0, 4);
  r.drop();
  {
    std::lock_guard lock(s.mu);
    for (float& v : s.values) v = -v;
  }
  EXPECT_EQ(take(r, 0, 0, 4), (std::vector<float>{0, -1, -2, -3}));
}

TEST(ValueReader, AFailedReadAheadIsRethrownByTheNextTake) {
  Store s;
  s.values = {0, 1, 2, 3};
  s.fail = true;
  ValueReader r([&](int64_t b, kernels::Tensor h) { s.read(b, h); }, 4, 10.0);
  r.ahead(0, 0, 4);
  std::vector<float> out(4);
  EXPECT_THROW(r.take(0, 0, kernels::host_tensor(out.data(), {4})), std::runtime_error);
}

}  // namespace
}  // namespace llmtrain::trainer
