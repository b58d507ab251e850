// Model: the transformer of one pipeline stage (GPT-2 or LLaMA family), with hand-written forward
// and backward over preallocated buffers (docs/architecture.md §3: no autograd, flat parameter and gradient
// buffers). docs/model.md documents the parameter layout and every op of a block.
//
// Rules a reader could get wrong:
//  - Parameters live in ONE flat buffer and gradients in another of the same layout and dtype
//    (options.dtype: fp32, or 16-bit with the fp32 master in the optimizer), in the
//    order of model_param_specs() restricted to this stage; ModelParam::value/grad are views.
//    Nothing may reallocate them: the optimizer, ZeRO shards and checkpoint I/O work on ranges.
//  - With options.external_params (ZeRO 3) there is no parameter buffer either: the param-storage
//    hook hands out each group's values (a gathered copy) before forward, backward or recomputation
//    reads them, and takes them back after; ModelParam::value is only meaningful while its group is
//    held. The values themselves live in a compact shard of flat ranges the model is given
//    (set_param_shard), which init_parameters and checkpoints write and read.
//  - Backward ACCUMULATES into the gradient buffer (gradient accumulation over micro-batches);
//    call zero_grads() once per optimizer step. With options.external_grads (ZeRO 2) there is no
//    such buffer: backward accumulates into storage the grad-storage hook hands out per group. The loss a micro-batch
//    contributes is loss_scale · mean(token losses); pass loss_scale = 1 / micro-batches to average.
//  - Every buffer is sized at construction for options.micro_batch × seq_len tokens; a step
//    allocates nothing. Views returned by forward_logits/forward_cached/stage_output/
//    stage_input_grad/loss stay valid only until the next call that uses the same activation slot
//    (forward_logits and forward_cached use slot 0).
//  - The model never reads tensor memory on the host (docs/architecture.md §3 "Devices"): token ids, targets
//    and stage inputs enter through kernels::copy, the loss is a [1] tensor produced by an op
//    (loss(slot)), and only the conveniences forward_backward/forward_loss copy it to a host float.
//    Token ids are checked where they are read, by the embedding and cross-entropy kernels; the
//    data loader (GptDataset::sample) and the tokenizer only produce real ids.
//  - Tensor-parallel crossings are explicit calls on the tp communicator (parallel/
//    tensor_parallel.h) at every column-/row-parallel boundary; with tp = 1 they do nothing.
//  - There is one forward pass. Generation (forward_cached) runs the same embedding, block and
//    head code as training, with a KV cache in place of attention over the whole sequence.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "common/recipe/layout.h"
#include "common/recipe/recipe.h"
#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "parallel/comm/comm.h"
#include "parallel/grad_sync.h"
#include "trainer/model/model_spec.h"

namespace llmtrain::trainer {

// Which part of the model this rank holds.
//
// With virtual pipeline stages (the interleaved schedule) a stage holds `chunks` non-contiguous
// runs of blocks: chunk c is virtual stage c · stages + s and holds blocks [layer_begin + c ·
// chunk_stride, layer_end + c · chunk_stride). Local block l (0 ≤ l < blocks(), the order of the
// parameters in the flat buffers and of the activations) is chunk l / chunk_blocks(). The
// embedding belongs to chunk 0 and the head to chunk chunks - 1.
struct StageLayout {
  int layer_begin = 0, layer_end = 0;  // chunk 0's blocks [layer_begin, layer_end)
  bool has_embedding = true;           // the first stage: token (+ position) embedding
  bool has_head = true;                // the last stage: final norm, LM head and loss
  int chunks = 1;                      // virtual chunks (parallel.virtual_stages)
  int chunk_stride = 0;                // blocks from one chunk's first block to the next's

  int chunk_blocks() const { return layer_end - layer_begin; }
  int blocks() const { return chunks * chunk_blocks(); }
  // The global layer of local block l, and the local block of a global layer (-1: not held).
  int layer(int local) const { return layer_begin + (local / chunk_blocks()) * chunk_stride + local % chunk_blocks(); }
  int local(int layer) const {
    for (int c = 0; c < chunks; ++c) {
      const int begin = layer_begin + c * chunk_stride;
      if (layer >= begin && layer < begin + chunk_blocks()) return c * chunk_blocks() + layer - begin;
    }
    return -1;
  }
};

// Stage `stage` of `stages` equal pipeline stages (layers must divide evenly; recipe_check
// guarantees it). stages = 1 gives the whole model.
StageLayout pipeline_stage_layout(const ModelConfig& model, int stage, int stages);
// Stage `stage` of an uneven split (parallel.pp_layers): blocks[s] consecutive blocks on stage s,
// each ≥ 1, adding up to the model's layers (recipe_check guarantees it). Empty: the even split
// over `stages`.
StageLayout pipeline_stage_layout(const ModelConfig& model, int stage, int stages, const std::vector<int>& blocks);
// Stage `stage` of `stages` with `chunks` virtual chunks each (the interleaved schedule): layers
// split evenly over stages × chunks blocks, block c · stages + stage in chunk c. chunks = 1 is the
// even split.
StageLayout pipeline_stage_layout(const ModelConfig& model, int stage, int stages, int chunks);

// What stage `stage` holds under a layout: its virtual chunks (virtual_stages > 1), else its share of
// the layout's blocks per stage (uneven) or of the even split. train(), the memory plan, --dry-run
// and the planner all place blocks with this.
StageLayout pipeline_stage_layout(const ModelConfig& model, const Layout& layout, int stage);

// Whether stage `stage` holds both ends of a tied word embedding (one chunk holds the embedding and
// the head). Its embedding's group is then held from the embedding's forward through the head's, and
// from the head's backward through the embedding's (the head reads and writes the same weight).
bool tied_in_stage(const ModelConfig& model, const StageLayout& stage);

// The storage dtype of train.precision: fp32, bf16 or fp16.
kernels::DType precision_dtype(Precision precision);

// The recipe's RoPE scaling as the rope_table op takes it (YaRN's attention factor resolved).
kernels::RopeScaling rope_scaling_op(const RopeScalingConfig& c);

struct ModelOptions {
  StageLayout stage = {};  // default: filled by the constructor as the whole model when layer_end == 0
  int micro_batch = 1;     // the largest micro-batch (sequences) forward/backward will see
  int seq_len = 0;         // the longest sequence; 0 = model.seq_len
  // none: every block keeps its activations; selective: the products (linear, attention and the
  // residual after attention) are kept and the norms and the MLP activation recomputed in
  // backward; full: only block inputs are kept and the whole block's forward recomputed.
  ActivationCheckpointing checkpointing = ActivationCheckpointing::none;
  int activation_slots = 1;  // micro-batches whose activations may be alive at once (pipeline schedules),
                             // per virtual chunk of the stage
  // Storage of the parameter and gradient buffers and of the activations (train.precision): fp32,
  // bf16 or fp16. The per-row statistics (norm mean/rstd, attention and loss lse, the losses) stay
  // fp32 whatever it is, and so does the vocab-parallel loss's scratch; ops compute in fp32
  // (kernels/ops.h) and tp's crossings move this dtype (reductions sum in fp32). 16-bit needs a
  // training model of the whole network (any tp, no KV cache).
  kernels::DType dtype = kernels::DType::fp32;
  // Generation: > 0 allocates per-layer K and V caches [micro_batch, kv_cache_tokens, kv_heads/tp,
  // head dim] for forward_cached (at most model.max_positions). 0 = a training model, no cache.
  int64_t kv_cache_tokens = 0;
  // ZeRO 2: no flat gradient buffer; backward writes each parameter group's gradients where the
  // grad-storage hook says (set_grad_storage_hook), and grads()/ModelParam::grad are only
  // meaningful for the group backward is computing.
  bool external_grads = false;
  // ZeRO 3: no flat parameter buffer; forward and backward read each group's values where the
  // param-storage hook says (set_param_storage_hook). Implies nothing about gradients (ZeRO 3 sets
  // external_grads too).
  bool external_params = false;
  // Sequence parallelism (tp > 1): the residual stream, the norms and the residual adds hold this
  // rank's micro_batch·seq_len / tp token rows; all-gathers before the column-parallel linears and
  // reduce-scatters after the row-parallel ones replace the all-reduces (parallel/tensor_parallel.h).
  // Needs the whole model on this stage and micro_batch·seq_len divisible by tp.
  bool sequence_parallel = false;
  // Context parallelism: each sequence is split over this many ranks (parallel/context_parallel.h),
  // and seq_len above is this rank's share (the sequence / context_parallel: two chunks of
  // seq_len / 2 rows, at the positions cp_chunk says). Attention is ring attention over the cp
  // group the constructor is given; the ring's buffers are activations work memory. Training only
  // (no KV cache).
  int context_parallel = 1;
  CpComm cp_comm = CpComm::ring;  // ring attention, or Ulysses' all-to-all (heads and kv_heads / tp divisible by cp)
  // Expert parallelism (MoE models): the experts split over this many ranks (the ep group the
  // constructor is given). Each rank computes experts [ep rank · E/ep, (ep rank + 1) · E/ep) for the
  // tokens of every rank of its group, which reach it and return by all-to-all. The experts'
  // activations are sized for the worst case, ep × a rank's own picks. Without experts_sharded
  // (ZeRO 2 and 3) every rank holds all experts (the others' gradients are 0 here, and the dp × cp
  // reduction sums each from the ranks that computed it).
  int expert_parallel = 1;
  // With expert_parallel > 1 (Layout::experts_sharded: ZeRO 0 and 1): this rank holds only its E/ep
  // experts of each MoE block (ModelParam::expert_shard); their gradients are the sum over its ep
  // group's tokens, which the expert-data-parallel reduction completes.
  bool experts_sharded = false;
  // Zero-bubble pipeline schedules: backward runs as stage_backward_input then
  // stage_backward_weight, and each slot keeps the linears' output gradients in between. Needs
  // every activation kept (no checkpointing), gradients and parameters of its own, no sequence
  // parallelism.
  bool split_backward = false;
  // Where the parameters, gradients and activations live (train.device). Initialization draws on
  // the host and copies to the device; everything else runs as ops on the device.
  kernels::Device device = kernels::Device::cpu;
};

// What a model of this shape allocates on one rank, in bytes, without allocating it: computed by
// the same layout code the constructor runs, so it equals what a constructed Model holds.
struct ModelMemory {
  int64_t params = 0;  // the flat parameter buffer in options.dtype (this rank's shards; 0 with external_params)
  int64_t grads = 0;   // the flat gradient buffer, same layout and dtype (0 with external_grads)
  int64_t activations_kept = 0;  // what the activation slots keep from forward to backward (all slots)
  int64_t activations_work = 0;  // shared by the slots: backward's gradient buffers, recomputation,
                                 // RoPE table, the vocab-parallel loss's scratch
  int64_t head_logits = 0;       // of activations_kept: the head's logits [tokens, padded vocab / tp]
                                 // (all slots; their gradient overwrites them), 1/tp of tp 1's
  int64_t kv_cache = 0;          // generation's K and V caches (kv_cache_tokens > 0)

  // The activation arena: Model::activation_bytes().
  int64_t activations() const { return activations_kept + activations_work + kv_cache; }
  int64_t total() const { return params + grads + activations(); }
};

// The memory plan of the stage `options.stage` of `model` on tensor-parallel rank `tp_rank` of
// `tp_size`: throws the constructor's Errors for a shape it would refuse. Optimizer state is not
// the model's (see trainer/optim/optimizer.h).
ModelMemory model_memory_plan(const ModelConfig& model, const ModelOptions& options, int tp_size, int tp_rank);

struct ModelParam;
// The parameters (specs, shapes, flat offsets; no tensors) that stage `options.stage` of `model`
// holds on tensor-parallel rank `tp_rank`, without allocating: the constructor's layout.
std::vector<ModelParam> model_param_layout(const ModelConfig& model, const ModelOptions& options, int tp_size,
                                           int tp_rank);

// Targets equal to this take no part in the loss (Hugging Face's and PyTorch's convention).
inline constexpr int32_t kIgnoreIndex = -100;

struct MicroBatch {
  kernels::Tensor tokens;   // [B, T] int32 token ids (read by the first stage)
  kernels::Tensor targets;  // [B, T] int32 next-token ids or kIgnoreIndex (read by the last stage)
};

// One parameter as this rank holds it.
struct ModelParam {
  ParamSpec spec;              // global name, global shape, tp split dimension, decay, init
  std::vector<int64_t> shape;  // this rank's shard of it (the global shape when not split)
  int64_t shard_begin = 0;     // first index along spec.tp_split_dim held here
  int64_t offset = 0;          // element offset in the flat buffers
  kernels::Tensor value, grad;
  // On a last pipeline stage without the embedding, the tied word embedding is a second copy of
  // the token embedding whose gradient the pipeline must sum with the first stage's.
  bool tied_copy = false;
  // A lower tensor-parallel rank holds the same slice: a parameter tp does not split (tp rank > 0),
  // or a key/value head replicated over tp / kv_heads ranks. Counted once in the grad norm and
  // written once in checkpoints (by the lowest rank holding it).
  bool tp_replica = false;
  // An expert's weight held only by the ranks of its ep index (ModelOptions::experts_sharded): its
  // gradient is reduced over the expert-data-parallel group, and the first rank of that group
  // writes it.
  bool expert_shard = false;

  int64_t numel() const;
};

// The shard of a parameter as runs of contiguous elements: fn(local_offset, global_offset, count)
// for each run, in order. Global offsets index the parameter's global row-major shape.
template <typename Fn>
void for_each_shard_run(const ModelParam& p, Fn&& fn);

class Model {
 public:
  // `config` must be resolved (no auto fields). `tp` is this rank's tensor-parallel group
  // (a one-rank comm when tp = 1; it must outlive the model); heads, ffn_hidden and the padded
  // vocabulary must divide by its size, and kv_heads must divide it or be divided by it (key/value
  // heads replicated over tp / kv_heads ranks; the constructor is then collective over `tp`).
  // `cp` is this rank's context-parallel group, of options.context_parallel ranks (null when that
  // is 1); it must outlive the model.
  Model(const ModelConfig& config, const ModelOptions& options, parallel::Comm& tp, parallel::Comm* cp = nullptr,
        parallel::Comm* ep = nullptr);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }

  // ---- parameters ----
  const std::vector<ModelParam>& parameters() const { return params_; }
  const ModelParam& parameter(std::string_view name) const;  // LT_CHECK-fails on an unknown name
  // The parameter of `role` (of block `layer`, global index, for block roles); LT_CHECK-fails when
  // this stage does not hold it. A tied head is ParamRole::token_embedding.
  const ModelParam& parameter(ParamRole role, int layer = -1) const;
  // [numel] flat, in options.dtype; undefined with options.external_params.
  kernels::Tensor params() const { return param_buf_.tensor(); }
  kernels::Tensor grads() const { return grad_buf_.tensor(); }  // undefined with options.external_grads
  int64_t numel() const { return numel_; }                      // elements of the flat layout
  kernels::Device device() const { return act_buf_.tensor().device; }
  // Every parameter from the counter-based RNG (trainer/model/param_init.h): a shard gets the values
  // of its slice of the whole parameter (rounded once to a 16-bit options.dtype). With
  // options.external_params it writes the param shard (set_param_shard must come first).
  void init_parameters(uint64_t seed);
  // With options.external_params: where the parameter values live between uses. `owned` are flat
  // ranges (ascending, disjoint) and `values` holds their elements packed (owned[0]'s, then
  // owned[1]'s, ...), as AdamW packs its moments; elements outside `owned` are another rank's.
  // The storage must outlive the model's use of it. Undefined `values`: they live elsewhere
  // (parallel.offload_params: the optimizer's offload store), and neither init nor checkpoints
  // reach them through the model.
  void set_param_shard(std::vector<parallel::FlatRange> owned, kernels::Tensor values);
  const std::vector<parallel::FlatRange>& param_shard_ranges() const { return shard_ranges_; }
  kernels::Tensor param_shard() const { return shard_values_; }
  // Where flat element `at` has its value in param_shard(); -1 outside the owned ranges.
  int64_t param_shard_offset(int64_t at) const;
  void zero_grads();

  // ---- the whole model (pp = 1) ----
  // Forward, loss (mean over counted target tokens), and backward of loss_scale · loss,
  // accumulated into grads(). Returns the loss, copied to the host: a synchronization point on a
  // device (a training loop that must not wait uses stage_forward/stage_backward and loss(0)).
  float forward_backward(const MicroBatch& mb, float loss_scale);
  // Forward and loss only (evaluation); the same host copy.
  float forward_loss(const MicroBatch& mb);
  // Logits [B, T, padded vocab] for every position (padding columns included). tp 1 only (Error
  // otherwise): with tp > 1 no rank holds the whole vocabulary's logits.
  kernels::Tensor forward_logits(kernels::Tensor tokens);

  // ---- generation (options.kv_cache_tokens > 0, pp = 1) ----
  // Runs tokens [B, T] (B <= micro_batch, T <= seq_len) at positions [position, position + T)
  // through the training forward, appending their keys and values to the cache and attending
  // over cache rows [0, position + T); returns the logits [B, T, padded vocab] of every row (as
  // forward_logits gives them for the whole sequence). tp 1 only, as forward_logits. Positions before `position` must
  // have been fed already (position 0 starts a new sequence); throws an Error past the cache.
  kernels::Tensor forward_cached(kernels::Tensor tokens, int64_t position);

  // ---- one pipeline stage (the calls above are built on these) ----
  // What crosses between stages (each stage's input and output, and their gradients):
  // [micro_batch, seq_len, hidden], or with sequence parallelism this tp rank's rows of the
  // residual stream, [micro_batch · seq_len / tp, hidden] (sent to the same tp rank of the next
  // stage); a stage input of that shape is a micro-batch of micro_batch × seq_len tokens (training
  // and evaluation micro-batches are full).
  kernels::Shape stage_activation_shape() const;
  // `input` (stage_activation_shape(), or [B, T, hidden] for a smaller micro-batch without sequence
  // parallelism) comes from the previous stage (absent on the first). mb.tokens and
  // mb.targets may be host or device tensors (copied in with kernels::copy). On the last stage
  // with mb.targets, loss(slot) then holds the loss.
  // With virtual chunks (options.stage.chunks > 1) `chunk` says which of the stage's runs of blocks
  // to run: chunk 0 starts from the embedding (stage 0) or `input`, the last chunk ends in the head
  // (last stage); each chunk has its own options.activation_slots slots.
  void stage_forward(int slot, const MicroBatch& mb, kernels::Tensor input, int chunk = 0);
  // [1] fp32 on the model's device: the mean loss over counted targets of the slot's last forward
  // (last stage, with targets; 0 without targets). The caller copies it where it needs it.
  kernels::Tensor loss(int slot) const;  // of the last chunk
  // The routing statistics of local block `block` of `chunk` (0 ≤ block < chunk_blocks) after the
  // slot's last forward: fp32 [2·experts + 2] (moe_route_stats) on the model's device, which the
  // caller copies where it needs it; undefined for a dense block.
  kernels::Tensor moe_route_stats(int slot, int chunk, int block) const;
  kernels::Tensor stage_output(int slot, int chunk = 0) const;  // [B, T, hidden] (or SP rows), for the next stage
  // `grad_output` (as stage_output) comes from the next stage (absent on the last, which starts
  // from its loss · loss_scale).
  // The grad-ready hook fires for the groups of this chunk only (the head in the last, the
  // embedding in chunk 0).
  void stage_backward(int slot, kernels::Tensor grad_output, float loss_scale, int chunk = 0);
  kernels::Tensor stage_input_grad() const;  // as the stage input, of the last backward, for the previous stage
  // options.split_backward: stage_backward in two. The input half computes stage_input_grad(), the
  // norms' and the embedding's gradients, and keeps each linear's output gradient in the slot; the
  // weight half accumulates the linears' weight (and bias) gradients from them and fires the
  // grad-ready hook. Weight halves must run in the order of the input halves per chunk (the
  // pipeline's ascending micro-batches); the slot is busy until its weight half.
  void stage_backward_input(int slot, kernels::Tensor grad_output, float loss_scale, int chunk = 0);
  void stage_backward_weight(int slot, int chunk = 0);

  // Bytes of the activation buffers (all slots, the backward's work buffers and a KV cache):
  // model_memory_plan() gives the same number without building a model, which the tests check
  // against this.
  size_t activation_bytes() const { return act_buf_.bytes(); }

  // ---- overlap of gradient communication with backward ----
  // Called during stage_backward as soon as the gradients of a group of parameters are complete
  // for that backward: (ParamPlace::head, -1) after the head, (ParamPlace::block, layer) after
  // each block (global layer index, in decreasing order), (ParamPlace::embedding, -1) after the
  // embedding — the tied word embedding is complete only then. Data parallelism launches its
  // bucket all-reduces from it on the last micro-batch of a step. An empty function clears it.
  using GradReadyHook = std::function<void(ParamPlace place, int layer)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }
  // Called after every block's forward and every block's backward (either half of a split
  // backward too): between layers, where a caller lets its asynchronous transfers advance (a
  // pipeline's sends and receives progress only inside communicator calls). An empty function
  // clears it.
  using LayerDoneHook = std::function<void()>;
  void set_layer_done_hook(LayerDoneHook hook) { layer_done_ = std::move(hook); }
  // With options.external_grads: called during stage_backward before backward first writes a
  // group's gradients (the same (place, layer) the grad-ready hook names; a tied embedding's group
  // before the head's); returns fp32 storage for the group's flat range (its first parameter's
  // offset to its last one's end), which backward accumulates into (+=) until the group is ready.
  using GradStorageHook = std::function<kernels::Tensor(ParamPlace place, int layer)>;
  void set_grad_storage_hook(GradStorageHook hook) { grad_storage_ = std::move(hook); }
  // With options.external_params: `get` is called before forward, backward or recomputation first
  // reads a group's values (`backward`: in backward, which runs the groups in the grad-ready
  // hook's order; forward runs them in the reverse), and returns fp32 storage holding the values
  // of the group's flat range, valid until `release` for the same group. A tied word embedding's
  // group is held from the embedding's forward through the head's, and from the head's backward
  // through the embedding's.
  using ParamStorageHook = std::function<kernels::Tensor(ParamPlace place, int layer, bool backward)>;
  using ParamReleaseHook = std::function<void(ParamPlace place, int layer)>;
  void set_param_storage_hook(ParamStorageHook get, ParamReleaseHook release) {
    param_storage_ = std::move(get);
    param_release_ = std::move(release);
  }

 private:
  friend ModelMemory model_memory_plan(const ModelConfig&, const ModelOptions&, int, int);
  friend std::vector<ModelParam> model_param_layout(const ModelConfig&, const ModelOptions&, int, int);
  struct Dims;
  class Arena;
  struct BlockWeights;
  struct EndWeights;
  struct LayerActs;
  struct LayerGrads;
  struct Slot;
  struct Work;
  struct Cache;

  // Construction, shared with model_memory_plan: checks and defaults, the parameter layout, and
  // the activation arena's layout (the one function that decides every activation buffer).
  static ModelOptions resolve(const ModelConfig& config, ModelOptions options, int tp_size);
  // ep_shards > 1 (sharded experts): only expert ep_rank · E/ep_shards ... of each MoE block.
  static std::vector<ModelParam> param_layout(const ModelConfig& config, const StageLayout& stage, int tp_size,
                                              int tp_rank, int ep_shards, int ep_rank, int64_t* numel);
  static ModelMemory lay_out(const ModelConfig& config, const ModelOptions& options, const Dims& dims, Arena& arena,
                             std::vector<Slot>& slots, Work& work);

  void build_params();
  void build_activations();
  void bind_views();
  void bind_block(int local_layer, bool grad);
  void bind_ends(bool grad);
  void bind_group_grads(ParamPlace place, int layer);
  bool tied_in_stage() const;
  void hold_params(ParamPlace place, int layer, bool backward);
  void release_params(ParamPlace place, int layer);
  void init_param_elements(const ModelParam& p, uint64_t seed, int64_t begin, int64_t end, float* out) const;
  void forward_blocks(Slot& s, int64_t position, bool cached, int chunk);
  Slot& slot_at(int slot, int chunk);
  const Slot& slot_at(int slot, int chunk) const;
  void embed_forward(Slot& s, int64_t position);
  void embedding_forward_held(Slot& s, int64_t position);
  void head_forward_held(Slot& s);
  void embed_backward(Slot& s);
  void block_forward(int layer, LayerActs& a, kernels::Tensor x, kernels::Tensor out, int b, int t, bool recompute,
                     int64_t position, const Cache* cache);
  // The input-gradient half of a block's backward when `keep` is given (the linears' output
  // gradients go there), else the whole backward; block_backward_weight is the other half.
  void block_backward(int layer, LayerActs& a, kernels::Tensor x, int b, int t, const LayerGrads* keep = nullptr);
  void block_backward_weight(int layer, const LayerActs& a, const LayerGrads& kept, int b, int t);
  // Selective recomputation: a layer's kept products with the shared element-wise buffers, and
  // the element-wise results (norms, MLP activation) recomputed from the block input and the kept
  // products, before the block's backward.
  LayerActs selective_acts(const LayerActs& kept) const;
  void block_recompute_elementwise(int layer, LayerActs& a, kernels::Tensor x, int b, int t);
  void head_forward(Slot& s);
  void head_backward(Slot& s, float loss_scale, bool split = false);  // split: without the head's weight
  void head_backward_weight(Slot& s);
  // The crossings around the block's and the head's linears, with or without sequence parallelism
  // (model_layers.cpp): a norm of this rank's stream rows `x` into `in`, the input of a
  // column-parallel linear; a row-parallel linear's output `out` (this rank's stream rows) from `in`;
  // and their backwards.
  void norm_into_tp_region(kernels::Tensor in, kernels::Tensor x, kernels::Tensor w, kernels::Tensor b,
                           kernels::Tensor mean, kernels::Tensor rstd);
  void norm_into_tp_region_backward(kernels::Tensor dx, kernels::Tensor dw, kernels::Tensor db, kernels::Tensor din,
                                    kernels::Tensor x, kernels::Tensor w, kernels::Tensor mean, kernels::Tensor rstd,
                                    kernels::Tensor dx_add);
  // out = the sum over tp of the partial results `produce(partial)` writes for all n rows; with
  // sequence parallelism partial is work.sp_full and out this rank's rows of the sum.
  template <class Produce>
  void reduce_over_tp(kernels::Tensor out, int64_t n, Produce&& produce);
  void row_parallel_out(kernels::Tensor out, kernels::Tensor in, kernels::Tensor w);
  void row_parallel_out_backward(kernels::Tensor din, kernels::Tensor dw, kernels::Tensor db, kernels::Tensor dout,
                                 kernels::Tensor dfull, kernels::Tensor in, kernels::Tensor w, kernels::Tensor kept,
                                 kernels::Tensor gelu_pre = {}, kernels::Tensor gelu_db = {});
  // Learned positions and RoPE at this rank's positions: `position` onwards, or with context
  // parallelism each half of every sample at its chunk's (x [B, T, ·]).
  void positions_forward(kernels::Tensor x, int64_t position);
  void positions_backward(kernels::Tensor dx);
  void rope_apply(kernels::Tensor qkv4, const kernels::Tensor& table, int64_t position, bool backward);
  // The llama family's MLP gate (model.activation: SwiGLU or GeGLU) and its backward.
  void gate_forward(kernels::Tensor act, kernels::Tensor fc);
  void gate_backward(kernels::Tensor dfc, kernels::Tensor dact, kernels::Tensor fc);
  // The routed experts' (model.moe.swiglu_limit: gpt-oss's clamped SwiGLU).
  void expert_gate_forward(kernels::Tensor act, kernels::Tensor fc);
  void expert_gate_backward(kernels::Tensor dfc, kernels::Tensor dact, kernels::Tensor fc);
  // model.post_norms: a row-parallel output linear followed by the RMSNorm of its output, and the
  // norm's backward (block_forward's and block_backward's comments).
  void post_normed_out(kernels::Tensor out, kernels::Tensor in, kernels::Tensor w, kernels::Tensor norm_w,
                       kernels::Tensor raw, kernels::Tensor rstd);
  kernels::Tensor post_norm_backward(kernels::Tensor dout, kernels::Tensor norm_w, kernels::Tensor dnorm_w,
                                     kernels::Tensor raw, kernels::Tensor rstd);
  float embedding_scale() const;
  // Local block `local_layer`'s RoPE table (the windowed layers' own with model.rope_local_theta)
  // and its attention's mask and scale.
  const kernels::Tensor& rope_table_of(int local_layer) const;
  kernels::AttentionSpec attention_spec(int local_layer) const;
  // qk_norm: the per-head RMSNorm of the q and k heads of qkv4 (kept input: a.qk_in), and its
  // backward in place on dqkv4 (the norm weights' gradients reduced over tp).
  // A MoE block's MLP (model_layers.cpp): out = the experts' weighted outputs for the normed rows
  // ln2 (plus the gated shared expert's, model.moe.shared_ffn_hidden); its backward leaves d(ln2) in dln.
  void moe_forward(const BlockWeights& w, LayerActs& a, kernels::Tensor ln2, kernels::Tensor out);
  void moe_experts_forward(const BlockWeights& w, LayerActs& a, kernels::Tensor in, kernels::Tensor y);
  kernels::Tensor local_experts(const kernels::Tensor& all) const;
  void moe_experts_backward(const BlockWeights& w, const BlockWeights& g, const LayerActs& a, kernels::Tensor dy,
                            kernels::Tensor din);
  void moe_backward(const BlockWeights& w, const BlockWeights& g, const LayerActs& a, kernels::Tensor ln2,
                    kernels::Tensor dout, kernels::Tensor dln);
  kernels::Tensor down_bias(const BlockWeights& w) const;
  bool moe_block(int local_layer) const { return config_.moe.layer(options_.stage.layer(local_layer)); }
  void qk_norm_forward(const BlockWeights& w, LayerActs& a, kernels::Tensor qkv4);
  void qk_norm_backward(const BlockWeights& w, const BlockWeights& g, const LayerActs& a, kernels::Tensor dqkv4);
  size_t replicated_kv_grads(const BlockWeights& g, std::array<kernels::Tensor, 2>& out) const;
  void require_whole_model(const char* what) const;
  void require_tp1(const char* what) const;
  // Sequence parallelism: the replicated parameters' gradients (norms, row-parallel biases) of a
  // block (layer >= 0) or of the head (layer < 0), reduced over tp around their backward.
  void sp_grads(int layer, bool begin);
  float host_loss(int slot) const;
  // A stage backward's start from the next stage's gradient (this rank's rows with sequence
  // parallelism), and what it sends back: the gradient of its input, kept in work_->input_grad.
  void take_grad_output(const Slot& s, kernels::Tensor grad_output);
  void keep_input_grad(const Slot& s);

  ModelConfig config_;
  ModelOptions options_;
  parallel::Comm& tp_;
  parallel::Comm* cp_ = nullptr;              // the context-parallel group (null at cp 1)
  parallel::Comm* ep_ = nullptr;              // the expert-parallel group (null at ep 1)
  std::unique_ptr<parallel::Comm> kv_group_;  // the tp ranks holding this rank's key/value head (replicated)
  bool llama_ = false;
  bool sp_ = false;       // options.sequence_parallel with tp > 1
  float loss_scale_ = 1;  // the backward in progress's (the MoE auxiliary losses' gradients take it)
  int64_t seq_ = 0, heads_ = 0, kv_heads_ = 0, head_dim_ = 0, ffn_ = 0, vocab_local_ = 0, vocab_begin_ = 0;
  int64_t shared_ffn_ = 0;  // a MoE block's shared expert's width on this rank (0: none)

  std::vector<ModelParam> params_;
  int64_t numel_ = 0;
  kernels::Buffer param_buf_, grad_buf_, act_buf_;
  std::vector<parallel::FlatRange> shard_ranges_;
  kernels::Tensor shard_values_;
  std::vector<BlockWeights> weights_, weight_grads_;  // per local layer
  std::unique_ptr<EndWeights> ends_, end_grads_;      // embedding and head
  std::unique_ptr<Work> work_;
  std::vector<Slot> slots_;
  GradReadyHook grad_ready_;
  LayerDoneHook layer_done_;
  GradStorageHook grad_storage_;
  ParamStorageHook param_storage_;
  ParamReleaseHook param_release_;
};

template <typename Fn>
void for_each_shard_run(const ModelParam& p, Fn&& fn) {
  const int s = p.spec.tp_split_dim;
  if (s < 0 || p.shape[s] == p.spec.shape[s]) {
    fn(int64_t(0), int64_t(0), p.numel());
    return;
  }
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < s; ++d) outer *= p.spec.shape[d];
  for (size_t d = size_t(s) + 1; d < p.spec.shape.size(); ++d) inner *= p.spec.shape[d];
  const int64_t run = p.shape[s] * inner;
  for (int64_t o = 0; o < outer; ++o) fn(o * run, (o * p.spec.shape[s] + p.shard_begin) * inner, run);
}

}  // namespace llmtrain::trainer
