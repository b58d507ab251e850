// A Hugging Face config.json as `llmtrain import` reads it: the JSON (depth-bounded), every field's
// type and range, and the tensor layouts derived from what it claims.
#include <nlohmann/json.hpp>

#include "common/json_depth.h"
#include "tests/fuzz/fuzz_util.h"
#include "trainer/checkpoint/hf_bridge.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmtrain;
  fuzz::quiet();
  const std::string_view text = fuzz::bytes(data, size);
  try {
    require_json_depth(text, "config.json");
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return 0;
    trainer::HfImportedConfig c = trainer::hf_read_model_config(j, "config.json");
    if (c.model.layers > 4) c.model.layers = 4;  // the layouts per layer are alike; keep runs short
    for (const auto& p : trainer::model_param_specs(c.model)) trainer::hf_tensor_layout(c.model, p);
  } catch (const Error&) {
  }
  return 0;
}
