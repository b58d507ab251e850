// The decoders of a SentencePiece-style tokenizer.json (Replace, ByteFallback, Fuse, Strip,
// Metaspace, Sequences of them): token strings back to text, as Hugging Face's Tokenizer::decode
// does with skip_special_tokens=False.
//
// Each step works on the list of token strings (Strip and Metaspace look at each token, and
// Metaspace at which one is first), so the chain runs over the list and the pieces are
// concatenated at the end, as Hugging Face does.
//
// Rule a reader could get wrong: ByteFallback turns a run of "<0xNN>" tokens into their bytes when
// the whole run is valid UTF-8, and otherwise into one U+FFFD per token, as Hugging Face does, so
// the text is always UTF-8. A stream of tokens ending inside a character (generation) therefore
// ends in U+FFFD until the character's last byte comes: DecodeStream (tokenizer.h) holds such an
// end back, as Hugging Face's DecodeStream does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace llmtrain::trainer {

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

struct BpeDecoderStage {
  enum class Kind { replace, byte_fallback, fuse, strip, metaspace };
  Kind kind = Kind::fuse;
  std::string pattern;      // replace: the literal found
  std::string content;      // replace: what it becomes; strip: the character stripped; metaspace: its replacement
  uint64_t start = 0;       // strip: at most this many `content` characters off each token's start
  uint64_t stop = 0;        // strip: ... and off its end
  bool strip_first = true;  // metaspace (prepend_scheme first/always): the first token loses every `content`
};

// The text of `tokens` through `chain`; with no decoder in the file (`has_decoder` false), the
// tokens joined by single spaces, as Hugging Face does. Throws llmtrain::Error when a Replace would
// grow the text past text_growth_limit (bpe_normalizer.h).
std::string decode_token_strings(const std::vector<BpeDecoderStage>& chain, bool has_decoder,
                                 std::vector<std::string> tokens);

// The byte a "<0xNN>" token stands for (as Hugging Face's ByteFallback reads it: six bytes, two hex
// digits or '+' and one), or -1.
int byte_fallback_value(const std::string& token);

}  // namespace llmtrain::trainer
