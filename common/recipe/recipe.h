// The recipe: everything a training job is, as plain structs (docs/architecture.md §6; every key is
// documented in docs/recipe.md). cli/ parses YAML into these; nothing here knows about YAML.
//
// Rule a reader could get wrong: a field documented as "0 = auto" holds 0 only between parsing
// and recipe_resolve(); after resolution every such field holds its concrete value. Parsing
// rejects an explicit 0 for those fields, so 0 always means "the user said auto or nothing".
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/enum_names.h"

namespace llmtrain {

enum class ModelFamily { gpt2, llama };
enum class DeviceKind { cpu, cuda };
enum class Precision { fp32, bf16, fp16 };
enum class GradReduceDtype { fp32, bf16 };
enum class ActivationCheckpointing { none, selective, full };
enum class NonFiniteAction { stop, skip };
enum class LrSchedule { cosine, linear, constant, wsd };
// The warmup-stable-decay schedule's decay: linear, or 1 − √p (Hägele et al. 2024, MiniCPM's kind).
enum class WsdShape { linear, one_minus_sqrt };
// The optimizer's state (AdamW's moments) in memory: fp32, or bf16 (updated in fp32, stored rounded).
enum class StateDtype { fp32, bf16 };
// optimizer.name: AdamW for everything, or Muon for the hidden matrices (AdamW for the rest).
enum class OptimizerName { adamw, muon };
// Muon's step size for an [m, n] matrix, named as torch.optim.Muon's adjust_lr_fn names them:
// lr·√max(1, m/n) (Keller Jordan's original), or lr·0.2·√max(m, n) (Moonshot's, matching AdamW's
// update RMS).
enum class MuonAdjustLr { original, match_rms_adamw };
enum class PipelineSchedule { gpipe, one_f_one_b, interleaved, zero_bubble };
// Context parallelism's attention: K/V blocks around a ring, or Ulysses' heads ↔ sequence all-to-all.
enum class CpComm { ring, all_to_all };
// What moves a cuda rank's device memory between ranks: NCCL when the build and layout allow
// (automatic), NCCL, or the staged path through pinned host memory and MPI (parallel/comm/device_comm.h).
enum class DeviceCommKind { automatic, nccl, staged };
// Where the optimizer's state lives between its updates (parallel.offload): in the compute device's
// memory, in (pinned) host memory, or in files under parallel.offload_path (trainer/optim/offload.h).
enum class OffloadKind { none, host, nvme };
enum class ResumeMode { automatic, none, path };
// What the run measures besides its step times (log.profile): nothing, or each op's device time over
// a few steps (trainer/loop/op_profiler.h, docs/metrics.md "Per-op timing").
enum class ProfileMode { none, ops };
// RoPE's frequency scaling for longer contexts (transformers' rope_type): Llama 3.1+'s `llama3`,
// `linear` position interpolation, or YaRN (`yarn`: gpt-oss, Qwen's long-context configs).
enum class RopeScalingType { none, linear, llama3, yarn };
// The llama family's MLP gate: silu (LLaMA) or the tanh GELU (Gemma).
enum class MlpActivation { swiglu, geglu };

struct RopeScalingConfig {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1.0;                // linear, llama3 and yarn: the context extension factor
  double low_freq_factor = 1.0;       // llama3
  double high_freq_factor = 4.0;      // llama3
  int original_max_positions = 8192;  // llama3 and yarn: original_max_position_embeddings
  double beta_fast = 32;              // yarn: pairs turning more than this often over the original context keep
                                      // their frequency
  double beta_slow = 1;               // yarn: those turning less often than this are divided by factor
  bool truncate = true;               // yarn: the ramp's pair range floored and ceiled
  double attention_factor = 0;        // yarn: cos and sin multiplied by this (0 = inferred: yarn_attention_factor)
  double mscale = 0;                  // yarn, with mscale_all_dim: DeepSeek's auto attention factor
  double mscale_all_dim = 0;

  // YaRN's attention factor as transformers infers it: attention_factor when set, else
  // m(factor, mscale) / m(factor, mscale_all_dim) when both are set, else m(factor, 1), with
  // m(s, k) = 0.1 · k · ln(s) + 1 (1 for s ≤ 1).
  double yarn_attention_factor() const;
};

// Mixture of experts (docs/model.md "Mixture of experts"): MoE blocks replace the MLP of every
// `every`-th layer after the first `first_dense` dense ones. Off while experts is 0.
struct MoeConfig {
  int experts = 0;             // 0 = dense model
  int top_k = 2;               // experts each token goes to
  int ffn_hidden = 0;          // 0 = auto: model.ffn_hidden (each expert's SwiGLU width)
  int every = 1;               // a MoE block every n-th layer (counted from first_dense)
  int first_dense = 0;         // layers before the first MoE block
  bool renormalize = true;     // the top-k weights renormalised to sum to 1 (Mixtral)
  double aux_loss = 0.01;      // load-balancing loss coefficient (Megatron-Core's normalisation)
  double z_loss = 0.001;       // router z-loss coefficient
  double capacity_factor = 0;  // 0 = dropless; else each expert keeps at most ⌈factor · N · top_k / experts⌉ rows
  // 0 = none; else a shared expert of this SwiGLU width that every token visits, its output scaled by
  // a sigmoid gate σ(x · w) and added to the routed experts' (Qwen2-MoE's shared_expert)
  int shared_ffn_hidden = 0;
  // 0 = SwiGLU experts; else gpt-oss's clamped SwiGLU: with g = min(gate, limit) and u = clamp(up,
  // ±limit), (u + 1) · g · σ(swiglu_alpha · g)
  double swiglu_limit = 0;
  double swiglu_alpha = 1.702;
  // Biases on the router's logits and on every routed expert's three products (gpt-oss's)
  bool bias = false;

  bool enabled() const { return experts > 0; }
  // Whether global layer `layer` is a MoE block.
  bool layer(int layer) const { return enabled() && layer >= first_dense && (layer - first_dense) % every == 0; }
};

struct ModelConfig {
  ModelFamily family = ModelFamily::gpt2;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;     // 0 = auto: heads (multi-head attention)
  int ffn_hidden = 0;   // 0 = auto: 4·hidden (gpt2); 8/3·hidden rounded up to 256 (llama)
  int vocab = 0;        // 0 = auto: from the tokenizer
  int vocab_pad = 128;  // embedding/head rows padded to a multiple of this
  int seq_len = 0;
  int max_positions = 0;  // 0 = auto: seq_len
  double rope_theta = 10000.0;
  RopeScalingConfig rope_scaling;
  // The llama family's variants (Qwen, Mistral; docs/model.md):
  int head_dim = 0;        // 0 = auto: hidden / heads (Qwen3 and Mistral set their own)
  bool qkv_bias = false;   // biases on the q, k and v projections (Qwen2)
  bool o_bias = false;     // a bias on o_proj (gpt-oss: with qkv_bias, transformers' attention_bias)
  bool qk_norm = false;    // per-head RMSNorm of q and k before RoPE (Qwen3)
  int sliding_window = 0;  // 0 = none; else each query sees itself and the window − 1 keys before it (Mistral)
  // Gemma 3's (docs/model.md "Gemma 3"):
  int full_attention_every = 0;      // with sliding_window: every n-th layer (the n-th, 2n-th, ...) sees every key
  double rope_local_theta = 0;       // 0 = rope_theta; else the windowed layers' RoPE base, without rope_scaling
  double query_pre_attn_scalar = 0;  // 0 = the head size; the softmax scale is its −1/2 power
  MlpActivation activation = MlpActivation::swiglu;
  bool post_norms = false;        // RMSNorms of the attention and MLP outputs before their residual adds
  bool scale_embeddings = false;  // the token embeddings × √hidden
  double logit_softcap = 0;       // 0 = none; else logits = cap · tanh(logits / cap)
  // gpt-oss's: a learned logit per query head in each layer's softmax denominator (attention sinks)
  bool attention_sinks = false;
  double norm_eps = 1e-5;
  double init_std = 0.02;
  double dropout = 0.0;
  bool tie_embeddings = true;  // default per family: true for gpt2, false for llama
  MoeConfig moe;

  int head_size() const { return head_dim > 0 ? head_dim : hidden / heads; }
  // Whether global layer `layer` attends within the sliding window (every layer but each
  // full_attention_every-th when a window is set).
  bool windowed(int layer) const {
    return sliding_window > 0 && (full_attention_every == 0 || (layer + 1) % full_attention_every != 0);
  }
  int padded_vocab() const { return (vocab + vocab_pad - 1) / vocab_pad * vocab_pad; }
};

struct DataSource {
  std::string path;  // Megatron indexed dataset prefix (absolute after resolution)
  double weight = 1.0;
};

struct DataConfig {
  std::string tokenizer = "byte";  // "byte" or an absolute path to tokenizer.json / vocab.json
  std::vector<DataSource> train;
  std::string valid;  // "" = no validation set
};

// fp16's dynamic loss scaling, with Megatron's defaults: the loss is multiplied by `initial` before
// backward; a step whose gradients overflow is skipped, and once `hysteresis` overflows have
// happened since the scale last grew, every further overflow multiplies it by `backoff` (not
// below `min`); `growth_interval` steps in a row without an overflow double it and restore the
// hysteresis.
struct LossScaleConfig {
  double initial = 4294967296.0;  // 2^32
  int64_t growth_interval = 1000;
  double backoff = 0.5;
  int hysteresis = 2;
  double min = 1.0;
};

struct TrainConfig {
  DeviceKind device = DeviceKind::cpu;
  Precision precision = Precision::fp32;
  int64_t steps = 0;
  int micro_batch = 0;
  int global_batch = 0;    // 0 = auto: micro_batch · dp (no accumulation)
  double grad_clip = 1.0;  // 0 = no clipping
  uint64_t seed = 1234;
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::none;
  NonFiniteAction on_nonfinite = NonFiniteAction::stop;
  int max_skipped_steps = 10;  // on_nonfinite: skip stops after this many skipped steps in a row
  LossScaleConfig loss_scale;  // precision fp16 only
  int threads = 0;             // 0 = auto: usable cores / local ranks
};

// optimizer.muon: Muon's settings (torch.optim.Muon's defaults), and the AdamW part's own lr and
// weight decay (unset: optimizer.lr and optimizer.weight_decay).
struct MuonConfig {
  double momentum = 0.95;
  bool nesterov = true;
  int64_t ns_steps = 5;
  std::array<double, 3> ns_coefficients = {3.4445, -4.7750, 2.0315};
  StateDtype ns_dtype = StateDtype::bf16;  // the Newton–Schulz products' dtype: bf16 or fp32
  MuonAdjustLr adjust_lr = MuonAdjustLr::original;
  std::optional<double> adamw_lr, adamw_weight_decay;
};

struct OptimizerConfig {
  OptimizerName name = OptimizerName::adamw;
  MuonConfig muon;
  double lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup = 0;
  LrSchedule schedule = LrSchedule::cosine;
  int64_t decay_steps = 0;  // 0 = auto: train.steps
  // schedule wsd: warmup, lr until the decay's last wsd_decay_steps steps before decay_steps (0: the
  // last wsd_decay_fraction of decay_steps), then down to min_lr in wsd_shape
  int64_t wsd_decay_steps = 0;
  double wsd_decay_fraction = 0.2;
  WsdShape wsd_shape = WsdShape::one_minus_sqrt;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  StateDtype state_dtype = StateDtype::fp32;
  // 16-bit training keeps an fp32 master copy of the parameters in the optimizer; false updates the
  // bf16 parameters in place, rounded stochastically (seeded by train.seed).
  bool master = true;

  // schedule wsd: the decay's length in steps (at least 1) and its first step (decay_steps − that).
  int64_t wsd_decay_length() const;
  int64_t wsd_decay_start() const { return decay_steps - wsd_decay_length(); }
};

struct ParallelConfig {
  int tp = 1;
  int pp = 1;
  int dp = 0;  // 0 = auto: world size / (tp · cp · pp)
  // Context parallelism: each sequence split over cp ranks in 2·cp chunks (rank i holds chunks i and
  // 2·cp − 1 − i); cp_comm says how attention crosses them.
  int cp = 1;
  CpComm cp_comm = CpComm::ring;
  // Expert parallelism (model.moe): the experts split over ep consecutive ranks of the dp × cp
  // domain.
  int ep = 1;
  int zero = 0;
  int zero_group =
      0;  // 0 = auto: the whole dp group at zero ≥ 1, 1 at zero 0 (ZeRO shards within groups of this many dp ranks)
  bool sequence_parallel = false;
  PipelineSchedule pp_schedule = PipelineSchedule::one_f_one_b;
  int virtual_stages = 1;
  // Transformer blocks per pipeline stage, first to last (an uneven split, e.g. fewer blocks on the
  // stages holding the embedding and the head); empty = layers / pp on every stage.
  std::vector<int> pp_layers;
  double bucket_mb = 25.0;
  double timeout_s = 300.0;
  // What the data-parallel gradient reduction moves and sums in: fp32 (16-bit gradients widened,
  // summed in fp32, the result rounded once) or bf16 (train.precision bf16 only: the bf16 gradient
  // words on the wire, half the bytes, every addition rounded to bf16 as NCCL does).
  GradReduceDtype grad_reduce_dtype = GradReduceDtype::fp32;
  DeviceCommKind device_comm = DeviceCommKind::automatic;  // train.device cuda only
  OffloadKind offload = OffloadKind::none;
  std::string offload_path;     // offload nvme: the directory of the state files (absolute after resolution)
  bool offload_params = false;  // ZeRO 3: the owned parameter shards too, to the same place
};

struct CheckpointConfig {
  std::string dir;      // "" = auto: <log.dir>/ckpt
  int64_t every = 200;  // 0 = only at the end
  int keep = 3;
  ResumeMode resume = ResumeMode::automatic;
  std::string resume_path;  // when resume == path (absolute after resolution)
  bool load_weights_only = false;
  // Bound on a save's (and a load's) waits for other ranks, instead of parallel.timeout: writing a
  // large model's shards takes longer than any collective should.
  double timeout_s = 1800.0;
  // Saves snapshot this rank's slices into host memory at the step boundary and write them on a
  // background thread while training goes on (trainer/checkpoint/async_checkpoint.h).
  bool async = false;
};

struct EvalConfig {
  int64_t every = 200;  // 0 = only at the end
  int batches = 20;
};

struct LogConfig {
  int64_t every = 10;
  std::string dir;                // "" = auto: runs/<name>
  double peak_tflops = 0.0;       // 0 = auto: from the device (see docs/recipe.md)
  double straggler_factor = 1.5;  // a rank computing this many times the median is named
  bool tensorboard = false;       // also write TensorBoard event files to <dir>/tensorboard/
  ProfileMode profile = ProfileMode::none;
  int profile_steps = 3;  // log.profile ops: the steps timed, after the first (warm-up) one
};

struct SlurmConfig {
  std::string partition;  // "" = cluster default
  std::string account;
  std::string time;  // "" = partition default; else [D-]HH:MM:SS or minutes
};

struct SshConfig {
  int port = 22;
  std::string identity;  // "" = ssh's default
  std::string config;    // "" = ssh's default
};

struct LaunchConfig {
  int procs_per_node = 1;
  int nodes = 1;
  std::string hostfile;  // "" = none
  int max_restarts = 0;
  // No rank making progress (a step, or a change of phase) for this long ends the job, naming the
  // ranks behind and the collective they are in, and restarts it when max_restarts allows. 0 = off.
  double hang_timeout_s = 600.0;
  // train.device cuda: a rank takes device local_rank mod (the devices it sees); more local ranks
  // than devices is refused unless this lets them share (tests on one GPU or the simulator).
  bool share_devices = false;
  SlurmConfig slurm;
  SshConfig ssh;
};

struct Recipe {
  std::string name;
  std::string source_file;  // absolute path of the YAML file it came from
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimizerConfig optimizer;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  LogConfig log;
  LaunchConfig launch;

  int world_size() const { return parallel.tp * parallel.cp * parallel.pp * parallel.dp; }
  // Micro-batches each data-parallel rank runs per optimizer step.
  int grad_accum_steps() const { return global_batch_per_dp() / train.micro_batch; }
  int global_batch_per_dp() const { return train.global_batch / parallel.dp; }
};

// The names recipes give an enum's values, in the order messages list them: the one table the
// recipe parser (cli/recipe_parse.cpp) reads and to_string writes from.
std::span<const EnumName<ModelFamily>> enum_names(ModelFamily);
std::span<const EnumName<DeviceKind>> enum_names(DeviceKind);
std::span<const EnumName<OptimizerName>> enum_names(OptimizerName);
std::span<const EnumName<MuonAdjustLr>> enum_names(MuonAdjustLr);
std::span<const EnumName<Precision>> enum_names(Precision);
std::span<const EnumName<GradReduceDtype>> enum_names(GradReduceDtype);
std::span<const EnumName<ActivationCheckpointing>> enum_names(ActivationCheckpointing);
std::span<const EnumName<NonFiniteAction>> enum_names(NonFiniteAction);
std::span<const EnumName<LrSchedule>> enum_names(LrSchedule);
std::span<const EnumName<WsdShape>> enum_names(WsdShape);
std::span<const EnumName<StateDtype>> enum_names(StateDtype);
std::span<const EnumName<PipelineSchedule>> enum_names(PipelineSchedule);
std::span<const EnumName<RopeScalingType>> enum_names(RopeScalingType);
std::span<const EnumName<MlpActivation>> enum_names(MlpActivation);
std::span<const EnumName<CpComm>> enum_names(CpComm);
std::span<const EnumName<DeviceCommKind>> enum_names(DeviceCommKind);
std::span<const EnumName<OffloadKind>> enum_names(OffloadKind);
std::span<const EnumName<ProfileMode>> enum_names(ProfileMode);

// The name of a recipe enum's value, as recipes write it ("1f1b").
template <typename E>
requires requires(E v) { enum_names(v); }
const char* to_string(E v) { return enum_name(enum_names(v), v); }

}  // namespace llmtrain
