// How large a tokenizer's vocabulary is, for `model.vocab: auto`, without building the tokenizer.
#pragma once

#include <string>

namespace llmtrain::trainer {

// The byte tokenizer: ids 0..255 are bytes, 256 is <|endoftext|> (end of document).
inline constexpr int kByteVocabSize = 257;
inline constexpr int kByteEodId = 256;

// "byte", or a path to a Hugging Face tokenizer.json or a GPT-2 vocab.json: the number of ids
// (one more than the largest id, added tokens included). Throws llmtrain::Error naming the file.
int tokenizer_vocab_size(const std::string& tokenizer);

}  // namespace llmtrain::trainer
