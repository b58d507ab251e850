// Added tokens of a tokenizer.json ("added_tokens"): cut out of a text before the BPE model sees
// it, leftmost-longest as Hugging Face's Aho-Corasick (MatchKind::LeftmostLongest) finds them,
// honouring single_word, lstrip and rstrip. One matcher holds the tokens of one kind: those with
// normalized=false are matched in the raw text, the others in each normalized stretch
// (bpe_tokenizer.h gives the order).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/data/regex_splitter.h"

namespace llmtrain::trainer {

struct BpeAddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// A stretch of a text: an added token, or text still to encode.
struct Segment {
  uint32_t begin, end;
  int32_t id;  // an added token's id, or -1 for text still to encode
};

class AddedMatcher {
 public:
  void add(const BpeAddedToken& t) {
    if (!t.content.empty()) tokens_.push_back(t);
  }
  // Call once, after the last add().
  void finish();
  bool empty() const { return tokens_.empty(); }
  size_t size() const { return tokens_.size(); }

  // Splits text[b, e) into added-token segments and the stretches between them (HF find_matches);
  // `word_char` matches one word character (single_word).
  void split(std::string_view text, uint32_t b, uint32_t e, const RegexSplitter& word_char,
             std::vector<Segment>& out) const;

 private:
  std::vector<BpeAddedToken> tokens_;
  std::array<std::vector<uint32_t>, 256> by_first_;  // tokens by first byte, longest first
};

}  // namespace llmtrain::trainer
