// GPT samples: every sample is a window of seq_len + 1 tokens of the documents concatenated as
// stored (nothing inserted), an epoch's windows tile its stream, each epoch visits every document
// once, the order follows the seed only, epochs extend as far as asked, blending follows the
// weights, and bad data is refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "common/error.h"
#include "trainer/data/gpt_dataset.h"

using namespace llmtrain;
using namespace llmtrain;
using namespace llmtrain::trainer;
namespace fs = std::filesystem;

namespace {

class GptDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("llmtrain_gpt_{}_{}", getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Documents whose tokens say where they come from: tag * 100000 + document * 100 + position,
  // with varied lengths (some empty, some longer than a sample).
  std::string make(const std::string& name, int tag, int docs, unsigned seed) {
    std::string prefix = (dir_ / name).string();
    IndexedDatasetWriter w(prefix, TokenDtype::int32);
    std::mt19937 rng(seed);
    for (int d = 0; d < docs; ++d) {
      int len = d % 13 == 5 ? 0 : 1 + int(rng() % (d % 9 == 0 ? 90 : 20));
      std::vector<int32_t> doc(static_cast<size_t>(len));
      for (int i = 0; i < len; ++i) doc[size_t(i)] = tag * 100000 + d * 100 + i % 100;
      w.add_document(doc);
    }
    w.close();
    w.commit();
    return prefix;
  }
  fs::path dir_;
};

// Rebuilds epoch e's stream from the documents in the dataset's order and checks every sample of
// the epoch against it.
TEST_F(GptDatasetTest, SamplesAreWindowsOfTheShuffledConcatenationAndTileEachEpoch) {
  std::string p = make("a", 1, 400, 1);
  const int seq = 16;
  GptDataset ds({{p, 1.0}}, seq, 1234);
  const IndexedDataset& data = ds.source(0);
  int64_t S = ds.samples_per_epoch(0);
  ASSERT_EQ(S, (data.num_tokens() - 1) / seq);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int32_t> stream;
    std::set<int64_t> seen_docs;
    for (int64_t k = 0; k < data.num_documents(); ++k) {
      int64_t d = ds.document_at(0, epoch, k);
      seen_docs.insert(d);
      auto doc = data.document(d);
      stream.insert(stream.end(), doc.begin(), doc.end());
    }
    ASSERT_EQ(int64_t(seen_docs.size()), data.num_documents())
        << "epoch " << epoch << " must visit every document once";
    std::set<int64_t> windows;
    for (int64_t j = epoch * S; j < (epoch + 1) * S; ++j) {
      GptSampleLocation loc = ds.locate(j);
      ASSERT_EQ(loc.epoch, epoch);
      windows.insert(loc.epoch_sample);
      std::vector<int32_t> want(stream.begin() + loc.token_offset, stream.begin() + loc.token_offset + seq + 1);
      ASSERT_EQ(ds.sample(j), want) << "sample " << j;
    }
    EXPECT_EQ(int64_t(windows.size()), S) << "the windows of an epoch are all different";
    EXPECT_EQ(*windows.begin(), 0);
    EXPECT_EQ(*windows.rbegin(), S - 1);
  }
}

TEST_F(GptDatasetTest, OrderDependsOnTheSeedOnly) {
  std::string p = make("a", 1, 300, 2);
  GptDataset a({{p, 1.0}}, 8, 7), b({{p, 1.0}}, 8, 7), c({{p, 1.0}}, 8, 8);
  int differ = 0;
  for (int64_t i = 0; i < 500; ++i) {
    ASSERT_EQ(a.sample(i), b.sample(i)) << "same seed, sample " << i;
    differ += a.sample(i) != c.sample(i);
  }
  EXPECT_GT(differ, 450) << "another seed must give another order";
  // Not the stored order: consecutive samples are not consecutive windows.
  int consecutive = 0;
  for (int64_t i = 1; i < 200; ++i) consecutive += a.locate(i).token_offset == a.locate(i - 1).token_offset + 8;
  EXPECT_LT(consecutive, 10);
  // Epochs differ from each other.
  int64_t S = a.samples_per_epoch(0);
  int same = 0;
  for (int64_t i = 0; i < 100; ++i) same += a.sample(i) == a.sample(S + i);
  EXPECT_LT(same, 10);
}

TEST_F(GptDatasetTest, FarEpochsAndRandomAccessAgreeWithSequentialAccess) {
  std::string p = make("a", 1, 50, 3);
  GptDataset seq_read({{p, 1.0}}, 8, 5), random_read({{p, 1.0}}, 8, 5);
  int64_t S = seq_read.samples_per_epoch(0);
  std::vector<std::vector<int32_t>> all;
  for (int64_t i = 0; i < 40 * S; ++i) all.push_back(seq_read.sample(i));
  std::mt19937 rng(1);
  for (int k = 0; k < 2000; ++k) {
    int64_t i = int64_t(rng() % all.size());
    ASSERT_EQ(random_read.sample(i), all[size_t(i)]) << "sample " << i;
  }
}

TEST_F(GptDatasetTest, BlendingFollowsWeightsAndKeepsEachSourceInOrder) {
  std::string a = make("a", 1, 200, 4), b = make("b", 2, 100, 5), c = make("c", 3, 80, 6);
  GptDataset ds({{a, 5.0}, {b, 3.0}, {c, 2.0}}, 8, 99);
  EXPECT_DOUBLE_EQ(ds.weight(0), 0.5);
  GptDataset single_a({{a, 1.0}}, 8, 99);
  std::vector<int64_t> count(3, 0);
  const int64_t n = 20000;  // several blend chunks
  for (int64_t i = 0; i < n; ++i) {
    GptSampleLocation loc = ds.locate(i);
    ASSERT_EQ(loc.source_sample, count[size_t(loc.source)]) << "each source is read in its own order";
    ++count[size_t(loc.source)];
    for (int s = 0; s < 3; ++s)
      ASSERT_LE(std::abs(double(count[size_t(s)]) - ds.weight(size_t(s)) * double(i + 1)), 1.0)
          << "source " << s << " after " << i + 1 << " samples";
    auto tokens = ds.sample(i);
    ASSERT_EQ(tokens[0] / 100000, loc.source + 1) << "sample " << i << " comes from its source";
  }
  // A source's samples are the same as when it is alone (same seed, same source position 0).
  for (int64_t i = 0, j = 0; i < 300; ++i)
    if (ds.locate(i).source == 0) {
      ASSERT_EQ(ds.sample(i), single_a.sample(j++));
    }
}

TEST_F(GptDatasetTest, TokensOutsideTheVocabularyAreAnError) {
  std::string p = make("a", 1, 40, 7);
  GptDataset ds({{p, 1.0}}, 8, 1, /*vocab_size=*/1000);
  try {
    ds.sample(0);
    FAIL() << "a token id >= 1000 passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary of 1000 ids"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_F(GptDatasetTest, DatasetTooSmallOrBadWeightIsAnErrorNamingIt) {
  std::string p = (dir_ / "tiny").string();
  {
    IndexedDatasetWriter w(p, TokenDtype::uint16);
    w.add_document(std::vector<int32_t>{1, 2, 3, 4});
    w.close();
    w.commit();
  }
  try {
    GptDataset ds({{p, 1.0}}, 8, 1);
    FAIL() << "opened a dataset shorter than one sample";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p + " has 4 tokens, but one sample needs seq_len + 1 = 9"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(GptDataset({{p, 0.0}}, 2, 1), Error);
  EXPECT_THROW(GptDataset({{(dir_ / "none").string(), 1.0}}, 2, 1), Error);
}

}  // namespace
