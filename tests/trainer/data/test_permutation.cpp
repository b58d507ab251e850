// The shuffles' permutation: a bijection of [0, n) for every n, and no position favoured.
#include <gtest/gtest.h>

#include <vector>

#include "trainer/data/permutation.h"

using namespace llmtrain;
using namespace llmtrain::trainer;

namespace {

TEST(Permutation, IsABijectionForEverySize) {
  for (uint64_t n : {1u, 2u, 3u, 5u, 7u, 8u, 9u, 100u, 1000u, 4097u, 65536u, 100003u}) {
    Permutation p(n, 42);
    std::vector<uint8_t> hit(n, 0);
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t j = p(i);
      ASSERT_LT(j, n);
      ASSERT_FALSE(hit[j]) << "n " << n << ": " << j << " hit twice";
      hit[j] = 1;
    }
  }
}

TEST(Permutation, PlacesAnElementUniformlyOverKeys) {
  // Where element 0 lands, over many keys: every position about equally often.
  const uint64_t n = 10;
  std::vector<int> where(n, 0);
  for (uint64_t key = 0; key < 20000; ++key) ++where[Permutation(n, key)(0)];
  for (uint64_t i = 0; i < n; ++i) EXPECT_NEAR(where[i], 2000, 200) << "position " << i;
}

}  // namespace
