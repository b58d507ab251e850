// UTF-8 validation for the tokenizers: byte-level BPE takes Unicode text (its pre-tokenizer regex
// works on code points), so invalid UTF-8 is refused before it reaches PCRE2, which would
// otherwise have to re-check the whole text on every match.
//
// Rule a reader could get wrong: "valid" means exactly what Rust's `str` (and so Hugging Face
// `tokenizers`) and Python's strict UTF-8 codec accept — no overlong forms, no surrogates
// (U+D800..U+DFFF), nothing above U+10FFFF. A looser check would let through text the reference
// library can never see, and our ids for it could not be checked against anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace llmtrain::trainer {

// Offset of the first byte that is not part of a valid UTF-8 sequence, or npos when the whole
// text is valid.
inline size_t utf8_invalid_offset(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    // ASCII fast path, eight bytes at a time.
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    auto cont = [&](size_t k) { return i + k < n && (p[i + k] & 0xC0) == 0x80; };
    if (c >= 0xC2 && c <= 0xDF) {
      if (!cont(1)) return i;
      i += 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      if (!cont(1) || !cont(2)) return i;
      unsigned char c1 = p[i + 1];
      if (c == 0xE0 && c1 < 0xA0) return i;  // overlong
      if (c == 0xED && c1 > 0x9F) return i;  // surrogate
      i += 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      if (!cont(1) || !cont(2) || !cont(3)) return i;
      unsigned char c1 = p[i + 1];
      if (c == 0xF0 && c1 < 0x90) return i;  // overlong
      if (c == 0xF4 && c1 > 0x8F) return i;  // above U+10FFFF
      i += 4;
    } else {
      return i;  // continuation byte without a lead, 0xC0/0xC1, or 0xF5..0xFF
    }
  }
  return std::string_view::npos;
}

// Length in bytes of the UTF-8 sequence that starts with lead byte `c` (1 for anything else).
inline int utf8_sequence_length(unsigned char c) {
  if (c < 0xC0) return 1;
  if (c < 0xE0) return 2;
  if (c < 0xF0) return 3;
  return 4;
}

// Decodes the code point at s[i] (the text must be valid UTF-8) and advances i past it.
inline uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  unsigned char c = p[i];
  if (c < 0x80) {
    ++i;
    return c;
  }
  int len = utf8_sequence_length(c);
  uint32_t cp = c & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
  i += len;
  return cp;
}

// Appends the UTF-8 encoding of code point `cp` to `out`.
template <typename String>
inline void utf8_append(String& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

}  // namespace llmtrain::trainer
