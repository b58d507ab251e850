// The optimizer state's store (trainer/optim/offload.h) with nvme, on real files: what for_each_unit
// leaves is what read() returns and the reverse, across unit edges and for every array, with the
// bytes counted; nothing is left in the directory; an I/O error and a disk without room are errors
// naming the file or the directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include "common/error.h"
#include "kernels/ops.h"
#include "trainer/optim/offload.h"

namespace llmtrain::trainer {
namespace {

namespace fs = std::filesystem;

class OffloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("offload_" + std::to_string(getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  OffloadConfig config() const {
    return {.kind = OffloadKind::nvme, .dir = (dir_ / "state").string(), .rank = 3, .timeout_s = 60};
  }
  fs::path dir_;
};

TEST_F(OffloadTest, UnitsAndRandomAccessSeeTheSameState) {
  const int64_t numel = 20000;  // units of 3072: 7 units, the last partial
  OffloadStore store(config(), 3, numel);
  EXPECT_EQ(store.unit(), offload_unit(numel));
  EXPECT_EQ(store.unit() % 1024, 0);
  ASSERT_GT(store.units(), 2);
  EXPECT_EQ(store.units(), (numel + store.unit() - 1) / store.unit());
  EXPECT_TRUE(fs::is_empty(dir_ / "state")) << "the file is unlinked once open";
  EXPECT_NE(store.where().find("llmtrain-offload-rank3-pid"), std::string::npos) << store.where();

  // Zero at first; every unit sets element i of array a to a·1e5 + i.
  std::vector<int64_t> seen;
  store.for_each_unit(
      [&](int64_t u, int64_t begin, int64_t count, std::span<const kernels::Tensor> st) {
        seen.push_back(u);
        ASSERT_EQ(st.size(), 3u);
        EXPECT_EQ(begin, u * store.unit());
        for (int a = 0; a < 3; ++a) {
          ASSERT_EQ(st[size_t(a)].numel(), count);
          float* p = st[size_t(a)].ptr<float>();
          for (int64_t i = 0; i < count; ++i) {
            EXPECT_EQ(p[i], 0.0f);
            p[i] = float(a * 100000 + begin + i);
          }
        }
      },
      /*write_back=*/true);
  std::vector<int64_t> want(size_t(store.units()));
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(seen, want);

  // Read back across unit edges, then overwrite a stretch and see it in the units.
  for (int a = 0; a < 3; ++a) {
    std::vector<float> got(5000);
    store.read(a, 2000, kernels::host_tensor(got.data(), {5000}));
    for (int64_t i = 0; i < 5000; ++i) ASSERT_EQ(got[size_t(i)], float(a * 100000 + 2000 + i)) << a << " " << i;
  }
  std::vector<float> patch(4000, -1.0f);
  store.write(1, numel - 4000, kernels::host_tensor(patch.data(), {4000}));
  store.for_each_unit(
      [&](int64_t, int64_t begin, int64_t count, std::span<const kernels::Tensor> st) {
        for (int a = 0; a < 3; ++a)
          for (int64_t i = 0; i < count; ++i) {
            const int64_t at = begin + i;
            const float want_value = a == 1 && at >= numel - 4000 ? -1.0f : float(a * 100000 + at);
            ASSERT_EQ(st[size_t(a)].ptr<float>()[i], want_value) << a << " " << at;
          }
      },
      /*write_back=*/false);
  const OffloadStore::Stats io = store.stats();
  EXPECT_EQ(io.read_bytes, 2 * store.units() * 3 * store.unit() * 4);
  EXPECT_EQ(io.written_bytes, store.units() * 3 * store.unit() * 4);
}

TEST_F(OffloadTest, AnIoErrorNamesTheFile) {
  OffloadStore store(config(), 2, 10000);
  store.inject_write_error();
  try {
    store.for_each_unit([](int64_t, int64_t, int64_t, std::span<const kernels::Tensor>) {}, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(store.where()), std::string::npos) << what;
    EXPECT_NE(what.find("writing unit 0"), std::string::npos) << what;
    EXPECT_NE(what.find("Input/output error"), std::string::npos) << what;
    EXPECT_EQ(e.kind(), Error::Kind::environment);
    EXPECT_NE(e.hint().find("last checkpoint"), std::string::npos) << e.hint();
  }
}

TEST_F(OffloadTest, ADiskWithoutRoomIsRefusedAtOnce) {
  // 2^40 elements of two arrays: 8 TiB, more than any test machine's disk.
  try {
    OffloadStore store(config(), 2, int64_t(1) << 40);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("parallel.offload_path " + (dir_ / "state").string()), std::string::npos) << what;
    EXPECT_NE(what.find("rank 3's optimizer state needs 8.0 TiB"), std::string::npos) << what;
  }
  EXPECT_TRUE(fs::is_empty(dir_ / "state"));
}

}  // namespace
}  // namespace llmtrain::trainer
