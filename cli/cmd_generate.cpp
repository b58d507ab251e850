// `llmtrain generate CKPT`: load a checkpoint's weights, recipe and tokenizer, and sample text from
// it with a KV cache, streaming each token to stdout as it is produced; then says on stderr why it
// stopped (end of document, --max-tokens, the model's context full).
#include <cstdio>
#include <filesystem>
#include <optional>

#include "cli/commands.h"
#include "cli/recipe_parse.h"
#include "common/checkpoint_dir.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/json_depth.h"
#include "common/log.h"
#include "common/strings.h"
#include "parallel/comm/comm.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_inspect.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/data/tokenizer.h"
#include "trainer/data/tokenizer_load.h"
#include "trainer/model/generate.h"
#include "trainer/model/model.h"

namespace llmtrain::cli {
namespace fs = std::filesystem;

namespace {

// The step directories to try, newest first: the given one, or those of a checkpoint directory
// (or of a run directory's ckpt/).
std::vector<std::string> step_dirs(const std::string& path) {
  if (fs::exists(fs::path(path) / kManifestFile)) return {path};
  if (!fs::is_directory(path))
    throw Error(fmt::format("{} does not exist", path),
                "give a checkpoint: runs/<name>, runs/<name>/ckpt or a step_<N>/");
  auto dirs = checkpoint_candidates(path);
  if (dirs.empty() && fs::is_directory(fs::path(path) / "ckpt"))
    dirs = checkpoint_candidates((fs::path(path) / "ckpt").string());
  if (dirs.empty())
    throw Error(fmt::format("{} holds no checkpoint (no manifest.json, no step_<N>/, no ckpt/)", path),
                "give a checkpoint: runs/<name>, runs/<name>/ckpt or a step_<N>/");
  return dirs;
}

// The logits after each prompt token ([tokens, vocab], the real ids only) and the ids, as a
// safetensors file: what a comparison with another implementation of the model reads.
void write_prompt_logits(trainer::KvCacheDecoder& decoder, const std::vector<int32_t>& prompt,
                         const std::string& path) {
  const int64_t vocab = decoder.vocab(), n = static_cast<int64_t>(prompt.size());
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  for (int64_t t = 0; t < n; ++t) {
    std::span<const float> row = decoder.append(std::span<const int32_t>(&prompt[size_t(t)], 1));
    std::copy(row.begin(), row.begin() + vocab, logits.begin() + t * vocab);
  }
  decoder.reset();
  std::string bytes;
  trainer::safetensors_write(
      {{"logits", kernels::DType::fp32, {n, vocab}, logits.data()}, {"ids", kernels::DType::int32, {n}, prompt.data()}},
      {}, [&](const void* d, size_t k) { bytes.append(static_cast<const char*>(d), k); });
  write_file_atomic(default_file_system(), path, bytes);
}

// --prompt-ids "1,2,3": every element a token id, none empty (CLI11's own splitting would drop the
// empty element of "1,,2" without a word).
std::vector<int32_t> parse_prompt_ids(const std::string& text) {
  std::vector<int32_t> ids;
  const std::vector<std::string> parts = split(text, ',');
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string id = trim(parts[i]);
    const auto v = parse_int64(id);
    if (!v || *v < 0 || *v > INT32_MAX)
      throw Error(fmt::format("--prompt-ids {}: element {} is {}", printable(text), i + 1,
                              id.empty() ? "empty" : "\"" + printable(id) + "\", not a token id"),
                  "give token ids separated by commas: --prompt-ids 464,3290,286");
    ids.push_back(int32_t(*v));
  }
  return ids;
}

}  // namespace

int cmd_generate(const GenerateArgs& args) {
  const std::vector<int32_t> prompt_ids =
      args.prompt_ids_given ? parse_prompt_ids(args.prompt_ids) : std::vector<int32_t>{};
  if (args.max_tokens < 1)
    throw Error(fmt::format("--max-tokens {}: expected at least 1", args.max_tokens), "give the tokens to generate");
  if (args.temperature == 0 && (args.top_k > 0 || args.top_p < 1.0))
    log_warn("--temperature 0 picks the likeliest token every time: --top-k and --top-p have no effect");
  auto world = parallel::make_local_comm();
  for (const std::string& dir : step_dirs(args.checkpoint)) {
    // The recipe the checkpoint was trained with gives the model's shape.
    std::string manifest_path = (fs::path(dir) / kManifestFile).string();
    const std::string manifest_text = read_file(manifest_path);
    require_json_depth(manifest_text, manifest_path);
    auto j = nlohmann::json::parse(manifest_text, nullptr, false);
    if (j.is_discarded()) {
      log_warn("skipping {}: {} is not valid JSON", dir, manifest_path);
      continue;
    }
    trainer::Manifest manifest = trainer::manifest_from_json(j, manifest_path);
    ParsedRecipe parsed = recipe_parse_text(manifest.recipe_yaml, manifest_path + " (recipe)", {});
    if (!parsed.diags.empty()) throw RecipeError(std::move(parsed.diags));
    ModelConfig cfg = parsed.recipe.model;

    std::unique_ptr<trainer::Tokenizer> tok;
    if (manifest.tokenizer_kind == trainer::kTokenizerKindByte) {
      tok = trainer::load_tokenizer("byte");
    } else {
      std::string file = (fs::path(dir) / manifest.tokenizer).string();
      tok = trainer::load_tokenizer_from_bytes(manifest.tokenizer_kind, read_file(file), file);
    }
    std::vector<int32_t> prompt = args.prompt_ids_given ? prompt_ids : tok->encode(args.prompt);
    // The ids the tokenizer can decode: the only ones sampled (a model's vocabulary may be padded
    // past the tokenizer's ids) and the only ones a prompt may hold, so that the text never stops
    // half-way at one it cannot.
    std::vector<bool> decodable(size_t(cfg.vocab), false);
    int64_t can_decode = 0;
    for (int32_t id = 0; id < cfg.vocab; ++id) {
      if (id >= tok->vocab_size()) break;
      try {
        tok->decode(std::span<const int32_t>(&id, 1));
        decodable[size_t(id)] = true;
        ++can_decode;
      } catch (const Error&) {
      }
    }
    if (can_decode == 0)
      throw Error(fmt::format("the checkpoint's tokenizer decodes none of the model's {} ids", cfg.vocab),
                  "the checkpoint's tokenizer and model do not belong together");
    for (int32_t id : prompt)
      if (id < 0 || id >= cfg.vocab || !decodable[size_t(id)])
        throw Error(fmt::format("--prompt-ids: {} is not a token id of this model that its tokenizer decodes (0..{})",
                                id, std::min<int64_t>(cfg.vocab, tok->vocab_size()) - 1),
                    "give ids of the checkpoint's tokenizer");
    if (prompt.empty()) {
      if (tok->eod_id() < 0)
        throw Error("the prompt is empty and the tokenizer has no end-of-document token to start from",
                    "give --prompt TEXT");
      prompt.push_back(tok->eod_id());
    }
    // (--max-tokens may be anything up to 2^63 - 1: the sum is taken once it is bounded by the context.)
    const int64_t context = std::min<int64_t>(
        cfg.max_positions, int64_t(prompt.size()) + std::min<int64_t>(args.max_tokens, cfg.max_positions));
    if (int64_t(prompt.size()) >= cfg.max_positions)
      throw Error(fmt::format("the prompt is {} tokens; the model's context is {} (model.max_positions)", prompt.size(),
                              cfg.max_positions),
                  "use a shorter prompt");
    // The model the manifest's recipe describes, checked against the files and this host before it
    // is allocated (a recipe may claim any size).
    try {
      // Besides the parameters: the KV cache of the context, and at least one activation row of each
      // kind per position of model.seq_len (a lower bound: it refuses only what cannot fit).
      const double kv_cache = 2.0 * cfg.layers * double(context) * cfg.kv_heads * double(cfg.head_size()) * 4;
      const double activations = double(cfg.seq_len) * (double(cfg.hidden) + cfg.ffn_hidden + cfg.padded_vocab()) * 4;
      trainer::checkpoint_check_model_fits(dir, manifest, cfg, 2.0, "generating from " + dir, kv_cache + activations);
    } catch (const Error& e) {
      if (e.kind() == Error::Kind::environment) throw;  // too large for this host: not a damaged checkpoint
      log_warn("skipping damaged checkpoint {}: {}", dir, e.what());
      continue;
    }
    // The model runs its training forward with a KV cache of the whole context.
    trainer::ModelOptions opts;
    opts.micro_batch = 1;
    opts.kv_cache_tokens = context;
    trainer::Model model(cfg, opts, *world);
    try {
      trainer::checkpoint_load(dir, trainer::checkpoint_slices(model, nullptr, true, false), *world);
    } catch (const Error& e) {
      log_warn("skipping damaged checkpoint {}: {}", dir, e.what());
      continue;
    }
    log_info("generating from {} (step {}, {} model of {} layers, tokenizer {})", dir, manifest.step,
             to_string(cfg.family), cfg.layers, tok->describe());

    trainer::KvCacheDecoder decoder(model);
    if (!args.logits_out.empty()) write_prompt_logits(decoder, prompt, args.logits_out);
    trainer::GenerateOptions o;
    o.max_tokens = args.max_tokens;
    o.sampling = {args.temperature, args.top_k, args.top_p};
    o.seed = args.seed;
    o.stop_at_eod = !args.ignore_eod;
    if (can_decode < cfg.vocab && !args.ids) {  // --ids decodes nothing: every id, as transformers' generate
      o.allowed = std::move(decodable);
      log_info("sampling among the {} of the model's {} ids its tokenizer decodes", can_decode, cfg.vocab);
    }
    if (!args.ids) std::fputs(args.prompt_ids_given ? tok->decode(prompt).c_str() : args.prompt.c_str(), stdout);
    std::fflush(stdout);
    bool first = true;
    std::optional<trainer::DecodeStream> stream;  // the text each token adds (decode([id]) alone may not be)
    if (!args.ids) stream.emplace(*tok, prompt);
    auto out = trainer::generate(decoder, prompt, tok->eod_id(), o, [&](int32_t id) {
      std::string text = args.ids ? fmt::format("{}{}", first ? "" : " ", id) : stream->next(id);
      first = false;
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    });
    if (stream) {  // a character whose last byte never came: its U+FFFDs, as the whole text has them
      const std::string rest = stream->finish();
      std::fwrite(rest.data(), 1, rest.size(), stdout);
    }
    std::fputs("\n", stdout);
    std::fflush(stdout);
    // Why it stopped, after the text (on stderr, so that stdout is the text alone).
    const int64_t n = static_cast<int64_t>(out.size());
    std::string why =
        n == args.max_tokens ? fmt::format("--max-tokens {} reached", args.max_tokens)
        : decoder.position() >= decoder.capacity()
            ? fmt::format("the model's context of {} tokens is full (model.max_positions)", cfg.max_positions)
            : "end of document (the model produced the end-of-document token)";
    std::fprintf(stderr, "stopped after %lld token%s: %s\n", static_cast<long long>(n), n == 1 ? "" : "s", why.c_str());
    return kExitOk;
  }
  throw Error(fmt::format("no intact checkpoint in {}", args.checkpoint), "see the warnings above");
}

}  // namespace llmtrain::cli
