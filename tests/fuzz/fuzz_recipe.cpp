// A recipe file, through everything `llmtrain validate` does before any rank starts: YAML,
// schema, types, ranges, resolution of auto fields (tokenizer files named in it are read, bounded)
// and the cross-checks of the layout. The fuzzer's input is the file.
#include "cli/recipe_load.h"
#include "cli/recipe_parse.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmtrain;
  fuzz::quiet();
  fuzz::MemFile file(fuzz::bytes(data, size));
  try {
    cli::recipe_load(file.path(), {});
  } catch (const cli::RecipeError&) {
  } catch (const Error&) {
  }
  return 0;
}
