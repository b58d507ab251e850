// The sampler: (a) every step reads the same samples whatever the data-parallel size, each exactly
// once; (b) resuming from a consumed-samples count continues exactly, also under another dp size;
// and the layout arithmetic is checked with every factor named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "common/error.h"
#include "trainer/data/gpt_dataset.h"
#include "trainer/data/sampler.h"

using namespace llmtrain;
using namespace llmtrain;
using namespace llmtrain::trainer;
namespace fs = std::filesystem;

namespace {

// The samples of one step, read by all ranks of a dp group: rank -> indices.
std::vector<int64_t> step_of_all_ranks(int64_t global, int micro, int dp, int64_t consumed) {
  std::vector<int64_t> all;
  for (int r = 0; r < dp; ++r) {
    Sampler s(global, micro, r, dp);
    auto mine = s.step_indices(consumed);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  return all;
}

TEST(Sampler, EveryStepReadsTheSameSamplesForAnyDpSize) {
  const int64_t global = 48;
  for (int micro : {1, 2, 3, 4}) {
    for (int dp : {1, 2, 4, 8}) {
      if (global % (micro * dp)) continue;
      for (int64_t step = 0; step < 5; ++step) {
        auto all = step_of_all_ranks(global, micro, dp, step * global);
        std::sort(all.begin(), all.end());
        ASSERT_EQ(int64_t(all.size()), global) << "micro " << micro << " dp " << dp;
        for (int64_t i = 0; i < global; ++i)
          ASSERT_EQ(all[size_t(i)], step * global + i) << "micro " << micro << " dp " << dp << " step " << step;
      }
    }
  }
}

TEST(Sampler, MicroBatchesFollowMegatronsLayout) {
  Sampler r1(16, 2, 1, 4);  // 2 micro-batches of 2 per rank per step
  EXPECT_EQ(r1.micro_batches_per_step(), 2);
  EXPECT_EQ(r1.micro_batch_indices(0, 0), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r1.micro_batch_indices(0, 1), (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(r1.micro_batch_indices(16, 0), (std::vector<int64_t>{18, 19}));
}

TEST(Sampler, ResumeFromConsumedSamplesContinuesExactlyUnderAnyDp) {
  // An uninterrupted dp=2 run, and a run that stops after step 7 and resumes with dp=4: the
  // samples of every step after the resume point are the same.
  const int64_t global = 32;
  std::vector<std::vector<int64_t>> uninterrupted;
  for (int64_t step = 0; step < 20; ++step) {
    auto s = step_of_all_ranks(global, 4, 2, step * global);
    std::sort(s.begin(), s.end());
    uninterrupted.push_back(s);
  }
  int64_t consumed = 8 * global;  // what the checkpoint after step 7 records
  for (int64_t step = 8; step < 20; ++step, consumed += global) {
    auto s = step_of_all_ranks(global, 2, 4, consumed);
    std::sort(s.begin(), s.end());
    ASSERT_EQ(s, uninterrupted[size_t(step)]) << "step " << step;
  }
}

TEST(Sampler, ResumedRunReadsTheSameTokens) {
  fs::path dir = fs::temp_directory_path() / fmt::format("llmtrain_sampler_{}", getpid());
  fs::create_directories(dir);
  std::string prefix = (dir / "d").string();
  {
    IndexedDatasetWriter w(prefix, TokenDtype::uint16);
    for (int d = 0; d < 60; ++d) w.add_document(std::vector<int32_t>(size_t(5 + d % 17), d));
    w.close();
    w.commit();
  }
  // Tokens each step reads in a run of 30 steps at dp=1, and in a "resumed" process (fresh dataset
  // object, dp=2) from step 11 on.
  GptDataset first({{prefix, 1.0}}, 16, 77);
  Sampler one(8, 4, 0, 1);
  std::vector<std::vector<int32_t>> tokens;
  for (int64_t step = 0; step < 30; ++step) {
    std::vector<int32_t> t;
    for (int64_t i : one.step_indices(step * 8)) {
      auto s = first.sample(i);
      t.insert(t.end(), s.begin(), s.end());
    }
    tokens.push_back(t);
  }
  GptDataset resumed({{prefix, 1.0}}, 16, 77);
  Sampler r0(8, 2, 0, 2), r1(8, 2, 1, 2);
  for (int64_t step = 11; step < 30; ++step) {
    std::map<int64_t, std::vector<int32_t>> by_index;
    for (const Sampler* s : {&r0, &r1})
      for (int64_t i : s->step_indices(step * 8)) by_index[i] = resumed.sample(i);
    std::vector<int32_t> t;
    for (auto& [i, s] : by_index) t.insert(t.end(), s.begin(), s.end());
    ASSERT_EQ(t, tokens[size_t(step)]) << "step " << step;
  }
  fs::remove_all(dir);
}

TEST(Sampler, LayoutErrorsNameEveryFactor) {
  try {
    Sampler s(30, 4, 0, 2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "global batch 30 is not divisible by micro batch 4 × dp 2 = 8");
  }
  EXPECT_THROW(Sampler(32, 4, 2, 2), Error);
  EXPECT_THROW(Sampler(32, 0, 0, 2), Error);
}

}  // namespace
