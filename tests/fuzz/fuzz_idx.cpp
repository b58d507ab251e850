// A Megatron indexed dataset: the input is the .idx file; the .bin beside it holds as many bytes as
// the input's first two bytes say (so the fuzzer can make them agree or not). Every document is
// then read, as training would.
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "trainer/data/indexed_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmtrain;
  fuzz::quiet();
  if (size < 2) return 0;
  const size_t bin_bytes = size_t(data[0]) | size_t(data[1]) << 8;
  const auto prefix = (fuzz::scratch_dir() / "data").string();
  fuzz::write_file(trainer::index_file(prefix), fuzz::bytes(data + 2, size - 2));
  fuzz::write_file(trainer::data_file(prefix), std::string(bin_bytes, '\x01'));
  try {
    trainer::IndexedDataset ds(prefix);
    for (int64_t d = 0; d < ds.num_documents() && d < 64; ++d) ds.document(d);
    for (int64_t s = 0; s < ds.num_sequences() && s < 64; ++s) ds.sequence(s);
    ds.describe();
    ds.lengths_crc32c();
  } catch (const Error&) {
  }
  return 0;
}
