// The byte tokenizer (data.tokenizer: byte): ids 0..255 are the bytes of the text, 256 is
// <|endoftext|> (end of document). No files; any bytes are accepted, valid UTF-8 or not, and there
// is no matching of special tokens written in the text (bytes are bytes).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/data/tokenizer.h"

namespace llmtrain::trainer {

// The byte tokenizer's layout.
inline constexpr int32_t kByteVocabSize = 257;
inline constexpr int32_t kByteEodId = 256;

class ByteTokenizer final : public Tokenizer {
 public:
  ByteTokenizer();
  void encode_append(std::string_view text, std::vector<int32_t>& ids) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return kByteVocabSize; }
  int32_t eod_id() const override { return kByteEodId; }
  bool is_special(int32_t id) const override { return id == kByteEodId; }
  std::string describe() const override;
};

}  // namespace llmtrain::trainer
