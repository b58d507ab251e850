#include "common/recipe/recipe_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>

#include "common/error.h"

namespace llmtrain {
namespace fs = std::filesystem;

bool default_tie_embeddings(ModelFamily family) { return family == ModelFamily::gpt2; }

namespace {

std::string absolute_path(const std::string& p, const std::string& cwd) {
  if (p.empty()) return p;
  fs::path path(p);
  if (path.is_relative()) path = fs::path(cwd) / path;
  return path.lexically_normal().string();
}

// A layout of `needed` ranks on a world nobody sized (WorldInfo::defaulted): how to start them.
RecipeProblem start_ranks_problem(int64_t needed, const std::string& layout, const WorldInfo& world) {
  return {"launch.procs_per_node",
          fmt::format("the layout needs {} ranks ({}), but no rank count was given, so the launch starts {} ({})",
                      needed, layout, world.size, world.source),
          fmt::format("start {} ranks: --nproc {} (or set launch.procs_per_node: {} in the recipe)", needed, needed,
                      needed)};
}

// LLaMA's FFN width: 2/3 of 4·hidden, rounded up to a multiple of 256 (Meta's reference).
int llama_default_ffn(int hidden) {
  int f = (8 * hidden) / 3;
  return (f + 255) / 256 * 256;
}

}  // namespace

void fill_zero_group(ParallelConfig& p) {
  if (p.zero == 0)
    p.zero_group = 1;
  else if (p.zero_group == 0)
    p.zero_group = p.dp;
}

int threads_per_rank(const Recipe& r, int cores, int ranks_on_host) {
  if (r.train.threads > 0) return r.train.threads;
  return std::max(1, cores / std::max(1, ranks_on_host));
}

std::vector<RecipeProblem> recipe_resolve(Recipe& r, const WorldInfo& world, const std::string& cwd,
                                          const TokenizerVocabFn& tokenizer_vocab) {
  std::vector<RecipeProblem> problems;
  ModelConfig& m = r.model;

  if (m.kv_heads == 0) m.kv_heads = m.heads;
  if (m.ffn_hidden == 0) m.ffn_hidden = m.family == ModelFamily::gpt2 ? 4 * m.hidden : llama_default_ffn(m.hidden);
  if (m.max_positions == 0) m.max_positions = m.seq_len;
  if (m.head_dim == 0 && m.heads > 0 && m.hidden % m.heads == 0) m.head_dim = m.hidden / m.heads;
  if (m.moe.ffn_hidden == 0) m.moe.ffn_hidden = m.ffn_hidden;

  if (r.data.tokenizer != "byte") r.data.tokenizer = absolute_path(r.data.tokenizer, cwd);
  for (auto& src : r.data.train) src.path = absolute_path(src.path, cwd);
  r.data.valid = absolute_path(r.data.valid, cwd);
  if (m.vocab == 0) {
    try {
      m.vocab = tokenizer_vocab(r.data.tokenizer);
    } catch (const Error& e) {
      problems.push_back({"data.tokenizer", fmt::format("model.vocab is auto, but {}", e.what()),
                          "fix data.tokenizer, or set model.vocab explicitly", /*io=*/true});
      m.vocab = 1;  // keep resolving the rest; the problem above stops the run
    }
  }

  ParallelConfig& p = r.parallel;
  if (p.dp == 0) {
    // Products of counts in 64 bits: the parser bounds each count by 2^16, so none can wrap.
    const int64_t tp_pp = int64_t(p.tp) * p.cp * p.pp;
    const std::string factors =
        p.cp > 1 ? fmt::format("tp {} × cp {} × pp {}", p.tp, p.cp, p.pp) : fmt::format("tp {} × pp {}", p.tp, p.pp);
    if (tp_pp > 0 && world.size % tp_pp == 0) {
      p.dp = int(world.size / tp_pp);
    } else if (world.defaulted && tp_pp > world.size) {
      problems.push_back(start_ranks_problem(tp_pp, fmt::format("{}, dp auto", factors), world));
      p.dp = 1;
    } else {
      problems.push_back({"parallel.dp",
                          fmt::format("parallel.dp is auto, but world size {} ({}) is not divisible by {} = {}",
                                      world.size, world.source, factors, tp_pp),
                          p.cp > 1 ? "make the number of ranks a multiple of tp × cp × pp, or change tp/cp/pp"
                                   : "make the number of ranks a multiple of tp × pp, or change tp/pp"});
      p.dp = 1;
    }
  }
  // zero_group: an explicit value is still told from auto here.
  if (p.zero == 0 && p.zero_group > 1)
    problems.push_back({"parallel.zero_group",
                        fmt::format("zero_group {} is set but parallel.zero is 0 (nothing is sharded)", p.zero_group),
                        "zero_group only means something with parallel.zero: 1: set zero: 1, or remove zero_group"});
  fill_zero_group(p);
  if (r.train.global_batch == 0)
    r.train.global_batch = r.train.micro_batch * p.dp;  // each at most 2^20 and 2^16: no wrap
  if (r.optimizer.decay_steps == 0) r.optimizer.decay_steps = r.train.steps;
  // Muon's AdamW part: optimizer.lr and weight_decay unless set (recipe_changes: they follow them).
  if (!r.optimizer.muon.adamw_lr) r.optimizer.muon.adamw_lr = r.optimizer.lr;
  if (!r.optimizer.muon.adamw_weight_decay) r.optimizer.muon.adamw_weight_decay = r.optimizer.weight_decay;

  if (r.log.dir.empty()) r.log.dir = "runs/" + r.name;
  r.log.dir = absolute_path(r.log.dir, cwd);
  if (r.checkpoint.dir.empty()) r.checkpoint.dir = (fs::path(r.log.dir) / "ckpt").string();
  r.checkpoint.dir = absolute_path(r.checkpoint.dir, cwd);
  r.checkpoint.resume_path = absolute_path(r.checkpoint.resume_path, cwd);
  r.parallel.offload_path = absolute_path(r.parallel.offload_path, cwd);
  r.launch.hostfile = absolute_path(r.launch.hostfile, cwd);
  r.launch.ssh.identity = absolute_path(r.launch.ssh.identity, cwd);
  r.launch.ssh.config = absolute_path(r.launch.ssh.config, cwd);
  return problems;
}

std::vector<RecipeProblem> recipe_check(const Recipe& r, const WorldInfo& world) {
  std::vector<RecipeProblem> out;
  auto problem = [&](std::string key, std::string msg, std::string hint) {
    out.push_back({std::move(key), std::move(msg), std::move(hint)});
  };
  const ModelConfig& m = r.model;
  const ParallelConfig& p = r.parallel;

  // Model shape.
  if (m.head_dim == 0 && m.hidden % m.heads != 0)
    problem("model.heads",
            fmt::format("hidden {} is not divisible by heads {} (remainder {})", m.hidden, m.heads, m.hidden % m.heads),
            "choose heads so that hidden / heads (the head size) is a whole number, e.g. hidden 768 with 12 heads");
  if (m.heads % m.kv_heads != 0)
    problem("model.kv_heads", fmt::format("heads {} is not divisible by kv_heads {}", m.heads, m.kv_heads),
            "each key/value head serves heads / kv_heads query heads: pick a divisor of heads");
  if (m.family == ModelFamily::gpt2 && m.kv_heads != m.heads)
    problem("model.kv_heads",
            fmt::format("family gpt2 uses multi-head attention, found kv_heads {} != heads {}", m.kv_heads, m.heads),
            "remove model.kv_heads, or use family: llama for grouped-query attention");
  const bool derived_head = m.hidden % m.heads == 0 && int64_t(m.head_size()) * m.heads == m.hidden;
  if (m.family == ModelFamily::llama && derived_head && m.head_size() % 2 != 0)
    problem(
        "model.heads",
        fmt::format("RoPE needs an even head size, found hidden {} / heads {} = {}", m.hidden, m.heads, m.head_size()),
        "choose heads so that hidden / heads is even");
  else if (m.family == ModelFamily::llama && m.head_dim > 0 && m.head_dim % 2 != 0)
    problem("model.head_dim", fmt::format("RoPE needs an even head size, found head_dim {}", m.head_dim),
            "choose an even model.head_dim");
  // The llama family's variants: GPT-2 has biases everywhere, learned positions and no windows.
  if (m.family == ModelFamily::gpt2) {
    const char* hint =
        "this key describes a llama-family model (Qwen, Mistral, Llama 3): remove it, or use family: llama";
    if (m.head_dim > 0 && int64_t(m.head_dim) * m.heads != m.hidden)
      problem("model.head_dim",
              fmt::format("family gpt2 has head size hidden / heads, found head_dim {} with hidden {} and heads {}",
                          m.head_dim, m.hidden, m.heads),
              hint);
    if (m.qkv_bias) problem("model.qkv_bias", "family gpt2 always has its q, k and v biases", hint);
    if (m.qk_norm) problem("model.qk_norm", "family gpt2 has no per-head q/k norm", hint);
    if (m.sliding_window > 0) problem("model.sliding_window", "family gpt2 attends to every earlier position", hint);
    if (m.rope_scaling.type != RopeScalingType::none)
      problem("model.rope_scaling.type", "family gpt2 has learned positions, not RoPE", hint);
    const std::pair<const char*, bool> gemma_keys[] = {{"full_attention_every", m.full_attention_every > 0},
                                                       {"rope_local_theta", m.rope_local_theta > 0},
                                                       {"query_pre_attn_scalar", m.query_pre_attn_scalar > 0},
                                                       {"activation", m.activation != MlpActivation::swiglu},
                                                       {"post_norms", m.post_norms},
                                                       {"scale_embeddings", m.scale_embeddings},
                                                       {"logit_softcap", m.logit_softcap > 0},
                                                       {"attention_sinks", m.attention_sinks},
                                                       {"o_bias", m.o_bias}};
    for (const auto& [key, set] : gemma_keys)
      if (set) problem(fmt::format("model.{}", key), "family gpt2 is GPT-2's architecture, without this variant", hint);
  }
  if (m.o_bias && m.post_norms)
    problem("model.o_bias", "o_bias with post_norms: the bias would be added after the attention output's norm",
            "remove one of them (Gemma has no o_proj bias)");
  // Gemma 3's local/global layers: the pattern and the local RoPE base describe windowed layers.
  if (m.sliding_window == 0) {
    const char* hint = "set model.sliding_window (Gemma 3: 512 or 1024), or remove the key";
    if (m.full_attention_every > 0)
      problem("model.full_attention_every",
              fmt::format("full_attention_every {} without a sliding window: every layer already sees every key",
                          m.full_attention_every),
              hint);
    if (m.rope_local_theta > 0)
      problem("model.rope_local_theta",
              fmt::format("rope_local_theta {} without a sliding window: no layer is local", m.rope_local_theta), hint);
  }
  if (m.rope_scaling.type == RopeScalingType::llama3 &&
      !(m.rope_scaling.high_freq_factor > m.rope_scaling.low_freq_factor))
    problem("model.rope_scaling.high_freq_factor",
            fmt::format("llama3 scaling needs high_freq_factor > low_freq_factor, found {} and {}",
                        m.rope_scaling.high_freq_factor, m.rope_scaling.low_freq_factor),
            "Llama 3.1 uses low_freq_factor 1 and high_freq_factor 4");
  {
    // YaRN's keys mean nothing to another rope type: refused there rather than ignored.
    const RopeScalingConfig& rs = m.rope_scaling;
    const RopeScalingConfig defaults;
    if (rs.type != RopeScalingType::yarn) {
      const std::pair<const char*, bool> yarn_only[] = {
          {"beta_fast", rs.beta_fast != defaults.beta_fast},
          {"beta_slow", rs.beta_slow != defaults.beta_slow},
          {"truncate", rs.truncate != defaults.truncate},
          {"attention_factor", rs.attention_factor != defaults.attention_factor},
          {"mscale", rs.mscale != defaults.mscale},
          {"mscale_all_dim", rs.mscale_all_dim != defaults.mscale_all_dim}};
      for (const auto& [key, set] : yarn_only)
        if (set)
          problem(fmt::format("model.rope_scaling.{}", key),
                  fmt::format("{} is a yarn key, and rope_scaling.type is {}", key, to_string(rs.type)),
                  "set model.rope_scaling.type: yarn, or remove the key");
    }
  }
  // Mixture of experts.
  if (m.moe.enabled()) {
    if (m.moe.swiglu_limit == 0 && m.moe.swiglu_alpha != MoeConfig{}.swiglu_alpha)
      problem("model.moe.swiglu_alpha", fmt::format("swiglu_alpha {} without swiglu_limit", m.moe.swiglu_alpha),
              "the gain belongs to gpt-oss's clamped SwiGLU: set model.moe.swiglu_limit (7), or remove the key");
    // Gemma's variants are built for dense MLPs.
    if (m.activation != MlpActivation::swiglu)
      problem("model.activation", "MoE experts are SwiGLU, found activation geglu",
              "remove model.activation (geglu is Gemma's dense MLP)");
    if (m.post_norms)
      problem("model.post_norms", "norms after a MoE block's output are not built",
              "remove model.post_norms (Gemma's dense blocks have them)");
    if (m.family == ModelFamily::gpt2)
      problem("model.moe.experts",
              fmt::format("family gpt2 with {} experts: MoE blocks are built for the llama family", m.moe.experts),
              "use family: llama (Mixtral's architecture: SwiGLU experts), or remove model.moe");
    if (m.moe.top_k > m.moe.experts)
      problem("model.moe.top_k", fmt::format("top_k {} exceeds experts {}", m.moe.top_k, m.moe.experts),
              "each token picks top_k different experts: choose top_k ≤ experts (Mixtral: 2 of 8)");
    if (m.moe.first_dense >= m.layers)
      problem("model.moe.first_dense",
              fmt::format("first_dense {} leaves no MoE block in a model of {} layers", m.moe.first_dense, m.layers),
              "choose first_dense < model.layers, or remove model.moe for a dense model");
  } else if (m.moe.shared_ffn_hidden > 0) {
    problem(
        "model.moe.shared_ffn_hidden",
        fmt::format("a shared expert of width {} without experts (model.moe.experts is 0)", m.moe.shared_ffn_hidden),
        "the shared expert is part of a MoE block: set model.moe.experts, or remove shared_ffn_hidden (a dense "
        "model's MLP is model.ffn_hidden)");
  } else if (m.moe.bias) {
    problem("model.moe.bias", "router and expert biases without experts (model.moe.experts is 0)",
            "the biases are a MoE block's: set model.moe.experts, or remove the key");
  } else if (m.moe.swiglu_limit > 0 || m.moe.swiglu_alpha != MoeConfig{}.swiglu_alpha) {
    problem(m.moe.swiglu_limit > 0 ? "model.moe.swiglu_limit" : "model.moe.swiglu_alpha",
            "gpt-oss's clamped SwiGLU without experts (model.moe.experts is 0)",
            "it is the routed experts' gate: set model.moe.experts, or remove the key (a dense model's MLP is "
            "SwiGLU or model.activation: geglu)");
  }
  if (p.ep > 1) {
    if (!m.moe.enabled())
      problem("parallel.ep", fmt::format("ep {} without experts (model.moe.experts is 0)", p.ep),
              "expert parallelism splits a MoE model's experts: set model.moe.experts, or ep: 1");
    else if (m.moe.experts % p.ep != 0)
      problem("parallel.ep", fmt::format("model.moe.experts {} is not divisible by ep {}", m.moe.experts, p.ep),
              "each expert-parallel rank computes experts / ep of them: choose ep dividing experts");
    if (p.dp > 0 && (int64_t(p.dp) * p.cp) % p.ep != 0)
      problem("parallel.ep",
              fmt::format("ep {} does not divide dp {} × cp {} = {}", p.ep, p.dp, p.cp, int64_t(p.dp) * p.cp),
              "expert-parallel groups are carved from the dp × cp ranks: choose ep dividing dp × cp");
  }
  if (m.seq_len > m.max_positions)
    problem("model.seq_len", fmt::format("seq_len {} exceeds max_positions {}", m.seq_len, m.max_positions),
            "raise model.max_positions or lower model.seq_len");
  if (m.vocab_pad > 0 && m.vocab > 0 && m.padded_vocab() % m.vocab_pad != 0)
    problem("model.vocab_pad", "internal: padded vocabulary not a multiple of vocab_pad", "report this as a bug");

  // Tensor parallelism: every split dimension must divide by tp.
  if (p.tp > 1) {
    if (m.heads % p.tp != 0)
      problem("parallel.tp", fmt::format("model.heads {} is not divisible by tp {}", m.heads, p.tp),
              "tensor parallelism gives each rank heads / tp attention heads: choose tp dividing heads");
    if (m.kv_heads > 0 && m.kv_heads % p.tp != 0 && p.tp % m.kv_heads != 0)
      problem(
          "parallel.tp",
          fmt::format("model.kv_heads {} and tp {}: neither divides the other (kv_heads % tp = {}, tp % kv_heads = {})",
                      m.kv_heads, p.tp, m.kv_heads % p.tp, p.tp % m.kv_heads),
          "key/value heads are split over tp when tp divides kv_heads, and replicated (each rank holds the one "
          "its query heads read) when kv_heads divides tp: choose tp so that one divides the other");
    if (m.ffn_hidden % p.tp != 0)
      problem("parallel.tp", fmt::format("model.ffn_hidden {} is not divisible by tp {}", m.ffn_hidden, p.tp),
              "choose tp dividing ffn_hidden, or change ffn_hidden");
    if (m.moe.enabled() && m.moe.ffn_hidden % p.tp != 0)
      problem("parallel.tp", fmt::format("model.moe.ffn_hidden {} is not divisible by tp {}", m.moe.ffn_hidden, p.tp),
              "each expert's width is split over tp like the dense MLP's: choose tp dividing model.moe.ffn_hidden");
    if (m.moe.enabled() && m.moe.shared_ffn_hidden % p.tp != 0)
      problem("parallel.tp",
              fmt::format("model.moe.shared_ffn_hidden {} is not divisible by tp {}", m.moe.shared_ffn_hidden, p.tp),
              "the shared expert's width is split over tp like the dense MLP's: choose tp dividing "
              "model.moe.shared_ffn_hidden");
    if (m.padded_vocab() % p.tp != 0)
      problem("parallel.tp",
              fmt::format("padded vocabulary {} (vocab {} rounded up to vocab_pad {}) is not divisible by tp {}",
                          m.padded_vocab(), m.vocab, m.vocab_pad, p.tp),
              "make model.vocab_pad a multiple of tp (e.g. 128)");
  }
  if (p.sequence_parallel && p.tp == 1)
    problem("parallel.sequence_parallel", "sequence_parallel is true but tp is 1",
            "sequence parallelism splits work across a tensor-parallel group: set tp > 1 or sequence_parallel: false");
  // Context parallelism: each sequence in 2·cp equal chunks.
  if (p.cp > 1 && m.seq_len % (2 * p.cp) != 0)
    problem("parallel.cp",
            fmt::format("context parallelism cuts each sequence into 2 · cp = {} equal chunks, but model.seq_len {} "
                        "is not divisible by {} (remainder {})",
                        2 * p.cp, m.seq_len, 2 * p.cp, m.seq_len % (2 * p.cp)),
            "choose cp so that 2 · cp divides model.seq_len (e.g. seq_len a power of two)");
  if (p.cp > 1 && p.cp_comm == CpComm::all_to_all) {
    // Ulysses gives each cp rank heads / cp of this tp rank's heads (and of its key/value heads).
    const int64_t heads = m.heads / std::max(p.tp, 1);
    const int64_t kv = m.kv_heads > 0 && m.kv_heads % std::max(p.tp, 1) == 0 ? m.kv_heads / std::max(p.tp, 1) : 1;
    if (heads % p.cp != 0 || kv % p.cp != 0)
      problem("parallel.cp_comm",
              fmt::format("all_to_all gives each of cp {} ranks heads / cp of a tp rank's {} query and {} key/value "
                          "heads, which cp does not divide",
                          p.cp, heads, kv),
              "use cp_comm: ring (any head count), or choose cp dividing the (key/value) heads per tp rank");
  }
  const int64_t seq_local = p.cp > 1 ? m.seq_len / p.cp : m.seq_len;
  const int64_t rows = int64_t(r.train.micro_batch) * seq_local;
  if (p.sequence_parallel && p.tp > 1 && rows % p.tp != 0)
    problem("parallel.sequence_parallel",
            fmt::format("sequence parallelism splits micro_batch {} × seq_len {}{} = {} token rows over tp {}, which "
                        "does not divide them (remainder {})",
                        r.train.micro_batch, m.seq_len, p.cp > 1 ? fmt::format(" / cp {}", p.cp) : "", rows, p.tp,
                        rows % p.tp),
            "choose train.micro_batch and model.seq_len whose product tp divides");

  // Pipeline parallelism.
  const int64_t chunks = int64_t(p.pp) * p.virtual_stages;
  if (!p.pp_layers.empty()) {
    int64_t sum = 0;
    for (int n : p.pp_layers) sum += n;
    if (int64_t(p.pp_layers.size()) != p.pp)
      problem("parallel.pp_layers", fmt::format("{} block counts for pp {}", p.pp_layers.size(), p.pp),
              "give one block count per pipeline stage, first to last");
    else if (sum != m.layers)
      problem("parallel.pp_layers",
              fmt::format("the block counts add up to {}, the model has {} layers", sum, m.layers),
              "the stages together must hold every layer once");
    if (p.virtual_stages > 1)
      problem("parallel.pp_layers", "an uneven split with virtual_stages > 1",
              "leave pp_layers out to split layers evenly over the virtual stages");
  } else if (m.layers % chunks != 0)
    problem("model.layers",
            fmt::format("layers {} is not divisible by pp {} × virtual_stages {} = {}", m.layers, p.pp,
                        p.virtual_stages, chunks),
            "every pipeline chunk must hold the same number of layers: choose pp and virtual_stages dividing layers");
  if (p.virtual_stages > 1 && p.pp_schedule != PipelineSchedule::interleaved)
    problem("parallel.virtual_stages",
            fmt::format("virtual_stages {} needs pp_schedule: interleaved, found {}", p.virtual_stages,
                        to_string(p.pp_schedule)),
            "set parallel.pp_schedule: interleaved, or virtual_stages: 1");
  if (p.pp_schedule == PipelineSchedule::interleaved && (p.pp == 1 || p.virtual_stages == 1))
    problem(
        "parallel.pp_schedule",
        fmt::format("the interleaved schedule needs pp > 1 and virtual_stages > 1, found pp {} and virtual_stages {}",
                    p.pp, p.virtual_stages),
        "use pp_schedule: 1f1b, or set pp and virtual_stages above 1");

  // ZeRO.
  if (p.zero >= 2 && p.pp > 1)
    problem("parallel.zero",
            fmt::format("ZeRO stage {} cannot be combined with pipeline parallelism (pp {})", p.zero, p.pp),
            "stage 2 and 3 shard gradients that pipeline stages accumulate over micro-batches: use zero: 1 with pp > 1 "
            "(as DeepSpeed)");
  if (p.zero > 0 && p.dp > 0 && p.dp % p.zero_group != 0)
    problem("parallel.zero_group", fmt::format("zero_group {} does not divide dp {}", p.zero_group, p.dp),
            fmt::format("shard groups are zero_group consecutive dp ranks: choose a divisor of dp {} (or auto = dp)",
                        p.dp));

  // World size.
  const int64_t needed = int64_t(p.tp) * p.cp * p.pp * p.dp;
  const std::string factors = p.cp > 1 ? fmt::format("tp {} × cp {} × pp {} × dp {}", p.tp, p.cp, p.pp, p.dp)
                                       : fmt::format("tp {} × pp {} × dp {}", p.tp, p.pp, p.dp);
  if (needed != world.size && world.defaulted && needed > world.size)
    out.push_back(start_ranks_problem(needed, factors, world));
  else if (needed != world.size)
    problem("parallel.dp", fmt::format("world size {} ({}) != {} = {}", world.size, world.source, factors, needed),
            p.cp > 1 ? "make tp × cp × pp × dp equal the number of ranks, or set parallel.dp: auto"
                     : "make tp × pp × dp equal the number of ranks, or set parallel.dp: auto");

  // Batch arithmetic.
  const TrainConfig& t = r.train;
  const int64_t per_step = int64_t(t.micro_batch) * std::max(p.dp, 1);
  const bool ranks_give_dp = needed == world.size;  // dp is the number of ranks over the other factors
  if (t.global_batch % per_step != 0)
    problem("train.global_batch",
            fmt::format("global_batch {} is not divisible by micro_batch {} × dp {} = {}{}", t.global_batch,
                        t.micro_batch, p.dp, per_step,
                        ranks_give_dp
                            ? fmt::format(" (dp {}: the world size {}, {}{}, over {})", p.dp, world.size, world.source,
                                          world.source.find("procs_per_node") != std::string::npos
                                              ? " (--nproc sets launch.procs_per_node)"
                                              : "",
                                          factors.substr(0, factors.rfind(" × dp")))
                            : ""),
            ranks_give_dp
                ? "global_batch must be a whole number of micro-batches on every data-parallel rank: start fewer "
                  "ranks (--nproc), raise train.global_batch, lower train.micro_batch, or set parallel.dp"
                : "global_batch must be a whole number of micro-batches on every data-parallel rank");
  else if (p.pp_schedule == PipelineSchedule::interleaved && p.pp > 1 && (t.global_batch / per_step) % p.pp != 0)
    problem("train.global_batch",
            fmt::format("the interleaved schedule needs micro-batches per step ({}) divisible by pp {}",
                        t.global_batch / per_step, p.pp),
            "raise global_batch or change micro_batch so that the micro-batch count is a multiple of pp");

  // Optimizer schedule.
  const OptimizerConfig& o = r.optimizer;
  if (o.min_lr > o.lr)
    problem("optimizer.min_lr", fmt::format("min_lr {} is larger than lr {}", o.min_lr, o.lr),
            "min_lr is the floor the schedule decays to: keep it ≤ lr");
  if (o.warmup > o.decay_steps)
    problem("optimizer.warmup", fmt::format("warmup {} is longer than decay_steps {}", o.warmup, o.decay_steps),
            "warmup steps count inside decay_steps: shorten warmup or lengthen decay_steps");
  const OptimizerConfig plain;
  if (o.schedule != LrSchedule::wsd) {
    const std::pair<const char*, bool> wsd_only[] = {
        {"wsd_decay_steps", o.wsd_decay_steps != plain.wsd_decay_steps},
        {"wsd_decay_fraction", o.wsd_decay_fraction != plain.wsd_decay_fraction},
        {"wsd_shape", o.wsd_shape != plain.wsd_shape}};
    for (const auto& [key, set] : wsd_only)
      if (set)
        problem(fmt::format("optimizer.{}", key),
                fmt::format("{} belongs to the wsd schedule, and optimizer.schedule is {}", key, to_string(o.schedule)),
                "set optimizer.schedule: wsd, or remove the key");
  } else if (o.wsd_decay_steps > 0 && o.wsd_decay_fraction != plain.wsd_decay_fraction) {
    problem("optimizer.wsd_decay_fraction",
            fmt::format("wsd_decay_fraction {} beside wsd_decay_steps {}", o.wsd_decay_fraction, o.wsd_decay_steps),
            "the decay's length is one of the two: remove wsd_decay_fraction, or set wsd_decay_steps: 0");
  } else if (o.warmup <= o.decay_steps && o.wsd_decay_start() < o.warmup) {
    problem(o.wsd_decay_steps > 0 ? "optimizer.wsd_decay_steps" : "optimizer.wsd_decay_fraction",
            fmt::format("the decay of {} steps starts at step {}, before warmup ends at step {}", o.wsd_decay_length(),
                        o.wsd_decay_start(), o.warmup),
            "the stable phase lies between warmup and the decay: shorten the decay or warmup, or lengthen "
            "decay_steps");
  }

  if (o.state_dtype == StateDtype::bf16 && r.parallel.offload != OffloadKind::none)
    problem("optimizer.state_dtype", "not supported yet: bf16 optimizer state with parallel.offload",
            "the offload store holds fp32 state: use state_dtype: fp32 with offload, or offload: none");
  if (!o.master) {
    if (r.train.precision != Precision::bf16)
      problem("optimizer.master",
              r.train.precision == Precision::fp32
                  ? std::string("false with train.precision fp32 (fp32 parameters are their own master)")
                  : std::string("not supported yet: false with train.precision fp16"),
              "training without a master is bf16's: set train.precision: bf16, or remove optimizer.master");
    else if (r.parallel.zero >= 3)
      problem("optimizer.master", "not supported yet: false with parallel.zero 3",
              "ZeRO 3's owned parameter shard is fp32 and is the master: use zero 1 or 2, or master: true");
    else if (r.parallel.offload != OffloadKind::none)
      problem("optimizer.master", "not supported yet: false with parallel.offload",
              "the offload store updates an fp32 copy: use offload: none, or master: true");
  }
  if (o.name == OptimizerName::muon) {
    // Under ZeRO each matrix's update is gathered over its shard group (muon_matrix_step); the
    // offload store and the no-master path update element by element and are not built for it.
    auto later = [&](const std::string& what, const std::string& hint) {
      problem("optimizer.name", fmt::format("not supported yet: muon with {}", what), hint);
    };
    if (r.parallel.offload != OffloadKind::none)
      later("parallel.offload", "use offload: none with Muon, or optimizer.name: adamw");
    else if (!o.master)
      later("optimizer.master false", "keep the fp32 master with Muon (master: true), or optimizer.name: adamw");
  } else {
    const MuonConfig plain;
    const MuonConfig& m = o.muon;
    const std::pair<const char*, bool> muon_only[] = {
        {"momentum", m.momentum != plain.momentum},
        {"nesterov", m.nesterov != plain.nesterov},
        {"ns_steps", m.ns_steps != plain.ns_steps},
        {"ns_coefficients", m.ns_coefficients != plain.ns_coefficients},
        {"ns_dtype", m.ns_dtype != plain.ns_dtype},
        {"adjust_lr", m.adjust_lr != plain.adjust_lr},
        {"adamw_lr", m.adamw_lr && *m.adamw_lr != o.lr},
        {"adamw_weight_decay", m.adamw_weight_decay && *m.adamw_weight_decay != o.weight_decay}};
    for (const auto& [key, set] : muon_only)
      if (set)
        problem(fmt::format("optimizer.muon.{}", key),
                fmt::format("{} belongs to Muon, and optimizer.name is {}", key, to_string(o.name)),
                "set optimizer.name: muon, or remove the key");
  }
  if (r.parallel.grad_reduce_dtype == GradReduceDtype::bf16 && r.train.precision == Precision::fp16)
    problem("parallel.grad_reduce_dtype", "bf16 with train.precision fp16",
            "fp16 gradients (loss-scaled) would lose 3 mantissa bits as bf16: use grad_reduce_dtype: fp32, or "
            "train.precision: bf16");
  if (r.parallel.device_comm == DeviceCommKind::nccl && r.train.device != DeviceKind::cuda)
    problem("parallel.device_comm", fmt::format("nccl with train.device {}", to_string(r.train.device)),
            "NCCL moves device memory: it needs train.device: cuda (cpu ranks communicate through MPI); remove "
            "device_comm or set it to auto");

  // Offload (trainer/optim/offload.h).
  const ParallelConfig& pc = r.parallel;
  if (pc.offload == OffloadKind::host && r.train.device != DeviceKind::cuda)
    problem("parallel.offload", fmt::format("host with train.device {}", to_string(r.train.device)),
            "a cpu rank's optimizer state is in host memory already: use offload: nvme (files under "
            "offload_path) to move it out of memory, or remove offload");
  if (pc.offload == OffloadKind::nvme && pc.offload_path.empty())
    problem("parallel.offload", "nvme without parallel.offload_path",
            "set parallel.offload_path to a directory on a local disk with room for the optimizer state");
  if (pc.offload != OffloadKind::nvme && !pc.offload_path.empty())
    problem("parallel.offload_path", fmt::format("offload_path with offload {}", to_string(pc.offload)),
            "offload_path is where offload: nvme keeps its files: set offload: nvme, or remove offload_path");
  if (pc.offload_params && pc.zero != 3)
    problem("parallel.offload_params", fmt::format("true with parallel.zero {}", pc.zero),
            "offload_params moves ZeRO 3's parameter shards: set zero: 3, or remove offload_params");
  else if (pc.offload_params && pc.offload == OffloadKind::none)
    problem("parallel.offload_params", "true with parallel.offload none",
            "say where they go: parallel.offload: host (cuda ranks) or nvme with offload_path");

  // Launch.
  if (!r.launch.hostfile.empty() && r.launch.nodes > 1)
    problem("launch.nodes", "launch.hostfile and launch.nodes > 1 both given",
            "with a hostfile the hosts and their slots come from the file: remove launch.nodes");
  return out;
}

std::vector<NotSupported> unsupported_features(const Recipe& r) {
  std::vector<NotSupported> out;
  const ParallelConfig& p = r.parallel;
  if (r.model.dropout > 0)
    out.push_back({NotYet::dropout, fmt::format("model.dropout {} (dropout > 0)", r.model.dropout)});
  // ZB-H1's weight-gradient half reads the activations a recomputation would have recomputed into
  // shared buffers long before.
  if (p.pp > 1 && p.pp_schedule == PipelineSchedule::zero_bubble &&
      r.train.activation_checkpointing != ActivationCheckpointing::none)
    out.push_back({NotYet::zero_bubble_recompute,
                   fmt::format("parallel.pp_schedule: zero_bubble with train.activation_checkpointing: {} (the split "
                               "backward keeps every activation)",
                               to_string(r.train.activation_checkpointing))});
  // Ring and all-to-all attention run the full causal mask.
  if (p.cp > 1 && r.model.sliding_window > 0)
    out.push_back({NotYet::cp_sliding_window,
                   fmt::format("parallel.cp {} with model.sliding_window {} (context parallelism runs the full causal "
                               "mask; use cp: 1 with a window)",
                               p.cp, r.model.sliding_window)});
  // Ring and all-to-all attention take the default softmax scale.
  if (p.cp > 1 && r.model.query_pre_attn_scalar > 0)
    out.push_back({NotYet::cp_softmax_scale,
                   fmt::format("parallel.cp {} with model.query_pre_attn_scalar {} (context parallelism's attention "
                               "scales by 1/√head_dim)",
                               p.cp, r.model.query_pre_attn_scalar)});
  // Mixture of experts: dropless with context parallelism.
  const MoeConfig& moe = r.model.moe;
  if (moe.enabled()) {
    // Sharded experts (ep > 1 at ZeRO 0/1) shard their optimizer state over the whole
    // expert-data-parallel group; hybrid sharding's shard groups of fewer dp ranks are not built for them.
    if (p.ep > 1 && p.zero == 1 && p.zero_group < p.dp)
      out.push_back({NotYet::moe_layout,
                     fmt::format("parallel.ep {} with parallel.zero_group {} < dp {} (hybrid sharding of the experts' "
                                 "optimizer state)",
                                 p.ep, p.zero_group, p.dp)});
    // Each cp rank would fill an expert's capacity from its own rows: not the drops of cp 1.
    if (p.cp > 1 && moe.capacity_factor > 0)
      out.push_back({NotYet::moe_layout,
                     fmt::format("model.moe.capacity_factor {} with parallel.cp {}", moe.capacity_factor, p.cp)});
  }
  // bf16 on the wire is the bf16 gradient buffer itself; fp32 gradients would need a rounded copy.
  if (p.grad_reduce_dtype == GradReduceDtype::bf16 && r.train.precision == Precision::fp32)
    out.push_back({NotYet::bf16_reduce_of_fp32,
                   "parallel.grad_reduce_dtype: bf16 with train.precision fp32 (fp32 gradients reduced as bf16)"});
  return out;
}

std::vector<std::string> describe(const std::vector<NotSupported>& features) {
  std::vector<std::string> out;
  for (const NotSupported& n : features) out.push_back(n.text);
  return out;
}

Error unsupported_error(const std::vector<NotSupported>& features, const std::string& consequence) {
  std::string what;
  for (const NotSupported& n : features) what += (what.empty() ? "" : "; ") + n.text;
  return Error("not supported yet: " + what, "`llmtrain validate` accepts this recipe, but this build cannot run it" +
                                                 consequence + "; see docs/recipe.md for what runs today");
}

}  // namespace llmtrain
