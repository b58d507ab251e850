// The recipe schema (cli/recipe_schema.h) against docs/recipe.md and the resolved recipe: every key
// has its docs row with the schema's type and default; every key `validate` prints is documented;
// resolution leaves no auto but the two host-dependent ones; the table itself is well formed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "cli/recipe_emit.h"
#include "cli/recipe_load.h"
#include "cli/recipe_schema.h"
#include "common/strings.h"

using namespace llmtrain;
namespace fs = std::filesystem;

namespace {

struct DocRow {
  std::string type, fallback;
};

// The cells of a markdown table row, split at bars that are not escaped (`\|` is a bar inside a cell).
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  for (size_t i = 1; i < line.size(); ++i) {
    if (line[i] == '|' && line[i - 1] != '\\') {
      out.push_back(std::string(trim(cell)));
      cell.clear();
    } else {
      cell += line[i];
    }
  }
  return out;
}

// docs/recipe.md's key tables: `key` → its type and default cells.
std::map<std::string, DocRow> docs_rows() {
  std::ifstream in(fs::path(LLMTRAIN_SOURCE_DIR) / "docs/recipe.md");
  EXPECT_TRUE(in) << "docs/recipe.md is missing";
  std::map<std::string, DocRow> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (!starts_with(line, "| `")) continue;
    const std::vector<std::string> c = cells(line);
    if (c.size() < 4 || c[0].size() < 3) continue;
    rows[c[0].substr(1, c[0].size() - 2)] = {c[1], c[2]};
  }
  return rows;
}

std::string write_temp(const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("llmtrain_schema_" + std::to_string(getpid()) + ".yaml");
  std::ofstream(p) << text;
  return p.string();
}

TEST(RecipeSchema, EveryKeyHasItsDocsRowWithTheSchemasTypeAndDefault) {
  const std::map<std::string, DocRow> rows = docs_rows();
  ASSERT_GT(rows.size(), 50u);
  for (const cli::RecipeKey& k : cli::recipe_schema()) {
    if (k.section && cli::parent_key(k.key).empty()) continue;  // top-level sections are the page's headings
    SCOPED_TRACE(k.key);
    const auto row = rows.find(k.key);
    ASSERT_NE(row, rows.end()) << "docs/recipe.md has no row for `" << k.key << "`";
    EXPECT_EQ(row->second.type, k.type) << "the type column of `" << k.key << "`";
    EXPECT_EQ(row->second.fallback, k.fallback) << "the default column of `" << k.key << "`";
  }
  const std::vector<std::string> keys = cli::recipe_schema_keys();
  for (const auto& [key, row] : rows)
    EXPECT_NE(std::find(keys.begin(), keys.end(), key), keys.end())
        << "docs/recipe.md documents `" << key << "`, which the schema does not have";
}

TEST(RecipeSchema, EachEntryIsComplete) {
  std::vector<std::string> seen;
  for (const cli::RecipeKey& k : cli::recipe_schema()) {
    SCOPED_TRACE(k.key);
    EXPECT_FALSE(k.type.empty() || k.fallback.empty() || k.doc.empty());
    EXPECT_EQ(k.doc.find('\n'), std::string::npos) << "one line of documentation";
    if (!k.section) {
      EXPECT_TRUE(k.parse && k.emit);
    }
    const std::string parent = cli::parent_key(k.key);
    if (!parent.empty()) {  // a section comes before its keys
      EXPECT_NE(std::find(seen.begin(), seen.end(), parent), seen.end());
    }
    EXPECT_EQ(std::find(seen.begin(), seen.end(), k.key), seen.end()) << "declared twice";
    seen.push_back(k.key);
  }
}

// The keys of recipe_to_yaml's output, dotted by indentation, with their values.
std::vector<std::pair<std::string, std::string>> printed_keys(const std::string& yaml) {
  std::vector<std::pair<std::string, std::string>> out;
  std::vector<std::string> path;
  std::istringstream in(yaml);
  std::string line;
  while (std::getline(in, line)) {
    const size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos || line[indent] == '-') continue;  // data.train's items
    const size_t colon = line.find(':');
    path.resize(indent / 2);
    path.push_back(line.substr(indent, colon - indent));
    out.push_back({join(path, "."), std::string(trim(line.substr(colon + 1)))});
  }
  return out;
}

TEST(RecipeSchema, EveryKeyValidatePrintsIsDocumentedAndResolved) {
  const std::map<std::string, DocRow> rows = docs_rows();
  const std::string file = write_temp(
      "name: t\nmodel: {family: llama, layers: 2, hidden: 64, heads: 4, seq_len: 32}\ndata: {train: data/x}\n"
      "train: {steps: 10, micro_batch: 2}\nparallel: {zero: 1}\nlaunch: {procs_per_node: 2}\n");
  const cli::LoadedRecipe loaded = cli::recipe_load(file, {});
  fs::remove(file);
  std::set<std::string> host_auto, takes_auto;  // (checkpoint.resume's `auto` is a mode, not a default)
  for (const cli::RecipeKey& k : cli::recipe_schema()) {
    if (k.host_auto) host_auto.insert(k.key);
    if (k.type.find("or auto") != std::string::npos) takes_auto.insert(k.key);
  }
  EXPECT_EQ(host_auto, (std::set<std::string>{"train.threads", "log.peak_tflops"}));
  const auto printed = printed_keys(cli::recipe_to_yaml(loaded.recipe));
  EXPECT_GT(printed.size(), 70u);
  for (const auto& [key, value] : printed) {
    SCOPED_TRACE(key);
    const bool top_section = key.find('.') == std::string::npos && value.empty();
    if (!top_section) {
      EXPECT_TRUE(rows.count(key)) << "validate prints `" << key << "`, docs/recipe.md lacks it";
    }
    if (takes_auto.count(key) && !host_auto.count(key)) {
      EXPECT_NE(value, "auto") << "resolution left `" << key << "` auto";
    }
  }
  // zero_group's auto: the dp group at zero ≥ 1, a group of one at zero 0.
  EXPECT_EQ(loaded.recipe.parallel.dp, 2);
  EXPECT_EQ(loaded.recipe.parallel.zero_group, 2);
  const std::string zero0 = write_temp(
      "name: t\nmodel: {family: gpt2, layers: 2, hidden: 64, heads: 4, seq_len: 32}\ndata: {train: data/x}\n"
      "train: {steps: 10, micro_batch: 2}\n");
  EXPECT_EQ(cli::recipe_load(zero0, {}).recipe.parallel.zero_group, 1);
  fs::remove(zero0);
}

}  // namespace
