#include "cli/recipe_section.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "cli/recipe_schema.h"

namespace llmtrain::cli {

using Kind = YamlValue::Kind;

std::string range_text(const IntRule& r) {
  const auto lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  std::string s;
  // An int field's rule is clamped to int's range; that bound is not the user's concern.
  const bool bounded = r.max != hi && r.max != std::numeric_limits<int>::max();
  if (r.min != lo && bounded)
    s = fmt::format("an integer in {}..{}", r.min, r.max);
  else if (r.min == 1)
    s = "a positive integer";
  else if (r.min == 0)
    s = "a non-negative integer";
  else if (r.min != lo)
    s = fmt::format("an integer ≥ {}", r.min);
  else
    s = "an integer";
  if (r.allow_auto) s += " or auto";
  return s;
}

std::string range_text(const FloatRule& r) {
  std::string s = "a number";
  bool lo = std::isfinite(r.min), hi = std::isfinite(r.max);
  if (lo && hi)
    s += fmt::format(" in {}{}, {}{}", r.min_exclusive ? "(" : "[", r.min, r.max, r.max_exclusive ? ")" : "]");
  else if (lo)
    s += fmt::format(" {} {}", r.min_exclusive ? ">" : "≥", r.min);
  if (r.allow_auto) s += " or auto";
  return s;
}

namespace {

// [+-]? (digits [. digits?] | . digits) ([eE] [+-]? digits)?: what YAML and people write as a
// number; from_chars alone would also take "inf", "nan" and hexadecimal.
bool is_decimal(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    const size_t from = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i - from;
  };
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  size_t mantissa = digits();
  if (i < s.size() && s[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == s.size();
}

}  // namespace

bool parse_int(const std::string& s, int64_t& out) {
  const auto v = parse_int64(s);
  if (v) out = *v;
  return v.has_value();
}

bool parse_float(const std::string& s, double& out) {
  if (!is_decimal(s)) return false;
  const char* b = s.data() + (s[0] == '+' ? 1 : 0);
  auto [p, ec] = std::from_chars(b, s.data() + s.size(), out);
  // Finite, and zero or normal: no value means a subnormal such as 1e-320 (its reciprocal is infinite).
  return ec == std::errc() && p == s.data() + s.size() && std::isfinite(out) &&
         (out == 0 || std::fabs(out) >= std::numeric_limits<double>::min());
}

std::string leaf(const std::string& key) { return key.substr(key.rfind('.') + 1); }

Section::Section(const YamlValue* value, std::string path, std::string parent_where, std::vector<Diagnostic>& diags)
    : value_(value), path_(std::move(path)), parent_where_(std::move(parent_where)), diags_(&diags) {
  if (value_ && value_->kind != Kind::map && value_->kind != Kind::null) {
    error(value_->where, path_, fmt::format("expected a map of keys, found {}", value_->describe()),
          fmt::format("write `{}:` followed by indented `key: value` lines", leaf(path_)));
    value_ = nullptr;
  }
  if (value_ && value_->kind == Kind::null) value_ = nullptr;
}

std::string Section::where() const { return value_ ? value_->location() : parent_where_; }

const YamlValue* Section::get(const std::string& key) {
  asked_.insert(key);
  if (!value_) return nullptr;
  const YamlValue* v = value_->find(key);
  return v && !v->is_null() ? v : nullptr;
}

Section Section::subsection(const std::string& key) { return Section(get(key), full(key), where(), *diags_); }

void Section::required(const std::string& key) {
  if (!get(key))
    error(where(), full(key), "missing required key",
          fmt::format("add `{}: <value>` to the {} section", key, path_.empty() ? "top-level" : path_));
}

void Section::integer(const std::string& key, int64_t& out, IntRule rule) {
  const YamlValue* v = get(key);
  if (!v) {
    if (rule.allow_null && value_ && value_->find(key)) out = 0;
    return;
  }
  if (v->kind == Kind::scalar && !v->quoted && rule.allow_auto && v->scalar == "auto") {
    out = 0;
    return;
  }
  int64_t n = 0;
  if (v->kind != Kind::scalar || v->quoted || !parse_int(v->scalar, n)) {
    std::string hint = v->quoted ? "remove the quotes: numbers are written bare"
                                 : fmt::format("write {} as a whole number, e.g. `{}: {}`", full(key), key,
                                               rule.min > 0 ? rule.min : 0);
    error(v->where, full(key), fmt::format("expected {}, found {}", range_text(rule), v->describe()), hint);
    return;
  }
  if (n < rule.min || n > rule.max) {
    const std::string most =
        n > rule.max && range_text(rule).find("..") == std::string::npos ? fmt::format(" (at most {})", rule.max) : "";
    error(v->where, full(key), fmt::format("expected {}, found {}{}", range_text(rule), n, most),
          rule.allow_auto ? "use a value in range, or auto for the default" : "use a value in range");
    return;
  }
  out = n;
}

void Section::integer(const std::string& key, int& out, IntRule rule) {
  rule.min = std::max<int64_t>(rule.min, std::numeric_limits<int>::min());
  rule.max = std::min<int64_t>(rule.max, std::numeric_limits<int>::max());
  int64_t v = out;
  integer(key, v, rule);
  out = static_cast<int>(v);
}

void Section::number(const std::string& key, double& out, FloatRule rule) {
  const YamlValue* v = get(key);
  if (!v) return;
  if (v->kind == Kind::scalar && !v->quoted && rule.allow_auto && v->scalar == "auto") {
    out = 0;
    return;
  }
  double x = 0;
  if (v->kind != Kind::scalar || v->quoted || !parse_float(v->scalar, x)) {
    error(v->where, full(key), fmt::format("expected {}, found {}", range_text(rule), v->describe()),
          v->quoted ? "remove the quotes: numbers are written bare" : "write a decimal number such as 0.1 or 1.0e-4");
    return;
  }
  bool low = rule.min_exclusive ? x <= rule.min : x < rule.min;
  bool high = rule.max_exclusive ? x >= rule.max : x > rule.max;
  if (low || high) {
    error(v->where, full(key), fmt::format("expected {}, found {}", range_text(rule), v->scalar),
          "use a value in range");
    return;
  }
  out = x;
}

void Section::boolean(const std::string& key, bool& out) {
  const YamlValue* v = get(key);
  if (!v) return;
  static const std::set<std::string> yes{"true", "True", "TRUE"}, no{"false", "False", "FALSE"};
  if (v->kind == Kind::scalar && !v->quoted && yes.count(v->scalar))
    out = true;
  else if (v->kind == Kind::scalar && !v->quoted && no.count(v->scalar))
    out = false;
  else
    error(v->where, full(key), fmt::format("expected true or false, found {}", v->describe()),
          "write true or false, unquoted");
}

bool Section::string(const std::string& key, std::string& out, bool allow_null) {
  const YamlValue* v = get(key);
  if (!v) {
    if (allow_null && value_ && value_->find(key)) out.clear();
    return false;
  }
  if (v->kind != Kind::scalar || v->scalar.empty()) {
    error(v->where, full(key), fmt::format("expected a string, found {}", v->describe()),
          "write a single value, e.g. a name or a path");
    return false;
  }
  out = v->scalar;
  return true;
}

void Section::string_or_auto(const std::string& key, std::string& out) {
  if (string(key, out) && out == "auto") out.clear();
}

void Section::duration(const std::string& key, double& out, bool zero_off) {
  const YamlValue* t = get(key);
  if (!t) return;
  auto secs = t->kind == Kind::scalar ? parse_duration_seconds(t->scalar) : std::nullopt;
  if (!secs || *secs < 0 || (*secs == 0 && !zero_off))
    error(t->where, full(key),
          fmt::format("expected a {} duration, found {}", zero_off ? "non-negative" : "positive", t->describe()),
          zero_off ? "write seconds with a unit, e.g. 300s, 10m or 1h; 0 turns it off"
                   : "write seconds with a unit, e.g. 300s, 5m or 1h");
  else
    out = *secs;
}

void Section::choice_error(const YamlValue& v, const std::string& key, const std::vector<std::string>& names) {
  std::string hint = fmt::format("use one of: {}", join(names, ", "));
  if (v.kind == Kind::scalar)
    if (auto m = closest_match(v.scalar, names)) hint = fmt::format("did you mean {}? ({})", *m, hint);
  error(v.where, full(key), fmt::format("expected one of {}, found {}", join(names, " | "), v.describe()), hint);
}

void Section::finish() {
  if (!value_) return;
  std::vector<std::string> candidates(asked_.begin(), asked_.end());
  for (const auto& [k, v] : value_->entries) {
    if (asked_.count(k)) continue;
    std::string hint, meant;
    if (auto m = closest_match(k, candidates)) {
      meant = full(*m);
      hint = fmt::format("did you mean {}?", meant);
    } else {
      for (const auto& known : recipe_schema_keys())
        if (leaf(known) == k) {
          meant = known;
          hint = fmt::format("did you mean {}? (it belongs in another section)", known);
        }
      if (hint.empty()) hint = fmt::format("valid keys here: {}", join(candidates, ", "));
    }
    error(key_where(k), full(k), "unknown key", hint);
    diags_->back().meant = meant;
  }
}

void Section::error(std::string where, std::string key, std::string message, std::string hint) {
  diags_->push_back({std::move(where), std::move(key), std::move(message), std::move(hint)});
}

std::string Section::key_where(const std::string& key) const {
  const YamlValue* v = value_ ? value_->find(key) : nullptr;
  return v ? v->location() : where();
}

}  // namespace llmtrain::cli
