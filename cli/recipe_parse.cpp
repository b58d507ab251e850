// Recipe parsing: the YAML tree (after `--set` overrides) into Recipe, by walking the schema
// (cli/recipe_schema.h): each section's keys in the schema's order, then the keys nobody asked for.
#include "cli/recipe_parse.h"

#include <fmt/format.h>

#include <algorithm>

#include "cli/recipe_schema.h"
#include "cli/recipe_section.h"
#include "common/strings.h"

namespace llmtrain::cli {
namespace {

using Kind = YamlValue::Kind;

// Reads the keys of the section `path` ("" = top level), nested sections included, from `s`.
void parse_section(Section& s, const std::string& path, Recipe& r) {
  for (const RecipeKey& k : recipe_schema()) {
    if (parent_key(k.key) != path) continue;
    const std::string name = leaf(k.key);
    if (k.required) s.required(name);
    if (k.section) {
      Section sub = s.subsection(name);
      parse_section(sub, k.key, r);
    } else {
      k.parse(s, r);
    }
  }
  s.finish();
}

// A misspelt key hides the key it was meant to be (`modle:` hides `model:`): the typo is reported
// first, and the "missing required key" errors of the hidden key and of everything required inside
// it are dropped. Applies to the diagnostics from `first` on.
void put_typos_first(std::vector<Diagnostic>& diags, size_t first) {
  std::vector<std::string> meant;
  for (size_t i = first; i < diags.size(); ++i)
    if (!diags[i].meant.empty()) meant.push_back(diags[i].meant);
  if (meant.empty()) return;
  auto hidden = [&](const Diagnostic& d) {
    if (d.message != "missing required key") return false;
    for (const auto& m : meant)
      if (d.key == m || starts_with(d.key, m + ".")) return true;
    return false;
  };
  diags.erase(std::remove_if(diags.begin() + std::ptrdiff_t(first), diags.end(), hidden), diags.end());
  std::stable_partition(diags.begin() + std::ptrdiff_t(first), diags.end(),
                        [](const Diagnostic& d) { return !d.meant.empty(); });
}

void parse_root(const YamlValue& root, const std::string& file, Recipe& r, std::vector<Diagnostic>& diags) {
  const size_t first = diags.size();
  Section top(&root, "", file + ":1:1", diags);
  if (!top.value() && root.kind == Kind::null) {
    // One error, not one per required key.
    top.error(file, "", "the recipe is empty",
              "a recipe needs name, model (family, layers, hidden, heads, seq_len), data.train and train (steps, "
              "micro_batch): start from recipes/tiny.yaml");
    return;
  }
  parse_section(top, "", r);
  put_typos_first(diags, first);
}

}  // namespace

ParsedRecipe recipe_parse(const std::string& file, const std::vector<std::string>& overrides) {
  ParsedRecipe out;
  out.tree = yaml_load_file(file, out.diags);
  if (!out.diags.empty() && out.tree.kind == Kind::null) return out;  // unreadable or not YAML
  for (const auto& o : overrides) yaml_apply_override(out.tree, o, out.diags);
  parse_root(out.tree, file, out.recipe, out.diags);
  return out;
}

ParsedRecipe recipe_parse_text(const std::string& text, const std::string& name,
                               const std::vector<std::string>& overrides) {
  ParsedRecipe out;
  out.tree = yaml_load_string(text, name, out.diags);
  for (const auto& o : overrides) yaml_apply_override(out.tree, o, out.diags);
  parse_root(out.tree, name, out.recipe, out.diags);
  return out;
}

std::string recipe_key_where(const YamlValue& root, const std::string& file, const std::string& key) {
  const YamlValue* cur = &root;
  const YamlValue* deepest = &root;
  for (const auto& part : split(key, '.')) {
    cur = cur && cur->kind == Kind::map ? cur->find(part) : nullptr;
    if (!cur) break;
    deepest = cur;
  }
  if (cur) return cur->location();
  // The key was not written (its default or auto value is at fault): point at its section.
  std::string section = deepest->location().empty() || deepest == &root ? file : deepest->location();
  return fmt::format("{} ({} not set: default)", section, key);
}

}  // namespace llmtrain::cli
