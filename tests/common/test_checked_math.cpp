// Sizes from files are multiplied without wrapping (common/checked_math.h).
#include <gtest/gtest.h>

#include <vector>

#include "common/checked_math.h"

using namespace llmtrain;

TEST(CheckedMath, ProductsThatWrapAreRefused) {
  EXPECT_EQ(checked_product(std::vector<int64_t>{}), 1);
  EXPECT_EQ(checked_product(std::vector<int64_t>{3, 4, 5}), 60);
  EXPECT_EQ(checked_product(std::vector<int64_t>{0, int64_t(1) << 62}), 0);
  // 2^32 × 2^32 is 2^64: as uint64 arithmetic it wraps to 0, an "empty" tensor.
  EXPECT_FALSE(checked_product(std::vector<int64_t>{int64_t(1) << 32, int64_t(1) << 32}));
  EXPECT_FALSE(checked_product(std::vector<int64_t>{int64_t(1) << 40, int64_t(1) << 40, 0}));
  EXPECT_FALSE(checked_product(std::vector<int64_t>{-1, 5}));
  EXPECT_EQ(checked_product(std::vector<int64_t>{INT64_MAX}), INT64_MAX);
  EXPECT_FALSE(checked_mul(INT64_MAX, 2));
  EXPECT_FALSE(checked_add(INT64_MAX, 1));
  EXPECT_EQ(checked_add(INT64_MAX - 1, 1), INT64_MAX);
}
