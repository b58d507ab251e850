// A safetensors file (a checkpoint shard, later a Hugging Face model): the header's JSON, dtypes,
// shapes and offsets checked against the file, then every tensor's bytes read.
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "trainer/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmtrain;
  fuzz::quiet();
  fuzz::MemFile file(fuzz::bytes(data, size));
  try {
    trainer::SafetensorsFile st(file.path());
    std::vector<char> buf;
    for (const auto& t : st.tensors()) {
      buf.resize(size_t(t.bytes()));
      st.read(t, buf.data());
    }
  } catch (const Error&) {
  }
  return 0;
}
