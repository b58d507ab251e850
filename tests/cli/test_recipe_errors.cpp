// Every bad recipe a user can write gets a message that names the key, the line it is on, and
// what is wrong. Each case edits one line of a valid base recipe and checks the first diagnostic
// that names the expected key: its location is `<file>:<line>:` of the edited line, and its text
// contains the expected phrase.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "cli/recipe_load.h"
#include "cli/recipe_parse.h"
#include "common/recipe/recipe_check.h"

using namespace llmtrain;
namespace fs = std::filesystem;

namespace {

const char* kBase = R"(name: t
model:
  family: gpt2
  layers: 4
  hidden: 128
  heads: 4
  seq_len: 64
data:
  tokenizer: byte
  train: [{path: data/x, weight: 1.0}]
train:
  device: cpu
  steps: 10
  micro_batch: 2
  global_batch: 8
optimizer:
  lr: 1.0e-3
parallel:
  tp: 1
launch:
  procs_per_node: 1
)";

struct Case {
  const char* name;
  const char* find;        // a substring of one base line; "" appends `replace` at the end
  const char* replace;     // replaces the whole line containing `find`
  const char* key;         // the key the diagnostic must name
  const char* locate;      // the diagnostic must point at the line of the edited text containing this
  const char* phrase;      // ...and contain this (message or hint)
  const char* find2 = "";  // an optional second line edit
  const char* replace2 = "";
  const char* set = "";  // an optional --set override (to give the job the ranks a layout needs)
};

std::string edit_line(const std::string& text, const std::string& find, const std::string& replace) {
  if (find.empty()) return text + replace + "\n";
  size_t pos = text.find(find);
  if (pos == std::string::npos) return "";
  size_t begin = text.rfind('\n', pos);
  begin = begin == std::string::npos ? 0 : begin + 1;
  size_t end = text.find('\n', pos);
  return text.substr(0, begin) + replace + text.substr(end);
}

std::string edit(const Case& c) {
  std::string text = edit_line(kBase, c.find, c.replace);
  if (!text.empty() && *c.find2) text = edit_line(text, c.find2, c.replace2);
  return text;
}

int line_of(const std::string& text, const std::string& needle) {
  size_t pos = text.find(needle);
  if (pos == std::string::npos) return -1;
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + pos, '\n'));
}

class RecipeErrors : public ::testing::TestWithParam<Case> {};

TEST_P(RecipeErrors, NamesKeyLineAndProblem) {
  const Case& c = GetParam();
  std::string text = edit(c);
  ASSERT_FALSE(text.empty()) << "case edits a line that is not in the base recipe: " << c.find;
  fs::path file = fs::temp_directory_path() / ("llmtrain_recipe_" + std::to_string(getpid()) + "_" + c.name + ".yaml");
  std::ofstream(file) << text;

  std::vector<cli::Diagnostic> diags;
  std::vector<std::string> sets;
  if (*c.set) sets.push_back(c.set);
  try {
    cli::recipe_load(file.string(), sets);
  } catch (const cli::RecipeError& e) {
    diags = e.diagnostics();
  }
  fs::remove(file);
  ASSERT_FALSE(diags.empty()) << "recipe was accepted:\n" << text;

  std::string all;
  for (const auto& d : diags) all += d.format() + "\n";
  const cli::Diagnostic* hit = nullptr;
  for (const auto& d : diags)
    if (d.key == c.key) {
      hit = &d;
      break;
    }
  ASSERT_NE(hit, nullptr) << "no diagnostic names key " << c.key << "; got:\n" << all;

  int line = line_of(text, c.locate);
  ASSERT_GT(line, 0) << "case's locate text not found: " << c.locate;
  std::string want_where = file.string() + ":" + std::to_string(line) + ":";
  EXPECT_EQ(hit->where.rfind(want_where, 0), 0u) << "expected location " << want_where << ", got:\n" << all;
  std::string both = hit->message + " / " + hit->hint;
  EXPECT_NE(both.find(c.phrase), std::string::npos) << "expected \"" << c.phrase << "\" in:\n" << all;
  EXPECT_FALSE(hit->hint.empty()) << "every diagnostic carries a hint:\n" << all;
}

const Case kCases[] = {
    // fp16 gradients reduced as bf16.
    {"bf16_reduce_of_fp16", "tp: 1", "  tp: 1\n  grad_reduce_dtype: bf16", "parallel.grad_reduce_dtype",
     "grad_reduce_dtype", "use grad_reduce_dtype: fp32", "device: cpu", "  device: cpu\n  precision: fp16"},
    // parallel.offload (issue 42): host memory is where a cpu rank's state is already; nvme needs a
    // place; offload_path means nothing without nvme; offload_params moves ZeRO 3's shards only.
    {"offload_host_on_cpu", "tp: 1", "  tp: 1\n  offload: host", "parallel.offload", "offload: host",
     "use offload: nvme"},
    {"offload_nvme_without_path", "tp: 1", "  tp: 1\n  offload: nvme", "parallel.offload", "offload: nvme",
     "set parallel.offload_path"},
    {"offload_path_without_nvme", "tp: 1", "  tp: 1\n  offload_path: /scratch", "parallel.offload_path", "offload_path",
     "set offload: nvme"},
    {"offload_params_without_zero3", "tp: 1", "  tp: 1\n  offload_params: true", "parallel.offload_params",
     "offload_params", "set zero: 3"},
    // NCCL moves device memory only.
    {"nccl_on_cpu", "tp: 1", "  tp: 1\n  device_comm: nccl", "parallel.device_comm", "device_comm: nccl",
     "needs train.device: cuda"},
    // Schema: unknown keys, with suggestions.
    {"typo_key", "layers: 4", "  layres: 4", "model.layres", "layres", "did you mean model.layers"},
    {"gpt2_qk_norm", "seq_len: 64", "  seq_len: 64\n  qk_norm: true", "model.qk_norm", "qk_norm: true",
     "use family: llama"},
    {"gpt2_post_norms", "seq_len: 64", "  seq_len: 64\n  post_norms: true", "model.post_norms", "post_norms: true",
     "use family: llama"},
    {"pattern_without_window", "family: gpt2", "  family: llama", "model.full_attention_every",
     "full_attention_every: 6", "set model.sliding_window", "seq_len: 64", "  seq_len: 64\n  full_attention_every: 6"},
    {"o_bias_post_norms", "family: gpt2", "  family: llama", "model.o_bias", "o_bias: true", "Gemma has no o_proj bias",
     "seq_len: 64", "  seq_len: 64\n  o_bias: true\n  post_norms: true"},
    {"clamped_swiglu_dense", "family: gpt2", "  family: llama", "model.moe.swiglu_limit",
     "moe:", "set model.moe.experts", "seq_len: 64", "  seq_len: 64\n  moe: {swiglu_limit: 7}"},
    {"expert_bias_dense", "family: gpt2", "  family: llama", "model.moe.bias", "moe:", "set model.moe.experts",
     "seq_len: 64", "  seq_len: 64\n  moe: {bias: true}"},
    {"geglu_experts", "family: gpt2", "  family: llama", "model.activation", "activation: geglu",
     "geglu is Gemma's dense MLP", "seq_len: 64", "  seq_len: 64\n  activation: geglu\n  moe: {experts: 4}"},
    {"llama_odd_head_dim", "family: gpt2", "  family: llama", "model.head_dim", "head_dim: 7",
     "choose an even model.head_dim", "seq_len: 64", "  seq_len: 64\n  head_dim: 7"},
    {"llama3_bands", "family: gpt2", "  family: llama", "model.rope_scaling.high_freq_factor",
     "rope_scaling:", "Llama 3.1 uses", "seq_len: 64",
     "  seq_len: 64\n  rope_scaling: {type: llama3, factor: 8, high_freq_factor: 0.5}"},
    {"rope_scaling_type", "seq_len: 64", "  seq_len: 64\n  rope_scaling: {type: longrope}", "model.rope_scaling.type",
     "longrope", "yarn"},
    {"yarn_key_without_yarn", "family: gpt2", "  family: llama", "model.rope_scaling.beta_fast",
     "rope_scaling:", "set model.rope_scaling.type: yarn", "seq_len: 64",
     "  seq_len: 64\n  rope_scaling: {type: llama3, factor: 8, beta_fast: 16}"},
    // Mixture of experts.
    {"gpt2_moe", "seq_len: 64", "  seq_len: 64\n  moe: {experts: 4}", "model.moe.experts", "moe:", "use family: llama"},
    {"moe_top_k", "family: gpt2", "  family: llama", "model.moe.top_k", "moe:", "choose top_k ≤ experts", "seq_len: 64",
     "  seq_len: 64\n  moe: {experts: 2, top_k: 3}"},
    {"moe_first_dense", "family: gpt2", "  family: llama", "model.moe.first_dense",
     "moe:", "choose first_dense < model.layers", "seq_len: 64", "  seq_len: 64\n  moe: {experts: 4, first_dense: 4}"},
    {"moe_shared_without_experts", "family: gpt2", "  family: llama", "model.moe.shared_ffn_hidden",
     "moe:", "set model.moe.experts", "seq_len: 64", "  seq_len: 64\n  moe: {shared_ffn_hidden: 64}"},
    {"ep_without_experts", "tp: 1", "  tp: 1\n  ep: 2", "parallel.ep", "ep: 2", "set model.moe.experts"},
    {"ep_not_dividing_experts", "family: gpt2", "  family: llama\n  moe: {experts: 3}", "parallel.ep", "ep: 2",
     "choose ep dividing experts", "tp: 1", "  tp: 1\n  ep: 2\n  dp: 2"},
    {"typo_section", "", "optimiser:\n  lr: 0.1", "optimiser", "optimiser", "did you mean optimizer"},
    {"key_in_wrong_section", "micro_batch: 2", "  micro_batch: 2\n  warmup: 10", "train.warmup", "warmup",
     "did you mean optimizer.warmup"},
    {"unknown_key_no_match", "seq_len: 64", "  seq_len: 64\n  colour: blue", "model.colour", "colour",
     "valid keys here"},
    {"missing_required", "seq_len: 64", "  max_positions: 64", "model.seq_len", "model:", "missing required key"},
    {"missing_name", "name: t", "# no name", "name", "# no name", "missing required key"},
    {"section_not_map", "", "eval: 5", "eval", "eval: 5", "expected a map"},
    // Types.
    {"int_is_word", "layers: 4", "  layers: four", "model.layers", "four",
     "expected an integer in 1..65536, found \"four\""},
    {"int_is_float", "hidden: 128", "  hidden: 12.5", "model.hidden", "12.5", "found \"12.5\""},
    {"int_quoted", "heads: 4", "  heads: \"4\"", "model.heads", "\"4\"", "remove the quotes"},
    {"bool_yes", "seq_len: 64", "  seq_len: 64\n  tie_embeddings: yes", "model.tie_embeddings", "tie_embeddings",
     "expected true or false"},
    {"bool_bad", "tp: 1", "  tp: 1\n  sequence_parallel: maybe", "parallel.sequence_parallel", "maybe",
     "expected true or false"},
    {"tensorboard_not_bool", "", "log:\n  tensorboard: \"true\"", "log.tensorboard", "tensorboard",
     "expected true or false"},
    {"profile_unknown", "", "log:\n  profile: kernels", "log.profile", "kernels", "expected one of none | ops"},
    {"float_is_word", "lr: 1.0e-3", "  lr: fast", "optimizer.lr", "fast", "expected a number"},
    {"choice_typo", "family: gpt2", "  family: gtp2", "model.family", "gtp2", "did you mean gpt2"},
    {"device_unknown", "device: cpu", "  device: tpu", "train.device", "tpu", "expected one of cpu | cuda"},
    {"betas_wrong_length", "lr: 1.0e-3", "  lr: 1.0e-3\n  betas: [0.9]", "optimizer.betas", "betas", "two numbers"},
    {"duration_bad", "tp: 1", "  tp: 1\n  timeout: soon", "parallel.timeout", "soon", "positive duration"},
    {"slurm_time_bad", "procs_per_node: 1", "  procs_per_node: 1\n  slurm: {time: tomorrow}", "launch.slurm.time",
     "slurm", "Slurm time limit"},
    {"train_list_empty", "train: [{path", "  train: []", "data.train", "train: []", "empty list"},
    {"name_with_space", "name: t", "name: my run", "name", "name:", "letters, digits"},
    // Ranges.
    {"int_zero", "layers: 4", "  layers: 0", "model.layers", "layers: 0", "expected an integer in 1..65536, found 0"},
    {"int_negative", "steps: 10", "  steps: -3", "train.steps", "steps: -3", "found -3"},
    {"zero_stage_out_of_range", "tp: 1", "  tp: 1\n  zero: 4", "parallel.zero", "zero: 4", "integer in 0..3"},
    {"profile_steps_zero", "", "log:\n  profile: ops\n  profile_steps: 0", "log.profile_steps", "profile_steps: 0",
     "expected an integer in 1..1000, found 0"},
    {"dropout_out_of_range", "seq_len: 64", "  seq_len: 64\n  dropout: 1.5", "model.dropout", "dropout", "[0, 1)"},
    {"ssh_port_out_of_range", "procs_per_node: 1", "  procs_per_node: 1\n  ssh: {port: 70000}", "launch.ssh.port",
     "ssh", "1..65535"},
    {"loss_scale_backoff", "micro_batch: 2", "  micro_batch: 2\n  loss_scale: {backoff: 1.5}",
     "train.loss_scale.backoff", "backoff", "found 1.5"},
    {"loss_scale_min_above_initial", "micro_batch: 2", "  micro_batch: 2\n  loss_scale: {initial: 1024, min: 2048}",
     "train.loss_scale.min", "loss_scale", "min 2048 is above initial 1024"},
    {"duplicate_key", "heads: 4", "  heads: 4\n  heads: 8", "model.heads", "heads: 8", "duplicate key"},
    // Cross-field rules.
    {"hidden_not_div_heads", "hidden: 128", "  hidden: 130", "model.heads", "heads: 4",
     "hidden 130 is not divisible by heads 4"},
    {"heads_not_div_kv", "family: gpt2", "  family: llama\n  kv_heads: 3", "model.kv_heads", "kv_heads",
     "heads 4 is not divisible by kv_heads 3"},
    {"gpt2_gqa", "heads: 4", "  heads: 4\n  kv_heads: 2", "model.kv_heads", "kv_heads",
     "family gpt2 uses multi-head attention"},
    {"rope_odd_head_dim", "family: gpt2", "  family: llama", "model.heads", "heads: 4", "RoPE needs an even head size",
     "hidden: 128", "  hidden: 12"},
    {"vocab_too_small", "seq_len: 64", "  seq_len: 64\n  vocab: 1", "model.vocab", "vocab: 1", "integer ≥ 2"},
    {"tp_not_div_heads", "tp: 1", "  tp: 3", "parallel.tp", "tp: 3", "model.heads 4 is not divisible by tp 3", "", "",
     "launch.procs_per_node=3"},
    {"tp_and_kv_heads_coprime", "heads: 4", "  heads: 24\n  kv_heads: 6", "parallel.tp",
     "tp:", "model.kv_heads 6 and tp 4: neither divides the other", "tp: 1", "  tp: 4", "launch.procs_per_node=4"},
    {"tp_not_div_ffn", "seq_len: 64", "  seq_len: 64\n  ffn_hidden: 511", "parallel.tp",
     "tp:", "ffn_hidden 511 is not divisible by tp", "tp: 1", "  tp: 2", "launch.procs_per_node=2"},
    {"tp_not_div_vocab", "seq_len: 64", "  seq_len: 64\n  vocab_pad: 2", "parallel.tp", "tp:", "padded vocabulary 258",
     "tp: 1", "  tp: 4", "launch.procs_per_node=4"},
    {"layers_not_div_pp", "tp: 1", "  pp: 3", "model.layers", "layers: 4", "layers 4 is not divisible by pp 3", "", "",
     "launch.procs_per_node=3"},
    {"virtual_without_interleaved", "tp: 1", "  tp: 1\n  virtual_stages: 2", "parallel.virtual_stages",
     "virtual_stages", "needs pp_schedule: interleaved"},
    {"batch_not_div", "global_batch: 8", "  global_batch: 7", "train.global_batch", "global_batch: 7",
     "global_batch 7 is not divisible by micro_batch 2 × dp 1"},
    {"world_size_mismatch", "tp: 1", "  dp: 2", "parallel.dp", "dp: 2",
     "world size 1 (launch.nodes 1 × launch.procs_per_node 1) != tp 1 × pp 1 × dp 2 = 2"},
    {"zero_with_pp", "tp: 1", "  zero: 2\n  pp: 2", "parallel.zero", "zero: 2", "cannot be combined with pipeline", "",
     "", "launch.procs_per_node=2"},
    {"pp_layers_not_a_list", "tp: 1", "  tp: 1\n  pp_layers: 4", "parallel.pp_layers", "pp_layers",
     "list of block counts"},
    {"pp_layers_zero_blocks", "tp: 1", "  pp: 2\n  pp_layers: [0, 4]", "parallel.pp_layers", "pp_layers",
     "block counts ≥ 1", "", "", "launch.procs_per_node=2"},
    {"pp_layers_count", "tp: 1", "  pp: 2\n  pp_layers: [1, 2, 1]", "parallel.pp_layers", "pp_layers",
     "3 block counts for pp 2", "", "", "launch.procs_per_node=2"},
    {"pp_layers_sum", "tp: 1", "  pp: 2\n  pp_layers: [1, 2]", "parallel.pp_layers", "pp_layers",
     "the block counts add up to 3, the model has 4 layers", "", "", "launch.procs_per_node=2"},
    {"zero_group_without_zero", "tp: 1", "  tp: 1\n  zero_group: 2", "parallel.zero_group", "zero_group",
     "zero_group 2 is set but parallel.zero is 0"},
    {"zero_group_not_div_dp", "tp: 1", "  tp: 1\n  zero: 1\n  zero_group: 3", "parallel.zero_group", "zero_group",
     "zero_group 3 does not divide dp 1"},
    {"seq_len_over_positions", "seq_len: 64", "  seq_len: 64\n  max_positions: 32", "model.seq_len", "seq_len",
     "seq_len 64 exceeds max_positions 32"},
    {"min_lr_over_lr", "lr: 1.0e-3", "  lr: 1.0e-3\n  min_lr: 0.1", "optimizer.min_lr", "min_lr", "larger than lr"},
    {"warmup_over_decay", "lr: 1.0e-3", "  lr: 1.0e-3\n  warmup: 50", "optimizer.warmup", "warmup",
     "longer than decay_steps 10"},
    {"bf16_state_offloaded", "lr: 1.0e-3", "  lr: 1.0e-3\n  state_dtype: bf16", "optimizer.state_dtype", "state_dtype",
     "not supported yet", "tp: 1", "  tp: 1\n  offload: nvme\n  offload_path: /scratch"},
    {"no_master_fp32", "lr: 1.0e-3", "  lr: 1.0e-3\n  master: false", "optimizer.master", "master",
     "fp32 parameters are their own master"},
    {"no_master_zero3", "lr: 1.0e-3", "  lr: 1.0e-3\n  master: false", "optimizer.master", "master",
     "not supported yet: false with parallel.zero 3", "steps: 10", "  steps: 10\n  precision: bf16", "parallel.zero=3"},
    {"muon_offloaded", "lr: 1.0e-3", "  lr: 1.0e-3\n  name: muon", "optimizer.name", "name: muon",
     "not supported yet: muon with parallel.offload", "tp: 1", "  tp: 1\n  offload: nvme\n  offload_path: /scratch"},
    {"muon_ns_coefficients", "lr: 1.0e-3", "  lr: 1.0e-3\n  name: muon\n  muon:\n    ns_coefficients: [3.4, -4.7]",
     "optimizer.muon.ns_coefficients", "ns_coefficients", "expected a list of three finite numbers"},
    {"muon_key_adamw", "lr: 1.0e-3", "  lr: 1.0e-3\n  muon:\n    ns_steps: 3", "optimizer.muon.ns_steps", "ns_steps",
     "belongs to Muon, and optimizer.name is adamw"},
    {"wsd_key_cosine", "lr: 1.0e-3", "  lr: 1.0e-3\n  wsd_shape: linear", "optimizer.wsd_shape", "wsd_shape",
     "optimizer.schedule is cosine"},
    {"wsd_decay_in_warmup", "lr: 1.0e-3", "  lr: 1.0e-3\n  schedule: wsd\n  warmup: 5\n  wsd_decay_steps: 6",
     "optimizer.wsd_decay_steps", "wsd_decay_steps", "starts at step 4, before warmup ends at step 5"},
    {"wsd_steps_and_fraction", "lr: 1.0e-3",
     "  lr: 1.0e-3\n  schedule: wsd\n  wsd_decay_steps: 2\n  wsd_decay_fraction: 0.5", "optimizer.wsd_decay_fraction",
     "wsd_decay_fraction", "remove wsd_decay_fraction"},
    {"sequence_parallel_rows", "seq_len: 64", "  seq_len: 63", "parallel.sequence_parallel", "sequence_parallel",
     "micro_batch 2 × seq_len 63 = 126 token rows over tp 4", "tp: 1", "  tp: 4\n  sequence_parallel: true",
     "launch.procs_per_node=4"},
    {"sequence_parallel_tp1", "tp: 1", "  tp: 1\n  sequence_parallel: true", "parallel.sequence_parallel",
     "sequence_parallel", "tp is 1"},
    {"cp_chunks_seq_len", "seq_len: 64", "  seq_len: 60", "parallel.cp",
     "cp:", "2 · cp = 8 equal chunks, but model.seq_len 60 is not divisible by 8", "tp: 1", "  tp: 1\n  cp: 4",
     "launch.procs_per_node=4"},
    {"cp_world_size", "tp: 1", "  tp: 1\n  cp: 2\n  dp: 2", "parallel.dp", "dp: 2", "!= tp 1 × cp 2 × pp 1 × dp 2 = 4",
     "", "", "launch.procs_per_node=3"},
    {"cp_dp_auto_divides", "tp: 1", "  tp: 1\n  cp: 2", "parallel.dp",
     "parallel:", "is not divisible by tp 1 × cp 2 × pp 1 = 2", "", "", "launch.procs_per_node=3"},
    {"cp_all_to_all_heads", "tp: 1", "  tp: 1\n  cp: 8\n  cp_comm: all_to_all", "parallel.cp_comm", "cp_comm",
     "all_to_all gives each of cp 8 ranks heads / cp of a tp rank's 4 query and 4 key/value heads", "", "",
     "launch.procs_per_node=8"},
    {"cp_comm_bad", "tp: 1", "  tp: 1\n  cp_comm: ulysses", "parallel.cp_comm", "cp_comm", "ulysses"},
    {"tokenizer_missing", "tokenizer: byte", "  tokenizer: /nonexistent/tokenizer.json", "data.tokenizer",
     "tokenizer:", "cannot read tokenizer file"},
    {"weights_only_without_resume", "", "checkpoint: {resume: none, load_weights_only: true}",
     "checkpoint.load_weights_only", "checkpoint:", "checkpoint.resume is none"},
    {"hostfile_and_nodes", "procs_per_node: 1", "  procs_per_node: 1\n  hostfile: hosts.txt\n  nodes: 2",
     "launch.nodes", "nodes: 2", "hostfile"},
};

INSTANTIATE_TEST_SUITE_P(Cases, RecipeErrors, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(RecipeErrorsSyntax, YamlSyntaxErrorNamesLine) {
  fs::path file = fs::temp_directory_path() / ("llmtrain_syntax_" + std::to_string(getpid()) + ".yaml");
  std::ofstream(file) << "name: t\nmodel:\n  layers: [4\n  hidden: 8\n";
  std::vector<cli::Diagnostic> diags;
  try {
    cli::recipe_load(file.string(), {});
  } catch (const cli::RecipeError& e) {
    diags = e.diagnostics();
  }
  fs::remove(file);
  ASSERT_EQ(diags.size(), 1u);
  EXPECT_EQ(diags[0].where.rfind(file.string() + ":", 0), 0u) << diags[0].format();
  EXPECT_NE(diags[0].message.find("YAML syntax error"), std::string::npos) << diags[0].format();
}

TEST(RecipeErrorsSyntax, UnreadableFileNamesPath) {
  std::vector<cli::Diagnostic> diags;
  try {
    cli::recipe_load("/nonexistent/recipe.yaml", {});
  } catch (const cli::RecipeError& e) {
    diags = e.diagnostics();
  }
  ASSERT_EQ(diags.size(), 1u);
  EXPECT_EQ(diags[0].where, "/nonexistent/recipe.yaml");
  EXPECT_NE(diags[0].message.find("cannot read the recipe file"), std::string::npos);
}

TEST(RecipeErrorsSyntax, EveryProblemReportedAtOnce) {
  fs::path file = fs::temp_directory_path() / ("llmtrain_many_" + std::to_string(getpid()) + ".yaml");
  std::string text = kBase;
  text.replace(text.find("layers: 4"), 9, "layers: x");
  text.replace(text.find("steps: 10"), 9, "steps: -1");
  std::ofstream(file) << text;
  std::vector<cli::Diagnostic> diags;
  try {
    cli::recipe_load(file.string(), {});
  } catch (const cli::RecipeError& e) {
    diags = e.diagnostics();
  }
  fs::remove(file);
  ASSERT_EQ(diags.size(), 2u);
  EXPECT_EQ(diags[0].key, "model.layers");
  EXPECT_EQ(diags[1].key, "train.steps");
}

TEST(RecipeErrorsSyntax, TypoOfARequiredKeyIsReportedAloneAndFirst) {
  fs::path file = fs::temp_directory_path() / ("llmtrain_typo_" + std::to_string(getpid()) + ".yaml");
  auto diags_of = [&](const std::string& text) {
    std::ofstream(file) << text;
    std::vector<cli::Diagnostic> diags;
    try {
      cli::recipe_load(file.string(), {});
    } catch (const cli::RecipeError& e) {
      diags = e.diagnostics();
    }
    fs::remove(file);
    return diags;
  };
  // `modle:` hides `model:` and the five keys required inside it: one error, not seven.
  std::string text = kBase;
  text.replace(text.find("model:"), 6, "modle:");
  auto diags = diags_of(text);
  ASSERT_EQ(diags.size(), 1u) << diags.back().format();
  EXPECT_EQ(diags[0].key, "modle");
  EXPECT_EQ(diags[0].hint, "did you mean model?");
  // Inside a section too, and ahead of other errors.
  text = kBase;
  text.replace(text.find("layers: 4"), 9, "layrs: 4");
  text.replace(text.find("steps: 10"), 9, "steps: -1");
  diags = diags_of(text);
  ASSERT_EQ(diags.size(), 2u);
  EXPECT_EQ(diags[0].key, "model.layrs");
  EXPECT_EQ(diags[1].key, "train.steps");
}

// 16-bit training is built for every layout (tp with and without sequence parallelism, pp, every
// ZeRO stage); bf16 gradients may be reduced in bf16, fp32 gradients reduced as bf16 are not built.
TEST(UnsupportedFeatures, SixteenBitTrainsAtEveryLayout) {
  Recipe r;
  r.train.precision = Precision::bf16;
  EXPECT_TRUE(describe(unsupported_features(r)).empty());
  r.parallel.zero = 1;
  EXPECT_TRUE(describe(unsupported_features(r)).empty());
  r.parallel.zero = 3;
  r.parallel.grad_reduce_dtype = GradReduceDtype::bf16;
  EXPECT_TRUE(describe(unsupported_features(r)).empty());
  r.parallel.zero = 1, r.parallel.tp = 2, r.parallel.sequence_parallel = true, r.parallel.pp = 2;
  EXPECT_TRUE(describe(unsupported_features(r)).empty());
  r.train.precision = Precision::fp32;
  EXPECT_THAT(
      describe(unsupported_features(r)),
      ::testing::ElementsAre(::testing::HasSubstr("parallel.grad_reduce_dtype: bf16 with train.precision fp32")));
}

// train.device cuda trains under every layout: more ranks, tp, pp and ZeRO are not refused.
TEST(UnsupportedFeatures, CudaTrainsUnderEveryLayout) {
  Recipe r;
  r.train.device = DeviceKind::cuda;
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    r.train.precision = p;
    EXPECT_TRUE(describe(unsupported_features(r)).empty());
  }
  r.launch.procs_per_node = 8, r.parallel.dp = 2, r.parallel.tp = 2, r.parallel.pp = 2, r.parallel.zero = 3;
  EXPECT_TRUE(describe(unsupported_features(r)).empty());
}

// A sliding window with context parallelism is refused by name (ring and Ulysses run the full mask).
TEST(UnsupportedFeatures, SlidingWindowWithContextParallelism) {
  Recipe r;
  r.model.sliding_window = 16;
  EXPECT_TRUE(describe(unsupported_features(r)).empty());
  r.parallel.cp = 2;
  const std::vector<std::string> refused = describe(unsupported_features(r));
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("model.sliding_window 16"), std::string::npos) << refused[0];
}

// Gemma's query_pre_attn_scalar with context parallelism is refused by name (ring and Ulysses take
// the default softmax scale).
TEST(UnsupportedFeatures, SoftmaxScaleWithContextParallelism) {
  Recipe r;
  r.model.query_pre_attn_scalar = 168;
  EXPECT_TRUE(describe(unsupported_features(r)).empty());
  r.parallel.cp = 2;
  const std::vector<std::string> refused = describe(unsupported_features(r));
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("model.query_pre_attn_scalar 168"), std::string::npos) << refused[0];
}

// MoE blocks train without ep under tp (with sequence parallelism), cp (dropless), dp, pp (every
// schedule), ZeRO and activation checkpointing, on either device; each other layout is refused by name.
TEST(UnsupportedFeatures, MixtureOfExpertsLayouts) {
  Recipe r;
  r.model.family = ModelFamily::llama;
  r.model.moe.experts = 4;
  r.parallel.dp = 2, r.parallel.pp = 2, r.parallel.zero = 1;
  EXPECT_TRUE(describe(unsupported_features(r)).empty());
  r.train.device = DeviceKind::cuda;
  r.parallel.tp = 2, r.parallel.sequence_parallel = true, r.parallel.cp = 2;
  r.train.activation_checkpointing = ActivationCheckpointing::selective;
  EXPECT_TRUE(describe(unsupported_features(r)).empty());
  r.train.activation_checkpointing = ActivationCheckpointing::none;
  r.parallel.pp_schedule = PipelineSchedule::zero_bubble;
  EXPECT_TRUE(describe(unsupported_features(r)).empty());
  r.parallel.pp_schedule = PipelineSchedule::one_f_one_b;
  r.train.device = DeviceKind::cpu;
  r.parallel.tp = 1, r.parallel.sequence_parallel = false, r.parallel.cp = 1;
  const std::vector<std::pair<std::function<void(Recipe&)>, std::string>> refused = {
      {[](Recipe& x) { x.parallel.ep = 2; }, "parallel.ep 2"},
      {[](Recipe& x) { x.parallel.cp = 2, x.model.moe.capacity_factor = 1; },
       "model.moe.capacity_factor 1 with parallel.cp 2"},
  };
  for (const auto& [change, phrase] : refused) {
    Recipe changed = r;
    change(changed);
    const std::vector<std::string> text = describe(unsupported_features(changed));
    ASSERT_EQ(text.size(), 1u) << phrase;
    EXPECT_NE(text[0].find(phrase), std::string::npos) << text[0];
  }
  // A dense model's ep is checked by recipe_check (it needs experts), not refused here.
  r.model.moe.experts = 0;
  r.parallel.tp = 2, r.parallel.cp = 2;
  EXPECT_TRUE(describe(unsupported_features(r)).empty());
}

// Context parallelism trains on the CPU with the ring and with Ulysses; the device path is refused.
TEST(UnsupportedFeatures, ContextParallelismRunsOnEitherDevice) {
  Recipe r;
  r.parallel.cp = 2;
  for (CpComm comm : {CpComm::ring, CpComm::all_to_all})
    for (DeviceKind device : {DeviceKind::cpu, DeviceKind::cuda}) {
      r.parallel.cp_comm = comm, r.train.device = device;
      EXPECT_TRUE(describe(unsupported_features(r)).empty());
    }
}

}  // namespace
