// The normalizers of a tokenizer.json (Prepend, Replace, Sequences of them), and the literal
// replacement they share with the Replace decoder (bpe_decoder.h).
//
// Hugging Face applies the normalizer to each stretch of text between added tokens with
// `normalized: false`, and to the content of every added token with `normalized: true` (which is
// then matched in the normalized text): LLaMA-2's Prepend("▁") makes "<sep>" match as "▁<sep>".
//
// Rule a reader could get wrong: the file decides how much these steps grow a text (a Replace of
// " " by 200 bytes, many of them in a Sequence), so each step's output size is computed before it
// is built and refused past `limit` bytes: a hostile tokenizer cannot make one call allocate
// without bound. The limit is set once per call from the input (text_growth_limit), never per step,
// so a Sequence cannot compound it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace llmtrain::trainer {

struct BpeNormalizerStage {
  enum class Kind { prepend, replace };
  Kind kind = Kind::replace;
  std::string pattern;  // replace: the literal found ("" matches at every character boundary, as in HF)
  std::string content;  // prepend: put in front of a non-empty text; replace: what each match becomes
};

// Bounds on what a tokenizer file may ask of these steps.
inline constexpr size_t kMaxTextStages = 64;                    // normalizer, pre-tokenizer or decoder steps
inline constexpr size_t kMaxTextStageLiteral = 256;             // bytes in one pattern, content or prefix
inline constexpr size_t kMaxTextGrowth = 16;                    // output bytes per input byte, over all steps
inline constexpr size_t kTextGrowthSlack = 64 * 1024;           // plus this much
inline constexpr size_t kMaxTextBytes = (size_t(1) << 31) - 1;  // pieces use 32-bit offsets

// The most bytes the steps may produce from `input_size` bytes (at most kMaxTextBytes).
size_t text_growth_limit(size_t input_size);

// Appends `in` to `out` with every non-overlapping occurrence of `pattern` (leftmost first) replaced
// by `content`. Throws llmtrain::Error, naming `what`, when `out` would pass `limit` bytes.
void replace_all(std::string_view in, std::string_view pattern, std::string_view content, size_t limit,
                 std::string_view what, std::string& out);

// `out` = `in` through the stages in order (`scratch` is working space). Throws llmtrain::Error when
// the result would pass text_growth_limit(in.size()).
void normalize_text(const std::vector<BpeNormalizerStage>& stages, std::string_view in, std::string& out,
                    std::string& scratch);

}  // namespace llmtrain::trainer
