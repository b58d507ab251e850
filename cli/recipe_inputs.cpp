#include "cli/recipe_inputs.h"

#include <fmt/format.h>

#include <filesystem>

#include "common/strings.h"

namespace llmtrain::cli {
namespace fs = std::filesystem;
namespace {

bool exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

RecipeInput dataset(std::string key, std::string where, const std::string& prefix) {
  RecipeInput in{std::move(key), std::move(where), prefix, true, {}, ""};
  for (const char* ext : {".bin", ".idx"})
    if (!exists(prefix + ext)) in.missing.push_back(prefix + ext);
  // A file of the pair given for its prefix (data/train.bin): the prefix without the suffix is it.
  for (const char* ext : {".bin", ".idx"}) {
    const std::string bare = prefix.substr(0, prefix.size() - std::string_view(ext).size());
    if (!in.missing.empty() && prefix.ends_with(ext) && exists(bare + ".bin") && exists(bare + ".idx"))
      in.suggestion = bare;
  }
  return in;
}

const YamlValue* child(const YamlValue* v, const char* key) {
  return v && v->kind == YamlValue::Kind::map ? v->find(key) : nullptr;
}

std::string location(const YamlValue* v, const std::string& fallback) {
  return v && !v->location().empty() ? v->location() : fallback;
}

}  // namespace

std::vector<RecipeInput> recipe_inputs(const LoadedRecipe& loaded) {
  const Recipe& r = loaded.recipe;
  const YamlValue* data = child(&loaded.tree, "data");
  std::vector<RecipeInput> out;

  // data.train is one PREFIX, or a list of prefixes or {path, weight} maps (cli/recipe_parse.cpp).
  const YamlValue* train = child(data, "train");
  const bool listed = train && train->kind == YamlValue::Kind::sequence;
  for (size_t i = 0; i < r.data.train.size(); ++i) {
    const YamlValue* item = listed && i < train->items.size() ? &train->items[i] : nullptr;
    const bool map = item && item->kind == YamlValue::Kind::map;
    std::string key = !listed ? "data.train" : fmt::format("data.train[{}]{}", i, map ? ".path" : "");
    const YamlValue* at = map ? item->find("path") : listed ? item : train;
    out.push_back(dataset(key, location(at, loaded.file), r.data.train[i].path));
  }
  if (!r.data.valid.empty())
    out.push_back(dataset("data.valid", location(child(data, "valid"), loaded.file), r.data.valid));

  RecipeInput tok{"data.tokenizer", location(child(data, "tokenizer"), loaded.file), r.data.tokenizer, false, {}, ""};
  if (tok.path != "byte" && !exists(tok.path)) tok.missing.push_back(tok.path);
  out.push_back(tok);
  return out;
}

std::string describe_input(const RecipeInput& in) {
  std::string what = in.dataset ? in.path + " (.bin + .idx)" : in.path == "byte" ? "byte (built in)" : in.path;
  if (in.missing.empty()) return printable(fmt::format("{:<20} {}", in.key, what));
  return printable(fmt::format("{:<20} {}: MISSING ({} {} not exist{})", in.key, what, join(in.missing, " and "),
                               in.missing.size() == 1 ? "does" : "do",
                               in.suggestion.empty() ? "" : "; the dataset is " + in.suggestion + ": drop the suffix"));
}

void require_recipe_inputs(const LoadedRecipe& loaded) {
  std::vector<Diagnostic> diags;
  for (const RecipeInput& in : recipe_inputs(loaded)) {
    if (in.missing.empty()) continue;
    if (in.dataset && !in.suggestion.empty())
      diags.push_back({in.where, in.key,
                       fmt::format("dataset {}: {} {} not exist", in.path, join(in.missing, " and "),
                                   in.missing.size() == 1 ? "does" : "do"),
                       fmt::format("a dataset is named by its PREFIX, without .bin or .idx: drop the suffix ({} "
                                   "names {}.bin and {}.idx, which are there)",
                                   in.suggestion, in.suggestion, in.suggestion),
                       /*io=*/true});
    else if (in.dataset)
      diags.push_back({in.where, in.key,
                       fmt::format("dataset {}: {} {} not exist", in.path, join(in.missing, " and "),
                                   in.missing.size() == 1 ? "does" : "do"),
                       fmt::format("a dataset is a PREFIX naming PREFIX.bin and PREFIX.idx; create it with `llmtrain "
                                   "prep --input FILE... --tokenizer ... --output {}`, or fix the path (a relative "
                                   "path starts at the folder llmtrain runs in)",
                                   in.path),
                       /*io=*/true});
    else
      diags.push_back({in.where, in.key, fmt::format("tokenizer {} does not exist", in.path),
                       "give byte, a tokenizer.json, GPT-2's vocab.json (merges.txt beside it) or a folder holding "
                       "them (a relative path starts at the folder llmtrain runs in)",
                       /*io=*/true});
  }
  if (!diags.empty()) throw RecipeError(std::move(diags));
}

}  // namespace llmtrain::cli
