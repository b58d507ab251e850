// Normalizer steps and the bounded literal replacement (see bpe_normalizer.h).
#include "trainer/data/bpe_normalizer.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"

namespace llmtrain::trainer {

namespace {

bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

[[noreturn]] void too_large(std::string_view what, size_t input, size_t output, size_t limit) {
  throw Error(fmt::format("the tokenizer's {} would turn {} bytes into {} (limit {})", what, input, output, limit),
              "the tokenizer file's Prepend/Replace steps multiply the text: the file is damaged or hostile");
}

}  // namespace

size_t text_growth_limit(size_t input_size) {
  if (input_size >= kMaxTextBytes / kMaxTextGrowth) return kMaxTextBytes;
  return std::min(kMaxTextBytes, input_size * kMaxTextGrowth + kTextGrowthSlack);
}

void replace_all(std::string_view in, std::string_view pattern, std::string_view content, size_t limit,
                 std::string_view what, std::string& out) {
  // Count first, in 64-bit arithmetic: the size is known (and checked) before anything is built.
  uint64_t matches = 0;
  if (pattern.empty()) {
    // Rust's str::match_indices("") matches before every character and at the end.
    for (char c : in) matches += is_continuation(c) ? 0 : 1;
    ++matches;
  } else {
    for (size_t at = in.find(pattern); at != std::string_view::npos; at = in.find(pattern, at + pattern.size()))
      ++matches;
  }
  const uint64_t size = uint64_t(out.size()) + in.size() - matches * pattern.size() + matches * content.size();
  if (size > limit) too_large(what, in.size(), size_t(std::min<uint64_t>(size, SIZE_MAX)), limit);
  out.reserve(size_t(size));
  if (pattern.empty()) {
    for (char c : in) {
      if (!is_continuation(c)) out += content;
      out.push_back(c);
    }
    out += content;
    return;
  }
  size_t from = 0;
  for (size_t at = in.find(pattern); at != std::string_view::npos; at = in.find(pattern, from)) {
    out.append(in.substr(from, at - from));
    out += content;
    from = at + pattern.size();
  }
  out.append(in.substr(from));
}

void normalize_text(const std::vector<BpeNormalizerStage>& stages, std::string_view in, std::string& out,
                    std::string& scratch) {
  const size_t limit = text_growth_limit(in.size());
  out.assign(in);
  for (const BpeNormalizerStage& s : stages) {
    scratch.clear();
    if (s.kind == BpeNormalizerStage::Kind::prepend) {
      if (out.empty()) continue;  // Hugging Face's Prepend leaves an empty text alone
      if (out.size() + s.content.size() > limit)
        too_large("Prepend normalizer", in.size(), out.size() + s.content.size(), limit);
      scratch.reserve(out.size() + s.content.size());
      scratch += s.content;
      scratch += out;
    } else {
      replace_all(out, s.pattern, s.content, limit, "Replace normalizer", scratch);
    }
    std::swap(out, scratch);
  }
}

}  // namespace llmtrain::trainer
