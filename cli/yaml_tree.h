// A YAML document as a plain tree that remembers where every value came from: a file position
// (line and column, 1-based) or a `--set key=value` argument. Recipes are parsed from this tree
// rather than from yaml-cpp nodes so that overrides can be merged without yaml-cpp's reference
// semantics, duplicate keys are caught, and every error can name its source.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace llmtrain::cli {

// One problem found in a recipe, printed as "<where>: <key>: <message>\n  hint: <hint>".
struct Diagnostic {
  std::string where;  // "recipe.yaml:12:5" or "--set train.steps=abc"
  std::string key;    // "train.steps" ("" for file-level problems)
  std::string message;
  std::string hint;
  // Reading a file failed (the recipe, the tokenizer): each process meets it alone, unlike a
  // problem of the recipe's content, which every rank of a job meets alike.
  bool io = false;
  // For an unknown key: the schema key it most likely meant ("model" for "modle"), else "".
  std::string meant = {};

  std::string format() const;
};

struct YamlValue {
  // A map's key and value. Not std::pair: a pair holding the type it is part of is ill-formed
  // until that type is complete, and clang (the sanitizer build) rejects it.
  struct Entry;
  enum class Kind { null, scalar, sequence, map };
  Kind kind = Kind::null;
  std::string scalar;            // for scalars
  bool quoted = false;           // a quoted scalar is a string, never a number or bool
  std::vector<Entry> entries;    // for maps, in file order
  std::vector<YamlValue> items;  // for sequences
  std::string where;             // "file:line:col" of the value, or "--set ..."
  std::string key_where;         // where the key naming this value is written ("" for list items)

  const YamlValue* find(const std::string& key) const;
  YamlValue* find(const std::string& key);
  bool is_null() const { return kind == Kind::null; }
  // The best place to point at for this value: its key's line when it has one.
  const std::string& location() const { return key_where.empty() ? where : key_where; }
  // A short description for "found ..." messages: "the string \"abc\"", "a list", "a map", "null".
  std::string describe() const;
};

struct YamlValue::Entry {
  std::string first;  // the key
  YamlValue second;   // its value
};

// Parses `path`. Syntax errors, unreadable files and duplicate keys become diagnostics; the
// returned tree holds whatever could be read.
YamlValue yaml_load_file(const std::string& path, std::vector<Diagnostic>& diags);
YamlValue yaml_load_string(const std::string& text, const std::string& name, std::vector<Diagnostic>& diags);

// Applies one `--set a.b.c=value` override (value parsed as YAML) to `root`.
void yaml_apply_override(YamlValue& root, const std::string& assignment, std::vector<Diagnostic>& diags);

}  // namespace llmtrain::cli
