// A tokenizer.json and a text, for the parts the fuzzer should steer both of: normalizers,
// Metaspace, byte fallback, unknown tokens and the decoder chain of SentencePiece-style BPE (the
// seeds are LLaMA-2 and Mistral layouts). The input is the tokenizer.json, a NUL byte (which a
// JSON text cannot hold), then the text. A tokenizer that loads encodes the text, decodes the ids
// whole and streamed, and decodes ids taken from the text's bytes (some out of range, which must be
// an llmtrain::Error).
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "trainer/data/tokenizer.h"
#include "trainer/data/tokenizer_load.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmtrain;
  fuzz::quiet();
  const std::string_view input = fuzz::bytes(data, size);
  const size_t nul = input.find('\0');
  const std::string_view file = input.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? "Hello  world\n" : input.substr(nul + 1);
  std::unique_ptr<trainer::Tokenizer> tok;
  try {
    tok = trainer::load_tokenizer_from_bytes(trainer::kTokenizerKindHfJson, file, "fuzz");
  } catch (const Error&) {
    return 0;
  }
  try {
    std::vector<int32_t> ids = tok->encode(text);
    tok->decode(ids);
    if (!ids.empty()) {
      trainer::DecodeStream stream(*tok, {ids[0]});
      for (size_t i = 1; i < ids.size() && i < 64; ++i) stream.next(ids[i]);
    }
  } catch (const Error&) {
  }
  try {
    // Two bytes per id, over [-1, vocab]: the ends are errors, the rest any token at all.
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < text.size() && ids.size() < 256; i += 2) {
      const int32_t raw = int32_t(uint8_t(text[i])) << 8 | uint8_t(text[i + 1]);
      ids.push_back(raw % (tok->vocab_size() + 2) - 1);
    }
    tok->decode(ids);
  } catch (const Error&) {
  }
  return 0;
}
