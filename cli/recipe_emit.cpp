// The resolved recipe as YAML, in the section and key order of docs/recipe.md.
#include "cli/recipe_emit.h"

#include <fmt/format.h>

#include <set>
#include <string_view>

#include "cli/recipe_parse.h"
#include "common/strings.h"

namespace llmtrain::cli {
namespace {

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

}  // namespace

std::string recipe_to_yaml(const Recipe& r) {
  std::string y;
  auto line = [&](int indent, const std::string& key, const std::string& value) {
    y += std::string(indent, ' ') + key + ":" + (value.empty() ? "" : " " + value) + "\n";
  };
  const auto& m = r.model;
  line(0, "name", str(r.name));
  line(0, "model", "");
  line(2, "family", to_string(m.family));
  line(2, "layers", std::to_string(m.layers));
  line(2, "hidden", std::to_string(m.hidden));
  line(2, "heads", std::to_string(m.heads));
  line(2, "kv_heads", std::to_string(m.kv_heads));
  line(2, "ffn_hidden", std::to_string(m.ffn_hidden));
  line(2, "vocab", std::to_string(m.vocab));
  line(2, "vocab_pad", std::to_string(m.vocab_pad));
  line(2, "seq_len", std::to_string(m.seq_len));
  line(2, "max_positions", std::to_string(m.max_positions));
  line(2, "rope_theta", num(m.rope_theta));
  line(2, "norm_eps", num(m.norm_eps));
  line(2, "init_std", num(m.init_std));
  line(2, "dropout", num(m.dropout));
  line(2, "tie_embeddings", flag(m.tie_embeddings));

  line(0, "data", "");
  line(2, "tokenizer", str(r.data.tokenizer));
  line(2, "train", "");
  for (const auto& src : r.data.train)
    y += fmt::format("    - {{path: {}, weight: {}}}\n", str(src.path), num(src.weight));
  line(2, "valid", opt_str(r.data.valid));

  const auto& t = r.train;
  line(0, "train", "");
  line(2, "device", to_string(t.device));
  line(2, "precision", to_string(t.precision));
  line(2, "steps", std::to_string(t.steps));
  line(2, "micro_batch", std::to_string(t.micro_batch));
  line(2, "global_batch", std::to_string(t.global_batch));
  line(2, "grad_clip", num(t.grad_clip));
  line(2, "seed", std::to_string(t.seed));
  line(2, "activation_checkpointing", to_string(t.activation_checkpointing));
  line(2, "on_nonfinite", to_string(t.on_nonfinite));
  line(2, "max_skipped_steps", std::to_string(t.max_skipped_steps));
  line(2, "loss_scale", "");
  line(4, "initial", num(t.loss_scale.initial));
  line(4, "growth_interval", std::to_string(t.loss_scale.growth_interval));
  line(4, "backoff", num(t.loss_scale.backoff));
  line(4, "hysteresis", std::to_string(t.loss_scale.hysteresis));
  line(4, "min", num(t.loss_scale.min));
  line(2, "threads", t.threads > 0 ? std::to_string(t.threads) : "auto");

  const auto& o = r.optimizer;
  line(0, "optimizer", "");
  line(2, "lr", num(o.lr));
  line(2, "min_lr", num(o.min_lr));
  line(2, "warmup", std::to_string(o.warmup));
  line(2, "schedule", to_string(o.schedule));
  line(2, "decay_steps", std::to_string(o.decay_steps));
  line(2, "betas", fmt::format("[{}, {}]", num(o.beta1), num(o.beta2)));
  line(2, "eps", num(o.eps));
  line(2, "weight_decay", num(o.weight_decay));

  const auto& p = r.parallel;
  line(0, "parallel", "");
  line(2, "tp", std::to_string(p.tp));
  line(2, "pp", std::to_string(p.pp));
  line(2, "dp", std::to_string(p.dp));
  line(2, "zero", std::to_string(p.zero));
  line(2, "zero_group", p.zero_group > 0 ? std::to_string(p.zero_group) : "auto");
  line(2, "sequence_parallel", flag(p.sequence_parallel));
  line(2, "pp_schedule", to_string(p.pp_schedule));
  line(2, "virtual_stages", std::to_string(p.virtual_stages));
  if (!p.pp_layers.empty()) {
    std::vector<std::string> blocks;
    for (int n : p.pp_layers) blocks.push_back(std::to_string(n));
    line(2, "pp_layers", "[" + join(blocks, ", ") + "]");
  }
  line(2, "bucket_mb", num(p.bucket_mb));
  line(2, "grad_reduce_dtype", to_string(p.grad_reduce_dtype));
  line(2, "timeout", num(p.timeout_s) + "s");

  const auto& c = r.checkpoint;
  line(0, "checkpoint", "");
  line(2, "dir", str(c.dir));
  line(2, "every", std::to_string(c.every));
  line(2, "keep", std::to_string(c.keep));
  line(2, "resume",
       c.resume == ResumeMode::automatic ? "auto"
       : c.resume == ResumeMode::none    ? "none"
                                         : str(c.resume_path));
  line(2, "load_weights_only", flag(c.load_weights_only));
  line(2, "timeout", num(c.timeout_s) + "s");

  line(0, "eval", "");
  line(2, "every", std::to_string(r.eval.every));
  line(2, "batches", std::to_string(r.eval.batches));

  line(0, "log", "");
  line(2, "every", std::to_string(r.log.every));
  line(2, "dir", str(r.log.dir));
  line(2, "peak_tflops", r.log.peak_tflops > 0 ? num(r.log.peak_tflops) : "auto");
  line(2, "straggler_factor", num(r.log.straggler_factor));
  line(2, "tensorboard", flag(r.log.tensorboard));

  const auto& l = r.launch;
  line(0, "launch", "");
  line(2, "procs_per_node", std::to_string(l.procs_per_node));
  line(2, "nodes", std::to_string(l.nodes));
  line(2, "hostfile", opt_str(l.hostfile));
  line(2, "max_restarts", std::to_string(l.max_restarts));
  line(2, "hang_timeout", num(l.hang_timeout_s) + "s");
  line(2, "slurm", "");
  line(4, "partition", opt_str(l.slurm.partition));
  line(4, "account", opt_str(l.slurm.account));
  line(4, "time", opt_str(l.slurm.time));
  line(2, "ssh", "");
  line(4, "port", std::to_string(l.ssh.port));
  line(4, "identity", opt_str(l.ssh.identity));
  line(4, "config", opt_str(l.ssh.config));
  return y;
}

std::string recipe_derived_yaml(const ModelConfig& m, const std::string& name, const std::string& tokenizer,
                                const std::string& resume, const std::string& config_path) {
  return fmt::format(
      "# Derived from {} by `llmtrain import`: set data.train to your dataset, then `llmtrain run`.\n"
      "name: {}\n"
      "model: {{family: {}, layers: {}, hidden: {}, heads: {}, kv_heads: {}, ffn_hidden: {}, vocab: {},\n"
      "        seq_len: {}, max_positions: {}, rope_theta: {}, norm_eps: {}, init_std: {}, tie_embeddings: {}}}\n"
      "data: {{tokenizer: {}, train: [data/train]}}\n"
      "train: {{steps: 1000, micro_batch: 1}}\n"
      "checkpoint: {{resume: {}, load_weights_only: true}}\n",
      printable(config_path), yaml_quoted(name, "the run name"), to_string(m.family), m.layers, m.hidden, m.heads,
      m.kv_heads, m.ffn_hidden, m.vocab, m.seq_len, m.max_positions, num(m.rope_theta), num(m.norm_eps),
      num(m.init_std), flag(m.tie_embeddings),
      tokenizer == "byte" ? std::string("byte") : yaml_quoted(tokenizer, "the tokenizer's path"),
      yaml_quoted(resume, "the checkpoint's path"));
}

}  // namespace llmtrain::cli
