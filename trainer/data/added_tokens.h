// Added tokens of a tokenizer.json ("added_tokens"): cut out of a text before the BPE model sees
// it, leftmost-longest as Hugging Face's Aho-Corasick (MatchKind::LeftmostLongest) finds them,
// honouring single_word, lstrip and rstrip. One matcher holds the tokens of one kind: those with
// normalized=false are matched in the raw text, the others in each normalized stretch
// (bpe_tokenizer.h gives the order).
//
// The cost: the tokens are one byte trie, walked from each position of the text for as long as the
// text follows some token, so a text of n bytes takes at most n × the longest token's length steps
// (kMaxAddedTokenBytes), whatever the number of tokens: linear in the text, bounded by the
// tokenizer. (Each token compared at each position was n × tokens: 200,000 added tokens on 150,000
// '<' never finished.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
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

// The longest added token the loader accepts (real ones are tens of bytes).
inline constexpr size_t kMaxAddedTokenBytes = 4096;

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
  // `word_char` matches one word character (single_word). `steps`, when given, counts the trie's
  // steps (the cost the tests measure against the text's length).
  void split(std::string_view text, uint32_t b, uint32_t e, const RegexSplitter& word_char, std::vector<Segment>& out,
             uint64_t* steps = nullptr) const;

 private:
  // The longest token starting at seg[p] (its index, or -1) and its end.
  int32_t longest_at(std::string_view seg, uint32_t p, uint32_t& end, uint64_t& steps) const;
  std::vector<BpeAddedToken> tokens_;
  // The trie: node 0 is the root; edge (node · 256 + byte) → child; the token ending at a node (the
  // first added of equal contents), or -1.
  std::unordered_map<uint64_t, uint32_t> edges_;
  std::vector<int32_t> token_at_;
};

}  // namespace llmtrain::trainer
