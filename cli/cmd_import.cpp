// `llmtrain import HF_DIR --out CKPT [--recipe R]`: a transformers model directory (config.json,
// model.safetensors or its index and shards, tokenizer.json) into a weights-only checkpoint, for
// fine-tuning with checkpoint.load_weights_only. Every tensor of the file must be used (a tensor we
// do not implement is refused, never dropped), every tensor of the model present, shapes exact.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "cli/commands.h"
#include "cli/recipe_emit.h"
#include "cli/recipe_load.h"
#include "cli/recipe_parse.h"
#include "common/checkpoint_dir.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/host.h"
#include "common/json_depth.h"
#include "common/log.h"
#include "common/recipe/recipe_check.h"
#include "common/strings.h"
#include "kernels/dtype_convert.h"
#include "parallel/comm/comm.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/hf_bridge.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/data/tokenizer_load.h"

namespace llmtrain::cli {
namespace fs = std::filesystem;
using kernels::DType;
using nlohmann::json;

namespace {

json read_json_file(const fs::path& path) {
  const std::string text = read_file(path.string());
  require_json_depth(text, path.string());
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) throw Error(fmt::format("{} is not valid JSON", path.string()), "give transformers' files");
  return j;
}

// The safetensors files of a model directory and where each tensor is.
class HfWeights {
 public:
  explicit HfWeights(const fs::path& dir) {
    const fs::path index = dir / "model.safetensors.index.json";
    std::vector<std::string> names;
    std::map<std::string, std::string> listed;  // tensor -> file, as the index says
    if (fs::exists(index)) {
      listed = trainer::hf_read_weight_index(read_json_file(index), index.string());
      std::set<std::string> files;
      for (const auto& [tensor, file] : listed) files.insert(file);
      names.assign(files.begin(), files.end());
    } else if (fs::exists(dir / "model.safetensors")) {
      names = {"model.safetensors"};
    } else {
      throw Error(fmt::format("{} has no model.safetensors (nor model.safetensors.index.json)", dir.string()),
                  fs::exists(dir / "pytorch_model.bin")
                      ? "not supported yet: pytorch_model.bin; save the model with transformers' "
                        "save_pretrained(dir, safe_serialization=True)"
                      : "give a directory written by transformers' save_pretrained or llmtrain export");
    }
    for (const std::string& n : names) files_.emplace_back((dir / n).string());
    for (size_t f = 0; f < files_.size(); ++f)
      for (const auto& t : files_[f].tensors()) {
        if (!where_.emplace(t.name, std::make_pair(f, &t)).second)
          throw Error(fmt::format("tensor {} is in two files ({} and {})", t.name, files_[where_[t.name].first].path(),
                                  files_[f].path()),
                      "the model directory is inconsistent");
        if (!listed.empty() && !listed.count(t.name))
          throw Error(
              fmt::format("{}: tensor {} of {} is not in its weight_map", index.string(), t.name, files_[f].path()),
              "the index does not describe these files: re-save the model with save_pretrained");
      }
    for (const auto& [tensor, file] : listed) {
      auto it = where_.find(tensor);
      if (it == where_.end() || fs::path(files_[it->second.first].path()).filename() != file)
        throw Error(fmt::format("{}: the weight_map puts tensor {} in {}, which does not hold it", index.string(),
                                tensor, file),
                    "the index does not describe these files: re-save the model with save_pretrained");
    }
  }

  const trainer::SafetensorsTensor* find(const std::string& name) const {
    auto it = where_.find(name);
    return it == where_.end() ? nullptr : it->second.second;
  }
  // The tensor as fp32 values (F32, BF16 and F16 are read; others refused).
  std::vector<float> read(const std::string& name) {
    const auto& [f, t] = where_.at(name);
    used_.insert(name);
    std::vector<float> out(static_cast<size_t>(t->numel()));
    if (t->dtype == DType::fp32) {
      files_[f].read(*t, out.data());
    } else if (t->dtype == DType::bf16 || t->dtype == DType::fp16) {
      std::vector<uint16_t> w(out.size());
      files_[f].read(*t, w.data());
      for (size_t i = 0; i < w.size(); ++i)
        out[i] = t->dtype == DType::bf16 ? kernels::bf16_to_fp32(w[i]) : kernels::fp16_to_fp32(w[i]);
    } else {
      throw Error(fmt::format("{}: tensor {} is {}", files_[f].path(), name, kernels::to_string(t->dtype)),
                  "not supported yet: weights that are not F32, BF16 or F16 (quantized models)");
    }
    return out;
  }
  std::vector<std::string> unused() const {
    std::vector<std::string> out;
    for (const auto& [name, ft] : where_)
      if (!used_.count(name)) out.push_back(name);
    return out;
  }

 private:
  std::vector<trainer::SafetensorsFile> files_;
  std::map<std::string, std::pair<size_t, const trainer::SafetensorsTensor*>> where_;
  std::set<std::string> used_;
};

// Buffers transformers saves with some models that are derived, not learned (and not ours).
bool derived_buffer(const std::string& name) {
  for (std::string_view suffix : {".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"})
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return true;
  return false;
}

// The recipe's model against config.json's: one line per field that differs.
void check_recipe_model(const ModelConfig& want, const ModelConfig& have, const std::string& recipe,
                        const std::string& config) {
  std::vector<std::string> bad;
  auto cmp = [&](const char* key, auto a, auto b) {
    if (a != b) bad.push_back(fmt::format("model.{}: the recipe says {}, {} says {}", key, a, config, b));
  };
  cmp("family", std::string(to_string(want.family)), std::string(to_string(have.family)));
  cmp("layers", want.layers, have.layers);
  cmp("hidden", want.hidden, have.hidden);
  cmp("heads", want.heads, have.heads);
  cmp("kv_heads", want.kv_heads, have.kv_heads);
  // A model with a MoE block on every layer (Mixtral) has no MLP: its width is the experts'.
  const bool all_moe = have.moe.enabled() && have.moe.first_dense == 0 && have.moe.every == 1;
  if (!all_moe) cmp("ffn_hidden", want.ffn_hidden, have.ffn_hidden);
  cmp("vocab", want.vocab, have.vocab);
  cmp("max_positions", want.max_positions, have.max_positions);
  cmp("norm_eps", want.norm_eps, have.norm_eps);
  if (have.family == ModelFamily::llama) {
    cmp("rope_theta", want.rope_theta, have.rope_theta);
    cmp("rope_scaling.type", std::string(to_string(want.rope_scaling.type)),
        std::string(to_string(have.rope_scaling.type)));
    if (have.rope_scaling.type != RopeScalingType::none)
      cmp("rope_scaling.factor", want.rope_scaling.factor, have.rope_scaling.factor);
    if (have.rope_scaling.type == RopeScalingType::llama3) {
      cmp("rope_scaling.low_freq_factor", want.rope_scaling.low_freq_factor, have.rope_scaling.low_freq_factor);
      cmp("rope_scaling.high_freq_factor", want.rope_scaling.high_freq_factor, have.rope_scaling.high_freq_factor);
      cmp("rope_scaling.original_max_positions", want.rope_scaling.original_max_positions,
          have.rope_scaling.original_max_positions);
    }
    if (have.rope_scaling.type == RopeScalingType::yarn) {
      const RopeScalingConfig &w = want.rope_scaling, &h = have.rope_scaling;
      cmp("rope_scaling.original_max_positions", w.original_max_positions, h.original_max_positions);
      cmp("rope_scaling.beta_fast", w.beta_fast, h.beta_fast);
      cmp("rope_scaling.beta_slow", w.beta_slow, h.beta_slow);
      cmp("rope_scaling.truncate", w.truncate, h.truncate);
      cmp("rope_scaling.attention_factor (as resolved)", w.yarn_attention_factor(), h.yarn_attention_factor());
    }
    cmp("head_dim", want.head_size(), have.head_size());
    cmp("qkv_bias", want.qkv_bias, have.qkv_bias);
    cmp("o_bias", want.o_bias, have.o_bias);
    cmp("attention_sinks", want.attention_sinks, have.attention_sinks);
    cmp("qk_norm", want.qk_norm, have.qk_norm);
    cmp("sliding_window", want.sliding_window, have.sliding_window);
    cmp("full_attention_every", want.full_attention_every, have.full_attention_every);
    cmp("rope_local_theta", want.rope_local_theta, have.rope_local_theta);
    cmp("query_pre_attn_scalar", want.query_pre_attn_scalar, have.query_pre_attn_scalar);
    cmp("activation", std::string(to_string(want.activation)), std::string(to_string(have.activation)));
    cmp("post_norms", want.post_norms, have.post_norms);
    cmp("scale_embeddings", want.scale_embeddings, have.scale_embeddings);
    cmp("logit_softcap", want.logit_softcap, have.logit_softcap);
    cmp("moe.experts", want.moe.experts, have.moe.experts);
    if (have.moe.enabled()) {
      // The router and experts' shapes and the forward pass; aux_loss and z_loss are the recipe's own
      // (training-only terms).
      cmp("moe.top_k", want.moe.top_k, have.moe.top_k);
      cmp("moe.ffn_hidden", want.moe.ffn_hidden, have.moe.ffn_hidden);
      cmp("moe.every", want.moe.every, have.moe.every);
      cmp("moe.first_dense", want.moe.first_dense, have.moe.first_dense);
      cmp("moe.renormalize", want.moe.renormalize, have.moe.renormalize);
      cmp("moe.shared_ffn_hidden", want.moe.shared_ffn_hidden, have.moe.shared_ffn_hidden);
      cmp("moe.bias", want.moe.bias, have.moe.bias);
      cmp("moe.swiglu_limit", want.moe.swiglu_limit, have.moe.swiglu_limit);
      cmp("moe.swiglu_alpha", want.moe.swiglu_alpha, have.moe.swiglu_alpha);
    }
  }
  cmp("tie_embeddings", want.tie_embeddings, have.tie_embeddings);
  if (!bad.empty())
    throw Error(fmt::format("{} does not describe the model in {}:\n  {}", recipe, config, fmt::join(bad, "\n  ")),
                "set these model: keys as config.json has them, or import without --recipe to derive one");
}

// The tokenizer of a model directory: our byte tokenizer as llmtrain exports it, a tokenizer.json,
// or GPT-2's vocab.json + merges.txt. nullptr when there is none.
std::unique_ptr<trainer::Tokenizer> hf_dir_tokenizer(const fs::path& dir) {
  const fs::path json_file = dir / "tokenizer.json";
  if (fs::exists(json_file)) {
    const std::string bytes = read_file(json_file.string());
    if (bytes == trainer::hf_byte_tokenizer_json()) return trainer::load_tokenizer("byte");
    return trainer::load_tokenizer_from_bytes(trainer::kTokenizerKindHfJson, bytes, json_file.string());
  }
  if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) return trainer::load_tokenizer(dir.string());
  return nullptr;
}

// A run name from the model directory's name (letters, digits, '.', '_' and '-').
std::string run_name(const fs::path& dir) {
  fs::path base = fs::absolute(dir).lexically_normal();
  if (base.filename().empty()) base = base.parent_path();
  std::string name = base.filename().string();
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '-';
  return name.empty() || !std::isalnum(static_cast<unsigned char>(name[0])) ? "imported-" + name : name;
}

// Refuses an output directory that holds anything (but, once taken, our own lock): an import
// creates its checkpoint directory fresh, and never writes into a run's.
void require_fresh_output(const fs::path& out, bool lock_taken) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(out, ec))) return;
  if (!fs::is_directory(fs::symlink_status(out, ec)))
    throw Error(fmt::format("--out {} exists and is not a directory", out.string()),
                "import into a new directory (nothing is overwritten)");
  std::vector<std::string> held;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (!(lock_taken && name == kLockFile)) held.push_back(name);
  }
  if (held.empty() && !ec) return;
  std::sort(held.begin(), held.end());
  const auto holder = lock_taken ? std::nullopt : CheckpointDirLock::recorded(out.string());
  const std::string in_use = holder && !holder->host.empty()
                                 ? fmt::format(": a checkpoint directory locked by host {}, pid {}{}", holder->host,
                                               holder->pid, holder->job.empty() ? "" : ", job " + holder->job)
                                 : "";
  throw Error(
      fmt::format("--out {} is not empty{} (it holds {}{})", out.string(), in_use,
                  join(std::vector<std::string>(held.begin(), held.begin() + std::min<size_t>(held.size(), 5)), ", "),
                  held.size() > 5 ? ", ..." : ""),
      "import into a new directory: an import never writes into a run's checkpoint directory or over files");
}

// --out as an absolute path without a trailing '/', checked to be new or empty.
fs::path output_dir(const std::string& arg) {
  fs::path out = fs::absolute(arg).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  if (out == out.root_path())
    throw Error(fmt::format("--out {}: not a directory to create", arg), "give a new directory");
  require_fresh_output(out, /*lock_taken=*/false);
  return out;
}

}  // namespace

int cmd_import(const ImportArgs& args) {
  const fs::path dir(args.hf_dir);
  if (!fs::is_directory(dir))
    throw Error(fmt::format("{} is not a directory", dir.string()), "give a transformers model directory");
  const fs::path config_path = dir / "config.json";
  if (!fs::exists(config_path))
    throw Error(fmt::format("{} is missing", config_path.string()), "give a transformers model directory");
  trainer::HfImportedConfig hf = trainer::hf_read_model_config(read_json_file(config_path), config_path.string());
  for (const auto& w : hf.warnings) log_warn("{}: {}", config_path.string(), w);

  std::unique_ptr<trainer::Tokenizer> tok = hf_dir_tokenizer(dir);
  ModelConfig cfg = hf.model;
  std::string recipe_yaml;
  if (!args.recipe.empty()) {
    LoadedRecipe loaded = recipe_load(args.recipe, {});
    check_recipe_model(loaded.recipe.model, hf.model, args.recipe, config_path.string());
    cfg = loaded.recipe.model;
    auto recipe_tok = trainer::load_tokenizer(loaded.recipe.data.tokenizer);
    if (tok && (tok->source().kind != recipe_tok->source().kind || tok->source().bytes != recipe_tok->source().bytes))
      throw Error(fmt::format("{}'s data.tokenizer ({}) is not the tokenizer of {}", args.recipe,
                              loaded.recipe.data.tokenizer, dir.string()),
                  "fine-tune with the model's own tokenizer (data.tokenizer: the model directory)");
    if (!tok) tok = std::move(recipe_tok);
    recipe_yaml = recipe_to_yaml(loaded.recipe);
  }
  // A SentencePiece tokenizer.model alone: load_tokenizer says how to get its tokenizer.json.
  if (!tok && fs::exists(dir / "tokenizer.model")) tok = trainer::load_tokenizer(dir.string());
  if (!tok)
    throw Error(fmt::format("{} has no tokenizer (tokenizer.json, or vocab.json + merges.txt)", dir.string()),
                "give --recipe with data.tokenizer, or add the model's tokenizer files");
  if (tok->vocab_size() > cfg.vocab)
    throw Error(
        fmt::format("the tokenizer has {} ids but config.json's vocab_size is {}", tok->vocab_size(), cfg.vocab),
        "the tokenizer does not belong to this model");

  // The output: a new (or empty) directory, never one in use. A checkpoint directory of a run holds
  // its lock and its `latest`: writing step 0 there would roll the run back.
  const fs::path out = output_dir(args.output);
  if (recipe_yaml.empty()) {
    // A fine-tuning starting point: the model as config.json says, this tokenizer, and the
    // imported weights to start from; data.train is the user's to fill in.
    const std::string tokenizer =
        tok->source().kind == trainer::kTokenizerKindByte
            ? "byte"
            : (out / checkpoint_step_dir(0) / trainer::checkpoint_tokenizer_file(tok->source().kind)).string();
    recipe_yaml = recipe_derived_yaml(cfg, run_name(dir), tokenizer, out.string(), config_path.string());
    ParsedRecipe parsed = recipe_parse_text(recipe_yaml, "the derived recipe", {});
    if (!parsed.diags.empty()) throw RecipeError(std::move(parsed.diags));
    // What `llmtrain validate` will say of its model, before anything is written: a config.json
    // transformers takes may still describe a model the recipe refuses (an odd head_dim, which RoPE
    // cannot rotate). The rest (data.train) is the user's to fill in.
    const WorldInfo one{1, "one rank", false};
    const int vocab = tok->vocab_size();
    std::vector<RecipeProblem> problems =
        recipe_resolve(parsed.recipe, one, fs::current_path().string(), [vocab](const std::string&) { return vocab; });
    if (problems.empty()) problems = recipe_check(parsed.recipe, one);
    std::vector<Diagnostic> diags;
    for (const RecipeProblem& p : problems)
      if (p.key.rfind("model.", 0) == 0)
        diags.push_back({config_path.string() + " (its derived recipe)", p.key, p.message, p.hint});
    if (!diags.empty()) throw RecipeError(std::move(diags));
  }

  // The weights, in our layout: every tensor's shape is checked against config.json (and its bytes
  // against the file) before it is read; the model's size against this host before any is.
  const auto specs = trainer::model_param_specs(cfg);
  int64_t model_bytes = 0, largest = 0;
  for (const trainer::ParamSpec& p : specs) {
    model_bytes += p.numel() * 4;
    // A fused expert tensor (transformers 5's gate_up_proj) is read whole: 2 · experts of these.
    largest = std::max(largest, p.numel() * 4 * (p.expert >= 0 ? 2 * cfg.moe.experts : 1));
  }
  require_host_memory(model_bytes + 2 * largest, fmt::format("importing the {}-parameter model of {}",
                                                             format_count(double(model_bytes / 4)), dir.string()));
  HfWeights weights(dir);
  std::vector<std::vector<float>> values;
  std::vector<trainer::CheckpointSlice> slices;
  values.reserve(specs.size());
  std::string fused_name;  // the fused expert tensor read last (its experts are consecutive parameters)
  std::vector<float> fused;
  for (const trainer::ParamSpec& p : specs) {
    const trainer::HfTensorLayout layout = trainer::hf_tensor_layout(cfg, p);
    std::string name = layout.name;
    if (!weights.find(name) && starts_with(name, "transformer.")) name = name.substr(12);  // GPT-2's original files
    if (!layout.fused_name.empty() && (layout.fused_only || !weights.find(name)) && weights.find(layout.fused_name)) {
      // transformers 5's in-memory MoE layout (gpt-oss's only one): this parameter is a part of a
      // fused tensor.
      const trainer::SafetensorsTensor* t = weights.find(layout.fused_name);
      if (t->shape != layout.fused_shape)
        throw Error(fmt::format("{}: tensor {} has shape [{}], config.json implies [{}]", dir.string(),
                                layout.fused_name, fmt::join(t->shape, ", "), fmt::join(layout.fused_shape, ", ")),
                    "the weights do not belong to this config.json");
      if (fused_name != layout.fused_name) {
        fused.clear();
        fused.shrink_to_fit();
        fused = weights.read(layout.fused_name);
        fused_name = layout.fused_name;
      }
      values.emplace_back(static_cast<size_t>(p.numel()));
      trainer::from_hf_fused(layout, p, fused.data(), values.back().data());
      slices.push_back({p.name, trainer::TensorRole::param, p.shape, trainer::SliceSpec::whole(p.shape),
                        kernels::Tensor(values.back().data(), DType::fp32, {p.numel()}), true});
      continue;
    }
    const trainer::SafetensorsTensor* t = weights.find(name);
    if (!t)
      throw Error(fmt::format("{} has no tensor {}", dir.string(), layout.name),
                  "the weights do not belong to this config.json");
    if (t->shape != layout.shape)
      throw Error(fmt::format("{}: tensor {} has shape [{}], config.json implies [{}]", dir.string(), name,
                              fmt::join(t->shape, ", "), fmt::join(layout.shape, ", ")),
                  "the weights do not belong to this config.json");
    std::vector<float> hf_values = weights.read(name);
    values.emplace_back(static_cast<size_t>(p.numel()));
    trainer::from_hf_layout(layout, p, hf_values.data(), values.back().data());
    slices.push_back({p.name, trainer::TensorRole::param, p.shape, trainer::SliceSpec::whole(p.shape),
                      kernels::Tensor(values.back().data(), DType::fp32, {p.numel()}), true});
  }
  for (const std::string& name : weights.unused()) {
    if (derived_buffer(name)) continue;
    if (cfg.tie_embeddings && name == "lm_head.weight") {
      // Some tied models store the head too: accept it only when it is the embedding (its shape
      // first: equal values over a shorter range prove nothing).
      const trainer::HfTensorLayout wte_layout = trainer::hf_tensor_layout(cfg, specs.front());
      const trainer::SafetensorsTensor* head_tensor = weights.find(name);
      std::vector<float> head = head_tensor->shape == wte_layout.shape ? weights.read(name) : std::vector<float>{};
      const std::vector<float>& wte = values.front();
      if (head_tensor->shape == wte_layout.shape && std::equal(head.begin(), head.end(), wte.begin())) continue;
      throw Error(fmt::format("{}: lm_head.weight differs from the token embedding, but tie_word_embeddings is true",
                              dir.string()),
                  "set tie_word_embeddings: false in config.json if the head is its own matrix");
    }
    throw Error(fmt::format("{}: tensor {} is not part of the {} model llmtrain builds from config.json", dir.string(),
                            name, to_string(cfg.family)),
                "not supported yet: this tensor's module (llmtrain refuses rather than drop weights)");
  }

  trainer::CheckpointMeta meta;
  meta.recipe_yaml = recipe_yaml;
  meta.tokenizer_kind = tok->source().kind;
  meta.tokenizer_bytes = tok->source().bytes;
  meta.extra = json{{"imported_from", utf8_sanitize(fs::absolute(dir).string())}};  // a note: JSON holds UTF-8 only
  auto world = parallel::make_local_comm();
  // The lock, as a run takes it, for the time of the write; then the directory must still be ours
  // alone (a run may have started in it since the check above).
  const auto lock = CheckpointDirLock::acquire(out.string(), fmt::format("import:{}", ::getpid()));
  require_fresh_output(out, /*lock_taken=*/true);
  const std::string step = trainer::checkpoint_save(default_file_system(), out.string(), meta, slices, *world, 1);
  if (args.recipe.empty()) write_file_atomic(default_file_system(), (out / "recipe.yaml").string(), recipe_yaml);
  log_info("imported {} ({} model, {} layers, hidden {}, vocab {}) into {}{}", dir.string(), to_string(cfg.family),
           cfg.layers, cfg.hidden, cfg.vocab, step,
           args.recipe.empty() ? fmt::format("; fine-tuning recipe template: {}", (out / "recipe.yaml").string()) : "");
  return kExitOk;
}

}  // namespace llmtrain::cli
