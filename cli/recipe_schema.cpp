// The recipe's keys, one entry each (cli/recipe_schema.h). The order is docs/recipe.md's and that of
// the resolved recipe `validate` prints.
#include "cli/recipe_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <set>
#include <string_view>

#include "common/recipe/recipe_check.h"
#include "common/strings.h"

namespace llmtrain::cli {
namespace {

using Kind = YamlValue::Kind;

// What docs/recipe.md says of a key: its type and default columns, and one line of meaning.
struct Doc {
  const char* type;
  const char* fallback;
  const char* doc;
};

// ---- How values are written back as YAML.

// Plain scalars that YAML would read as something else (numbers, booleans, null) or that
// contain syntax characters are double-quoted.
std::string str(const std::string& s) {
  static const std::string first = std::string(kLetters) + "_/.";
  static const std::string rest = first + std::string(kDigits) + "+-";
  static const std::set<std::string_view> reserved = {"true", "false", "True", "False", "TRUE", "FALSE", "null", "Null",
                                                      "NULL", "yes",   "no",   "on",    "off",  "auto",  "none", "~"};
  if (is_word(s, first, rest) && !reserved.count(s)) return s;
  return yaml_quoted(s, "a recipe value");
}
std::string opt_str(const std::string& s) { return s.empty() ? "null" : str(s); }
std::string num(double v) { return fmt::format("{}", v); }
std::string flag(bool b) { return b ? "true" : "false"; }

// ---- One factory per kind of value. `get` is a generic lambda returning the field, for a const
// and a mutable recipe alike: [](auto& r) -> auto& { return r.model.layers; }.

RecipeKey entry(const char* key, Doc d) {
  RecipeKey k;
  k.key = key, k.type = d.type, k.fallback = d.fallback, k.doc = d.doc;
  return k;
}

RecipeKey section(const char* key, Doc d, bool required = false) {
  RecipeKey k = entry(key, d);
  k.section = true;
  k.required = required;
  return k;
}

template <typename Get>
RecipeKey integer(const char* key, Get get, IntRule rule, Doc d, bool required = false) {
  RecipeKey k = entry(key, d);
  k.required = required;
  k.parse = [get, rule, name = leaf(key)](Section& s, Recipe& r) { s.integer(name, get(r), rule); };
  k.emit = [get, rule](const Recipe& r) -> std::optional<std::string> {
    const auto v = get(r);
    if (v == 0 && rule.allow_auto) return std::string("auto");
    if (v == 0 && rule.allow_null) return std::string("null");
    return std::to_string(v);
  };
  return k;
}

template <typename Get>
RecipeKey number(const char* key, Get get, FloatRule rule, Doc d) {
  RecipeKey k = entry(key, d);
  k.parse = [get, rule, name = leaf(key)](Section& s, Recipe& r) { s.number(name, get(r), rule); };
  k.emit = [get, rule](const Recipe& r) -> std::optional<std::string> {
    return rule.allow_auto && get(r) == 0 ? std::string("auto") : num(get(r));
  };
  return k;
}

template <typename Get>
RecipeKey boolean(const char* key, Get get, Doc d) {
  RecipeKey k = entry(key, d);
  k.parse = [get, name = leaf(key)](Section& s, Recipe& r) { s.boolean(name, get(r)); };
  k.emit = [get](const Recipe& r) -> std::optional<std::string> { return flag(get(r)); };
  return k;
}

template <typename Get>
RecipeKey choice(const char* key, Get get, Doc d, bool required = false) {
  RecipeKey k = entry(key, d);
  k.required = required;
  k.parse = [get, name = leaf(key)](Section& s, Recipe& r) { s.choice(name, get(r)); };
  k.emit = [get](const Recipe& r) -> std::optional<std::string> { return std::string(to_string(get(r))); };
  return k;
}

enum class Str {
  nullable,  // null or absent = unset (""), written as null
  value,     // a value (null is an error), written as itself
  or_auto,   // "auto" = "" until resolution fills it
};

template <typename Get>
RecipeKey string(const char* key, Get get, Str kind, Doc d) {
  RecipeKey k = entry(key, d);
  k.parse = [get, kind, name = leaf(key)](Section& s, Recipe& r) {
    if (kind == Str::or_auto)
      s.string_or_auto(name, get(r));
    else
      s.string(name, get(r), kind == Str::nullable);
  };
  k.emit = [get, kind](const Recipe& r) -> std::optional<std::string> {
    return kind == Str::nullable ? opt_str(get(r)) : str(get(r));
  };
  return k;
}

template <typename Get>
RecipeKey duration(const char* key, Get get, bool zero_off, Doc d) {
  RecipeKey k = entry(key, d);
  k.parse = [get, zero_off, name = leaf(key)](Section& s, Recipe& r) { s.duration(name, get(r), zero_off); };
  k.emit = [get](const Recipe& r) -> std::optional<std::string> { return num(get(r)) + "s"; };
  return k;
}

RecipeKey custom(const char* key, Doc d, std::function<void(Section&, Recipe&)> parse,
                 std::function<std::optional<std::string>(const Recipe&)> emit, bool required = false) {
  RecipeKey k = entry(key, d);
  k.required = required;
  k.parse = std::move(parse);
  k.emit = std::move(emit);
  return k;
}

// ---- Rules shared by several keys.

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

// ---- The keys whose values are not one scalar.

void parse_name(Section& s, Recipe& r) {
  if (!s.string("name", r.name, false)) return;
  static const std::string alnum = std::string(kLetters) + std::string(kDigits);
  if (!is_word(r.name, alnum, alnum + "._-"))
    s.error(s.get("name")->where, "name",
            fmt::format("expected a run name of letters, digits, '.', '_' or '-', found \"{}\"", r.name),
            "the name becomes a directory (runs/<name>): use e.g. gpt2-124m");
}

void parse_data_train(Section& s, Recipe& r) {
  std::vector<DataSource>& out = r.data.train;
  const YamlValue* v = s.get("train");
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
    Section entry = s.item(item, fmt::format("data.train[{}]", i));
    DataSource src;
    entry.required("path");
    entry.string("path", src.path, false);
    entry.number("weight", src.weight, kPositiveFloat);
    entry.finish();
    out.push_back(src);
  }
}

std::optional<std::string> emit_data_train(const Recipe& r) {
  std::string y;
  for (const DataSource& src : r.data.train)
    y += fmt::format("\n    - {{path: {}, weight: {}}}", str(src.path), num(src.weight));
  return y;
}

void parse_ns_coefficients(Section& s, Recipe& r) {
  const YamlValue* v = s.get("ns_coefficients");
  if (!v) return;
  std::array<double, 3> c{};
  bool ok = v->kind == Kind::sequence && v->items.size() == 3;
  for (size_t i = 0; ok && i < 3; ++i)
    ok = v->items[i].kind == Kind::scalar && !v->items[i].quoted && parse_float(v->items[i].scalar, c[i]) &&
         std::isfinite(c[i]) && std::abs(c[i]) <= 1e3;
  if (!ok)
    s.error(
        v->where, "optimizer.muon.ns_coefficients",
        fmt::format("expected a list of three finite numbers [a, b, c] (each within ±1000), found {}", v->describe()),
        "the quintic Newton–Schulz coefficients, e.g. PyTorch's [3.4445, -4.775, 2.0315]");
  else
    r.optimizer.muon.ns_coefficients = c;
}

// A number, or `auto` (unset: the value another key gives).
template <typename Get>
RecipeKey optional_number(const char* key, Get get, FloatRule rule, Doc d) {
  return custom(
      key, d,
      [get, rule, name = leaf(key)](Section& s, Recipe& r) {
        const YamlValue* v = s.get(name);
        if (!v || (v->kind == Kind::scalar && !v->quoted && v->scalar == "auto")) return;
        double x = 0;
        s.number(name, x, rule);
        get(r) = x;
      },
      [get](const Recipe& r) -> std::optional<std::string> { return get(r) ? num(*get(r)) : std::string("auto"); });
}

void parse_betas(Section& s, Recipe& r) {
  const YamlValue* b = s.get("betas");
  if (!b) return;
  double b1 = 0, b2 = 0;
  const bool ok = b->kind == Kind::sequence && b->items.size() == 2 && b->items[0].kind == Kind::scalar &&
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
    r.optimizer.beta1 = b1, r.optimizer.beta2 = b2;
}

void parse_pp_layers(Section& s, Recipe& r) {
  const YamlValue* v = s.get("pp_layers");
  if (!v) return;
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
    r.parallel.pp_layers = std::move(blocks);
}

std::optional<std::string> emit_pp_layers(const Recipe& r) {
  if (r.parallel.pp_layers.empty()) return std::nullopt;
  std::vector<std::string> blocks;
  for (int n : r.parallel.pp_layers) blocks.push_back(std::to_string(n));
  return "[" + join(blocks, ", ") + "]";
}

void parse_resume(Section& s, Recipe& r) {
  std::string resume;
  if (!s.string("resume", resume, false)) return;
  CheckpointConfig& c = r.checkpoint;
  if (resume == "auto")
    c.resume = ResumeMode::automatic;
  else if (resume == "none")
    c.resume = ResumeMode::none;
  else
    c.resume = ResumeMode::path, c.resume_path = resume;
}

std::optional<std::string> emit_resume(const Recipe& r) {
  const CheckpointConfig& c = r.checkpoint;
  return c.resume == ResumeMode::automatic ? "auto" : c.resume == ResumeMode::none ? "none" : str(c.resume_path);
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

std::vector<RecipeKey> make_schema() {
  const Str nullable = Str::nullable, value = Str::value, or_auto = Str::or_auto;
  // clang-format off
  return {
    custom("name", {"letters, digits, `.`, `_`, `-`", "required", "the run's name; outputs go to runs/<name>/"},
           parse_name, [](const Recipe& r) -> std::optional<std::string> { return str(r.name); }, true),

    section("model", {"map", "required", "the transformer"}, true),
    custom("model.family", {"`gpt2` \\| `llama`", "required", "the architecture family"},
           [](Section& s, Recipe& r) {
             s.choice("family", r.model.family);
             r.model.tie_embeddings = default_tie_embeddings(r.model.family);  // before tie_embeddings is read
           },
           [](const Recipe& r) -> std::optional<std::string> { return std::string(to_string(r.model.family)); }, true),
    integer("model.layers", [](auto& r) -> auto& { return r.model.layers; }, kRankCount,
            {"int ≥ 1", "required", "transformer blocks"}, true),
    integer("model.hidden", [](auto& r) -> auto& { return r.model.hidden; }, kModelDim,
            {"int ≥ 1", "required", "model width d"}, true),
    integer("model.heads", [](auto& r) -> auto& { return r.model.heads; }, kRankCount,
            {"int ≥ 1", "required", "attention heads"}, true),
    integer("model.kv_heads", [](auto& r) -> auto& { return r.model.kv_heads; }, kRankCountOrAuto,
            {"int ≥ 1 or auto", "auto = `heads`", "key/value heads (fewer than heads: grouped-query attention)"}),
    integer("model.ffn_hidden", [](auto& r) -> auto& { return r.model.ffn_hidden; }, kModelDimOrAuto,
            {"int ≥ 1 or auto", "auto", "MLP width"}),
    integer("model.vocab", [](auto& r) -> auto& { return r.model.vocab; },
            IntRule{2, std::numeric_limits<int32_t>::max(), true},
            {"int ≥ 2 or auto", "auto", "vocabulary size (auto: the tokenizer's)"}),
    integer("model.vocab_pad", [](auto& r) -> auto& { return r.model.vocab_pad; }, kModelDim,
            {"int ≥ 1", "128", "embedding and head rows padded to a multiple of this"}),
    integer("model.seq_len", [](auto& r) -> auto& { return r.model.seq_len; }, IntRule{1, 1 << 24},
            {"int ≥ 1", "required", "training sequence length"}, true),
    integer("model.max_positions", [](auto& r) -> auto& { return r.model.max_positions; }, IntRule{1, 1 << 24, true},
            {"int ≥ 1 or auto", "auto = `seq_len`", "positions the model can address"}),
    number("model.rope_theta", [](auto& r) -> auto& { return r.model.rope_theta; }, kPositiveFloat,
           {"number > 0", "10000", "RoPE base (llama)"}),
    section("model.rope_scaling", {"map", "{}", "RoPE frequency scaling for long contexts (llama)"}),
    choice("model.rope_scaling.type", [](auto& r) -> auto& { return r.model.rope_scaling.type; },
           {"`none` \\| `linear` \\| `llama3` \\| `yarn`", "`none`",
            "transformers' rope_type (Llama 3.1+: llama3; gpt-oss, Qwen long context: yarn)"}),
    number("model.rope_scaling.factor", [](auto& r) -> auto& { return r.model.rope_scaling.factor; },
           FloatRule{1.0, false, 1e6}, {"number ≥ 1", "1", "context extension factor (linear, llama3, yarn)"}),
    number("model.rope_scaling.low_freq_factor", [](auto& r) -> auto& { return r.model.rope_scaling.low_freq_factor; },
           FloatRule{0.0, true, 1e6}, {"number > 0", "1", "llama3: wavelengths above original / this are scaled"}),
    number("model.rope_scaling.high_freq_factor",
           [](auto& r) -> auto& { return r.model.rope_scaling.high_freq_factor; }, FloatRule{0.0, true, 1e6},
           {"number > 0", "4", "llama3: wavelengths below original / this are kept"}),
    integer("model.rope_scaling.original_max_positions",
            [](auto& r) -> auto& { return r.model.rope_scaling.original_max_positions; }, IntRule{1, 1 << 24},
            {"int ≥ 1", "8192", "llama3, yarn: the pre-training context (original_max_position_embeddings)"}),
    number("model.rope_scaling.beta_fast", [](auto& r) -> auto& { return r.model.rope_scaling.beta_fast; },
           FloatRule{0.0, true, 1e6}, {"number > 0", "32", "yarn: pairs turning more often keep their frequency"}),
    number("model.rope_scaling.beta_slow", [](auto& r) -> auto& { return r.model.rope_scaling.beta_slow; },
           FloatRule{0.0, true, 1e6}, {"number > 0", "1", "yarn: pairs turning less often are divided by factor"}),
    boolean("model.rope_scaling.truncate", [](auto& r) -> auto& { return r.model.rope_scaling.truncate; },
            {"bool", "true", "yarn: the ramp's pair range rounded outwards to whole pairs (gpt-oss: false)"}),
    number("model.rope_scaling.attention_factor",
           [](auto& r) -> auto& { return r.model.rope_scaling.attention_factor; },
           FloatRule{0.0, false, 1e3},
           {"number ≥ 0", "0 = inferred", "yarn: cos and sin multiplied by this (0: 0.1 · ln(factor) + 1)"}),
    number("model.rope_scaling.mscale", [](auto& r) -> auto& { return r.model.rope_scaling.mscale; },
           FloatRule{0.0, false, 1e3}, {"number ≥ 0", "0", "yarn with mscale_all_dim: DeepSeek's auto attention factor"}),
    number("model.rope_scaling.mscale_all_dim", [](auto& r) -> auto& { return r.model.rope_scaling.mscale_all_dim; },
           FloatRule{0.0, false, 1e3}, {"number ≥ 0", "0", "yarn: auto attention factor m(mscale) / m(mscale_all_dim)"}),
    integer("model.head_dim", [](auto& r) -> auto& { return r.model.head_dim; }, kModelDimOrAuto,
            {"int ≥ 1 or auto", "auto = hidden / heads", "attention head size (llama; Qwen3 and Mistral set it)"}),
    boolean("model.qkv_bias", [](auto& r) -> auto& { return r.model.qkv_bias; },
            {"bool", "false", "biases on the q, k and v projections (llama; Qwen2)"}),
    boolean("model.o_bias", [](auto& r) -> auto& { return r.model.o_bias; },
            {"bool", "false", "a bias on the attention's output projection o_proj (llama; gpt-oss)"}),
    boolean("model.qk_norm", [](auto& r) -> auto& { return r.model.qk_norm; },
            {"bool", "false", "per-head RMSNorm of q and k before RoPE (llama; Qwen3)"}),
    integer("model.sliding_window", [](auto& r) -> auto& { return r.model.sliding_window; },
            IntRule{1, 1 << 24, false, true},
            {"int ≥ 1 or null", "null", "each query sees itself and the window − 1 keys before it (llama; Mistral)"}),
    integer("model.full_attention_every", [](auto& r) -> auto& { return r.model.full_attention_every; },
            IntRule{0, 1 << 16},
            {"int ≥ 0", "0", "with sliding_window: every n-th layer sees every key (llama; Gemma 3: 6)"}),
    number("model.rope_local_theta", [](auto& r) -> auto& { return r.model.rope_local_theta; },
           FloatRule{0.0, false, 1e12},
           {"number ≥ 0", "0 = rope_theta", "the windowed layers' RoPE base, unscaled (llama; Gemma 3: 10000)"}),
    number("model.query_pre_attn_scalar", [](auto& r) -> auto& { return r.model.query_pre_attn_scalar; },
           FloatRule{0.0, false, 1e9},
           {"number ≥ 0", "0 = head size", "softmax scale = this^(-1/2) (llama; Gemma)"}),
    choice("model.activation", [](auto& r) -> auto& { return r.model.activation; },
           {"`swiglu` \\| `geglu`", "`swiglu`", "the MLP gate: silu, or the tanh GELU (llama; Gemma)"}),
    boolean("model.post_norms", [](auto& r) -> auto& { return r.model.post_norms; },
            {"bool", "false", "RMSNorms of the attention and MLP outputs before the residual adds (llama; Gemma)"}),
    boolean("model.scale_embeddings", [](auto& r) -> auto& { return r.model.scale_embeddings; },
            {"bool", "false", "the token embeddings multiplied by √hidden (llama; Gemma)"}),
    boolean("model.attention_sinks", [](auto& r) -> auto& { return r.model.attention_sinks; },
            {"bool", "false", "a learned logit per head in each softmax's denominator (llama; gpt-oss's sinks)"}),
    number("model.logit_softcap", [](auto& r) -> auto& { return r.model.logit_softcap; }, FloatRule{0.0, false, 1e6},
           {"number ≥ 0", "0 = none", "logits = cap · tanh(logits / cap) (llama; Gemma's final_logit_softcapping)"}),
    number("model.norm_eps", [](auto& r) -> auto& { return r.model.norm_eps; }, kPositiveFloat,
           {"number > 0", "1e-5", "LayerNorm / RMSNorm epsilon"}),
    number("model.init_std", [](auto& r) -> auto& { return r.model.init_std; }, kPositiveFloat,
           {"number > 0", "0.02", "standard deviation of the initial weights"}),
    number("model.dropout", [](auto& r) -> auto& { return r.model.dropout; }, FloatRule{0.0, false, 1.0, true},
           {"number in [0, 1)", "0", "dropout probability"}),
    boolean("model.tie_embeddings", [](auto& r) -> auto& { return r.model.tie_embeddings; },
            {"bool", "gpt2: true, llama: false", "the LM head shares the token embedding"}),
    section("model.moe", {"map", "{}", "mixture of experts: MoE blocks in place of some MLPs (llama)"}),
    number("model.moe.swiglu_limit", [](auto& r) -> auto& { return r.model.moe.swiglu_limit; },
           FloatRule{0.0, false, 1e6},
           {"number ≥ 0", "0 = SwiGLU", "the experts' clamped SwiGLU: gate ≤ limit, |up| ≤ limit (gpt-oss: 7)"}),
    boolean("model.moe.bias", [](auto& r) -> auto& { return r.model.moe.bias; },
            {"bool", "false", "biases on the router and the routed experts' products (gpt-oss)"}),
    number("model.moe.swiglu_alpha", [](auto& r) -> auto& { return r.model.moe.swiglu_alpha; },
           FloatRule{0.0, true, 1e6}, {"number > 0", "1.702", "with swiglu_limit: the sigmoid's gain (gpt-oss)"}),
    integer("model.moe.experts", [](auto& r) -> auto& { return r.model.moe.experts; }, IntRule{0, 1 << 12},
            {"int ≥ 0", "0", "experts per MoE block (0 = a dense model)"}),
    integer("model.moe.top_k", [](auto& r) -> auto& { return r.model.moe.top_k; }, IntRule{1, 1 << 12},
            {"int ≥ 1", "2", "experts each token is routed to"}),
    integer("model.moe.ffn_hidden", [](auto& r) -> auto& { return r.model.moe.ffn_hidden; }, kModelDimOrAuto,
            {"int ≥ 1 or auto", "auto = `model.ffn_hidden`", "each expert's SwiGLU width"}),
    integer("model.moe.every", [](auto& r) -> auto& { return r.model.moe.every; }, kRankCount,
            {"int ≥ 1", "1", "a MoE block every n-th layer, from first_dense on"}),
    integer("model.moe.first_dense", [](auto& r) -> auto& { return r.model.moe.first_dense; }, IntRule{0, kMaxRanks},
            {"int ≥ 0", "0", "dense layers before the first MoE block"}),
    boolean("model.moe.renormalize", [](auto& r) -> auto& { return r.model.moe.renormalize; },
            {"bool", "true", "the top-k router weights renormalised to sum to 1 (Mixtral)"}),
    number("model.moe.aux_loss", [](auto& r) -> auto& { return r.model.moe.aux_loss; }, FloatRule{0.0, false, 1e3},
           {"number ≥ 0", "0.01", "load-balancing loss coefficient (Megatron-Core's normalisation)"}),
    number("model.moe.z_loss", [](auto& r) -> auto& { return r.model.moe.z_loss; }, FloatRule{0.0, false, 1e3},
           {"number ≥ 0", "0.001", "router z-loss coefficient"}),
    number("model.moe.capacity_factor", [](auto& r) -> auto& { return r.model.moe.capacity_factor; },
           FloatRule{0.0, false, 1e3},
           {"number ≥ 0", "0 (dropless)", "each expert keeps ⌈factor · tokens · top_k / experts⌉ rows; the rest drop"}),
    integer("model.moe.shared_ffn_hidden", [](auto& r) -> auto& { return r.model.moe.shared_ffn_hidden; },
            IntRule{0, 1 << 20},
            {"int ≥ 0", "0 (none)",
             "a shared expert of this SwiGLU width every token visits, scaled by a sigmoid gate (Qwen2-MoE)"}),

    section("data", {"map", "required", "the training and validation data"}, true),
    string("data.tokenizer", [](auto& r) -> auto& { return r.data.tokenizer; }, value,
           {"`byte` or path", "`byte`", "the tokenizer the data was prepared with"}),
    custom("data.train", {"prefix, list of prefixes, or list of `{path, weight}`", "required",
                          "Megatron indexed datasets to train on, blended by weight"},
           parse_data_train, emit_data_train, true),
    string("data.valid", [](auto& r) -> auto& { return r.data.valid; }, nullable,
           {"prefix or null", "null", "validation dataset"}),

    section("train", {"map", "required", "the step: device, precision, batch, steps"}, true),
    choice("train.device", [](auto& r) -> auto& { return r.train.device; },
           {"`cpu` \\| `cuda`", "`cpu`", "where each rank computes"}),
    choice("train.precision", [](auto& r) -> auto& { return r.train.precision; },
           {"`fp32` \\| `bf16` \\| `fp16`", "`fp32`", "parameter, activation and gradient storage"}),
    integer("train.steps", [](auto& r) -> auto& { return r.train.steps; }, kPositive,
            {"int ≥ 1", "required", "optimizer steps to train"}, true),
    integer("train.micro_batch", [](auto& r) -> auto& { return r.train.micro_batch; }, kBatch,
            {"int ≥ 1", "required", "sequences per forward/backward on one rank"}, true),
    integer("train.global_batch", [](auto& r) -> auto& { return r.train.global_batch; }, IntRule{1, 1 << 30, true},
            {"int ≥ 1 or auto", "auto = micro_batch × dp", "sequences per optimizer step, all ranks"}),
    number("train.grad_clip", [](auto& r) -> auto& { return r.train.grad_clip; }, kNonNegativeFloat,
           {"number ≥ 0", "1.0", "global gradient-norm clip (0 = none)"}),
    custom("train.seed", {"int ≥ 0", "1234", "seeds initialization and data order"},
           [](Section& s, Recipe& r) {
             int64_t seed = static_cast<int64_t>(r.train.seed);
             s.integer("seed", seed, kNonNegative);
             r.train.seed = static_cast<uint64_t>(seed);
           },
           [](const Recipe& r) -> std::optional<std::string> { return std::to_string(r.train.seed); }),
    choice("train.activation_checkpointing", [](auto& r) -> auto& { return r.train.activation_checkpointing; },
           {"`none` \\| `selective` \\| `full`", "`none`", "what backward recomputes instead of keeping"}),
    choice("train.on_nonfinite", [](auto& r) -> auto& { return r.train.on_nonfinite; },
           {"`stop` \\| `skip`", "`stop`", "what a NaN/Inf loss or gradient does"}),
    integer("train.max_skipped_steps", [](auto& r) -> auto& { return r.train.max_skipped_steps; }, kPositive,
            {"int ≥ 1", "10", "skipped steps in a row before stopping"}),
    section("train.loss_scale", {"map", "{}", "fp16's dynamic loss scaling"}),
    number("train.loss_scale.initial", [](auto& r) -> auto& { return r.train.loss_scale.initial; },
           FloatRule{1.0, false, 1e38}, {"number ≥ 1", "4294967296 (2^32)", "the loss scale at the start"}),
    integer("train.loss_scale.growth_interval", [](auto& r) -> auto& { return r.train.loss_scale.growth_interval; },
            kPositive, {"int ≥ 1", "1000", "steps without overflow before the scale doubles"}),
    number("train.loss_scale.backoff", [](auto& r) -> auto& { return r.train.loss_scale.backoff; },
           FloatRule{0.0, true, 1.0, true}, {"number in (0, 1)", "0.5", "factor on the scale at an overflow"}),
    integer("train.loss_scale.hysteresis", [](auto& r) -> auto& { return r.train.loss_scale.hysteresis; },
            IntRule{1, 1 << 20}, {"int ≥ 1", "2", "overflows tolerated before the scale backs off"}),
    custom("train.loss_scale.min", {"number > 0, ≤ initial", "1", "the scale's floor"},
           [](Section& s, Recipe& r) {
             LossScaleConfig& ls = r.train.loss_scale;
             s.number("min", ls.min, {0.0, true, 1e38});
             if (ls.min > ls.initial)
               s.error(s.where(), "train.loss_scale.min", fmt::format("min {} is above initial {}", ls.min, ls.initial),
                       "the scale starts at initial and never goes below min");
           },
           [](const Recipe& r) -> std::optional<std::string> { return num(r.train.loss_scale.min); }),
    [] {
      RecipeKey k = integer("train.threads", [](auto& r) -> auto& { return r.train.threads; }, IntRule{1, 4096, true},
                            {"int ≥ 1 or auto", "auto = usable cores / ranks on this node", "CPU threads per rank"});
      k.host_auto = true;
      return k;
    }(),

    section("optimizer", {"map", "{}", "AdamW or Muon and the learning-rate schedule"}),
    choice("optimizer.name", [](auto& r) -> auto& { return r.optimizer.name; },
           {"`adamw` \\| `muon`", "`adamw`", "the optimizer (muon: Muon for hidden matrices, AdamW for the rest)"}),
    number("optimizer.lr", [](auto& r) -> auto& { return r.optimizer.lr; }, kPositiveFloat,
           {"number > 0", "1e-3", "peak learning rate"}),
    number("optimizer.min_lr", [](auto& r) -> auto& { return r.optimizer.min_lr; }, kNonNegativeFloat,
           {"number ≥ 0", "0", "learning rate at the end of decay"}),
    integer("optimizer.warmup", [](auto& r) -> auto& { return r.optimizer.warmup; }, kNonNegative,
            {"int ≥ 0", "0", "linear warmup steps"}),
    choice("optimizer.schedule", [](auto& r) -> auto& { return r.optimizer.schedule; },
           {"`cosine` \\| `linear` \\| `constant` \\| `wsd`", "`cosine`", "decay after warmup"}),
    integer("optimizer.decay_steps", [](auto& r) -> auto& { return r.optimizer.decay_steps; }, kPositiveOrAuto,
            {"int ≥ 1 or auto", "auto = train.steps", "step at which min_lr is reached"}),
    integer("optimizer.wsd_decay_steps", [](auto& r) -> auto& { return r.optimizer.wsd_decay_steps; }, kNonNegative,
            {"int ≥ 0", "0 = wsd_decay_fraction", "schedule wsd: the decay's length in steps, ending at decay_steps"}),
    number("optimizer.wsd_decay_fraction", [](auto& r) -> auto& { return r.optimizer.wsd_decay_fraction; },
           FloatRule{0.0, true, 1.0}, {"number in (0, 1]", "0.2", "schedule wsd: the decay's share of decay_steps"}),
    choice("optimizer.wsd_shape", [](auto& r) -> auto& { return r.optimizer.wsd_shape; },
           {"`linear` \\| `1-sqrt`", "`1-sqrt`", "schedule wsd: the decay's shape"}),
    custom("optimizer.betas", {"[number, number] in [0, 1)", "[0.9, 0.95]", "Adam's β1, β2"}, parse_betas,
           [](const Recipe& r) -> std::optional<std::string> {
             return fmt::format("[{}, {}]", num(r.optimizer.beta1), num(r.optimizer.beta2));
           }),
    number("optimizer.eps", [](auto& r) -> auto& { return r.optimizer.eps; }, kPositiveFloat,
           {"number > 0", "1e-8", "Adam's ε"}),
    choice("optimizer.state_dtype", [](auto& r) -> auto& { return r.optimizer.state_dtype; },
           {"`fp32` \\| `bf16`", "`fp32`", "AdamW's moments in memory (bf16: half the bytes)"}),
    boolean("optimizer.master", [](auto& r) -> auto& { return r.optimizer.master; },
            {"bool", "true", "train.precision bf16: the optimizer's fp32 master copy (false: none)"}),
    number("optimizer.weight_decay", [](auto& r) -> auto& { return r.optimizer.weight_decay; }, kNonNegativeFloat,
           {"number ≥ 0", "0.1", "decoupled weight decay on matrices"}),
    section("optimizer.muon", {"map", "{}", "optimizer.name muon: Muon's settings"}),
    number("optimizer.muon.momentum", [](auto& r) -> auto& { return r.optimizer.muon.momentum; },
           FloatRule{0.0, false, 1.0, true}, {"number in [0, 1)", "0.95", "Muon's momentum μ"}),
    boolean("optimizer.muon.nesterov", [](auto& r) -> auto& { return r.optimizer.muon.nesterov; },
            {"bool", "true", "Nesterov momentum"}),
    integer("optimizer.muon.ns_steps", [](auto& r) -> auto& { return r.optimizer.muon.ns_steps; }, IntRule{1, 100},
            {"int in 1..100", "5", "Newton–Schulz iterations"}),
    custom("optimizer.muon.ns_coefficients", {"[number, number, number]", "[3.4445, -4.775, 2.0315]", "the quintic iteration's a, b, c"},
           parse_ns_coefficients,
           [](const Recipe& r) -> std::optional<std::string> {
             const auto& c = r.optimizer.muon.ns_coefficients;
             return fmt::format("[{}, {}, {}]", num(c[0]), num(c[1]), num(c[2]));
           }),
    choice("optimizer.muon.ns_dtype", [](auto& r) -> auto& { return r.optimizer.muon.ns_dtype; },
           {"`bf16` \\| `fp32`", "`bf16`", "the Newton–Schulz products' dtype"}),
    choice("optimizer.muon.adjust_lr", [](auto& r) -> auto& { return r.optimizer.muon.adjust_lr; },
           {"`original` \\| `match_rms_adamw`", "`original`", "the matrix's step size from its shape"}),
    optional_number("optimizer.muon.adamw_lr", [](auto& r) -> auto& { return r.optimizer.muon.adamw_lr; },
                    kPositiveFloat, {"number > 0 or auto", "auto = optimizer.lr", "the AdamW part's peak lr"}),
    optional_number("optimizer.muon.adamw_weight_decay",
                    [](auto& r) -> auto& { return r.optimizer.muon.adamw_weight_decay; }, kNonNegativeFloat,
                    {"number ≥ 0 or auto", "auto = optimizer.weight_decay", "the AdamW part's weight decay"}),

    section("parallel", {"map", "{}", "the layout over ranks"}),
    integer("parallel.tp", [](auto& r) -> auto& { return r.parallel.tp; }, kRankCount,
            {"int ≥ 1", "1", "tensor-parallel size"}),
    integer("parallel.pp", [](auto& r) -> auto& { return r.parallel.pp; }, kRankCount,
            {"int ≥ 1", "1", "pipeline stages"}),
    integer("parallel.dp", [](auto& r) -> auto& { return r.parallel.dp; }, kRankCountOrAuto,
            {"int ≥ 1 or auto", "auto = world / (tp·cp·pp)", "data-parallel replicas"}),
    integer("parallel.cp", [](auto& r) -> auto& { return r.parallel.cp; }, kRankCount,
            {"int ≥ 1", "1", "context-parallel size: each sequence split over cp ranks (2·cp chunks)"}),
    choice("parallel.cp_comm", [](auto& r) -> auto& { return r.parallel.cp_comm; },
           {"`ring` \\| `all_to_all`", "`ring`", "context parallelism's attention: K/V ring or Ulysses all-to-all"}),
    integer("parallel.ep", [](auto& r) -> auto& { return r.parallel.ep; }, kRankCount,
            {"int ≥ 1", "1", "expert-parallel size (model.moe): the experts split over ep ranks of dp × cp"}),
    integer("parallel.zero", [](auto& r) -> auto& { return r.parallel.zero; }, IntRule{0, 3},
            {"int 0..3", "0", "ZeRO stage"}),
    integer("parallel.zero_group", [](auto& r) -> auto& { return r.parallel.zero_group; }, kRankCountOrAuto,
            {"int ≥ 1 or auto", "auto = dp (zero ≥ 1), 1 (zero 0)", "dp ranks one ZeRO shard group spans"}),
    boolean("parallel.sequence_parallel", [](auto& r) -> auto& { return r.parallel.sequence_parallel; },
            {"bool", "false", "Megatron sequence parallelism"}),
    choice("parallel.pp_schedule", [](auto& r) -> auto& { return r.parallel.pp_schedule; },
           {"`gpipe` \\| `1f1b` \\| `interleaved` \\| `zero_bubble`", "`1f1b`", "pipeline schedule"}),
    integer("parallel.virtual_stages", [](auto& r) -> auto& { return r.parallel.virtual_stages; }, kRankCount,
            {"int ≥ 1", "1", "model chunks per pipeline rank (interleaved)"}),
    custom("parallel.pp_layers", {"list of ints ≥ 1", "(even split)", "blocks per pipeline stage"}, parse_pp_layers,
           emit_pp_layers),
    number("parallel.bucket_mb", [](auto& r) -> auto& { return r.parallel.bucket_mb; }, kPositiveFloat,
           {"number > 0", "25", "gradient bucket size in MiB"}),
    choice("parallel.grad_reduce_dtype", [](auto& r) -> auto& { return r.parallel.grad_reduce_dtype; },
           {"`fp32` \\| `bf16`", "`fp32`", "what the data-parallel gradient reduction sums in"}),
    choice("parallel.device_comm", [](auto& r) -> auto& { return r.parallel.device_comm; },
           {"`auto` \\| `nccl` \\| `staged`", "`auto`",
            "what moves device memory between cuda ranks: NCCL, or staged through host memory and MPI"}),
    choice("parallel.offload", [](auto& r) -> auto& { return r.parallel.offload; },
           {"`none` \\| `host` \\| `nvme`", "`none`",
            "where the optimizer's state waits between updates: device memory, host memory, or files"}),
    string("parallel.offload_path", [](auto& r) -> auto& { return r.parallel.offload_path; }, nullable,
           {"path", "(none)", "offload nvme: the directory of this job's state files (scratch)"}),
    boolean("parallel.offload_params", [](auto& r) -> auto& { return r.parallel.offload_params; },
            {"bool", "false", "ZeRO 3: the parameter shards go where the optimizer state goes"}),
    duration("parallel.timeout", [](auto& r) -> auto& { return r.parallel.timeout_s; }, false,
             {"duration", "300s", "bound on every wait for another rank"}),

    section("checkpoint", {"map", "{}", "saving and resuming"}),
    string("checkpoint.dir", [](auto& r) -> auto& { return r.checkpoint.dir; }, or_auto,
           {"path or auto", "auto = `<log.dir>/ckpt`", "where checkpoints go"}),
    integer("checkpoint.every", [](auto& r) -> auto& { return r.checkpoint.every; }, kNonNegative,
            {"int ≥ 0", "200", "steps between checkpoints (0 = only at the end)"}),
    integer("checkpoint.keep", [](auto& r) -> auto& { return r.checkpoint.keep; }, kPositive,
            {"int ≥ 1", "3", "newest checkpoints kept"}),
    custom("checkpoint.resume", {"`auto` \\| `none` \\| path", "`auto`", "where a run starts from"}, parse_resume,
           emit_resume),
    custom("checkpoint.load_weights_only", {"bool", "false", "take only the weights from the resumed checkpoint"},
           [](Section& s, Recipe& r) {
             s.boolean("load_weights_only", r.checkpoint.load_weights_only);
             if (r.checkpoint.load_weights_only && r.checkpoint.resume == ResumeMode::none)
               s.error(s.where(), "checkpoint.load_weights_only",
                       "load_weights_only is true but checkpoint.resume is none",
                       "set checkpoint.resume to the checkpoint whose weights to start from");
           },
           [](const Recipe& r) -> std::optional<std::string> { return flag(r.checkpoint.load_weights_only); }),
    duration("checkpoint.timeout", [](auto& r) -> auto& { return r.checkpoint.timeout_s; }, false,
             {"duration", "30m", "bound on a save's or load's waits for other ranks"}),
    boolean("checkpoint.async", [](auto& r) -> auto& { return r.checkpoint.async; },
            {"bool", "false", "snapshot to host memory at the step, write in the background"}),

    section("eval", {"map", "{}", "validation"}),
    integer("eval.every", [](auto& r) -> auto& { return r.eval.every; }, kNonNegative,
            {"int ≥ 0", "200", "steps between evaluations (0 = only at the end)"}),
    integer("eval.batches", [](auto& r) -> auto& { return r.eval.batches; }, kBatch,
            {"int ≥ 1", "20", "global batches per evaluation"}),

    section("log", {"map", "{}", "the console, metrics and the run directory"}),
    integer("log.every", [](auto& r) -> auto& { return r.log.every; }, kPositive,
            {"int ≥ 1", "10", "steps between console lines and metrics records"}),
    string("log.dir", [](auto& r) -> auto& { return r.log.dir; }, or_auto,
           {"path or auto", "auto = `runs/<name>`", "the run directory"}),
    [] {
      RecipeKey k = number("log.peak_tflops", [](auto& r) -> auto& { return r.log.peak_tflops; },
                           FloatRule{0.0, true, std::numeric_limits<double>::infinity(), false, true},
                           {"number > 0 or auto", "auto", "the per-rank peak MFU is measured against, TFLOP/s"});
      k.host_auto = true;
      return k;
    }(),
    number("log.straggler_factor", [](auto& r) -> auto& { return r.log.straggler_factor; }, FloatRule{1.0, true},
           {"number > 1", "1.5", "compute time over the median that names a straggler"}),
    boolean("log.tensorboard", [](auto& r) -> auto& { return r.log.tensorboard; },
            {"bool", "false", "also write TensorBoard event files"}),
    choice("log.profile", [](auto& r) -> auto& { return r.log.profile; },
           {"`none` \\| `ops`", "`none`", "ops: each op's device time over a few steps, a table at the end"}),
    integer("log.profile_steps", [](auto& r) -> auto& { return r.log.profile_steps; }, IntRule{1, 1000},
            {"int 1..1000", "3", "log.profile ops: the steps timed, after the first (warm-up) step"}),

    section("launch", {"map", "{}", "how ranks start"}),
    integer("launch.procs_per_node", [](auto& r) -> auto& { return r.launch.procs_per_node; }, IntRule{1, 4096},
            {"int ≥ 1", "1", "ranks per host"}),
    integer("launch.nodes", [](auto& r) -> auto& { return r.launch.nodes; }, kRankCount,
            {"int ≥ 1", "1", "hosts"}),
    string("launch.hostfile", [](auto& r) -> auto& { return r.launch.hostfile; }, nullable,
           {"path or null", "null", "Open MPI hostfile for ssh launches"}),
    integer("launch.max_restarts", [](auto& r) -> auto& { return r.launch.max_restarts; }, kNonNegative,
            {"int ≥ 0", "0", "restarts of a failed job from its last checkpoint"}),
    duration("launch.hang_timeout", [](auto& r) -> auto& { return r.launch.hang_timeout_s; }, true,
             {"duration", "10m", "no progress for this long ends the job (0 = off)"}),
    boolean("launch.share_devices", [](auto& r) -> auto& { return r.launch.share_devices; },
            {"bool", "false", "let more local ranks than visible CUDA devices share them"}),
    section("launch.slurm", {"map", "{}", "options for `llmtrain sbatch`"}),
    string("launch.slurm.partition", [](auto& r) -> auto& { return r.launch.slurm.partition; }, nullable,
           {"string or null", "null", "sbatch --partition"}),
    string("launch.slurm.account", [](auto& r) -> auto& { return r.launch.slurm.account; }, nullable,
           {"string or null", "null", "sbatch --account"}),
    custom("launch.slurm.time", {"Slurm time or null", "null", "sbatch --time"},
           [](Section& s, Recipe& r) {
             std::string& time = r.launch.slurm.time;
             s.string("time", time);
             if (!time.empty() && !is_slurm_time(time))
               s.error(s.get("time")->where, "launch.slurm.time",
                       fmt::format("expected a Slurm time limit, found \"{}\"", time),
                       "Slurm accepts minutes, MM:SS, HH:MM:SS or D-HH:MM:SS, e.g. 04:00:00");
           },
           [](const Recipe& r) -> std::optional<std::string> { return opt_str(r.launch.slurm.time); }),
    section("launch.ssh", {"map", "{}", "ssh options for hostfile launches"}),
    integer("launch.ssh.port", [](auto& r) -> auto& { return r.launch.ssh.port; }, IntRule{1, 65535},
            {"int 1..65535", "22", "ssh port"}),
    string("launch.ssh.identity", [](auto& r) -> auto& { return r.launch.ssh.identity; }, nullable,
           {"path or null", "null", "ssh identity file (-i)"}),
    string("launch.ssh.config", [](auto& r) -> auto& { return r.launch.ssh.config; }, nullable,
           {"path or null", "null", "ssh config file (-F)"}),
  };
  // clang-format on
}

}  // namespace

const std::vector<RecipeKey>& recipe_schema() {
  static const std::vector<RecipeKey> schema = make_schema();
  return schema;
}

std::vector<std::string> recipe_schema_keys() {
  std::vector<std::string> keys;
  for (const RecipeKey& k : recipe_schema()) keys.push_back(k.key);
  // The keys of data.train's {path, weight} items (parse_data_train), for "did you mean" hints.
  keys.insert(keys.end(), {"data.train[].path", "data.train[].weight"});
  return keys;
}

std::string parent_key(const std::string& key) {
  const size_t dot = key.rfind('.');
  return dot == std::string::npos ? "" : key.substr(0, dot);
}

}  // namespace llmtrain::cli
