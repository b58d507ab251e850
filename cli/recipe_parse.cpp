// Recipe schema: every key, its type, range and default, checked while converting the YAML tree
// into Recipe. The schema is this file's code, one line per key; recipe_schema_keys()
// lists the keys by running the same code over an empty document, so docs/recipe.md can be
// checked against it.
#include "cli/recipe_parse.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "common/recipe/recipe_check.h"
#include "common/strings.h"

namespace llmtrain::cli {
namespace {

using Kind = YamlValue::Kind;

// Every key the schema mentions, collected as the parser runs; recipe_schema_keys() runs the
// parser once over an empty document so that the set is complete before it is searched.
std::set<std::string>& known_keys() {
  static std::set<std::string> keys;
  return keys;
}

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

bool parse_int(const std::string& s, int64_t& out) {
  const auto v = parse_int64(s);
  if (v) out = *v;
  return v.has_value();
}

bool parse_float(const std::string& s, double& out) {
  if (!is_decimal(s)) return false;
  const char* b = s.data() + (s[0] == '+' ? 1 : 0);
  auto [p, ec] = std::from_chars(b, s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && std::isfinite(out);
}

// One section (a YAML map) of the recipe. Each typed accessor checks one key; finish() reports
// the keys nobody asked for.
class Section {
 public:
  Section(const YamlValue* value, std::string path, std::string parent_where, std::vector<Diagnostic>& diags)
      : value_(value), path_(std::move(path)), parent_where_(std::move(parent_where)), diags_(diags) {
    if (value_ && value_->kind != Kind::map && value_->kind != Kind::null) {
      error(value_->where, path_, fmt::format("expected a map of keys, found {}", value_->describe()),
            fmt::format("write `{}:` followed by indented `key: value` lines", leaf(path_)));
      value_ = nullptr;
    }
    if (value_ && value_->kind == Kind::null) value_ = nullptr;
  }

  const std::string& path() const { return path_; }
  const YamlValue* value() const { return value_; }
  std::string where() const { return value_ ? value_->location() : parent_where_; }

  // Raw access: registers the key and returns its value when present and not null.
  const YamlValue* get(const char* key) {
    asked_.insert(key);
    known_keys().insert(full(key));
    if (!value_) return nullptr;
    const YamlValue* v = value_->find(key);
    return v && !v->is_null() ? v : nullptr;
  }

  void required(const char* key) {
    if (!get(key))
      error(where(), full(key), "missing required key",
            fmt::format("add `{}: <value>` to the {} section", key, path_.empty() ? "top-level" : path_));
  }

  void integer(const char* key, int64_t& out, IntRule rule = {}) {
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
      const std::string most = n > rule.max && range_text(rule).find("..") == std::string::npos
                                   ? fmt::format(" (at most {})", rule.max)
                                   : "";
      error(v->where, full(key), fmt::format("expected {}, found {}{}", range_text(rule), n, most),
            rule.allow_auto ? "use a value in range, or auto for the default" : "use a value in range");
      return;
    }
    out = n;
  }

  void integer(const char* key, int& out, IntRule rule = {}) {
    rule.min = std::max<int64_t>(rule.min, std::numeric_limits<int>::min());
    rule.max = std::min<int64_t>(rule.max, std::numeric_limits<int>::max());
    int64_t v = out;
    integer(key, v, rule);
    out = static_cast<int>(v);
  }

  void number(const char* key, double& out, FloatRule rule = {}) {
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

  void boolean(const char* key, bool& out) {
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

  // A string; `allow_null` lets `key: null` / `~` mean "unset" (stored as "").
  bool string(const char* key, std::string& out, bool allow_null = true) {
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

  // A string or "auto" (stored as "").
  void string_or_auto(const char* key, std::string& out) {
    if (string(key, out) && out == "auto") out.clear();
  }

  // One of a recipe enum's names (common/recipe/recipe.h).
  template <typename E>
  void choice(const char* key, E& out, const std::map<std::string, std::string>& not_yet = {}) {
    const YamlValue* v = get(key);
    if (!v) return;
    std::vector<std::string> names;
    for (const EnumName<E>& n : enum_names(out)) names.push_back(n.name);
    if (v->kind == Kind::scalar) {
      if (const std::optional<E> e = enum_value(enum_names(out), v->scalar)) {
        out = *e;
        return;
      }
      auto ny = not_yet.find(v->scalar);
      if (ny != not_yet.end()) {
        error(v->where, full(key), fmt::format("not supported yet: {} {}", full(key), v->scalar), ny->second);
        return;
      }
    }
    std::string hint = fmt::format("use one of: {}", join(names, ", "));
    if (v->kind == Kind::scalar)
      if (auto m = closest_match(v->scalar, names)) hint = fmt::format("did you mean {}? ({})", *m, hint);
    error(v->where, full(key), fmt::format("expected one of {}, found {}", join(names, " | "), v->describe()), hint);
  }

  // Reports keys present in the map that no accessor asked for.
  void finish() {
    if (!value_) return;
    std::vector<std::string> candidates(asked_.begin(), asked_.end());
    for (const auto& [k, v] : value_->entries) {
      if (asked_.count(k)) continue;
      std::string hint, meant;
      if (auto m = closest_match(k, candidates)) {
        meant = full(m->c_str());
        hint = fmt::format("did you mean {}?", meant);
      } else {
        for (const auto& known : recipe_schema_keys())
          if (leaf(known) == k) {
            meant = known;
            hint = fmt::format("did you mean {}? (it belongs in another section)", known);
          }
        if (hint.empty()) hint = fmt::format("valid keys here: {}", join(candidates, ", "));
      }
      error(key_where(k), full(k.c_str()), "unknown key", hint);
      diags_.back().meant = meant;
    }
  }

  void error(std::string where, std::string key, std::string message, std::string hint) {
    diags_.push_back({std::move(where), std::move(key), std::move(message), std::move(hint)});
  }

  std::string full(const char* key) const { return path_.empty() ? key : path_ + "." + key; }
  static std::string leaf(const std::string& p) { return p.substr(p.rfind('.') + 1); }

 private:
  std::string key_where(const std::string& key) const {
    const YamlValue* v = value_ ? value_->find(key) : nullptr;
    return v ? v->location() : where();
  }

  const YamlValue* value_;
  std::string path_;
  std::string parent_where_;
  std::vector<Diagnostic>& diags_;
  std::set<std::string> asked_;
};

Section subsection(Section& parent, const char* key, std::vector<Diagnostic>& diags) {
  return Section(parent.get(key), parent.full(key), parent.where(), diags);
}

constexpr IntRule kPositive{1};
constexpr IntRule kPositiveOrAuto{1, std::numeric_limits<int64_t>::max(), true};
constexpr IntRule kNonNegative{0};
// Upper bounds far above any real model or cluster and far below where a product of a few of them
// (tp × pp × dp, micro_batch × dp, layers ÷ (pp × virtual_stages)) could overflow: a hostile
// recipe gets an error here, not a wrapped product that divides by zero later.
constexpr int64_t kMaxRanks = 1 << 16;
constexpr IntRule kRankCount{1, kMaxRanks};
constexpr IntRule kRankCountOrAuto{1, kMaxRanks, true};
constexpr IntRule kModelDim{1, 1 << 20};
constexpr IntRule kModelDimOrAuto{1, 1 << 20, true};
constexpr IntRule kBatch{1, 1 << 20};
constexpr FloatRule kPositiveFloat{0.0, true};
constexpr FloatRule kNonNegativeFloat{0.0, false};

void parse_model(Section s, ModelConfig& m) {
  s.required("family");
  s.choice("family", m.family);
  m.tie_embeddings = default_tie_embeddings(m.family);
  for (const char* k : {"layers", "hidden", "heads", "seq_len"}) s.required(k);
  s.integer("layers", m.layers, kRankCount);
  s.integer("hidden", m.hidden, kModelDim);
  s.integer("heads", m.heads, kRankCount);
  s.integer("kv_heads", m.kv_heads, kRankCountOrAuto);
  s.integer("ffn_hidden", m.ffn_hidden, kModelDimOrAuto);
  s.integer("vocab", m.vocab, {2, std::numeric_limits<int32_t>::max(), true});
  s.integer("vocab_pad", m.vocab_pad, kModelDim);
  s.integer("seq_len", m.seq_len, {1, 1 << 24});
  s.integer("max_positions", m.max_positions, {1, 1 << 24, true});
  s.number("rope_theta", m.rope_theta, kPositiveFloat);
  s.number("norm_eps", m.norm_eps, kPositiveFloat);
  s.number("init_std", m.init_std, kPositiveFloat);
  s.number("dropout", m.dropout, {0.0, false, 1.0, true});
  s.boolean("tie_embeddings", m.tie_embeddings);
  s.finish();
}

void parse_data_sources(Section& s, std::vector<DataSource>& out, std::vector<Diagnostic>& diags) {
  const YamlValue* v = s.get("train");
  known_keys().insert("data.train[].path");
  known_keys().insert("data.train[].weight");
  if (!v) return;
  auto bad = [&](const YamlValue& at, const std::string& found) {
    s.error(at.where, "data.train",
            fmt::format("expected a dataset prefix, a list of prefixes, or a list of {{path, weight}} maps, found {}",
                        found),
            "e.g. `train: [{path: data/fortunes/train, weight: 1.0}]` (prefix of the .bin/.idx pair)");
  };
  if (v->kind == Kind::scalar) {
    out.push_back({v->scalar, 1.0});
    return;
  }
  if (v->kind != Kind::sequence || v->items.empty())
    return bad(*v, v->kind == Kind::sequence ? "an empty list" : v->describe());
  for (size_t i = 0; i < v->items.size(); ++i) {
    const YamlValue& item = v->items[i];
    if (item.kind == Kind::scalar) {
      out.push_back({item.scalar, 1.0});
      continue;
    }
    if (item.kind != Kind::map) return bad(item, item.describe());
    Section entry(&item, fmt::format("data.train[{}]", i), item.where, diags);
    DataSource src;
    entry.required("path");
    entry.string("path", src.path, false);
    entry.number("weight", src.weight, kPositiveFloat);
    entry.finish();
    out.push_back(src);
  }
}

void parse_data(Section s, DataConfig& d, std::vector<Diagnostic>& diags) {
  s.string("tokenizer", d.tokenizer, false);
  s.required("train");
  parse_data_sources(s, d.train, diags);
  s.string("valid", d.valid);
  s.finish();
}

void parse_train(Section s, TrainConfig& t, std::vector<Diagnostic>& diags) {
  s.choice("device", t.device);
  s.choice("precision", t.precision);
  s.required("steps");
  s.integer("steps", t.steps, kPositive);
  s.required("micro_batch");
  s.integer("micro_batch", t.micro_batch, kBatch);
  s.integer("global_batch", t.global_batch, {1, 1 << 30, true});
  s.number("grad_clip", t.grad_clip, kNonNegativeFloat);
  int64_t seed = static_cast<int64_t>(t.seed);
  s.integer("seed", seed, kNonNegative);
  t.seed = static_cast<uint64_t>(seed);
  s.choice("activation_checkpointing", t.activation_checkpointing);
  s.choice("on_nonfinite", t.on_nonfinite);
  s.integer("max_skipped_steps", t.max_skipped_steps, kPositive);
  s.integer("threads", t.threads, {1, 4096, true});
  {
    Section ls = subsection(s, "loss_scale", diags);
    ls.number("initial", t.loss_scale.initial, {1.0, false, 1e38});
    ls.integer("growth_interval", t.loss_scale.growth_interval, kPositive);
    ls.number("backoff", t.loss_scale.backoff, {0.0, true, 1.0, true});
    ls.integer("hysteresis", t.loss_scale.hysteresis, {1, 1 << 20});
    ls.number("min", t.loss_scale.min, {0.0, true, 1e38});
    if (t.loss_scale.min > t.loss_scale.initial)
      ls.error(ls.where(), "train.loss_scale.min",
               fmt::format("min {} is above initial {}", t.loss_scale.min, t.loss_scale.initial),
               "the scale starts at initial and never goes below min");
    ls.finish();
  }
  s.finish();
}

void parse_optimizer(Section s, OptimizerConfig& o) {
  s.number("lr", o.lr, kPositiveFloat);
  s.number("min_lr", o.min_lr, kNonNegativeFloat);
  s.integer("warmup", o.warmup, kNonNegative);
  s.choice("schedule", o.schedule);
  s.integer("decay_steps", o.decay_steps, kPositiveOrAuto);
  if (const YamlValue* b = s.get("betas")) {
    double b1 = 0, b2 = 0;
    bool ok = b->kind == Kind::sequence && b->items.size() == 2 && b->items[0].kind == Kind::scalar &&
              b->items[1].kind == Kind::scalar && !b->items[0].quoted && !b->items[1].quoted &&
              parse_float(b->items[0].scalar, b1) && parse_float(b->items[1].scalar, b2);
    if (!ok)
      s.error(b->where, "optimizer.betas",
              fmt::format("expected a list of two numbers [beta1, beta2], found {}", b->describe()),
              "e.g. betas: [0.9, 0.95]");
    else if (b1 < 0 || b1 >= 1 || b2 < 0 || b2 >= 1)
      s.error(b->where, "optimizer.betas", fmt::format("expected both betas in [0, 1), found [{}, {}]", b1, b2),
              "AdamW's betas are decay rates below 1, e.g. [0.9, 0.95]");
    else
      o.beta1 = b1, o.beta2 = b2;
  }
  s.number("eps", o.eps, kPositiveFloat);
  s.number("weight_decay", o.weight_decay, kNonNegativeFloat);
  s.finish();
}

// A duration key ("300s", "5m", "1h", or seconds): positive, or with `zero_off` also 0 (off).
void duration(Section& s, const char* key, const char* full_key, double& out, bool zero_off) {
  const YamlValue* t = s.get(key);
  if (!t) return;
  auto secs = t->kind == Kind::scalar ? parse_duration_seconds(t->scalar) : std::nullopt;
  if (!secs || *secs < 0 || (*secs == 0 && !zero_off))
    s.error(t->where, full_key,
            fmt::format("expected a {} duration, found {}", zero_off ? "non-negative" : "positive", t->describe()),
            zero_off ? "write seconds with a unit, e.g. 300s, 10m or 1h; 0 turns it off"
                     : "write seconds with a unit, e.g. 300s, 5m or 1h");
  else
    out = *secs;
}

void parse_parallel(Section s, ParallelConfig& p) {
  s.integer("tp", p.tp, kRankCount);
  s.integer("pp", p.pp, kRankCount);
  s.integer("dp", p.dp, kRankCountOrAuto);
  s.integer("zero", p.zero, {0, 3});
  s.integer("zero_group", p.zero_group, kRankCountOrAuto);
  s.boolean("sequence_parallel", p.sequence_parallel);
  s.choice("pp_schedule", p.pp_schedule);
  s.integer("virtual_stages", p.virtual_stages, kRankCount);
  if (const YamlValue* v = s.get("pp_layers")) {
    std::vector<int> blocks;
    bool ok = v->kind == Kind::sequence && !v->items.empty();
    for (size_t i = 0; ok && i < v->items.size(); ++i) {
      int64_t n = 0;
      ok = v->items[i].kind == Kind::scalar && !v->items[i].quoted && parse_int(v->items[i].scalar, n) && n >= 1 &&
           n <= 1'000'000;
      blocks.push_back(int(n));
    }
    if (!ok)
      s.error(v->where, "parallel.pp_layers",
              fmt::format("expected a list of block counts ≥ 1, one per pipeline stage, found {}", v->describe()),
              "e.g. pp_layers: [3, 5, 5, 3] for 16 layers over pp 4; leave it out to split layers evenly");
    else
      p.pp_layers = std::move(blocks);
  }
  s.number("bucket_mb", p.bucket_mb, kPositiveFloat);
  s.choice("grad_reduce_dtype", p.grad_reduce_dtype);
  duration(s, "timeout", "parallel.timeout", p.timeout_s, false);
  s.finish();
}

void parse_checkpoint(Section s, CheckpointConfig& c) {
  s.string_or_auto("dir", c.dir);
  s.integer("every", c.every, kNonNegative);
  s.integer("keep", c.keep, kPositive);
  duration(s, "timeout", "checkpoint.timeout", c.timeout_s, false);
  std::string resume;
  if (s.string("resume", resume, false)) {
    if (resume == "auto")
      c.resume = ResumeMode::automatic;
    else if (resume == "none")
      c.resume = ResumeMode::none;
    else
      c.resume = ResumeMode::path, c.resume_path = resume;
  }
  s.boolean("load_weights_only", c.load_weights_only);
  if (c.load_weights_only && c.resume == ResumeMode::none)
    s.error(s.where(), "checkpoint.load_weights_only", "load_weights_only is true but checkpoint.resume is none",
            "set checkpoint.resume to the checkpoint whose weights to start from");
  s.finish();
}

void parse_eval(Section s, EvalConfig& e) {
  s.integer("every", e.every, kNonNegative);
  s.integer("batches", e.batches, kBatch);
  s.finish();
}

void parse_log(Section s, LogConfig& l) {
  s.integer("every", l.every, kPositive);
  s.string_or_auto("dir", l.dir);
  s.number("peak_tflops", l.peak_tflops, {0.0, true, std::numeric_limits<double>::infinity(), false, true});
  s.number("straggler_factor", l.straggler_factor, {1.0, true});
  s.boolean("tensorboard", l.tensorboard);
  s.finish();
}

// minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (sbatch --time): [D-]N[:NN[:NN]].
bool is_slurm_time(std::string_view t) {
  const size_t dash = t.find('-');
  if (dash != std::string_view::npos) {
    if (!is_digits(t.substr(0, dash))) return false;
    t = t.substr(dash + 1);
  }
  const std::vector<std::string> parts = split(t, ':');
  if (parts.size() > 3 || !is_digits(parts[0])) return false;
  return std::all_of(parts.begin() + 1, parts.end(),
                     [](const std::string& p) { return p.size() <= 2 && is_digits(p); });
}

void parse_launch(Section s, LaunchConfig& l, std::vector<Diagnostic>& diags) {
  s.integer("procs_per_node", l.procs_per_node, {1, 4096});
  s.integer("nodes", l.nodes, kRankCount);
  s.string("hostfile", l.hostfile);
  s.integer("max_restarts", l.max_restarts, kNonNegative);
  duration(s, "hang_timeout", "launch.hang_timeout", l.hang_timeout_s, true);
  {
    Section slurm = subsection(s, "slurm", diags);
    slurm.string("partition", l.slurm.partition);
    slurm.string("account", l.slurm.account);
    slurm.string("time", l.slurm.time);
    if (!l.slurm.time.empty() && !is_slurm_time(l.slurm.time))
      slurm.error(slurm.get("time")->where, "launch.slurm.time",
                  fmt::format("expected a Slurm time limit, found \"{}\"", l.slurm.time),
                  "Slurm accepts minutes, MM:SS, HH:MM:SS or D-HH:MM:SS, e.g. 04:00:00");
    slurm.finish();
  }
  {
    Section ssh = subsection(s, "ssh", diags);
    ssh.integer("port", l.ssh.port, {1, 65535});
    ssh.string("identity", l.ssh.identity);
    ssh.string("config", l.ssh.config);
    ssh.finish();
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
  if (!top.value()) {
    if (root.kind == Kind::null) top.error(file, "", "the recipe is empty", "start from recipes/tiny.yaml");
  }
  top.required("name");
  if (top.string("name", r.name, false)) {
    static const std::string alnum = std::string(kLetters) + std::string(kDigits);
    if (!is_word(r.name, alnum, alnum + "._-"))
      top.error(top.get("name")->where, "name",
                fmt::format("expected a run name of letters, digits, '.', '_' or '-', found \"{}\"", r.name),
                "the name becomes a directory (runs/<name>): use e.g. gpt2-124m");
  }
  top.required("model");
  parse_model(subsection(top, "model", diags), r.model);
  top.required("data");
  parse_data(subsection(top, "data", diags), r.data, diags);
  top.required("train");
  parse_train(subsection(top, "train", diags), r.train, diags);
  parse_optimizer(subsection(top, "optimizer", diags), r.optimizer);
  parse_parallel(subsection(top, "parallel", diags), r.parallel);
  parse_checkpoint(subsection(top, "checkpoint", diags), r.checkpoint);
  parse_eval(subsection(top, "eval", diags), r.eval);
  parse_log(subsection(top, "log", diags), r.log);
  parse_launch(subsection(top, "launch", diags), r.launch, diags);
  top.finish();
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

std::vector<std::string> recipe_schema_keys() {
  // Running the parser once over an empty document visits every key of the schema.
  static const std::vector<std::string> keys = [] {
    std::vector<Diagnostic> ignored;
    YamlValue empty;
    empty.kind = Kind::map;
    Recipe r;
    parse_root(empty, "", r, ignored);
    return std::vector<std::string>(known_keys().begin(), known_keys().end());
  }();
  return keys;
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
