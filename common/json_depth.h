// JSON from files we did not write (tokenizer.json, safetensors headers, checkpoint manifests, JSONL
// records, metrics): nlohmann's parser and its destructor recurse once per nesting level, so a file
// of a million '[' overflows the stack (SIGSEGV) before any error can be reported. Every such text
// passes this check before it is parsed. The formats we read nest a handful of levels (a
// tokenizer.json's pre-tokenizer sequence is the deepest, at about 6).
#pragma once

#include <string_view>

namespace llmtrain {

inline constexpr int kMaxJsonDepth = 64;

// The deepest nesting of '[' and '{' outside strings in `text`, counting stops one past `limit`
// (so a hostile text costs one linear pass). Malformed JSON is measured as far as it goes; the
// parser reports what is wrong with it.
int json_nesting_depth(std::string_view text, int limit = kMaxJsonDepth);

// Throws llmtrain::Error "<origin>: JSON nested deeper than <limit> levels" when it is.
void require_json_depth(std::string_view text, std::string_view origin, int limit = kMaxJsonDepth);

}  // namespace llmtrain
