#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "common/json_depth.h"

namespace llmtrain {
namespace {

TEST(JsonDepth, CountsBracketsOutsideStrings) {
  EXPECT_EQ(json_nesting_depth("1"), 0);
  EXPECT_EQ(json_nesting_depth("{}"), 1);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}], "c": {}})"), 4);
  // Brackets inside strings, escaped quotes and backslashes do not count.
  EXPECT_EQ(json_nesting_depth(R"({"[[[": "]]]{{{", "q\"[[": 1})"), 1);
  EXPECT_EQ(json_nesting_depth(R"(["\\", [["x"]]])"), 3);
  // Malformed text is measured as far as it goes (the parser reports the rest); a stray closer
  // does not go below zero.
  EXPECT_EQ(json_nesting_depth("]]][[["), 3);
}

TEST(JsonDepth, StopsCountingPastTheLimit) {
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  EXPECT_EQ(json_nesting_depth(deep), kMaxJsonDepth + 1);
  EXPECT_EQ(json_nesting_depth(deep, 5), 6);
  EXPECT_NO_THROW(require_json_depth(std::string(64, '[') + std::string(64, ']'), "ok.json"));
  try {
    require_json_depth(deep, "tokenizer.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "tokenizer.json: JSON nested deeper than 64 levels");
  }
}

}  // namespace
}  // namespace llmtrain
