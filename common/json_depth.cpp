#include "common/json_depth.h"

#include "common/error.h"

namespace llmtrain {

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

void require_json_depth(std::string_view text, std::string_view origin, int limit) {
  if (json_nesting_depth(text, limit) > limit)
    throw Error(fmt::format("{}: JSON nested deeper than {} levels", origin, limit),
                "no file llmtrain reads nests that deep: the file is damaged or was not made for it");
}

}  // namespace llmtrain
