// Matching added tokens (see added_tokens.h).
#include "trainer/data/added_tokens.h"

#include <algorithm>
#include <cstring>

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
  for (size_t i = 0; i < tokens_.size(); ++i) by_first_[uint8_t(tokens_[i].content[0])].push_back(uint32_t(i));
  for (auto& v : by_first_)
    std::stable_sort(v.begin(), v.end(),
                     [&](uint32_t a, uint32_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
}

void AddedMatcher::split(std::string_view text, uint32_t b, uint32_t e, const RegexSplitter& word_char,
                         std::vector<Segment>& out) const {
  if (tokens_.empty()) {
    out.push_back({b, e, -1});
    return;
  }
  std::string_view seg = text.substr(b, e - b);
  uint32_t start_offset = 0, pos = 0, n = uint32_t(seg.size());
  while (pos < n) {
    uint32_t ms = 0, me = 0;
    const BpeAddedToken* t = nullptr;
    for (uint32_t p = pos; p < n && !t; ++p) {
      for (uint32_t idx : by_first_[uint8_t(seg[p])]) {
        const std::string& c = tokens_[idx].content;
        if (c.size() <= n - p && std::memcmp(seg.data() + p, c.data(), c.size()) == 0) {
          t = &tokens_[idx];
          ms = p;
          me = p + uint32_t(c.size());
          break;
        }
      }
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
}

}  // namespace llmtrain::trainer
