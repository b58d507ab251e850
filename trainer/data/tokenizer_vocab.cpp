#include "trainer/data/tokenizer_vocab.h"

#include "trainer/data/byte_tokenizer.h"
#include "trainer/data/tokenizer_load.h"

namespace llmtrain::trainer {

int tokenizer_vocab_size(const std::string& tokenizer) {
  if (tokenizer == "byte") return kByteVocabSize;
  return load_tokenizer(tokenizer)->vocab_size();
}

}  // namespace llmtrain::trainer
