// A Hugging Face model.safetensors.index.json (`llmtrain import` of a sharded model): the JSON
// (depth-bounded), its weight_map, and every file it names (which must be a plain file name of the
// model directory, never a path out of it).
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/json_depth.h"
#include "common/strings.h"
#include "tests/fuzz/fuzz_util.h"
#include "trainer/checkpoint/hf_bridge.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmtrain;
  fuzz::quiet();
  const std::string_view text = fuzz::bytes(data, size);
  try {
    require_json_depth(text, "model.safetensors.index.json");
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return 0;
    for (const auto& [tensor, file] : trainer::hf_read_weight_index(j, "model.safetensors.index.json"))
      if (!is_plain_file_name(file)) std::abort();  // a path out of the directory got through
  } catch (const Error&) {
  }
  return 0;
}
