// CRC-32C against the test vectors of RFC 3720 (iSCSI), appendix B.4, and the catalogue's check
// value for "123456789" — values from the standard, not from our code.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "common/crc32c.h"

using llmtrain::crc32c;
using llmtrain::crc32c_extend;

TEST(Crc32c, Rfc3720Vectors) {
  std::vector<uint8_t> b(32, 0);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x8A9136AAu);
  std::fill(b.begin(), b.end(), 0xFF);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x62A8AB43u);
  std::iota(b.begin(), b.end(), 0);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) b[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x113FDB5Cu);
}

TEST(Crc32c, CheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(llmtrain::crc32c_extend_portable(0, "123456789", 9), 0xE3069283u);
}

TEST(Crc32c, PortableEqualsHardware) {
  std::mt19937 rng(3);
  std::vector<uint8_t> data(4099);
  for (auto& x : data) x = static_cast<uint8_t>(rng());
  for (size_t n : {0ul, 1ul, 9ul, 64ul, 4099ul})
    EXPECT_EQ(llmtrain::crc32c_extend_portable(0, data.data(), n), crc32c(data.data(), n)) << n;
}

TEST(Crc32c, ExtendEqualsWhole) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(10007);
  for (auto& x : data) x = static_cast<uint8_t>(rng());
  uint32_t whole = crc32c(data.data(), data.size());
  for (size_t cut : {0ul, 1ul, 7ul, 8ul, 4096ul, 10006ul, 10007ul}) {
    uint32_t c = crc32c_extend(0, data.data(), cut);
    c = crc32c_extend(c, data.data() + cut, data.size() - cut);
    EXPECT_EQ(c, whole) << "cut at " << cut;
  }
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}
