#include "trainer/data/tokenizer_load.h"

#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_io.h"
#include "common/json_depth.h"
#include "trainer/data/bpe_tokenizer.h"
#include "trainer/data/byte_tokenizer.h"

namespace llmtrain::trainer {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTokenizerHint =
    "data.tokenizer / --tokenizer takes \"byte\", a Hugging Face tokenizer.json, GPT-2's vocab.json (with "
    "merges.txt beside it), or a directory holding one of those";

// SentencePiece's tokenizer.model is not read (docs/data.md says why): every model that ships one on
// the Hugging Face Hub has the equivalent tokenizer.json beside it, or transformers makes one.
[[noreturn]] void refuse_sentencepiece_model(const fs::path& model) {
  const fs::path json = model.parent_path() / "tokenizer.json";
  std::error_code ec;
  if (fs::exists(json, ec))
    throw Error(fmt::format("{}: SentencePiece .model files are not read; the tokenizer.json beside it is the same "
                            "tokenizer",
                            model.string()),
                fmt::format("use {} (or the directory {})", json.string(), model.parent_path().string()));
  const std::string dir = model.parent_path().empty() ? "." : model.parent_path().string();
  throw Error(
      fmt::format("{}: SentencePiece .model files are not read, and there is no tokenizer.json beside it",
                  model.string()),
      fmt::format("make the tokenizer.json with transformers (it needs the sentencepiece and protobuf packages): "
                  "python3 -c \"from transformers import AutoTokenizer; "
                  "AutoTokenizer.from_pretrained('{0}').save_pretrained('{0}')\"",
                  dir));
}

// A tokenizer file: regular and bounded (common/file_io.h), errors with the tokenizer's hint.
std::string read_tokenizer_file(const fs::path& path) {
  try {
    return read_file(path.string());
  } catch (const Error& e) {
    throw Error(fmt::format("tokenizer file: {}", e.what()), kTokenizerHint);
  }
}

std::unique_ptr<Tokenizer> load_gpt2_pair(const fs::path& vocab, const fs::path& merges) {
  std::string v = read_tokenizer_file(vocab), m = read_tokenizer_file(merges);
  std::string origin = vocab.string();
  BpeSpec spec = parse_gpt2_files(v, m, origin + " + " + merges.filename().string());
  nlohmann::json pair = {{"vocab.json", v}, {"merges.txt", m}};
  return std::make_unique<BpeTokenizer>(spec,
                                        TokenizerSource{std::string(kTokenizerKindGpt2Files), pair.dump(), origin});
}

std::unique_ptr<Tokenizer> load_hf_json(const fs::path& path) {
  std::string text = read_tokenizer_file(path);
  BpeSpec spec = parse_hf_tokenizer_json(text, path.string());
  return std::make_unique<BpeTokenizer>(
      spec, TokenizerSource{std::string(kTokenizerKindHfJson), std::move(text), path.string()});
}

// A .json file is a tokenizer.json when its "model" is an object; GPT-2's vocab.json is one flat
// object of ids (where "model" may well be a token).
bool is_hf_json(const fs::path& path) {
  try {
    const std::string text = read_tokenizer_file(path);
    require_json_depth(text, path.string());
    auto j = nlohmann::json::parse(text);
    return !j.is_object() || (j.contains("model") && j["model"].is_object());
  } catch (const nlohmann::json::exception&) {
    return true;  // let the tokenizer.json parser report the syntax error
  }
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  if (spec.empty()) throw Error("no tokenizer given", kTokenizerHint);
  fs::path path(spec);
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / "tokenizer.json")) return load_hf_json(path / "tokenizer.json");
    if (fs::exists(path / "vocab.json") && fs::exists(path / "merges.txt"))
      return load_gpt2_pair(path / "vocab.json", path / "merges.txt");
    if (fs::exists(path / "tokenizer.model")) refuse_sentencepiece_model(path / "tokenizer.model");
    throw Error(fmt::format("{}: a directory without tokenizer.json or vocab.json + merges.txt", spec), kTokenizerHint);
  }
  if (!fs::exists(path, ec))
    throw Error(fmt::format("cannot read tokenizer file {}: it does not exist", spec), kTokenizerHint);
  std::string name = path.filename().string();
  if (name == "merges.txt" || path.extension() == ".txt") {
    fs::path vocab = path.parent_path() / "vocab.json";
    if (!fs::exists(vocab))
      throw Error(
          fmt::format("{}: GPT-2 merges need vocab.json beside them, and {} does not exist", spec, vocab.string()),
          kTokenizerHint);
    return load_gpt2_pair(vocab, path);
  }
  if (path.extension() == ".model") refuse_sentencepiece_model(path);
  if (is_hf_json(path)) return load_hf_json(path);
  fs::path merges = path.parent_path() / "merges.txt";
  if (!fs::exists(merges))
    throw Error(fmt::format("{} looks like GPT-2's vocab.json, but {} does not exist", spec, merges.string()),
                "GPT-2-style tokenizers need vocab.json and merges.txt side by side");
  return load_gpt2_pair(path, merges);
}

std::unique_ptr<Tokenizer> load_tokenizer_from_bytes(std::string_view kind, std::string_view bytes,
                                                     std::string_view origin) {
  if (kind == kTokenizerKindByte) return std::make_unique<ByteTokenizer>();
  if (kind == kTokenizerKindHfJson) {
    BpeSpec spec = parse_hf_tokenizer_json(bytes, origin);
    return std::make_unique<BpeTokenizer>(
        spec, TokenizerSource{std::string(kTokenizerKindHfJson), std::string(bytes), std::string(origin)});
  }
  if (kind == kTokenizerKindGpt2Files) {
    nlohmann::json pair;
    require_json_depth(bytes, origin);
    try {
      pair = nlohmann::json::parse(bytes.begin(), bytes.end());
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: the stored GPT-2 tokenizer is not valid JSON: {}", origin, e.what()));
    }
    if (!pair.is_object() || !pair.contains("vocab.json") || !pair.contains("merges.txt") ||
        !pair["vocab.json"].is_string() || !pair["merges.txt"].is_string())
      throw Error(
          fmt::format("{}: the stored GPT-2 tokenizer needs \"vocab.json\" and \"merges.txt\" strings", origin));
    const auto& v = pair["vocab.json"].get_ref<const std::string&>();
    const auto& m = pair["merges.txt"].get_ref<const std::string&>();
    BpeSpec spec = parse_gpt2_files(v, m, origin);
    return std::make_unique<BpeTokenizer>(
        spec, TokenizerSource{std::string(kTokenizerKindGpt2Files), std::string(bytes), std::string(origin)});
  }
  throw Error(
      fmt::format("{}: unknown tokenizer kind {:?}", origin, std::string(kind)),
      fmt::format("known kinds: {}, {}, {}", kTokenizerKindByte, kTokenizerKindHfJson, kTokenizerKindGpt2Files));
}

}  // namespace llmtrain::trainer
