// A tokenizer file: the input is a Hugging Face tokenizer.json when its first byte is even, else
// the bytes a checkpoint stores for GPT-2's vocab.json + merges.txt ({"vocab.json": ..,
// "merges.txt": ..}). A tokenizer that loads then encodes and decodes a fixed text.
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "trainer/data/tokenizer.h"
#include "trainer/data/tokenizer_load.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmtrain;
  fuzz::quiet();
  if (size < 1) return 0;
  const auto kind = data[0] % 2 == 0 ? trainer::kTokenizerKindHfJson : trainer::kTokenizerKindGpt2Files;
  try {
    auto tok = trainer::load_tokenizer_from_bytes(kind, fuzz::bytes(data + 1, size - 1), "fuzz");
    const std::string text = "Hello, world! 12345 \xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80 \n\t  end";
    auto ids = tok->encode(text);
    tok->decode(ids);
  } catch (const Error&) {
  }
  return 0;
}
