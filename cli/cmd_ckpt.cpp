// `llmtrain ckpt inspect CKPT`: what a checkpoint holds (step, data position, the layout that wrote
// it, the model, every tensor with its slices and size) and whether every byte of it is intact (every
// checksum verified). Exit 0 when intact, 1 listing every problem when not.
#include <cstdio>

#include "cli/commands.h"
#include "cli/recipe_parse.h"
#include "common/error.h"
#include "common/strings.h"
#include "trainer/checkpoint/checkpoint_inspect.h"
#include "trainer/model/model_spec.h"

namespace llmtrain::cli {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// "tp 2 × pp 2 (interleaved, 2 virtual stages) × dp 2, zero 1, sequence parallel; bf16"
std::string layout_text(const trainer::Manifest& m, const Recipe* r) {
  const trainer::CheckpointMesh& mesh = m.mesh;
  std::string s = fmt::format("tp {}{} × pp {}", mesh.tp, mesh.cp > 1 ? fmt::format(" × cp {}", mesh.cp) : "", mesh.pp);
  if (r && mesh.pp > 1) {
    s += fmt::format(" ({}", to_string(r->parallel.pp_schedule));
    if (r->parallel.virtual_stages > 1) s += fmt::format(", {} virtual stages", r->parallel.virtual_stages);
    s += ")";
  }
  s += fmt::format(" × dp {}, zero {}", mesh.dp, mesh.zero);
  if (mesh.zero > 0 && mesh.zero_group > 0) s += fmt::format(" (shard groups of {})", mesh.zero_group);
  if (r && r->parallel.sequence_parallel) s += ", sequence parallel";
  if (r) s += fmt::format("; trained in {}", to_string(r->train.precision));
  return s;
}

}  // namespace

int cmd_ckpt_inspect(const CkptInspectArgs& args) {
  const std::string step = trainer::checkpoint_step_path(args.checkpoint);
  const trainer::CheckpointReport rep = trainer::checkpoint_inspect(step);
  const trainer::Manifest& m = rep.manifest;
  ParsedRecipe parsed = recipe_parse_text(m.recipe_yaml, step + "/manifest.json (recipe)", {});
  const Recipe* recipe = parsed.diags.empty() ? &parsed.recipe : nullptr;

  // Every string below may come from a file someone else wrote: printed escaped (no terminal
  // control sequence, no line break of its own).
  std::printf("checkpoint %s\n", printable(step).c_str());
  std::printf("  step %lld, %lld samples consumed\n", static_cast<long long>(m.step),
              static_cast<long long>(m.consumed_samples));
  std::printf("  layout: %s\n", layout_text(m, recipe).c_str());
  if (recipe) {
    const ModelConfig& c = recipe->model;
    std::printf(
        "  model: %s, %d layers, hidden %d, %d heads (%d key/value), ffn %d, vocab %d (padded %d), %s parameters\n",
        to_string(c.family), c.layers, c.hidden, c.heads, c.kv_heads, c.ffn_hidden, c.vocab, c.padded_vocab(),
        format_count(double(trainer::count_parameters(c))).c_str());
  } else {
    std::printf("  model: the recorded recipe does not parse (%zu problems)\n", parsed.diags.size());
  }
  std::printf("  tokenizer: %s\n",
              m.tokenizer_kind == "byte" ? "byte" : printable(m.tokenizer_kind + ", " + m.tokenizer).c_str());
  if (m.extra.contains("imported_from"))
    std::printf("  imported from: %s\n",
                printable(m.extra["imported_from"].is_string() ? m.extra["imported_from"].get<std::string>()
                                                               : m.extra["imported_from"].dump())
                    .c_str());
  std::printf("  %-48s %-7s %-16s %6s %10s\n", "tensor", "role", "shape", "slices", "bytes");
  for (const auto& t : rep.tensors)
    std::printf("  %-48s %-7s %-16s %6zu %10s\n", printable(t.tensor->name).c_str(), to_string(t.tensor->role),
                shape_text(t.tensor->shape).c_str(), t.tensor->slices.size(), format_bytes(double(t.bytes)).c_str());
  std::printf("  %zu tensors, %lld slices in %lld files, %s\n", rep.tensors.size(), static_cast<long long>(rep.slices),
              static_cast<long long>(rep.files), format_bytes(double(rep.bytes)).c_str());
  if (rep.problems.empty()) {
    std::printf("  checksums: all %lld slices verified (every 1 MiB chunk and every whole slice)\n",
                static_cast<long long>(rep.slices));
    return kExitOk;
  }
  std::printf("  DAMAGED: %zu problem%s\n", rep.problems.size(), rep.problems.size() == 1 ? "" : "s");
  for (const auto& p : rep.problems) std::printf("    %s\n", printable(p).c_str());
  std::fflush(stdout);
  return kExitFailure;
}

}  // namespace llmtrain::cli
