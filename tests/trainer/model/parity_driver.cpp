// Our side of the PyTorch parity tests (tests/trainer/model/parity.sh, scripts/reference/parity.py):
// builds a Model from flags, initializes it, and writes into --out:
//   config.json           the model and optimizer settings, for the reference to rebuild the model
//   weights.safetensors   the initial parameters (Hugging Face names, our layouts; docs/model.md)
//   batches.safetensors   probe.tokens/targets and step{s}.{a}.tokens/targets, int32 [B, T]
//   ours.safetensors      probe: loss, logits [B, T, Vpad], grad.<name> for every parameter
//                         (loss_scale 1); train: losses [steps], grad_norms [steps], lrs [steps],
//                         final.<name> after `steps` AdamW steps with gradient accumulation,
//                         the LR schedule and clipping
// A test tool, not a user command.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "parallel/comm/comm.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/model/model.h"
#include "trainer/optim/lr_schedule.h"
#include "trainer/optim/optimizer.h"

using namespace llmtrain;
using namespace llmtrain;
using namespace llmtrain::trainer;

namespace {

std::map<std::string, std::string> parse_flags(int argc, char** argv) {
  std::map<std::string, std::string> f;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0) throw Error("expected --flag value pairs, found " + k);
    f[k.substr(2)] = argv[i + 1];
  }
  return f;
}

void write_file(const std::string& path, const std::vector<SafetensorsEntry>& entries) {
  std::ofstream out(path, std::ios::binary);
  safetensors_write(entries, {{"producer", "llmtrain parity_driver"}},
                    [&](const void* p, size_t n) { out.write(static_cast<const char*>(p), std::streamsize(n)); });
  if (!out) throw Error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) try {
  auto f = parse_flags(argc, argv);
  auto get = [&](const char* k, const char* def) { return f.count(k) ? f[k] : std::string(def); };
  ModelConfig m;
  m.family = get("family", "gpt2") == "llama" ? ModelFamily::llama : ModelFamily::gpt2;
  m.layers = std::stoi(get("layers", "2"));
  m.hidden = std::stoi(get("hidden", "64"));
  m.heads = std::stoi(get("heads", "4"));
  m.kv_heads = std::stoi(get("kv-heads", std::to_string(m.heads).c_str()));
  m.ffn_hidden = std::stoi(get("ffn", std::to_string(4 * m.hidden).c_str()));
  m.vocab = std::stoi(get("vocab", "200"));
  m.vocab_pad = std::stoi(get("vocab-pad", "128"));
  m.seq_len = std::stoi(get("seq", "24"));
  m.max_positions = std::stoi(get("max-positions", std::to_string(m.seq_len).c_str()));
  m.rope_theta = std::stod(get("rope-theta", "10000"));
  m.norm_eps = std::stod(get("norm-eps", "1e-5"));
  m.init_std = std::stod(get("init-std", "0.02"));
  m.tie_embeddings = get("tie", "1") == "1";
  m.head_dim = std::stoi(get("head-dim", "0"));
  m.qkv_bias = get("qkv-bias", "0") == "1";
  m.qk_norm = get("qk-norm", "0") == "1";
  m.sliding_window = std::stoi(get("window", "0"));
  m.full_attention_every = std::stoi(get("full-every", "0"));
  m.rope_local_theta = std::stod(get("rope-local-theta", "0"));
  m.query_pre_attn_scalar = std::stod(get("query-scalar", "0"));
  m.activation = get("activation", "swiglu") == "geglu" ? MlpActivation::geglu : MlpActivation::swiglu;
  m.post_norms = get("post-norms", "0") == "1";
  m.scale_embeddings = get("scale-embeddings", "0") == "1";
  m.logit_softcap = std::stod(get("softcap", "0"));
  m.attention_sinks = get("sinks", "0") == "1";
  m.o_bias = get("o-bias", "0") == "1";
  const std::string rope_scaling = get("rope-scaling", "none");
  m.rope_scaling.type = rope_scaling == "linear"   ? RopeScalingType::linear
                        : rope_scaling == "llama3" ? RopeScalingType::llama3
                                                   : RopeScalingType::none;
  m.rope_scaling.factor = std::stod(get("rope-factor", "1"));
  m.rope_scaling.original_max_positions = std::stoi(get("rope-original", "8192"));
  m.moe.experts = std::stoi(get("moe-experts", "0"));
  m.moe.top_k = std::stoi(get("moe-top-k", "2"));
  m.moe.ffn_hidden = std::stoi(get("moe-ffn", std::to_string(m.ffn_hidden).c_str()));
  m.moe.every = std::stoi(get("moe-every", "1"));
  m.moe.first_dense = std::stoi(get("moe-first-dense", "0"));
  m.moe.renormalize = get("moe-renormalize", "1") == "1";
  m.moe.aux_loss = std::stod(get("moe-aux", "0.01"));
  m.moe.z_loss = std::stod(get("moe-z", "0.001"));
  m.moe.capacity_factor = std::stod(get("moe-capacity", "0"));
  m.moe.shared_ffn_hidden = std::stoi(get("moe-shared-ffn", "0"));
  m.moe.swiglu_limit = std::stod(get("moe-swiglu-limit", "0"));
  m.moe.swiglu_alpha = std::stod(get("moe-swiglu-alpha", "1.702"));
  m.moe.bias = get("moe-bias", "0") == "1";
  const int batch = std::stoi(get("batch", "2")), steps = std::stoi(get("steps", "20"));
  const int accum = std::stoi(get("accum", "1"));
  const double ignore = std::stod(get("ignore", "0"));
  const uint64_t seed = std::stoull(get("seed", "1234"));
  OptimizerConfig opt;
  opt.lr = std::stod(get("lr", "1e-2"));
  opt.min_lr = std::stod(get("min-lr", "1e-3"));
  opt.warmup = std::stoi(get("warmup", "5"));
  opt.decay_steps = std::stoi(get("decay-steps", std::to_string(steps).c_str()));
  opt.schedule = LrSchedule::cosine;
  opt.weight_decay = std::stod(get("weight-decay", "0.1"));
  const double clip = std::stod(get("clip", "1.0"));
  const std::string out = get("out", ".");

  ModelOptions mo;
  mo.micro_batch = batch;
  const std::string ckpt = get("ckpt", "0");  // 0 none, 1 full, 2 selective
  mo.checkpointing = ckpt == "1"   ? ActivationCheckpointing::full
                     : ckpt == "2" ? ActivationCheckpointing::selective
                                   : ActivationCheckpointing::none;
  auto tp = parallel::make_local_comm("tp");
  Model model(m, mo, *tp);
  model.init_parameters(seed);

  nlohmann::json cfg = {{"family", m.family == ModelFamily::llama ? "llama" : "gpt2"},
                        {"layers", m.layers},
                        {"hidden", m.hidden},
                        {"heads", m.heads},
                        {"kv_heads", m.kv_heads},
                        {"ffn_hidden", m.ffn_hidden},
                        {"vocab", m.vocab},
                        {"padded_vocab", m.padded_vocab()},
                        {"seq_len", m.seq_len},
                        {"max_positions", m.max_positions},
                        {"rope_theta", m.rope_theta},
                        {"norm_eps", m.norm_eps},
                        {"tie_embeddings", m.tie_embeddings},
                        {"head_dim", m.head_size()},
                        {"qkv_bias", m.qkv_bias},
                        {"qk_norm", m.qk_norm},
                        {"sliding_window", m.sliding_window},
                        {"full_attention_every", m.full_attention_every},
                        {"rope_local_theta", m.rope_local_theta},
                        {"query_pre_attn_scalar", m.query_pre_attn_scalar},
                        {"activation", to_string(m.activation)},
                        {"post_norms", m.post_norms},
                        {"scale_embeddings", m.scale_embeddings},
                        {"logit_softcap", m.logit_softcap},
                        {"attention_sinks", m.attention_sinks},
                        {"o_bias", m.o_bias},
                        {"rope_scaling",
                         {{"type", rope_scaling},
                          {"factor", m.rope_scaling.factor},
                          {"low_freq_factor", m.rope_scaling.low_freq_factor},
                          {"high_freq_factor", m.rope_scaling.high_freq_factor},
                          {"original_max_positions", m.rope_scaling.original_max_positions}}},
                        {"moe", m.moe.enabled() ? nlohmann::json{{"experts", m.moe.experts},
                                                                 {"top_k", m.moe.top_k},
                                                                 {"ffn_hidden", m.moe.ffn_hidden},
                                                                 {"every", m.moe.every},
                                                                 {"first_dense", m.moe.first_dense},
                                                                 {"renormalize", m.moe.renormalize},
                                                                 {"aux_loss", m.moe.aux_loss},
                                                                 {"z_loss", m.moe.z_loss},
                                                                 {"capacity_factor", m.moe.capacity_factor},
                                                                 {"shared_ffn_hidden", m.moe.shared_ffn_hidden},
                                                                 {"swiglu_limit", m.moe.swiglu_limit},
                                                                 {"swiglu_alpha", m.moe.swiglu_alpha},
                                                                 {"bias", m.moe.bias}}
                                                : nlohmann::json(nullptr)},
                        {"batch", batch},
                        {"steps", steps},
                        {"accum", accum},
                        {"lr", opt.lr},
                        {"min_lr", opt.min_lr},
                        {"warmup", opt.warmup},
                        {"decay_steps", opt.decay_steps},
                        {"beta1", opt.beta1},
                        {"beta2", opt.beta2},
                        {"eps", opt.eps},
                        {"weight_decay", opt.weight_decay},
                        {"clip", clip},
                        {"ignore_index", kIgnoreIndex}};
  std::ofstream(out + "/config.json") << cfg.dump(2);

  std::vector<SafetensorsEntry> weights;
  for (const ModelParam& p : model.parameters())
    weights.push_back({p.spec.name, kernels::DType::fp32, p.shape, p.value.data});
  write_file(out + "/weights.safetensors", weights);

  // Batches: uniform random tokens; targets random too, with a fraction ignored.
  std::mt19937_64 rng(seed + 1);
  std::uniform_int_distribution<int32_t> tok(0, m.vocab - 1);
  std::uniform_real_distribution<double> u(0, 1);
  const int64_t n = int64_t(batch) * m.seq_len;
  std::vector<std::string> names = {"probe"};
  for (int s = 0; s < steps; ++s)
    for (int a = 0; a < accum; ++a) names.push_back("step" + std::to_string(s) + "." + std::to_string(a));
  std::map<std::string, std::vector<int32_t>> tokens, targets;
  std::vector<SafetensorsEntry> batch_entries;
  for (const std::string& name : names) {
    auto& t = tokens[name];
    auto& g = targets[name];
    for (int64_t i = 0; i < n; ++i) {
      t.push_back(tok(rng));
      g.push_back(u(rng) < ignore ? kIgnoreIndex : tok(rng));
    }
  }
  for (const std::string& name : names) {
    batch_entries.push_back({name + ".tokens", kernels::DType::int32, {batch, m.seq_len}, tokens[name].data()});
    batch_entries.push_back({name + ".targets", kernels::DType::int32, {batch, m.seq_len}, targets[name].data()});
  }
  write_file(out + "/batches.safetensors", batch_entries);
  auto micro = [&](const std::string& name) {
    return MicroBatch{kernels::host_tensor(tokens[name].data(), {batch, m.seq_len}),
                      kernels::host_tensor(targets[name].data(), {batch, m.seq_len})};
  };

  // Probe: logits, loss and every gradient.
  std::vector<SafetensorsEntry> results;
  std::vector<float> logits;
  {
    kernels::Tensor l = model.forward_logits(micro("probe").tokens);
    logits.assign(l.ptr<float>(), l.ptr<float>() + l.numel());
  }
  model.zero_grads();
  float probe_loss = model.forward_backward(micro("probe"), 1.0f);
  std::vector<float> grads(model.grads().ptr<float>(), model.grads().ptr<float>() + model.numel());
  results.push_back({"probe.loss", kernels::DType::fp32, {1}, &probe_loss});
  results.push_back({"probe.logits", kernels::DType::fp32, {batch, m.seq_len, m.padded_vocab()}, logits.data()});
  for (const ModelParam& p : model.parameters())
    results.push_back({"grad." + p.spec.name, kernels::DType::fp32, p.shape, grads.data() + p.offset});

  // Training.
  AdamW adamw(opt, decay_ranges(model.parameters()), {{0, model.numel()}});
  std::vector<float> losses, norms, lrs;
  for (int s = 0; s < steps; ++s) {
    model.zero_grads();
    double loss = 0;
    for (int a = 0; a < accum; ++a)
      loss += model.forward_backward(micro("step" + std::to_string(s) + "." + std::to_string(a)), 1.0f / float(accum));
    const double norm = std::sqrt(grad_sum_squares(model.parameters(), 0));
    const double lr = lr_at(opt, s);
    adamw.step(model.params(), model.grads(), lr, clip_factor(norm, clip));
    losses.push_back(float(loss / accum));
    norms.push_back(float(norm));
    lrs.push_back(float(lr));
  }
  results.push_back({"train.losses", kernels::DType::fp32, {steps}, losses.data()});
  results.push_back({"train.grad_norms", kernels::DType::fp32, {steps}, norms.data()});
  results.push_back({"train.lrs", kernels::DType::fp32, {steps}, lrs.data()});
  for (const ModelParam& p : model.parameters())
    results.push_back({"final." + p.spec.name, kernels::DType::fp32, p.shape, p.value.data});
  write_file(out + "/ours.safetensors", results);
  std::printf("parity_driver: probe loss %.6f, final loss %.6f\n", probe_loss, losses.empty() ? 0.0f : losses.back());
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "%s\n", format_error(e).c_str());
  return 2;
}
