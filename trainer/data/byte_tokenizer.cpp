#include "trainer/data/byte_tokenizer.h"

#include <fmt/format.h>

#include "common/error.h"

namespace llmtrain::trainer {

ByteTokenizer::ByteTokenizer() : Tokenizer({std::string(kTokenizerKindByte), "", "byte"}) {}

void ByteTokenizer::encode_append(std::string_view text, std::vector<int32_t>& ids) const {
  size_t n = ids.size();
  ids.resize(n + text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[n + i] = static_cast<uint8_t>(text[i]);
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < 256)
      out.push_back(static_cast<char>(id));
    else if (id == kByteEodId)
      out += "<|endoftext|>";
    else
      throw Error(fmt::format("cannot decode token id {}: the byte tokenizer has ids 0..256", id),
                  "ids must come from the byte tokenizer");
  }
  return out;
}

std::string ByteTokenizer::describe() const {
  return "byte: ids 0..255 are the bytes of the text, 256 is <|endoftext|> (end of document); 257 ids";
}

}  // namespace llmtrain::trainer
