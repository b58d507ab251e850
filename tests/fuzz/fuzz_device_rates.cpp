// A device-rates file as `llmtrain plan --rates` reads it (planner::apply_measured_rates): the JSON
// (depth-bounded), every rate a finite number in range, the strings it records made printable.
#include "planner/device_catalog.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmtrain;
  fuzz::quiet();
  planner::DeviceSpec d = planner::device_lookup("h100");
  try {
    planner::apply_measured_rates_text(d, fuzz::bytes(data, size), "rates.json");
  } catch (const Error&) {
  }
  return 0;
}
