// `llmtrain prep` on a JSONL file (one worker, the byte tokenizer), once stopping at the first bad
// record and once skipping bad records: reading lines, JSON (depth-bounded), the key, the text.
#include "tests/fuzz/fuzz_util.h"
#include "trainer/data/data_prep.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmtrain;
  fuzz::quiet();
  const auto dir = fuzz::scratch_dir();
  const auto input = (dir / "input.jsonl").string();
  fuzz::write_file(input, fuzz::bytes(data, size));
  for (bool skip_bad : {false, true}) {
    trainer::PrepOptions o;
    o.inputs = {input};
    o.format = "jsonl";
    o.output = (dir / "out").string();
    o.workers = 1;
    o.skip_bad = skip_bad;
    o.max_document_mib = 1;
    o.progress_interval_s = 0;
    try {
      trainer::prep_run(o);
    } catch (const Error&) {
    }
  }
  return 0;
}
