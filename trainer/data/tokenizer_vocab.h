// How large a tokenizer's vocabulary is, for `model.vocab: auto`.
#pragma once

#include <string>

#include "trainer/data/tokenizer.h"

namespace llmtrain::trainer {

// "byte" (257: 256 bytes + <|endoftext|>), or a path load_tokenizer() accepts: one more than the
// largest id, added tokens included. Loads the tokenizer, so a file of an unsupported kind is
// refused here ("not supported yet"), before any rank starts. Throws llmtrain::Error naming the file.
int tokenizer_vocab_size(const std::string& tokenizer);

}  // namespace llmtrain::trainer
