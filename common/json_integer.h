// Integers in JSON we did not write (checkpoint manifests and the loop state they carry): a JSON
// integer in [lo, hi], never a float cast to an integer type. nlohmann converts a float such as
// 1e32 to an integer type by a cast, which is undefined behaviour out of range, so a reader of
// such a file takes its integers through here.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

namespace llmtrain {

// `v` as an integer in [lo, hi]. Throws llmtrain::Error naming `what` (the field) with `hint`
// (what the file is: "the manifest is damaged") when it is not a JSON integer or is out of range.
int64_t json_integer(const nlohmann::json& v, std::string_view what, std::string_view hint, int64_t lo = INT64_MIN,
                     int64_t hi = INT64_MAX);

}  // namespace llmtrain
