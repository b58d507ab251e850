// Byte-level BPE: the encoder behind Hugging Face tokenizer.json files of GPT-2/LLaMA-3 style and
// GPT-2's vocab.json + merges.txt. bpe_tokenizer_load.cpp turns those files into a BpeSpec; this
// class encodes and decodes with it.
//
// Encoding a text, in Hugging Face's order:
//  1. added tokens are cut out (leftmost-longest; first those with normalized=false, then the
//     others in what remains), honouring single_word / lstrip / rstrip;
//  2. every other stretch goes through the pre-tokenizer stages (regex splits; ByteLevel's
//     optional prefix space and GPT-2 regex) into words;
//  3. each word's bytes become their byte-level symbols and are merged, lowest merge rank first
//     (leftmost on ties), until no adjacent pair has a merge.
//
// Rule a reader could get wrong: vocabulary strings in the files are in GPT-2's byte-to-unicode
// alphabet (space is "Ġ"); everything here works on the raw bytes they stand for, so the
// mapping is applied once, at load, never per text.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/data/regex_splitter.h"
#include "trainer/data/tokenizer.h"

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

// One pre-tokenizer stage, applied to every piece the previous stages produced.
struct BpePreTokenizerStage {
  enum class Kind { split, byte_level };
  Kind kind = Kind::split;
  std::string pattern;            // split: the regex (Oniguruma dialect), behaviour Isolated
  bool add_prefix_space = false;  // byte_level: prepend ' ' to a piece that does not start with one
  bool use_regex = true;          // byte_level: split with GPT-2's regex
};

// Everything the encoder needs, as read from the files (token strings in the byte-level alphabet).
struct BpeSpec {
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // rank order
  std::vector<BpeAddedToken> added;
  std::vector<BpePreTokenizerStage> pre_tokenizer;
  bool ignore_merges = false;  // a word that is itself in the vocabulary is one token (LLaMA-3)
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
