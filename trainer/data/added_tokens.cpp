// Matching added tokens (see added_tokens.h).
#include "trainer/data/added_tokens.h"

#include <algorithm>

#include "trainer/data/utf8.h"

namespace llmtrain::trainer {

namespace {

bool ends_with_word(std::string_view s, const RegexSplitter& word_char) {
  size_t i = s.size();
  while (i > 0 && (uint8_t(s[i - 1]) & 0xC0) == 0x80) --i;  // back to the last character's lead byte
  return i > 0 ? word_char.match_prefix(s.substr(i - 1)) > 0 : false;
}

// Start of the run of white space that ends at `end`.
uint32_t white_space_start(std::string_view s, uint32_t end) {
  uint32_t start = end;
  while (start > 0) {
    uint32_t i = start - 1;
    while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80) --i;
    size_t k = i;
    if (!is_unicode_white_space(utf8_next(s, k))) break;
    start = i;
  }
  return start;
}

// End of the run of white space that starts at `begin`.
uint32_t white_space_end(std::string_view s, uint32_t begin) {
  size_t i = begin;
  while (i < s.size()) {
    size_t k = i;
    if (!is_unicode_white_space(utf8_next(s, k))) break;
    i = k;
  }
  return uint32_t(i);
}

}  // namespace

void AddedMatcher::finish() {
  edges_.clear();
  token_at_.assign(1, -1);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    uint32_t node = 0;
    for (char c : tokens_[i].content) {
      const uint64_t key = uint64_t(node) * 256 + uint8_t(c);
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        it = edges_.emplace(key, uint32_t(token_at_.size())).first;
        token_at_.push_back(-1);
      }
      node = it->second;
    }
    if (token_at_[node] < 0) token_at_[node] = int32_t(i);  // equal contents: the first added
  }
}

int32_t AddedMatcher::longest_at(std::string_view seg, uint32_t p, uint32_t& end, uint64_t& steps) const {
  int32_t best = -1;
  uint32_t node = 0;
  for (uint32_t q = p; q < seg.size(); ++q) {
    ++steps;
    const auto it = edges_.find(uint64_t(node) * 256 + uint8_t(seg[q]));
    if (it == edges_.end()) break;
    node = it->second;
    if (token_at_[node] >= 0) best = token_at_[node], end = q + 1;
  }
  return best;
}

void AddedMatcher::split(std::string_view text, uint32_t b, uint32_t e, const RegexSplitter& word_char,
                         std::vector<Segment>& out, uint64_t* steps) const {
  if (tokens_.empty()) {
    out.push_back({b, e, -1});
    return;
  }
  std::string_view seg = text.substr(b, e - b);
  uint32_t start_offset = 0, pos = 0, n = uint32_t(seg.size());
  uint64_t walked = 0;
  while (pos < n) {
    uint32_t ms = 0, me = 0;
    const BpeAddedToken* t = nullptr;
    for (uint32_t p = pos; p < n && !t; ++p) {
      const int32_t idx = longest_at(seg, p, me, walked);
      if (idx >= 0) t = &tokens_[size_t(idx)], ms = p;
    }
    if (!t) break;
    pos = me;
    uint32_t start = ms, stop = me;
    if (t->single_word) {
      bool start_space = ms == 0 || !ends_with_word(seg.substr(0, ms), word_char);
      bool stop_space = me == n || word_char.match_prefix(seg.substr(me)) <= 0;
      if (!start_space || !stop_space) continue;
    }
    if (t->lstrip) start = std::max(white_space_start(seg, ms), start_offset);
    if (t->rstrip) stop = white_space_end(seg, me);
    if (start_offset < start) out.push_back({b + start_offset, b + start, -1});
    out.push_back({b + start, b + stop, t->id});
    start_offset = stop;
  }
  if (start_offset < n) out.push_back({b + start_offset, e, -1});
  if (steps) *steps += walked;
}

}  // namespace llmtrain::trainer
