// A checkpoint's manifest.json: the JSON (depth-bounded), every field's type and range, and the
// slice arithmetic a loader does with what it claims (each slice against the whole tensor).
#include <nlohmann/json.hpp>

#include "common/json_depth.h"
#include "tests/fuzz/fuzz_util.h"
#include "trainer/checkpoint/checkpoint_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmtrain;
  fuzz::quiet();
  const std::string_view text = fuzz::bytes(data, size);
  try {
    require_json_depth(text, "manifest.json");
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return 0;
    trainer::Manifest m = trainer::manifest_from_json(j, "manifest.json");
    for (const auto& t : m.tensors) {
      const trainer::SliceSpec whole = trainer::SliceSpec::whole(t.shape);
      for (const auto& s : t.slices) trainer::slice_overlap(whole, s.slice);
    }
  } catch (const Error&) {
  }
  return 0;
}
