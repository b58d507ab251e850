// The recipe `llmtrain import` derives, round trip: a config.json (as import reads it) and the
// strings that go into the recipe (the model directory's path, the output path), written by
// recipe_derived_yaml and parsed back. The property beyond "an llmtrain::Error or nothing": the
// text parses to exactly the values written and gains no key — or, when a string holds a control
// character, is refused as a value (never read as YAML syntax).
//
// Input: config.json, then '\0', the model directory's path, '\0', the output path.
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "cli/recipe_emit.h"
#include "cli/recipe_parse.h"
#include "common/json_depth.h"
#include "common/strings.h"
#include "tests/fuzz/fuzz_util.h"
#include "trainer/checkpoint/hf_bridge.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmtrain;
  fuzz::quiet();
  const std::string_view text = fuzz::bytes(data, size);
  const size_t a = text.find('\0');
  const size_t b = a == std::string_view::npos ? a : text.find('\0', a + 1);
  const std::string_view config = text.substr(0, a);
  const std::string dir(a == std::string_view::npos ? "/models/m" : text.substr(a + 1, b - a - 1));
  // (import makes --out absolute: never "auto" or "none", the keywords of checkpoint.resume.)
  const std::string out = "/" + std::string(b == std::string_view::npos ? "ckpt/m" : text.substr(b + 1));
  ModelConfig m;  // a valid model when config.json is not
  m.family = ModelFamily::gpt2, m.layers = 2, m.hidden = 64, m.heads = 4, m.kv_heads = 4, m.ffn_hidden = 256;
  m.vocab = 300, m.seq_len = 32, m.max_positions = 32;
  try {
    require_json_depth(config, "config.json");
    nlohmann::json j = nlohmann::json::parse(config, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) m = trainer::hf_read_model_config(j, "config.json").model;
  } catch (const Error&) {
  }
  std::string yaml;
  try {
    yaml = cli::recipe_derived_yaml(m, "run", out + "/step_00000000/tokenizer.json", out, dir + "/config.json");
  } catch (const Error&) {
    if (text_problem(dir).empty() && text_problem(out).empty()) std::abort();  // refused good text
    return 0;
  }
  cli::ParsedRecipe p = cli::recipe_parse_text(yaml, "the derived recipe", {});
  if (p.recipe.name != "run" || p.recipe.parallel.tp != 1 || p.recipe.train.steps != 1000) std::abort();  // a key added
  // What the recipe's schema refuses of config.json's numbers (a range of its own) is a refusal of
  // model: keys; anything else refused is a string read wrong (or YAML syntax made of one).
  bool model_refused = false;
  for (const auto& d : p.diags) {
    if (starts_with(d.key, "model.")) {
      model_refused = true;
    } else if (text_problem(out).empty()) {
      std::abort();
    }
  }
  if (!text_problem(out).empty()) {
    if (p.diags.empty()) std::abort();  // a control character read back as something else
    return 0;
  }
  if (p.recipe.checkpoint.resume_path != out || p.recipe.data.tokenizer != out + "/step_00000000/tokenizer.json")
    std::abort();
  // The model's numbers back as written (the emitter prints doubles exactly).
  if (!model_refused &&
      (p.recipe.model.layers != m.layers || p.recipe.model.hidden != m.hidden || p.recipe.model.vocab != m.vocab ||
       p.recipe.model.norm_eps != m.norm_eps || p.recipe.model.rope_theta != m.rope_theta ||
       p.recipe.model.tie_embeddings != m.tie_embeddings || p.recipe.model.moe.experts != m.moe.experts ||
       (m.moe.enabled() &&
        (p.recipe.model.moe.top_k != m.moe.top_k || p.recipe.model.moe.ffn_hidden != m.moe.ffn_hidden ||
         p.recipe.model.moe.aux_loss != m.moe.aux_loss || p.recipe.model.moe.z_loss != m.moe.z_loss ||
         p.recipe.model.moe.renormalize != m.moe.renormalize))))
    std::abort();
  return 0;
}
