// The decoder chain of SentencePiece-style tokenizers (see bpe_decoder.h).
#include "trainer/data/bpe_decoder.h"

#include "trainer/data/bpe_normalizer.h"
#include "trainer/data/utf8.h"

namespace llmtrain::trainer {

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Consecutive "<0xNN>" tokens become one piece holding their bytes when those are valid UTF-8, else
// one U+FFFD per byte token, as Hugging Face's ByteFallback writes them (never raw invalid UTF-8).
std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string run;
  size_t run_tokens = 0;
  auto flush = [&] {
    if (run_tokens == 0) return;
    if (utf8_invalid_offset(run) == std::string::npos) {
      out.push_back(std::move(run));
    } else {
      out.insert(out.end(), run_tokens, std::string(kReplacementCharacter));
    }
    run.clear();
    run_tokens = 0;
  };
  for (std::string& t : tokens) {
    int b = byte_fallback_value(t);
    if (b >= 0) {
      run.push_back(char(b));
      ++run_tokens;
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  return out;
}

// At most `start` copies of `c` off the front of `t` and `stop` off its back (never crossing).
void strip(std::string& t, const std::string& c, uint64_t start, uint64_t stop) {
  if (c.empty()) return;
  size_t b = 0, e = t.size();
  for (uint64_t k = 0; k < start && e - b >= c.size() && t.compare(b, c.size(), c) == 0; ++k) b += c.size();
  for (uint64_t k = 0; k < stop && e - b >= c.size() && t.compare(e - c.size(), c.size(), c) == 0; ++k) e -= c.size();
  t = t.substr(b, e - b);
}

}  // namespace

int byte_fallback_value(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  // Rust's u8::from_str_radix, which Hugging Face uses, takes a leading '+'.
  if (t[3] == '+') return hex_digit(t[4]);
  int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string decode_token_strings(const std::vector<BpeDecoderStage>& chain, bool has_decoder,
                                 std::vector<std::string> tokens) {
  size_t total = 0;
  for (const auto& t : tokens) total += t.size();
  if (!has_decoder) {
    std::string out;
    out.reserve(total + tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  const size_t limit = text_growth_limit(total);
  for (const BpeDecoderStage& s : chain) {
    switch (s.kind) {
      case BpeDecoderStage::Kind::byte_fallback:
        tokens = byte_fallback(std::move(tokens));
        break;
      case BpeDecoderStage::Kind::fuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case BpeDecoderStage::Kind::strip:
        for (auto& t : tokens) strip(t, s.content, s.start, s.stop);
        break;
      case BpeDecoderStage::Kind::replace:
      case BpeDecoderStage::Kind::metaspace: {
        // The output of all tokens together stays within the limit: each call gets what is left.
        size_t used = 0;
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string out;
          if (s.kind == BpeDecoderStage::Kind::replace)
            replace_all(tokens[i], s.pattern, s.content, limit - used, "Replace decoder", out);
          else
            replace_all(tokens[i], s.content, i == 0 && s.strip_first ? "" : " ", limit - used, "Metaspace decoder",
                        out);
          used += out.size();
          tokens[i] = std::move(out);
        }
        break;
      }
    }
  }
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace llmtrain::trainer
