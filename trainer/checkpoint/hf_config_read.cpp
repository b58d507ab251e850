// Import's half of the Hugging Face bridge: transformers' config.json read into a ModelConfig (each
// family's fields; what llmtrain does not build refused by name) and a sharded checkpoint's index.
// hf_bridge.cpp holds the layouts and export's configs.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "common/error.h"
#include "common/strings.h"
#include "trainer/checkpoint/hf_bridge.h"

namespace llmtrain::trainer {
using nlohmann::json;

// ---- import ----

namespace {

// PretrainedConfig's own fields (and bookkeeping keys) that do not change the forward pass.
const std::set<std::string> kHarmless = {
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "_name_or_path", "_commit_hash",
    "_attn_implementation", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "task_specific_params", "id2label", "label2id", "num_labels", "problem_type",
    "finetuning_task", "tokenizer_class", "prefix", "return_dict", "output_hidden_states", "output_attentions",
    "torchscript", "use_bfloat16", "tf_legacy_loss", "chunk_size_feed_forward", "is_decoder", "max_length",
    "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature",
    "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "output_past", "initializer_range", "pretraining_tp", "n_ctx",
    // GPT2DoubleHeadsModel's summary head (not part of the language model)
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
    // numerics only in 16-bit attention; llmtrain computes attention in fp32
    "reorder_and_upcast_attn"};

const std::set<std::string> kDropout = {"resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout",
                                        "summary_first_dropout"};

// A JSON integer in [lo, hi], checked in the type it arrives in (an unsigned 2^64 − 1 is not −1),
// or nothing: a float such as 1.9 is no integer, whatever it would be cast to.
std::optional<int64_t> integer_in(const json& v, int64_t lo, int64_t hi) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))) return {};
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) return {};
  return x;
}

class ConfigReader {
 public:
  ConfigReader(const json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}

  int integer(const std::string& key, int64_t fallback, bool required, int64_t lo, int64_t hi) {
    used_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) {
      if (required) problem(key, "missing", "a positive integer");
      return static_cast<int>(fallback);
    }
    const std::optional<int64_t> v = integer_in(*it, lo, hi);
    if (!v) {
      problem(key, it->dump(), fmt::format("an integer in [{}, {}]", lo, hi));
      return static_cast<int>(fallback);
    }
    return static_cast<int>(*v);
  }
  double number(const std::string& key, double fallback, double lo, double hi) {
    used_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return fallback;
    if (!it->is_number() || !(it->get<double>() >= lo && it->get<double>() <= hi)) {
      problem(key, it->dump(), fmt::format("a number in [{}, {}]", lo, hi));
      return fallback;
    }
    return it->get<double>();
  }
  bool boolean(const std::string& key, bool fallback) {
    used_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) {
      problem(key, it->dump(), "true or false");
      return fallback;
    }
    return it->get<bool>();
  }
  void use(const std::string& key) { used_.insert(key); }
  // The JSON object at `key` (nullptr when absent or null; a problem when it is something else).
  const json* object(const std::string& key) {
    used_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return nullptr;
    if (!it->is_object()) {
      problem(key, it->dump().substr(0, 80), "an object or null");
      return nullptr;
    }
    return &*it;
  }
  // The field must be absent, null or `want` (a value we implement).
  void only(const std::string& key, const json& want, const std::string& supported) {
    used_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null() || *it == want) return;
    problem(key, it->dump(), supported);
  }
  void problem(const std::string& key, const std::string& found, const std::string& expected) {
    problems_.push_back(fmt::format("{}: found {}, llmtrain supports {}", key, found, expected));
  }
  void finish(std::vector<std::string>& warnings) {
    for (const auto& [key, value] : j_.items()) {
      if (used_.count(key) || kHarmless.count(key)) continue;
      if (kDropout.count(key)) {
        if (value.is_number() && value.get<double>() != 0.0)
          warnings.push_back(fmt::format("{}: {} is not used: llmtrain trains without dropout", key, value.dump()));
        continue;
      }
      problem(key, value.dump().substr(0, 80), "no such field (it may change the architecture)");
    }
    if (problems_.empty()) return;
    throw Error(fmt::format("{}: not supported yet by llmtrain import:\n  {}", origin_, fmt::join(problems_, "\n  ")),
                "llmtrain implements transformers' GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, "
                "Qwen3ForCausalLM, MistralForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM, "
                "Qwen2MoeForCausalLM, Gemma3ForCausalLM and GptOssForCausalLM without these options (docs/hf.md "
                "lists what is accepted)");
  }

 private:
  const json& j_;
  std::string origin_;
  std::set<std::string> used_;
  std::vector<std::string> problems_;
};

constexpr int64_t kMaxDim = int64_t(1) << 20, kMaxVocab = int64_t(1) << 24, kMaxPositions = int64_t(1) << 22;

// RoPE's parameters: rope_theta and rope_scaling as transformers 4.x writes them, or 5.x's
// rope_parameters (theta inside). Types other than default, linear, llama3 and yarn are refused by
// name. As transformers 5 reads them: original_max_position_embeddings defaults to
// max_position_embeddings, yarn's factor to their ratio, and a beta of 0 is the default one.
void read_rope(ConfigReader& r, const json& j, ModelConfig& m) {
  const json* params = r.object("rope_parameters");
  const json* scaling = r.object("rope_scaling");
  std::string where = "rope_scaling";
  if (params) {
    where = "rope_parameters";
    if (scaling) r.problem("rope_scaling", scaling->dump().substr(0, 80), "one of rope_scaling and rope_parameters");
    scaling = params;
    r.only("rope_theta", nullptr, "rope_theta inside rope_parameters (transformers 5) or beside rope_scaling (4.x)");
  } else {
    m.rope_theta = r.number("rope_theta", 10000.0, 1.0, 1e12);
  }
  if (!scaling) return;
  RopeScalingConfig& s = m.rope_scaling;
  std::string kind = "default";
  for (const char* key : {"rope_type", "type"}) {
    auto it = scaling->find(key);
    if (it != scaling->end() && it->is_string()) kind = it->get<std::string>();
  }
  if (kind == "linear")
    s.type = RopeScalingType::linear;
  else if (kind == "llama3")
    s.type = RopeScalingType::llama3;
  else if (kind == "yarn")
    s.type = RopeScalingType::yarn;
  else if (kind != "default")
    r.problem(where + ".rope_type", json(kind).dump().substr(0, 80),
              "\"default\", \"linear\", \"llama3\" or \"yarn\" (not dynamic, longrope or others)");
  const bool llama3 = s.type == RopeScalingType::llama3, yarn = s.type == RopeScalingType::yarn;
  if (llama3 || yarn) s.original_max_positions = m.max_positions;
  bool factor_set = false;
  // (No structured bindings: clang before 16 cannot capture them in the lambda below.)
  for (auto it = scaling->begin(); it != scaling->end(); ++it) {
    const std::string& key = it.key();
    const json& value = it.value();
    const std::string name = where + "." + key;
    auto number = [&](double lo, double hi) {
      if (value.is_number() && value.get<double>() >= lo && value.get<double>() <= hi) return value.get<double>();
      r.problem(name, value.dump().substr(0, 80), fmt::format("a number in [{}, {}]", lo, hi));
      return 1.0;
    };
    // yarn's optional numbers: null (or 0, for the betas) keeps transformers' default.
    auto optional = [&](double& out, double lo, double hi) {
      if (value.is_null() || (value.is_number() && value.get<double>() == 0.0)) return;
      out = number(lo, hi);
    };
    if (key == "rope_type" || key == "type") {
      if (!value.is_string()) r.problem(name, value.dump().substr(0, 80), "a string");
    } else if (key == "rope_theta" && params) {
      m.rope_theta = number(1.0, 1e12);
    } else if (key == "factor" && s.type != RopeScalingType::none) {
      if (!(yarn && value.is_null())) s.factor = number(1.0, 1e6), factor_set = true;
    } else if (key == "low_freq_factor" && llama3) {
      s.low_freq_factor = number(1e-6, 1e6);
    } else if (key == "high_freq_factor" && llama3) {
      s.high_freq_factor = number(1e-6, 1e6);
    } else if (key == "original_max_position_embeddings" && (llama3 || yarn)) {
      if (const std::optional<int64_t> v = integer_in(value, 1, kMaxPositions))
        s.original_max_positions = int(*v);
      else
        r.problem(name, value.dump().substr(0, 80), fmt::format("an integer in [1, {}]", kMaxPositions));
    } else if (key == "beta_fast" && yarn) {
      optional(s.beta_fast, 1e-6, 1e6);
    } else if (key == "beta_slow" && yarn) {
      optional(s.beta_slow, 1e-6, 1e6);
    } else if (key == "attention_factor" && yarn) {
      if (!value.is_null()) s.attention_factor = number(1e-6, 1e3);
    } else if ((key == "mscale" || key == "mscale_all_dim") && yarn) {
      if (!value.is_null()) (key == "mscale" ? s.mscale : s.mscale_all_dim) = number(0.0, 1e3);
    } else if (key == "truncate" && yarn) {
      if (value.is_boolean())
        s.truncate = value.get<bool>();
      else if (!value.is_null())
        r.problem(name, value.dump().substr(0, 80), "true or false");
    } else {
      r.problem(name, value.dump().substr(0, 80), fmt::format("no such field for rope type {}", kind));
    }
  }
  if (yarn && !factor_set) s.factor = double(m.max_positions) / double(s.original_max_positions);
  if (yarn && !(s.factor >= 1.0))
    r.problem(where + ".factor", json(s.factor).dump(),
              "a factor of at least 1 (max_position_embeddings / "
              "original_max_position_embeddings when absent)");
  if (s.type == RopeScalingType::llama3 && !(s.high_freq_factor > s.low_freq_factor))
    r.problem(where + ".high_freq_factor", json(s.high_freq_factor).dump(),
              fmt::format("a value above low_freq_factor {}", s.low_freq_factor));
}

// Mixtral's sparse block on every layer: softmax router, top num_experts_per_tok renormalised (Mixtral
// always divides the picks' weights by their sum), dropless. router_aux_loss_coef is carried over as
// it is, though the two losses normalise differently (docs/hf.md); Mixtral has no z-loss. gpt-oss's
// blocks route the same way (its top_k defaults to 4).
void read_mixtral_moe(ConfigReader& r, ModelConfig& m, int64_t default_top_k = 2, bool top_k_required = true) {
  MoeConfig& e = m.moe;
  e.experts = r.integer("num_local_experts", 8, true, 1, 1 << 12);
  e.top_k = r.integer("num_experts_per_tok", default_top_k, top_k_required, 1, 1 << 12);
  if (e.top_k > e.experts)
    r.problem("num_experts_per_tok", std::to_string(e.top_k), fmt::format("at most num_local_experts ({})", e.experts));
  e.ffn_hidden = m.ffn_hidden;
  e.every = 1;
  e.first_dense = 0;
  e.renormalize = true;
  e.capacity_factor = 0;
  e.aux_loss = r.number("router_aux_loss_coef", 0.001, 0.0, 1e3);
  e.z_loss = 0;
  r.only("router_jitter_noise", 0.0, "0 (no multiplicative noise on the router's input)");
  r.use("output_router_logits");  // whether forward returns the router logits (and adds the aux loss)
}

// Qwen3-MoE's sparse blocks: softmax router, top num_experts_per_tok, renormalised when
// norm_topk_prob, dropless. Layer l is a MoE block when num_experts > 0, (l + 1) % decoder_sparse_step
// == 0 and l is not in mlp_only_layers; the dense ones are Qwen3's MLP of intermediate_size. That set
// is taken when model.moe's first_dense / every can say it (every pattern export writes, and the
// released models: all layers MoE), and refused naming mlp_only_layers otherwise. Missing fields take
// Qwen3MoeConfig's defaults, as transformers does. Qwen2-MoE's blocks are the same with a gated
// shared expert of shared_expert_intermediate_size (qwen2: its defaults Qwen2MoeConfig's).
void read_qwen_moe(ConfigReader& r, const json& j, ModelConfig& m, bool qwen2) {
  MoeConfig& e = m.moe;
  // transformers 5 saves num_experts under its attribute_map's name, num_local_experts.
  const bool local = j.contains("num_local_experts") && !j["num_local_experts"].is_null();
  e.experts = r.integer(local ? "num_local_experts" : "num_experts", qwen2 ? 60 : 128, false, 1, 1 << 12);
  if (local && j.contains("num_experts") && !j["num_experts"].is_null() &&
      r.integer("num_experts", e.experts, false, 1, 1 << 12) != e.experts)
    r.problem("num_experts", j["num_experts"].dump(), fmt::format("num_local_experts' value ({})", e.experts));
  e.top_k = r.integer("num_experts_per_tok", qwen2 ? 4 : 8, false, 1, 1 << 12);
  if (e.top_k > e.experts)
    r.problem("num_experts_per_tok", std::to_string(e.top_k), fmt::format("at most num_experts ({})", e.experts));
  e.ffn_hidden = r.integer("moe_intermediate_size", qwen2 ? 1408 : 768, false, 1, kMaxDim * 8);
  if (qwen2) e.shared_ffn_hidden = r.integer("shared_expert_intermediate_size", 5632, false, 1, kMaxDim * 8);
  e.renormalize = r.boolean("norm_topk_prob", false);
  e.capacity_factor = 0;
  e.aux_loss = r.number("router_aux_loss_coef", 0.001, 0.0, 1e3);
  e.z_loss = 0;
  r.use("output_router_logits");
  const int step = r.integer("decoder_sparse_step", 1, false, 1, 4096);
  std::vector<bool> dense(size_t(std::max(m.layers, 0)), false);
  r.use("mlp_only_layers");
  if (const auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    const bool ok =
        it->is_array() && it->size() <= dense.size() &&
        std::all_of(it->begin(), it->end(), [&](const json& l) { return integer_in(l, 0, m.layers - 1).has_value(); });
    if (!ok) {
      r.problem("mlp_only_layers", it->dump().substr(0, 80), fmt::format("a list of layers in [0, {})", m.layers));
      return;
    }
    for (const json& l : *it) dense[size_t(l.get<int64_t>())] = true;
  }
  std::vector<int> sparse;
  for (int l = 0; l < m.layers; ++l)
    if (!dense[size_t(l)] && (l + 1) % step == 0) sparse.push_back(l);
  if (sparse.empty()) {
    r.problem("mlp_only_layers", j.value("mlp_only_layers", json::array()).dump().substr(0, 80),
              fmt::format("at least one MoE layer (with decoder_sparse_step {})", step));
    return;
  }
  e.first_dense = sparse.front();
  e.every = sparse.size() > 1 ? sparse[1] - sparse[0] : m.layers - sparse[0];
  for (int l = 0; l < m.layers; ++l)
    if (e.layer(l) != std::binary_search(sparse.begin(), sparse.end(), l)) {
      r.problem("mlp_only_layers", j.value("mlp_only_layers", json::array()).dump().substr(0, 80),
                fmt::format("dense layers llmtrain can hold with decoder_sparse_step {}: the first n dense, then a "
                            "MoE block every k-th layer (model.moe.first_dense, model.moe.every)",
                            step));
      return;
    }
}

// The llama family's shape fields, each class's defaults where a field is absent (kv_heads 0: the
// attention heads; head_dim 0: hidden / heads).
struct LlamaShapeDefaults {
  int64_t hidden, layers, heads, kv_heads, ffn, max_positions;
  double norm_eps;
  bool tie;
  int64_t head_dim;
};

void read_llama_shape(ConfigReader& r, ModelConfig& m, const LlamaShapeDefaults& d) {
  m.family = ModelFamily::llama;
  m.hidden = r.integer("hidden_size", d.hidden, true, 1, kMaxDim);
  m.layers = r.integer("num_hidden_layers", d.layers, true, 1, 4096);
  m.heads = r.integer("num_attention_heads", d.heads, true, 1, kMaxDim);
  m.kv_heads = r.integer("num_key_value_heads", d.kv_heads > 0 ? d.kv_heads : m.heads, false, 1, kMaxDim);
  m.ffn_hidden = r.integer("intermediate_size", d.ffn, true, 1, kMaxDim * 8);
  m.vocab = r.integer("vocab_size", 0, true, 1, kMaxVocab);
  m.max_positions = r.integer("max_position_embeddings", d.max_positions, false, 1, kMaxPositions);
  m.norm_eps = r.number("rms_norm_eps", d.norm_eps, 0.0, 1.0);
  m.tie_embeddings = r.boolean("tie_word_embeddings", d.tie);
  const int64_t head_dim = r.integer("head_dim", d.head_dim, false, 2, kMaxDim);
  if (head_dim > 0 && !(m.heads > 0 && int64_t(m.hidden) == head_dim * m.heads)) m.head_dim = int(head_dim);
}

// LlamaForCausalLM and the classes that are Llama with one more option each: Qwen2 (q/k/v biases),
// Qwen3 (per-head q/k norms, its own head size), Mistral (a sliding window), Mixtral (Mistral with
// a MoE block in place of every MLP), Qwen3-MoE (Qwen3 with MoE blocks), Qwen2-MoE (Qwen2 with MoE
// blocks that have a gated shared expert).
void read_llama_family(ConfigReader& r, const json& j, const std::string& type, ModelConfig& m) {
  read_llama_shape(r, m, {4096, 32, 32, 0, 11008, 2048, 1e-6, false, 0});
  read_rope(r, j, m);
  r.only("hidden_act", "silu", "\"silu\" (SwiGLU)");
  if (type == "llama" || type == "qwen3" || type == "qwen3_moe")
    r.only("attention_bias", false, "false (a bias on q, k, v and o_proj; Qwen2 is the class with q/k/v biases)");
  if (type == "llama") r.only("mlp_bias", false, "false (no biases on the MLP)");
  m.qkv_bias = type == "qwen2" || type == "qwen2_moe";
  m.qk_norm = type == "qwen3" || type == "qwen3_moe";
  if (type == "mistral" || type == "mixtral")
    m.sliding_window = r.integer("sliding_window", 0, false, 1, kMaxPositions);
  if (type == "mixtral") read_mixtral_moe(r, m);
  if (type == "qwen3_moe" || type == "qwen2_moe") read_qwen_moe(r, j, m, type == "qwen2_moe");
  if (type == "qwen2_moe") r.only("qkv_bias", true, "true (Qwen2-MoE's q, k and v biases)");
  if (type == "qwen2" || type == "qwen3" || type == "qwen3_moe" || type == "qwen2_moe") {
    // Qwen windows the layers from max_window_layers on when use_sliding_window is set.
    r.only("use_sliding_window", false, "false (every layer attends to all earlier positions)");
    r.integer("sliding_window", 0, false, 0, kMaxPositions);  // unused; 5.x's Qwen2-MoE saves 0
    r.integer("max_window_layers", 0, false, 0, 1 << 20);
  }
  // transformers 5 lists each layer's attention: all of one kind, the window's or the full one.
  if (const auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    r.use("layer_types");
    const char* want = m.sliding_window > 0 ? "sliding_attention" : "full_attention";
    const bool ok = it->is_array() && it->size() == size_t(m.layers) &&
                    std::all_of(it->begin(), it->end(), [&](const json& t) { return t == want; });
    if (!ok) r.problem("layer_types", it->dump().substr(0, 80), fmt::format("\"{}\" for every layer", want));
  }
}

// Which layers are local (windowed): `local` (one entry a layer, the class's default), or the
// config's layer_types; said as model.sliding_window (0: every layer global) and
// full_attention_every (the first global layer's number n, every n-th after it global). A list
// that is no such pattern is refused naming layer_types (false returned when the list is malformed).
bool read_layer_types(ConfigReader& r, const json& j, ModelConfig& m, std::vector<bool> local, const char* example) {
  r.use("layer_types");
  if (const auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    const bool ok = it->is_array() && it->size() == size_t(m.layers) &&
                    std::all_of(it->begin(), it->end(),
                                [](const json& t) { return t == "sliding_attention" || t == "full_attention"; });
    if (!ok) {
      r.problem("layer_types", it->dump().substr(0, 80),
                fmt::format("{} entries, each \"sliding_attention\" or \"full_attention\"", m.layers));
      return false;
    }
    for (int l = 0; l < m.layers; ++l) local[size_t(l)] = (*it)[size_t(l)] == "sliding_attention";
  }
  const auto first_global = std::find(local.begin(), local.end(), false);
  const bool any_local = std::find(local.begin(), local.end(), true) != local.end();
  if (m.sliding_window == 0 || !any_local) {
    m.sliding_window = 0;  // every layer global
    return true;
  }
  m.full_attention_every = first_global == local.end() ? 0 : int(first_global - local.begin()) + 1;
  for (int l = 0; l < m.layers; ++l)
    if (m.windowed(l) != local[size_t(l)]) {
      r.problem("layer_types", j.value("layer_types", json::array()).dump().substr(0, 80),
                fmt::format("local layers with every n-th global (model.full_attention_every; {})", example));
      break;
    }
  return true;
}

// GptOssForCausalLM (gpt_oss) as transformers 4.55+ and 5.x save it (GptOssConfig's defaults where
// absent): Llama's shape fields with head_dim, biases on q, k, v and o_proj, a sink per head, local
// (window sliding_window) and global layers alternating (layer_types), YaRN RoPE by default, and a
// MoE block on every layer: top num_experts_per_tok with a softmax over the picked logits (Mixtral's
// renormalised weights), biases on the router and the experts, the clamped SwiGLU. The released
// checkpoints' MXFP4 experts (quantization_config) are refused: import the bf16 conversion.
void read_gpt_oss(ConfigReader& r, const json& j, ModelConfig& m) {
  read_llama_shape(r, m, {2880, 36, 64, 8, 2880, 131072, 1e-5, false, 64});  // GptOssConfig's defaults
  r.only("hidden_act", "silu", "\"silu\" (the experts' clamped SwiGLU)");
  r.only("attention_bias", true, "true (gpt-oss's biases on q, k, v and o_proj)");
  m.qkv_bias = m.o_bias = m.attention_sinks = true;

  read_mixtral_moe(r, m, 4, false);
  MoeConfig& e = m.moe;
  if (j.contains("experts_per_token") && r.integer("experts_per_token", e.top_k, false, 1, 1 << 12) != e.top_k)
    r.problem("experts_per_token", j["experts_per_token"].dump().substr(0, 80),
              fmt::format("num_experts_per_tok's value ({})", e.top_k));
  e.bias = true;
  e.swiglu_limit = r.number("swiglu_limit", 7.0, 1e-6, 1e6);
  e.swiglu_alpha = r.number("swiglu_alpha", 1.702, 1e-6, 1e6);
  r.use("initial_context_length");  // 4.x's: the original context, rope_scaling's too

  // RoPE: GptOssConfig's default YaRN (and theta 150000) where the config has none.
  const bool theta = (j.contains("rope_theta") && !j["rope_theta"].is_null()) ||
                     (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
                      j["rope_parameters"].contains("rope_theta"));
  const bool any_rope = (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) ||
                        (j.contains("rope_scaling") && !j["rope_scaling"].is_null());
  read_rope(r, j, m);
  if (!theta) m.rope_theta = 150000.0;
  if (!any_rope) {
    RopeScalingConfig& s = m.rope_scaling;
    s.type = RopeScalingType::yarn;
    s.factor = 32.0;
    s.beta_fast = 32.0;
    s.beta_slow = 1.0;
    s.truncate = false;
    s.original_max_positions = 4096;
  }

  m.sliding_window = r.integer("sliding_window", 128, false, 1, kMaxPositions);
  if (j.contains("sliding_window") && j["sliding_window"].is_null()) m.sliding_window = 0;
  std::vector<bool> local(size_t(m.layers));
  for (int l = 0; l < m.layers; ++l) local[size_t(l)] = l % 2 == 0;  // GptOssConfig's: local, then global
  read_layer_types(r, j, m, std::move(local), "gpt-oss: 2");
}

// Gemma3ForCausalLM's text model (gemma3_text) as transformers 4.x and 5.x save it: Llama's
// shape fields with head_dim (Gemma3TextConfig's defaults where absent), the GeGLU MLP, four norms a
// block, q/k norms, the embedding × √hidden, local (windowed) and global layers (layer_types, or 4.x's
// sliding_window_pattern) with their own RoPE (5.x: rope_parameters.sliding_attention and
// .full_attention; 4.x: rope_local_base_freq, and rope_theta with rope_scaling for the global ones).
// The local layers take the default RoPE only; the layer pattern must be every n-th layer global.
void read_gemma3(ConfigReader& r, const json& j, const std::string& origin, ModelConfig& m,
                 std::vector<std::string>& warnings) {
  read_llama_shape(r, m, {2304, 26, 8, 4, 9216, 131072, 1e-6, true, 256});  // Gemma3TextConfig's defaults
  m.qk_norm = true;
  m.post_norms = true;
  m.scale_embeddings = true;
  m.activation = MlpActivation::geglu;
  r.only("hidden_activation", "gelu_pytorch_tanh", "\"gelu_pytorch_tanh\" (GeGLU, tanh approximation)");
  r.only("hidden_act", "gelu_pytorch_tanh", "\"gelu_pytorch_tanh\" (GeGLU, tanh approximation)");
  r.only("attention_bias", false, "false (no biases on q, k, v and o_proj)");
  r.only("attn_logit_softcapping", nullptr, "null (Gemma 2's capped attention scores are not built)");
  r.only("use_bidirectional_attention", false, "false (causal attention)");
  r.use("cache_implementation");  // generation's cache kind ("hybrid")
  m.query_pre_attn_scalar = r.number("query_pre_attn_scalar", 256, 1e-6, 1e9);
  m.logit_softcap = r.number("final_logit_softcapping", 0, 1e-6, 1e6);
  m.sliding_window = r.integer("sliding_window", 4096, false, 1, kMaxPositions);
  if (j.contains("sliding_window") && j["sliding_window"].is_null()) m.sliding_window = 0;

  // Which layers are local: layer_types (5.x, and 4.x from 4.53), else every pattern-th global.
  const bool private_pattern = j.contains("_sliding_window_pattern");
  const int pattern =
      r.integer(private_pattern ? "_sliding_window_pattern" : "sliding_window_pattern", 6, false, 1, 1 << 20);
  if (private_pattern) r.integer("sliding_window_pattern", pattern, false, 1, 1 << 20);
  std::vector<bool> local(size_t(m.layers));
  for (int l = 0; l < m.layers; ++l) local[size_t(l)] = (l + 1) % pattern != 0;
  if (!read_layer_types(r, j, m, std::move(local), "Gemma 3: 6")) return;

  // RoPE: the global layers' as any llama's, the local layers' base.
  const json* params =
      j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
              (j["rope_parameters"].contains("full_attention") || j["rope_parameters"].contains("sliding_attention"))
          ? &j["rope_parameters"]
          : nullptr;
  double local_theta = 10000.0;
  if (params) {
    r.use("rope_parameters");
    r.only("rope_theta", nullptr, "rope_theta inside rope_parameters (transformers 5)");
    r.only("rope_local_base_freq", nullptr, "the local base inside rope_parameters.sliding_attention");
    m.rope_theta = 1e6;
    for (const auto& [key, value] : params->items()) {
      const std::string where = origin + " rope_parameters." + key;
      if (key == "full_attention" && value.is_object()) {
        const json wrapped = {{"rope_parameters", value}};  // read as a llama's rope_parameters
        ConfigReader sub(wrapped, where);
        read_rope(sub, wrapped, m);
        sub.finish(warnings);
      } else if (key == "sliding_attention" && value.is_object()) {
        for (const auto& [k, v] : value.items()) {
          if (k == "rope_theta" && v.is_number() && v.get<double>() >= 1.0 && v.get<double>() <= 1e12)
            local_theta = v.get<double>();
          else if (!((k == "rope_type" || k == "type") && v == "default"))
            r.problem("rope_parameters.sliding_attention." + k, v.dump().substr(0, 80),
                      k == "rope_theta" ? "a number in [1, 1e12]" : "rope_type \"default\" and rope_theta only");
        }
      } else {
        r.problem("rope_parameters." + key, value.dump().substr(0, 80),
                  "the objects full_attention and sliding_attention");
      }
    }
  } else {
    read_rope(r, j, m);
    if (!j.contains("rope_theta") || j["rope_theta"].is_null()) m.rope_theta = 1e6;  // Gemma3TextConfig's default
    local_theta = r.number("rope_local_base_freq", 10000.0, 1.0, 1e12);
  }
  if (m.sliding_window > 0) m.rope_local_theta = local_theta;
  if (m.query_pre_attn_scalar == double(m.head_size())) m.query_pre_attn_scalar = 0;  // the default scale
}

}  // namespace

HfImportedConfig hf_read_model_config(const json& j, const std::string& origin) {
  if (!j.is_object()) throw Error(fmt::format("{}: not a JSON object", origin), "give transformers' config.json");
  HfImportedConfig out;
  ModelConfig& m = out.model;
  const std::string type =
      j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  ConfigReader r(j, origin);
  if (type == "gpt2") {
    m.family = ModelFamily::gpt2;
    m.hidden = r.integer("n_embd", 768, true, 1, kMaxDim);
    m.layers = r.integer("n_layer", 12, true, 1, 4096);
    m.heads = r.integer("n_head", 12, true, 1, kMaxDim);
    m.kv_heads = m.heads;
    m.ffn_hidden = r.integer("n_inner", int64_t(4) * m.hidden, false, 1, kMaxDim * 8);
    m.vocab = r.integer("vocab_size", 0, true, 1, kMaxVocab);
    m.max_positions = r.integer("n_positions", 1024, false, 1, kMaxPositions);
    m.norm_eps = r.number("layer_norm_epsilon", 1e-5, 0.0, 1.0);
    m.tie_embeddings = r.boolean("tie_word_embeddings", true);
    const auto act = j.find("activation_function");
    if (act != j.end() && *act == "gelu_pytorch_tanh")  // the same formula under another name
      r.only("activation_function", "gelu_pytorch_tanh", "");
    else
      r.only("activation_function", "gelu_new", "\"gelu_new\" (GELU, tanh approximation)");
    r.only("scale_attn_weights", true, "true (scores scaled by 1/sqrt(head dim))");
    r.only("scale_attn_by_inverse_layer_idx", false, "false");
    r.only("add_cross_attention", false, "false (a decoder-only model)");
  } else if (type == "llama" || type == "qwen2" || type == "qwen3" || type == "mistral" || type == "mixtral" ||
             type == "qwen3_moe" || type == "qwen2_moe") {
    read_llama_family(r, j, type, m);
  } else if (type == "gemma3_text") {
    read_gemma3(r, j, origin, m, out.warnings);
  } else if (type == "gpt_oss") {
    read_gpt_oss(r, j, m);
  } else {
    throw Error(fmt::format("{}: model_type is {}; llmtrain imports \"gpt2\", \"llama\", \"qwen2\", \"qwen3\", "
                            "\"mistral\", \"mixtral\", \"qwen3_moe\", \"qwen2_moe\", \"gemma3_text\" and "
                            "\"gpt_oss\"",
                            origin, j.contains("model_type") ? j["model_type"].dump() : "missing"),
                "not supported yet: other architectures");
  }
  m.init_std = r.number("initializer_range", 0.02, 0.0, 10.0);
  r.only("pruned_heads", json::object(), "{}");
  r.only("is_encoder_decoder", false, "false");
  r.only("quantization_config", nullptr, "none (an unquantized model)");
  if (m.heads > 0 && m.head_dim == 0 && m.hidden % m.heads != 0)
    r.problem("num_attention_heads", std::to_string(m.heads), fmt::format("a divisor of the hidden size {}", m.hidden));
  if (m.kv_heads > 0 && m.heads % m.kv_heads != 0)
    r.problem("num_key_value_heads", std::to_string(m.kv_heads),
              fmt::format("a divisor of the attention heads {}", m.heads));
  auto id = [&](const char* key) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null() || it->is_array()) return int32_t(-1);  // a list of ids: none taken
    const std::optional<int64_t> v = integer_in(*it, INT64_MIN, INT64_MAX);
    if (!v) r.problem(key, it->dump().substr(0, 80), "an integer token id, a list of them or null");
    return v && *v >= 0 && *v < m.vocab ? int32_t(*v) : int32_t(-1);
  };
  out.bos = id("bos_token_id");
  out.eos = id("eos_token_id");
  r.finish(out.warnings);
  m.seq_len = std::min(m.max_positions, 2048);
  return out;
}

std::map<std::string, std::string> hf_read_weight_index(const json& j, const std::string& origin) {
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(fmt::format("{}: no weight_map object", origin), "the index is damaged");
  const json& map = j["weight_map"];
  if (map.size() > kHfMaxIndexTensors)
    throw Error(fmt::format("{}: {} tensors in the weight_map, more than the {} llmtrain reads", origin, map.size(),
                            kHfMaxIndexTensors),
                "the index is damaged (or crafted)");
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : map.items()) {
    if (!file.is_string() || !is_plain_file_name(file.get<std::string>()))
      throw Error(fmt::format("{}: tensor {} maps to {}, not a file name inside the model directory", origin,
                              printable(tensor), printable(file.dump().substr(0, 80))),
                  "the index is damaged (or crafted): shards are files of the model directory");
    out.emplace(tensor, file.get<std::string>());
  }
  return out;
}

}  // namespace llmtrain::trainer
