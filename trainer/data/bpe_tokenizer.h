// BPE: the encoder behind Hugging Face tokenizer.json files and GPT-2's vocab.json + merges.txt, in
// two kinds. bpe_tokenizer_load.cpp turns those files into a BpeSpec; this class encodes and
// decodes with it.
//  - byte-level (a ByteLevel pre-tokenizer: GPT-2, LLaMA-3, Qwen): words are bytes, every byte has
//    a symbol;
//  - SentencePiece-style (no ByteLevel: LLaMA-2, Mistral, Mixtral): words are Unicode characters;
//    a character the vocabulary lacks becomes its UTF-8 bytes' "<0xNN>" tokens (byte_fallback),
//    else the unknown token; spaces are "▁" (a Metaspace pre-tokenizer, or a Prepend + Replace
//    normalizer in LLaMA-2's older files).
//
// Encoding a text, in Hugging Face's order:
//  1. added tokens with normalized=false are cut out (leftmost-longest), honouring single_word /
//     lstrip / rstrip;
//  2. each stretch between them is normalized (bpe_normalizer.h), then the added tokens with
//     normalized=true (their contents normalized too) are cut out of it;
//  3. every other stretch goes through the pre-tokenizer stages (regex splits; ByteLevel's
//     optional prefix space and GPT-2 regex; Metaspace) into words;
//  4. each word becomes its symbols (bytes or characters, as above) and they are merged, lowest
//     merge rank first (leftmost on ties), until no adjacent pair has a merge.
//
// Rule a reader could get wrong: byte-level vocabulary strings are in GPT-2's byte-to-unicode
// alphabet (space is "Ġ"); everything here works on the raw bytes they stand for, so the mapping is
// applied once, at load, never per text. SentencePiece-style vocabulary strings are the text itself.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/data/added_tokens.h"
#include "trainer/data/bpe_decoder.h"
#include "trainer/data/bpe_normalizer.h"
#include "trainer/data/regex_splitter.h"
#include "trainer/data/tokenizer.h"

namespace llmtrain::trainer {

// One pre-tokenizer stage, applied to every piece the previous stages produced.
struct BpePreTokenizerStage {
  enum class Kind { split, byte_level, metaspace };
  // metaspace: when a piece gets `replacement` in front (unless it starts with one already).
  enum class Prepend { always, first, never };
  Kind kind = Kind::split;
  std::string pattern;                // split: the regex (Oniguruma dialect), behaviour Isolated
  bool add_prefix_space = false;      // byte_level: prepend ' ' to a piece that does not start with one
  bool use_regex = true;              // byte_level: split with GPT-2's regex
  std::string replacement;            // metaspace: the character ' ' becomes ("▁")
  Prepend prepend = Prepend::always;  // metaspace: first = only the piece at the start of the text
  bool split = true;                  // metaspace: a new word at every `replacement`

  static BpePreTokenizerStage byte_level_stage(bool add_prefix_space, bool use_regex) {
    BpePreTokenizerStage s;
    s.kind = Kind::byte_level;
    s.add_prefix_space = add_prefix_space;
    s.use_regex = use_regex;
    return s;
  }
};

// Everything the encoder needs, as read from the files (token strings in the byte-level alphabet).
// Byte-level when `pre_tokenizer` has a ByteLevel stage (it is then the last), else SentencePiece-style.
struct BpeSpec {
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // rank order
  std::vector<BpeAddedToken> added;
  std::vector<BpeNormalizerStage> normalizer;
  std::vector<BpePreTokenizerStage> pre_tokenizer;
  std::vector<BpeDecoderStage> decoder;  // SentencePiece-style only (byte-level decodes to the bytes)
  bool has_decoder = false;              // SentencePiece-style: false = tokens joined by spaces, as HF does
  bool ignore_merges = false;            // a word that is itself in the vocabulary is one token (LLaMA-3)
  bool byte_fallback = false;            // a character without a token becomes its bytes' "<0xNN>" tokens
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  std::string format;  // "tokenizer.json" or "vocab.json + merges.txt", for describe()
};

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The byte -> code point table of GPT-2's byte-level alphabet.
const std::array<uint32_t, 256>& byte_to_unicode();

class BpeTokenizer final : public Tokenizer {
 public:
  // Throws llmtrain::Error (naming source.origin) for inconsistent files: a merge whose parts or
  // result are not in the vocabulary, duplicate ids, an unusable regex.
  BpeTokenizer(const BpeSpec& spec, TokenizerSource source);
  ~BpeTokenizer() override;

  void encode_append(std::string_view text, std::vector<int32_t>& ids) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  int32_t eod_id() const override { return eod_id_; }
  bool is_special(int32_t id) const override;
  std::string describe() const override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  int32_t vocab_size_ = 0;
  int32_t eod_id_ = -1;
};

// Parsers (bpe_tokenizer_load.cpp). `origin` names the file(s) in errors.
BpeSpec parse_hf_tokenizer_json(std::string_view json_text, std::string_view origin);
BpeSpec parse_gpt2_files(std::string_view vocab_json, std::string_view merges_txt, std::string_view origin);

}  // namespace llmtrain::trainer
