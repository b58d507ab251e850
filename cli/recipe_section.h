// One section (a YAML map) of a recipe being parsed, and the typed checks of its keys: the
// vocabulary the schema (cli/recipe_schema.cpp) declares its keys in. Each accessor reads one key,
// checks its type and range, stores it, and records a Diagnostic (with the key's file:line:col and
// a hint) when it is wrong; finish() reports the keys nobody asked for.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/yaml_tree.h"
#include "common/enum_names.h"
#include "common/strings.h"

namespace llmtrain::cli {

struct IntRule {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
  bool allow_auto = false;  // "auto" stores 0
  bool allow_null = false;  // null stores 0
};

struct FloatRule {
  double min = -std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
  double max = std::numeric_limits<double>::infinity();
  bool max_exclusive = false;
  bool allow_auto = false;  // "auto" stores 0
};

// "an integer in 1..65536 or auto", "a number > 0": the expected side of a range error.
std::string range_text(const IntRule& r);
std::string range_text(const FloatRule& r);

// A whole number as YAML and people write it (no "inf", no hexadecimal); false when it is not one.
bool parse_int(const std::string& s, int64_t& out);
// A finite decimal number ([+-]digits[.digits][e[+-]digits]), zero or normal (a subnormal such as
// 1e-320 is refused: no value means one); false when it is not one.
bool parse_float(const std::string& s, double& out);

class Section {
 public:
  Section(const YamlValue* value, std::string path, std::string parent_where, std::vector<Diagnostic>& diags);

  const std::string& path() const { return path_; }
  const YamlValue* value() const { return value_; }
  std::string where() const;

  // Raw access: notes the key as asked for and returns its value when present and not null.
  const YamlValue* get(const std::string& key);
  // A nested section under `key`.
  Section subsection(const std::string& key);
  // A map inside this section's value that is not under a key of its own (a list item), named `path`.
  Section item(const YamlValue& value, std::string path) {
    return Section(&value, std::move(path), value.where, *diags_);
  }

  void required(const std::string& key);
  void integer(const std::string& key, int64_t& out, IntRule rule = {});
  void integer(const std::string& key, int& out, IntRule rule = {});
  void number(const std::string& key, double& out, FloatRule rule = {});
  void boolean(const std::string& key, bool& out);
  // A string; `allow_null` lets `key: null` / `~` mean "unset" (stored as ""). True when one was read.
  bool string(const std::string& key, std::string& out, bool allow_null = true);
  // A string or "auto" (stored as "").
  void string_or_auto(const std::string& key, std::string& out);
  // A duration ("300s", "5m", "1h", or seconds): positive, or with `zero_off` also 0 (off).
  void duration(const std::string& key, double& out, bool zero_off);

  // One of a recipe enum's names (common/recipe/recipe.h).
  template <typename E>
  void choice(const std::string& key, E& out) {
    const YamlValue* v = get(key);
    if (!v) return;
    std::vector<std::string> names;
    for (const EnumName<E>& n : enum_names(out)) names.push_back(n.name);
    if (v->kind == YamlValue::Kind::scalar)
      if (const std::optional<E> e = enum_value(enum_names(out), v->scalar)) {
        out = *e;
        return;
      }
    choice_error(*v, key, names);
  }

  // Reports keys present in the map that no accessor asked for, with a "did you mean".
  void finish();

  void error(std::string where, std::string key, std::string message, std::string hint);
  std::string full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

 private:
  void choice_error(const YamlValue& v, const std::string& key, const std::vector<std::string>& names);
  std::string key_where(const std::string& key) const;

  const YamlValue* value_;
  std::string path_;
  std::string parent_where_;
  std::vector<Diagnostic>* diags_;
  std::set<std::string> asked_;
};

// The last part of a dotted key: "ssh" for "launch.ssh".
std::string leaf(const std::string& key);

}  // namespace llmtrain::cli
