// Tokenizers: text <-> token ids, for `llmtrain prep` (documents -> indexed dataset), for
// `model.vocab: auto`, and for generation (prompt in, ids out, ids back to text). This is the
// interface every kind implements; loading one, the one place that knows them all, is
// trainer/data/tokenizer_load.h; the kinds are byte_tokenizer.h and bpe_tokenizer.h.
//
// The kinds (docs/data.md says exactly what each accepts):
//  - "byte": ids 0..255 are the bytes of the text, 256 is <|endoftext|> (end of document). No
//    files. Any bytes are accepted, valid UTF-8 or not.
//  - byte-level BPE from a Hugging Face tokenizer.json (GPT-2, LLaMA-3, most current models) or
//    from GPT-2's vocab.json + merges.txt: pre-tokenizer regex (PCRE2), merges by rank, added and
//    special tokens;
//  - SentencePiece-style BPE from a tokenizer.json (LLaMA-2, Mistral, Mixtral): byte fallback,
//    Metaspace, the Prepend/Replace normalizers and the decoders these files use.
//  Ids are those of Hugging Face `tokenizers` (tests/trainer/data/test_tokenizer_parity checks
//  this). Other tokenizer files (Unigram, WordPiece, other normalizers) are refused with "not
//  supported yet"; SentencePiece's own tokenizer.model with a pointer to the tokenizer.json.
//
// Rules a reader could get wrong:
//  - encode() never adds BOS/EOS or applies the file's post-processor: it returns the ids of the
//    text itself (Megatron's GPT2BPETokenizer does the same); `prep` appends eod_id() per document.
//  - Special tokens written in the text ("<|endoftext|>") become their ids with BPE tokenizers, as
//    Hugging Face does by default; the byte tokenizer has no such matching (bytes are bytes).
//  - A Tokenizer is immutable after loading; encode/decode may be called from many threads.
//  - decode() returns bytes, not necessarily valid UTF-8 (a prefix of a multi-byte character is a
//    valid thing for a model to generate). Byte-level: decode(encode(t)) == t for every text t the
//    tokenizer accepts. SentencePiece-style: what Hugging Face's decode gives (its decoder drops
//    the space the encoder put in front), which is t except around added tokens.
//  - decode([id]) is not the next piece of a text for SentencePiece-style tokenizers (the first
//    token's leading space goes): stream with DecodeStream.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"

namespace llmtrain::trainer {

// What a checkpoint records to rebuild a tokenizer without the original files.
struct TokenizerSource {
  std::string kind;    // kTokenizerKindByte | kTokenizerKindHfJson | kTokenizerKindGpt2Files
  std::string bytes;   // the file's bytes ("" for byte; see load_tokenizer_from_bytes for gpt2)
  std::string origin;  // the path it was loaded from ("byte" for byte), for messages
};

inline constexpr std::string_view kTokenizerKindByte = "byte";
inline constexpr std::string_view kTokenizerKindHfJson = "hf-tokenizer-json";
inline constexpr std::string_view kTokenizerKindGpt2Files = "gpt2-vocab-merges";

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of `text`. Thread-safe. Throws llmtrain::Error for text the tokenizer cannot take
  // (BPE: invalid UTF-8, naming the byte offset).
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> ids;
    encode_append(text, ids);
    return ids;
  }
  // Appends the ids of `text` to `ids` (what prep's workers call, reusing one vector).
  virtual void encode_append(std::string_view text, std::vector<int32_t>& ids) const = 0;
  // While `flag` (which must outlive the tokenizer's use) is true, encoding stops between words
  // with llmtrain::Error "interrupted", so that one huge document does not hold a stop up (prep's
  // SIGTERM). Set before the encoding threads start.
  void set_interrupt(const std::atomic<bool>* flag) { interrupt_ = flag; }

  // The bytes the ids stand for, concatenated; special tokens as their text. Throws
  // llmtrain::Error for an id outside [0, vocab_size()) or one the vocabulary does not define.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  // One more than the largest id (added tokens included): the rows an embedding needs.
  virtual int32_t vocab_size() const = 0;
  // End-of-document id, or -1 when the tokenizer has none (prep then needs --no-append-eod).
  virtual int32_t eod_id() const = 0;
  // Whether `id` is a special token (end of document, added special tokens).
  virtual bool is_special(int32_t id) const = 0;
  // One line: kind, origin, vocabulary size, end-of-document token, pre-tokenizer.
  virtual std::string describe() const = 0;

  // "byte", or the path the tokenizer was loaded from: what data.tokenizer said.
  std::string spec() const { return source_.kind == kTokenizerKindByte ? "byte" : source_.origin; }
  // Kind and file bytes, enough for load_tokenizer_from_bytes() to rebuild an identical tokenizer.
  const TokenizerSource& source() const { return source_; }

 protected:
  explicit Tokenizer(TokenizerSource source) : source_(std::move(source)) {}
  // Throws the interruption set_interrupt asked for, when its flag is up.
  void check_interrupt() const {
    if (interrupt_ && interrupt_->load(std::memory_order_relaxed)) throw Error("interrupted while tokenizing");
  }

 private:
  TokenizerSource source_;
  const std::atomic<bool>* interrupt_ = nullptr;
};

// Text as ids arrive (streaming generation): next(id) is what the text of the ids so far gains,
// as Hugging Face's DecodeStream finds it. It decodes the ids since the last text it returned
// together with those that produced that text (the window's prefix: a decoder may treat a text's
// first token differently, Metaspace strips its space), returns what the window's text adds to the
// prefix's, and holds back a text that ends in U+FFFD — a byte-fallback character whose last byte
// has not come yet — until it does (finish() gives what is still held, at the end).
class DecodeStream {
 public:
  // `context`: the ids before the first next() (the prompt), whose text is not returned.
  DecodeStream(const Tokenizer& tokenizer, std::vector<int32_t> context);
  // Throws llmtrain::Error as Tokenizer::decode does.
  std::string next(int32_t id);
  // The text still held back (an incomplete character at the end: its U+FFFDs), once no id follows.
  std::string finish();

 private:
  std::string gained() const;  // what the pending ids add to the prefix's text
  const Tokenizer& tokenizer_;
  std::vector<int32_t> prefix_, pending_;  // the ids of the last text returned, and those since
  std::string prefix_text_;                // decode(prefix_)
};

}  // namespace llmtrain::trainer
