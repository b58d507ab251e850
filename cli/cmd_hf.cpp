// `llmtrain export CKPT --hf OUT` and `llmtrain import HF_DIR --out CKPT`: the Hugging Face bridge
// (trainer/checkpoint/hf_bridge.h knows transformers' fields and layouts; this file moves the files).
// Both write atomically: export builds OUT.partial and renames it; import writes a checkpoint the
// way training does.
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <set>

#include "cli/commands.h"
#include "cli/recipe_load.h"
#include "cli/recipe_parse.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/json_depth.h"
#include "common/log.h"
#include "common/strings.h"
#include "kernels/dtype_convert.h"
#include "parallel/comm/comm.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_inspect.h"
#include "trainer/checkpoint/hf_bridge.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/data/tokenizer_load.h"

namespace llmtrain::cli {
namespace fs = std::filesystem;
using kernels::DType;
using nlohmann::json;

namespace {

ModelConfig manifest_model(const trainer::Manifest& manifest, const std::string& step) {
  ParsedRecipe parsed = recipe_parse_text(manifest.recipe_yaml, step + "/manifest.json (recipe)", {});
  if (!parsed.diags.empty()) throw RecipeError(std::move(parsed.diags));
  return parsed.recipe.model;
}

std::unique_ptr<trainer::Tokenizer> manifest_tokenizer(const trainer::Manifest& manifest, const std::string& step) {
  if (manifest.tokenizer_kind == trainer::kTokenizerKindByte) return trainer::load_tokenizer("byte");
  const std::string file = (fs::path(step) / manifest.tokenizer).string();
  return trainer::load_tokenizer_from_bytes(manifest.tokenizer_kind, read_file(file), file);
}

// The values of `v` as `dtype`'s little-endian words.
std::string encode_tensor(const std::vector<float>& v, DType dtype) {
  std::string out;
  if (dtype == DType::fp32) {
    out.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    return out;
  }
  out.resize(v.size() * 2);
  auto* w = reinterpret_cast<uint16_t*>(out.data());
  for (size_t i = 0; i < v.size(); ++i)
    w[i] = dtype == DType::bf16 ? kernels::fp32_to_bf16(v[i]) : kernels::fp32_to_fp16(v[i]);
  return out;
}

void write_json(const fs::path& path, const json& j) {
  write_file_atomic(default_file_system(), path.string(), j.dump(2) + "\n");
}

}  // namespace

int cmd_export(const ExportArgs& args) {
  const std::string step = trainer::checkpoint_step_path(args.checkpoint);
  const trainer::Manifest manifest = trainer::checkpoint_read_manifest(step);
  const ModelConfig cfg = manifest_model(manifest, step);
  const DType dtype = args.dtype == "bf16" ? DType::bf16 : args.dtype == "fp16" ? DType::fp16 : DType::fp32;
  const std::string torch_dtype = dtype == DType::bf16 ? "bfloat16" : dtype == DType::fp16 ? "float16" : "float32";
  auto tok = manifest_tokenizer(manifest, step);
  const int32_t eod = tok->eod_id();
  const json config = trainer::hf_model_config(cfg, torch_dtype, eod, eod);  // refuses what transformers cannot hold
  if (cfg.moe.enabled() && cfg.moe.capacity_factor > 0)
    log_warn(
        "model.moe.capacity_factor {} is not exported: transformers' Mixtral is dropless, so where a forward of "
        "ours drops picks over an expert's capacity its outputs differ (docs/hf.md)",
        cfg.moe.capacity_factor);

  // The output: created fresh, never through or over what is there. Everything is written into a
  // new scratch directory beside it (a name no one can predict or have made) that takes the
  // output's name when complete; an empty directory there is replaced by that rename alone.
  fs::path out = fs::absolute(args.output).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // DIR/ is DIR: its scratch must not be inside it
  if (out == out.root_path())
    throw Error(fmt::format("--hf {}: not a directory to create", args.output), "give a new directory");
  std::error_code ec;
  const auto status = fs::symlink_status(out, ec);
  if (fs::exists(status) && !(fs::is_directory(status) && fs::is_empty(out, ec)))
    throw Error(fmt::format("{} already exists and is not an empty directory", out.string()),
                "export into a new directory (nothing is overwritten)");
  trainer::checkpoint_check_model_fits(step, manifest, cfg, 2.2, "exporting " + step);  // before anything is allocated
  FileSystem& fsys = default_file_system();
  fsys.make_dirs(out.parent_path().string());  // (as mkdir -p: the folders above OUT)
  const fs::path partial = make_temp_dir(out.string() + ".partial");
  struct RemoveUnlessDone {
    const fs::path& dir;
    bool done = false;
    ~RemoveUnlessDone() {
      std::error_code ignored;
      if (!done) fs::remove_all(dir, ignored);  // ours: made above, under a name no one else had
    }
  } scratch{partial};

  // The tensors, in the model's order (a fused one where its first part is), cut into shards of at
  // most max_shard_bytes.
  const auto params = trainer::checkpoint_read_params(step, cfg);
  struct HfTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> values;
  };
  std::vector<HfTensor> hf;
  std::map<std::string, size_t> fused_at;  // gpt-oss's fused expert tensors: their index in hf
  for (const trainer::ParamSpec& p : trainer::model_param_specs(cfg)) {
    const trainer::HfTensorLayout layout = trainer::hf_tensor_layout(cfg, p);
    if (!layout.fused_only) {
      hf.push_back({layout.name, layout.shape, trainer::to_hf_layout(layout, p, params.at(p.name).data())});
      continue;
    }
    auto [it, fresh] = fused_at.emplace(layout.fused_name, hf.size());
    if (fresh) {
      int64_t n = 1;
      for (int64_t d : layout.fused_shape) n *= d;
      hf.push_back({layout.fused_name, layout.fused_shape, std::vector<float>(static_cast<size_t>(n))});
    }
    trainer::to_hf_fused(layout, p, params.at(p.name).data(), hf[it->second].values.data());
  }
  struct Item {
    std::string name;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::vector<std::vector<Item>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (HfTensor& t : hf) {
    Item item{t.name, t.shape, encode_tensor(t.values, dtype)};
    t.values = {};  // freed as it is encoded
    if (!shards.back().empty() && shard_bytes + item.bytes.size() > args.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shard_bytes += item.bytes.size();
    total += item.bytes.size();
    shards.back().push_back(std::move(item));
  }
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = shards.size() == 1 ? "model.safetensors"
                                                : fmt::format("model-{:05}-of-{:05}.safetensors", s + 1, shards.size());
    std::vector<trainer::SafetensorsEntry> entries;
    for (const Item& it : shards[s]) {
      entries.push_back({it.name, dtype, it.shape, it.bytes.data()});
      weight_map[it.name] = name;
    }
    auto file = fsys.create((partial / name).string());
    // transformers requires the "format" metadata of files written by save_pretrained.
    trainer::safetensors_write(entries, {{"format", "pt"}}, [&](const void* d, size_t n) { file->append(d, n); });
    file->sync();
    file->close();
  }
  if (shards.size() > 1)
    write_json(partial / "model.safetensors.index.json",
               json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  write_json(partial / "config.json", config);
  write_json(partial / "generation_config.json", trainer::hf_generation_config(eod, eod));
  for (const auto& [name, text] : trainer::hf_tokenizer_files(*tok, cfg.max_positions))
    write_file_atomic(fsys, (partial / name).string(), text);
  fsys.sync_dir(partial.string());
  const mode_t mask = ::umask(0);  // mkdtemp made it 0700; an export is as readable as any directory
  ::umask(mask);
  fs::permissions(partial, fs::perms(0777 & ~mask), ec);
  fsys.rename(partial.string(), out.string());  // rename(2) replaces an empty directory, and nothing else
  scratch.done = true;
  fsys.sync_dir(out.parent_path().string());
  log_info("exported {} (step {}, {} {} layers, {}) to {}: {} tensor file{}, {}", step, manifest.step,
           to_string(cfg.family), cfg.layers, torch_dtype, out.string(), shards.size(), shards.size() == 1 ? "" : "s",
           format_bytes(double(total)));
  return kExitOk;
}

}  // namespace llmtrain::cli
