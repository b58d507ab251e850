// The pre-tokenizer regex of byte-level BPE tokenizers, run with PCRE2 (JIT-compiled).
//
// Hugging Face `tokenizers` runs these patterns with Oniguruma, so a pattern is first translated
// from Oniguruma's dialect to PCRE2's where the two differ on the same text: `\s` is Unicode's
// White_Space property in Oniguruma (PCRE2's UCP `\s` also takes U+180E), `\d` is any decimal
// digit, `\w` is letter/mark/number/connector, `\h` is a hex digit, `\uHHHH` is a code point.
//
// Rule a reader could get wrong: the text given to split() must already be valid UTF-8 (the
// tokenizer checks it once per call); matching skips PCRE2's own per-call UTF check, which would
// re-scan the whole text for every piece and make splitting quadratic.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace llmtrain::trainer {

// A piece of a text: [begin, end) byte offsets.
struct Piece {
  uint32_t begin;
  uint32_t end;
};

class RegexSplitter {
 public:
  // `pattern` in Oniguruma's dialect (as in tokenizer.json); `where` names its origin for errors.
  // Throws llmtrain::Error when the pattern does not compile or uses what PCRE2 cannot express.
  RegexSplitter(std::string_view pattern, std::string_view where);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends to `out` the pieces of text[begin, end) in order: every match, and every stretch
  // between matches ("Isolated" behaviour: nothing is dropped). Thread-safe.
  void split(std::string_view text, uint32_t begin, uint32_t end, std::vector<Piece>& out) const;

  // Length of the match anchored at the start of `text`, or -1 when there is none.
  int64_t match_prefix(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }
  const std::string& translated() const { return translated_; }

 private:
  int64_t match(std::string_view subject, size_t start, uint32_t options, size_t* match_begin) const;

  std::string pattern_;
  std::string translated_;
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

// Oniguruma-dialect pattern -> PCRE2 pattern (see the file comment). Throws llmtrain::Error for
// constructs that have no PCRE2 equivalent (nested classes, class intersection `&&`).
std::string translate_onig_pattern(std::string_view pattern, std::string_view where);

// Unicode White_Space (what Oniguruma's and Rust's `\s` match).
bool is_unicode_white_space(uint32_t cp);

}  // namespace llmtrain::trainer
