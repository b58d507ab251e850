// Integers of JSON we did not write (checkpoint manifests): integers in range, never a float cast.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "common/json_integer.h"

namespace llmtrain {
namespace {

std::string error_of(const nlohmann::json& v, int64_t lo, int64_t hi) {
  try {
    json_integer(v, "manifest step", "the manifest is damaged", lo, hi);
  } catch (const Error& e) {
    EXPECT_EQ(e.hint(), "the manifest is damaged");
    return e.what();
  }
  return "";
}

TEST(JsonInteger, TakesIntegersInRange) {
  EXPECT_EQ(json_integer(nlohmann::json(7), "x", "", 0, 10), 7);
  EXPECT_EQ(json_integer(nlohmann::json(INT64_MIN), "x", ""), INT64_MIN);
  EXPECT_EQ(json_integer(nlohmann::json::parse("9223372036854775807"), "x", ""), INT64_MAX);
}

TEST(JsonInteger, RefusesFloatsOtherTypesAndOutOfRangeNamingTheField) {
  EXPECT_EQ(error_of(nlohmann::json::parse("1e32"), 0, 100), "manifest step is 1e+32, not an integer");
  EXPECT_EQ(error_of(nlohmann::json(2.0), 0, 100), "manifest step is 2.0, not an integer");
  EXPECT_EQ(error_of(nlohmann::json("3"), 0, 100), "manifest step is \"3\", not an integer");
  EXPECT_EQ(error_of(nlohmann::json::parse("18446744073709551615"), 0, 100),
            "manifest step is 18446744073709551615, not an integer");
  EXPECT_EQ(error_of(nlohmann::json(101), 0, 100), "manifest step 101 is outside [0, 100]");
  EXPECT_EQ(error_of(nlohmann::json(-1), 0, 100), "manifest step -1 is outside [0, 100]");
}

}  // namespace
}  // namespace llmtrain
