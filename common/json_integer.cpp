#include "common/json_integer.h"

#include <fmt/format.h>

#include "common/error.h"

namespace llmtrain {

int64_t json_integer(const nlohmann::json& v, std::string_view what, std::string_view hint, int64_t lo, int64_t hi) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
    throw Error(fmt::format("{} is {}, not an integer", what, v.dump()), std::string(hint));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) throw Error(fmt::format("{} {} is outside [{}, {}]", what, x, lo, hi), std::string(hint));
  return x;
}

}  // namespace llmtrain
