#include "trainer/loop/train_step.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/log.h"
#include "kernels/ops.h"
#include "parallel/progress.h"
#include "trainer/checkpoint/checkpoint_format.h"
#include "trainer/loop/micro_batch_upload.h"
#include "trainer/optim/lr_schedule.h"
#include "trainer/optim/value_reader.h"

namespace llmtrain::trainer {

using kernels::DType;
using kernels::Tensor;
using parallel::ReduceOp;

// This rank's part of the model as the pipeline executor sees it: forward and backward of one
// micro-batch and chunk at a time, each micro-batch's activations in the model's slot (micro-batch
// mod slots) of the chunk. It reads the micro-batch's samples as its forward starts (the first
// stage), keeps its loss (the last stage), and tells the gradient sync which parameter groups
// backward completed (a chunk's groups are final after its backward of the last micro-batch).
class TrainStep::ModelStage final : public parallel::PipelineStage {
 public:
  // `tied`: this stage holds one of two copies of a tied word embedding (pp > 1); its group's
  // gradient is final only after TrainStep sums the copies, after the schedule, so backward does not
  // mark it (GradSync::finish marks it).
  // `pipe`: the links between stages, whose transfers advance between layers (with more than one stage).
  // `moe_stats`: where each micro-batch's MoE routing statistics go, [micro-batch][block of
  // `moe_layers`] of `moe_width` floats each.
  // `timeout_s` bounds a wait for a micro-batch's upload slot (parallel.timeout).
  ModelStage(Model& model, MicroBatchReader& batches, parallel::GradSync& sync, parallel::PipeLinks& pipe,
             int micro_batches, Tensor losses, bool tied, Tensor moe_stats, std::vector<int> moe_layers,
             int64_t moe_width, double timeout_s)
      : model_(model),
        batches_(batches),
        upload_(model.device(), std::min(2 * micro_batches, kMaxUploadSlots), timeout_s),
        micro_batches_(micro_batches),
        loss_scale_(1.0f / float(micro_batches)),
        losses_(losses),
        moe_stats_(moe_stats),
        moe_layers_(std::move(moe_layers)),
        moe_width_(moe_width) {
    // The place of each local block (chunk-major) among the stage's MoE blocks, -1 for a dense one.
    const StageLayout& layout = model.options().stage;
    for (int l = 0; l < layout.blocks(); ++l) {
      const auto at = std::find(moe_layers_.begin(), moe_layers_.end(), layout.layer(l));
      moe_index_.push_back(at == moe_layers_.end() ? -1 : int(at - moe_layers_.begin()));
    }
    const StageLayout st = model.options().stage;
    model_.set_grad_ready_hook([this, st, &sync, tied](ParamPlace place, int layer) {
      if (tied && place == ParamPlace::embedding) return;
      sync.group_ready(grad_group_of(st, place, layer), last_backward_);
    });
    if (model.options().external_grads)
      model_.set_grad_storage_hook(
          [st, &sync](ParamPlace place, int layer) { return sync.group_grads(grad_group_of(st, place, layer)); });
    if (model.options().external_params)
      model_.set_param_storage_hook(
          [st, &sync](ParamPlace place, int layer, bool backward) {
            return sync.group_params(grad_group_of(st, place, layer), backward);
          },
          [st, &sync](ParamPlace place, int layer) { sync.group_params_done(grad_group_of(st, place, layer)); });
    // Asynchronous transfers move only while their ranks call into MPI: between layers, not just
    // between micro-batches — a pipeline send posted after a forward or backward (without a
    // single-copy transport it moves in fragments, each needing its sender), and the gradient
    // sync's launched reductions and prefetched ZeRO-3 gathers.
    const bool pipelined = pipe.stages > 1;
    model_.set_layer_done_hook([&pipe, &sync, pipelined] {
      if (pipelined) pipe.progress();
      sync.progress();
    });
  }
  ~ModelStage() override {
    model_.set_layer_done_hook({});
    model_.set_grad_ready_hook({});
    model_.set_grad_storage_hook({});
    model_.set_param_storage_hook({}, {});
  }

  // fp16: backward starts from the loss times `scale` (each micro-batch's share of it).
  void set_loss_scale(double scale) { loss_scale_ = float(scale / double(micro_batches_)); }

  void begin_step(int64_t consumed_samples, StepObserver* observer) {
    consumed_ = consumed_samples;
    observer_ = observer;
  }

  kernels::Shape activation_shape() const override { return model_.stage_activation_shape(); }
  // The residual stream and its gradient in the storage dtype (16-bit: half the bytes of fp32): what
  // the next stage would have read at pp 1, so crossing a stage rounds nothing.
  kernels::DType activation_dtype() const override { return model_.options().dtype; }
  kernels::Device activation_device() const override { return model_.device(); }

  void forward(int micro_batch, int chunk, Tensor input) override {
    const StageLayout& st = model_.options().stage;
    const bool head = st.has_head && chunk == st.chunks - 1;
    if (observer_) observer_->op_begin();
    // Read at the first chunk (tokens) and the head's (targets): at most two reads per micro-batch,
    // each in an upload slot of its own.
    const bool reads = chunk == 0 || head;
    const MicroBatch mb = reads ? upload_.stage(batches_.read(consumed_, micro_batch)) : MicroBatch{};
    if (observer_) observer_->op_data_read();
    model_.stage_forward(slot(micro_batch), mb, input, chunk);
    if (reads) upload_.used();
    parallel::beat_progress();  // a long step is not a hang (parallel/progress.h)
    if (head) kernels::copy(losses_.flat(micro_batch, 1), model_.loss(slot(micro_batch)));
    // Each MoE block's routing statistics, at [micro-batch][its place in the stage's MoE blocks].
    const int blocks = model_.options().stage.chunk_blocks();
    for (int b = 0; b < blocks; ++b) {
      const int at = moe_index_[size_t(chunk * blocks + b)];
      if (at < 0) continue;
      const int64_t where = (int64_t(micro_batch) * int64_t(moe_layers_.size()) + at) * moe_width_;
      kernels::copy(moe_stats_.flat(where, moe_width_), model_.moe_route_stats(slot(micro_batch), chunk, b));
    }
    if (observer_) observer_->op_end(StepPhase::forward);
  }
  void backward(int micro_batch, int chunk, Tensor grad_output) override {
    if (observer_) observer_->op_begin();
    // Every schedule runs each chunk's backwards in micro-batch order.
    last_backward_ = micro_batch == micro_batches_ - 1;
    model_.stage_backward(slot(micro_batch), grad_output, loss_scale_, chunk);
    if (observer_) observer_->op_end(StepPhase::backward);
  }
  // Zero-bubble schedules: the weight half comes after the input half, in micro-batch order.
  void backward_input(int micro_batch, int chunk, Tensor grad_output) override {
    if (observer_) observer_->op_begin();
    model_.stage_backward_input(slot(micro_batch), grad_output, loss_scale_, chunk);
    if (observer_) observer_->op_end(StepPhase::backward);
  }
  void backward_weight(int micro_batch, int chunk) override {
    if (observer_) observer_->op_begin();
    last_backward_ = micro_batch == micro_batches_ - 1;
    model_.stage_backward_weight(slot(micro_batch), chunk);
    if (observer_) observer_->op_end(StepPhase::backward);
  }
  Tensor output(int micro_batch, int chunk) override { return model_.stage_output(slot(micro_batch), chunk); }
  Tensor input_grad(int, int) override { return model_.stage_input_grad(); }

 private:
  int slot(int micro_batch) const { return micro_batch % model_.options().activation_slots; }

  Model& model_;
  MicroBatchReader& batches_;
  MicroBatchUpload upload_;  // pinned slots the micro-batches reach a cuda model from
  int micro_batches_;
  float loss_scale_;  // each micro-batch's loss counts 1 / micro-batches of the step's
  Tensor losses_;
  Tensor moe_stats_;
  std::vector<int> moe_layers_;
  std::vector<int> moe_index_;  // per local block: its index in moe_layers_, or -1
  int64_t moe_width_ = 0;
  int64_t consumed_ = 0;
  StepObserver* observer_ = nullptr;
  bool last_backward_ = false;
};

std::unique_ptr<parallel::GradSync> make_step_grad_sync(const Placement& placement, const Model& model,
                                                        parallel::MeshComms& comms,
                                                        parallel::OwnedValues* owned_values) {
  const Layout& layout = placement.layout;
  const std::vector<std::vector<int>>& groups = placement.groups;
  const std::vector<ModelParam>& params = model.parameters();
  LT_CHECK(params.size() == placement.params.size(), "a model of {} parameters for a placement of {}", params.size(),
           placement.params.size());
  // A sync over the parameters `take` accepts: their ranges, and each group's of them.
  auto over = [&](parallel::Comm& comm, int shard_group, bool experts) {
    parallel::GradSyncLayout l;
    l.params = model.params(), l.grads = model.grads(), l.device = model.device(), l.dtype = model.options().dtype;
    if (layout.grad_reduce == GradReduceDtype::bf16) l.accumulate = parallel::Accumulate::in_dtype;
    l.held_group = placement.held_group;
    if (!experts) l.owned_values = owned_values;
    std::vector<int> index(params.size(), -1);
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].expert_shard == experts) {
        index[i] = int(l.param_ranges.size());
        l.param_ranges.push_back({params[i].offset, params[i].numel()});
      }
    for (const std::vector<int>& g : groups) {
      l.groups.emplace_back();
      for (int i : g)
        if (index[size_t(i)] >= 0) l.groups.back().push_back(index[size_t(i)]);
    }
    return parallel::make_grad_sync(layout.zero, comm, std::move(l), layout.bucket_mb, shard_group);
  };
  std::vector<parallel::FlatRange> expert_ranges;
  for (const ModelParam& p : params)
    if (p.expert_shard) {
      if (!expert_ranges.empty() && expert_ranges.back().end == p.offset)
        expert_ranges.back().end += p.numel();
      else
        expert_ranges.push_back({p.offset, p.offset + p.numel()});
    }
  if (expert_ranges.empty()) return over(comms.replicas(), layout.shard_group, false);
  // Sharded experts: their gradients averaged (and at ZeRO 1 their optimizer state sharded) over the
  // expert-data-parallel group, every rank of which holds the same experts.
  std::sort(expert_ranges.begin(), expert_ranges.end(),
            [](const parallel::FlatRange& a, const parallel::FlatRange& b) { return a.begin < b.begin; });
  LT_CHECK(comms.edp != nullptr, "sharded experts without an edp group");
  return parallel::make_expert_grad_sync(over(comms.replicas(), layout.shard_group, false),
                                         over(*comms.edp, layout.zero >= 1 ? layout.expert_replicas() : 1, true),
                                         std::move(expert_ranges), model.grads(), layout.ep);
}

TrainStep::TrainStep(const Recipe& recipe, const Placement& placement, Model& model, parallel::MeshComms& comms,
                     MicroBatchReader& batches)
    : recipe_(recipe), placement_(placement), model_(model), comms_(comms), lr_(recipe.optimizer) {
  std::vector<parallel::PipeOp> schedule = placement_.schedule;
  for (const parallel::PipeOp& op : schedule)
    if (op.kind == parallel::PipeOpKind::forward) micro_batches_ = std::max(micro_batches_, op.micro_batch + 1);
  LT_CHECK(micro_batches_ >= 1, "a schedule without forwards");
  LT_CHECK(parallel::max_in_flight_per_chunk(schedule) <= model.options().activation_slots,
           "the schedule keeps {} micro-batches in flight per chunk; the model has {} activation slots",
           parallel::max_in_flight_per_chunk(schedule), model.options().activation_slots);
  LT_CHECK(model.options().external_params == placement_.model.external_params &&
               model.options().external_grads == placement_.model.external_grads &&
               model.options().dtype == placement_.model.dtype,
           "the model was not built with the placement's options");
  // ZeRO 3 with parallel.offload_params: the owned values live in the optimizer's offload store,
  // whence the sync reads each unit's chunk when it gathers it.
  // A unit's chunk (Placement::values: one chunk at a time here) is read ahead of its gather.
  const bool params_offloaded = placement_.values_offloaded;
  if (params_offloaded)
    owned_values_ = std::make_unique<ValueReader>(
        [this](int64_t begin, kernels::Tensor host) { optimizer_->read_state(AdamW::State::master, begin, host); },
        placement_.values.numel, recipe.parallel.timeout_s);
  sync_ = make_step_grad_sync(placement_, model, comms, owned_values_.get());
  // What the sync gives this rank to own is what the placement counts (the memory account's and
  // the planner's numbers are the placement's).
  int64_t owned = 0;
  for (const parallel::FlatRange& r : sync_->owned()) owned += r.numel();
  LT_CHECK(owned == placement_.owned, "the gradient sync owns {} elements, the placement {}", owned, placement_.owned);
  // ZeRO 3: the values live in the sync's owned shard; initialisation and checkpoints reach them
  // through the model. Offloaded, initialisation writes a host shard of its own, which
  // master_from_params moves into the store and drops.
  if (params_offloaded) {
    initial_shard_ =
        kernels::Buffer(DType::fp32, {std::max<int64_t>(owned, 1)}, kernels::Device::cpu, kernels::MemoryKind::other);
    model.set_param_shard(sync_->owned(), initial_shard_.tensor().flat(0, owned));
  } else if (model.options().external_params) {
    model.set_param_shard(sync_->owned(), sync_->owned_params());
  }
  // A master for 16-bit parameters, except at ZeRO 3, whose owned values are fp32 already.
  const OffloadConfig offload{.kind = placement_.offload,
                              .dir = recipe.parallel.offload_path,
                              .rank = comms.world->rank(),
                              .device = model.device(),
                              .timeout_s = recipe.parallel.timeout_s,
                              .params = params_offloaded,
                              .cpu_update = placement_.update == UpdateSite::cpu};
  optimizer_ =
      std::make_unique<AdamW>(recipe.optimizer, decay_ranges(model.parameters()), sync_->owned(),
                              sync_->params_compact() ? DType::fp32 : model.options().dtype, model.device(), offload);
  optimizer_->set_rounding(recipe.train.seed, rounding_ranges(model.parameters()));  // optimizer.master false
  if (const OptimizerConfig& oc = recipe.optimizer; oc.name == OptimizerName::muon) {
    std::vector<MuonMatrix> matrices = muon_matrices(model.parameters());
    std::vector<parallel::GradSync::UnitShards> shards;  // under ZeRO: where each matrix's pieces are
    for (const MuonMatrix& mat : matrices) shards.push_back(sync_->shards_at(mat.begin));
    optimizer_->set_muon(muon_settings(oc.muon), std::move(matrices), oc.muon.adamw_lr.value_or(oc.lr) / oc.lr,
                         oc.muon.adamw_weight_decay.value_or(oc.weight_decay),
                         MuonGroup{comms.tp.get(), comms.control.tp.get()}, std::move(shards));
  }
  // The gradient norm's parts: only where this rank's elements count (each element once per model
  // replica: where data-parallel ranks hold shards, or with sharded experts other experts, only the
  // first copy of each owned range counts, and the squares are summed over the world).
  norm_over_world_ = sync_->shards_over_dp() || layout_.experts_sharded();
  for (const parallel::FlatRange& r : sync_->owned())
    if (!norm_over_world_ || sync_->first_copy_at(r.begin)) norm_ranges_.push_back(r);
  LT_CHECK(!sync_->grads_compact() || norm_ranges_.empty() || norm_ranges_ == sync_->owned(),
           "a compact gradient shard counted in part");
  norm_plan_.emplace(model.parameters(), comms.tp->rank(), norm_ranges_, sync_->grads_compact(), model.device());
  norm_pieces_ = norm_plan_->pieces();
  // MoE blocks: each micro-batch's routing statistics of this stage's blocks, after the norm parts.
  const ModelConfig& mc = model.config();
  const StageLayout& st = model.options().stage;
  for (int l = 0; l < st.blocks(); ++l)
    if (mc.moe.layer(st.layer(l))) moe_layers_.push_back(st.layer(l));
  for (int l = 0; l < mc.layers; ++l) moe_total_ += mc.moe.layer(l) ? 1 : 0;
  moe_width_ = 2 * int64_t(mc.moe.experts) + 2;
  const int64_t moe_floats = int64_t(micro_batches_) * int64_t(moe_layers_.size()) * moe_width_;
  scalars_ = kernels::Buffer(DType::fp32, {micro_batches_ + norm_pieces_ + moe_floats}, model.device());
  scalars_host_.assign(size_t(micro_batches_ + norm_pieces_ + moe_floats), 0.0f);
  // Tied word embedding over pp > 1: the first stage's embedding and the last stage's copy.
  const int pp = comms.pp->size(), stage = comms.pp->rank();
  if (pp > 1 && model.config().tie_embeddings && (stage == 0 || stage == pp - 1)) {
    for (size_t i = 0; i < model.parameters().size(); ++i)
      if (model.parameters()[i].spec.role == ParamRole::token_embedding) tied_param_ = int(i);
    LT_CHECK(tied_param_ >= 0, "stage {} of {} holds no token embedding", stage, pp);
    tied_peer_ = stage == 0 ? pp - 1 : 0;
    // In the gradients' dtype: a 16-bit copy's gradient crosses exactly, and the add widens both.
    tied_scratch_ = kernels::Buffer(model.options().dtype, {model.parameters()[size_t(tied_param_)].numel()},
                                    model.device(), kernels::MemoryKind::communication);
  }
  // The CPU update (offload host on a cuda rank): each reduced range's units start down to host
  // memory as the sync reports them, during backward.
  if (optimizer_->updates_on_cpu())
    sync_->set_reduced_hook([this](parallel::FlatRange r) {
      optimizer_->gradients_final(r.begin, r.end, step_params(), sync_->owned_grads(), sync_->grads_compact(),
                                  sync_->params_compact());
    });
  stage_ = std::make_unique<ModelStage>(model, batches, *sync_, comms.pipe, micro_batches_,
                                        scalars_.tensor().flat(0, micro_batches_), tied_peer_ >= 0,
                                        scalars_.tensor().flat(micro_batches_ + norm_pieces_, moe_floats), moe_layers_,
                                        moe_width_, recipe.parallel.timeout_s);
  if (layout_.precision == Precision::fp16) scaler_ = std::make_unique<LossScaler>(recipe.train.loss_scale);
  executor_ = std::make_unique<parallel::PipelineExecutor>(std::move(schedule), *stage_, comms.pipe);
}

TrainStep::~TrainStep() {
  // A read ahead in flight reads the optimizer's store, which goes before the reader does. Its
  // error, if any, no longer matters: the step is going.
  try {
    if (owned_values_) owned_values_->drop();
  } catch (const std::exception&) {
  }
}

std::vector<MoeLayerStats> TrainStep::moe_stats(std::span<const float> host) {
  if (moe_total_ == 0) return {};
  const ModelConfig& mc = model_.config();
  const MoeConfig& moe = mc.moe;
  const int64_t e = moe.experts, width = e + 3;  // per block: picks per expert, dropped, aux, z
  // A micro-batch's rows: with cp > 1 each rank's statistics are the whole sequence's (summed over
  // the cp group in the model), reported once per cp group below.
  const double rows = double(recipe_.train.micro_batch) * double(mc.seq_len);
  const double picks = rows * double(moe.top_k);
  std::vector<int> ordinal(size_t(mc.layers), -1), layer_of;
  for (int l = 0; l < mc.layers; ++l)
    if (moe.layer(l)) {
      ordinal[size_t(l)] = int(layer_of.size());
      layer_of.push_back(l);
    }
  // This stage's blocks at their places in the model's, then summed over the stages (each block is
  // on one) and the data-parallel ranks.
  std::vector<float> all(size_t(int64_t(moe_total_) * width), 0.0f);
  for (size_t i = 0; i < moe_layers_.size(); ++i) {
    float* out = all.data() + int64_t(ordinal[size_t(moe_layers_[i])]) * width;
    for (int mb = 0; mb < micro_batches_; ++mb) {
      const float* s = host.data() + (int64_t(mb) * int64_t(moe_layers_.size()) + int64_t(i)) * moe_width_;
      double balance = 0;  // Σ_e f_e · P_e (op_table.def, moe_router_backward)
      for (int64_t x = 0; x < e; ++x) {
        out[x] += s[x];
        balance += double(s[x]) / picks * (double(s[e + x]) / rows);
      }
      out[e] += s[2 * e + 1];
      out[e + 1] += float(moe.aux_loss * double(e) * balance / micro_batches_);
      out[e + 2] += float(moe.z_loss * double(s[2 * e]) / rows / micro_batches_);
    }
  }
  const Tensor t = kernels::host_tensor(all.data(), {int64_t(all.size())});
  if (comms_.pp->size() > 1) comms_.control.pp->all_reduce(t, ReduceOp::sum);
  comms_.control.replicas().all_reduce(t, ReduceOp::sum);
  std::vector<MoeLayerStats> stats(static_cast<size_t>(moe_total_));
  const double replicas = double(layout_.replicas()), cp = double(layout_.cp);
  for (int b = 0; b < moe_total_; ++b) {
    const float* v = all.data() + int64_t(b) * width;
    MoeLayerStats& l = stats[size_t(b)];
    l.layer = layer_of[size_t(b)];
    for (int64_t x = 0; x < e; ++x) l.tokens.push_back(double(v[x]) / cp);
    l.dropped = v[e] / cp;
    l.aux_loss = v[e + 1] / replicas;
    l.z_loss = v[e + 2] / replicas;
  }
  return stats;
}

StepOutcome TrainStep::run(int64_t step, int64_t consumed_samples) {
  if (observer_) observer_->step_begin();
  StepOutcome out = take_step(step, consumed_samples);
  if (observer_) observer_->step_end(out.times);
  return out;
}

StepOutcome TrainStep::take_step(int64_t step, int64_t consumed_samples) {
  optimizer_->gradients_begin();  // a step skipped before its update leaves early copies behind
  // The CPU update (offload host) while backward goes on, where the update is known before the
  // norm: no clipping, no loss scaling, and a non-finite step stops the run instead of skipping.
  if (updates_during_backward())
    optimizer_->update_as_gradients_arrive(step_params(), sync_->owned_grads(), lr_.at(step), sync_->grads_compact(),
                                           sync_->params_compact());
  StepOutcome out;
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  if (scaler_) {
    out.loss_scale = scale;
    stage_->set_loss_scale(scale);
  }
  model_.zero_grads();
  phase_end(StepPhase::optimizer);
  stage_->begin_step(consumed_samples, observer_);
  if (observer_) observer_->schedule_begin();
  executor_->run();  // forward, backward and data reads report themselves; pipeline waits are in none
  if (observer_) observer_->schedule_end();
  sum_tied_grads();
  copies_now_.in_backward = optimizer_->units_streamed();
  sync_->finish();
  copies_now_.before_update = optimizer_->units_streamed();
  phase_end(StepPhase::grad_sync);
  if (inject_overflow_ && inject_overflow_(step)) kernels::scale(sync_->owned_grads().flat(0, 1), INFINITY);

  // Σg² of what this rank owns, in parts on the device (trainer/optim/optimizer.h), then the step's
  // one read of the device: the micro-batch losses and those parts together.
  norm_plan_->sum_squares_into(scalars_.tensor().flat(micro_batches_, norm_pieces_),
                               sync_->grads_compact() ? sync_->owned_grads() : model_.grads());
  kernels::copy(kernels::host_tensor(scalars_host_.data(), {int64_t(scalars_host_.size())}), scalars_.tensor());
  // The loss: each micro-batch's mean, averaged over micro-batches (in double) and data-parallel ranks.
  const std::span<const float> host(scalars_host_);
  out.loss = float(sum_pieces(host.first(size_t(micro_batches_))) / micro_batches_);
  phase_end(StepPhase::optimizer);
  // Only the last pipeline stage computes the loss.
  if (comms_.pp->size() > 1)
    comms_.control.pp->broadcast(kernels::host_tensor(&out.loss, {1}), comms_.control.pp->size() - 1);
  // The mean over dp × cp: every cp rank's loss is the mean over its equal share of the tokens.
  comms_.control.replicas().all_reduce(kernels::host_tensor(&out.loss, {1}), ReduceOp::avg);
  phase_end(StepPhase::grad_sync);

  out.moe = moe_stats(host.subspan(size_t(micro_batches_ + norm_pieces_)));
  phase_end(StepPhase::grad_sync);

  // Σg² over every group that splits parameters; fp32 is enough for a norm that only scales the
  // update.
  float sq = float(sum_pieces(host.subspan(size_t(micro_batches_), size_t(norm_pieces_))));
  parallel::Comm& norm_group = norm_over_world_ ? *comms_.control.world : *comms_.control.mp;
  norm_group.all_reduce(kernels::host_tensor(&sq, {1}), ReduceOp::sum);
  phase_end(StepPhase::grad_sync);
  out.grad_norm = std::sqrt(double(sq));
  out.lr = lr_.at(step);

  if (scaler_) {
    // Every rank agrees on the overflow (the norm's group need not span the data-parallel ranks).
    float overflow = std::isfinite(sq) ? 0.0f : 1.0f;
    comms_.control.world->all_reduce(kernels::host_tensor(&overflow, {1}), ReduceOp::max);
    phase_end(StepPhase::grad_sync);
    out.grad_norm /= scale;
    if (overflow > 0 && std::isfinite(out.loss) && scale > recipe_.train.loss_scale.min) {
      scaler_->update(true);
      ++skipped_total_;
      log_warn("step {}: gradients overflowed at loss scale {}, update skipped; the scale is now {}", step + 1, scale,
               scaler_->scale());
      out.skipped = out.overflow = true;
      out.skipped_total = skipped_total_;
      out.grad_norm = INFINITY;
      return out;
    }
    if (overflow > 0) out.grad_norm = INFINITY;  // the scale is at its minimum: a non-finite step
  }

  if (!std::isfinite(out.loss) || !std::isfinite(out.grad_norm)) {
    if (recipe_.train.on_nonfinite == NonFiniteAction::stop)
      throw Error(fmt::format("non-finite {} at step {} (loss {}, grad norm {}); the last checkpoint is intact",
                              std::isfinite(out.loss) ? "gradient" : "loss", step + 1, out.loss, out.grad_norm),
                  "lower optimizer.lr, lengthen optimizer.warmup, set train.grad_clip, or set train.on_nonfinite: "
                  "skip to skip such steps");
    ++skipped_total_;
    if (++skipped_in_a_row_ > recipe_.train.max_skipped_steps)
      throw Error(fmt::format("{} non-finite steps in a row (up to step {}): stopping", skipped_in_a_row_, step + 1),
                  "the run diverged: lower optimizer.lr or resume from an earlier checkpoint");
    log_warn("step {}: non-finite loss or gradient, update skipped ({} in a row)", step + 1, skipped_in_a_row_);
    out.skipped = true;
    out.skipped_total = skipped_total_;
    return out;
  }
  skipped_in_a_row_ = 0;
  out.skipped_total = skipped_total_;
  float grad_scale = clip_factor(out.grad_norm, recipe_.train.grad_clip);
  if (scaler_) {
    grad_scale = float(double(grad_scale) / scale);  // unscale with the clip
    scaler_->update(false);
  }
  copies_now_.updated_early = optimizer_->units_updated();
  optimizer_->step(step_params(), sync_->owned_grads(), out.lr, grad_scale, sync_->grads_compact(),
                   sync_->params_compact());
  early_copies_ = copies_now_;
  phase_end(StepPhase::optimizer);
  sync_->gather_params();
  phase_end(StepPhase::grad_sync);
  return out;
}

bool TrainStep::updates_during_backward() const {
  return optimizer_->updates_on_cpu() && placement_.update_during_backward;
}

kernels::Tensor TrainStep::step_params() const {
  return sync_->params_compact() ? sync_->owned_params() : model_.params();
}

void TrainStep::sum_tied_grads() {
  if (tied_peer_ < 0) return;
  // Both stages send their copy's gradient and add the other's: a + b on one and b + a on the
  // other are the same floats, so the copies stay identical through the update. 16-bit gradients
  // travel as they are stored (exact) and the add sums in fp32 and rounds once, as each
  // micro-batch's accumulation into the one buffer does at pp 1.
  const Tensor grad = model_.parameters()[size_t(tied_param_)].grad.view({tied_scratch_.tensor().numel()});
  // One grouped exchange: both ways at once, so that no backend can deadlock on its order.
  using parallel::Transfer;
  comms_.pp
      ->exchange_async(
          {{Transfer::Kind::recv, tied_scratch_.tensor(), tied_peer_}, {Transfer::Kind::send, grad, tied_peer_}})
      ->wait();
  kernels::residual_forward(grad, grad, tied_scratch_.tensor(), Tensor{});
}

double schedule_bubble(const Recipe& recipe, int micro_batches) {
  const parallel::ScheduleSpec spec{recipe.parallel.pp, 0, micro_batches, recipe.parallel.virtual_stages};
  return parallel::schedule_timeline(parallel::make_schedules(recipe.parallel.pp_schedule, spec), micro_batches,
                                     spec.chunks)
      .bubble_fraction();
}

void TrainStep::master_from_params() {
  if (initial_shard_.data()) {  // offloaded ZeRO 3 values: into the store, and the host copy dropped
    optimizer_->master_from_params(model_.param_shard());
    model_.set_param_shard(sync_->owned(), {});
    initial_shard_ = {};
    return;
  }
  optimizer_->master_from_params(model_.params());
}

void TrainStep::params_from_master() {
  if (!optimizer_->has_master()) return;
  optimizer_->params_from_master(model_.params());
  sync_->gather_params();
}

nlohmann::json TrainStep::state() const {
  nlohmann::json j = {{"skipped_total", skipped_total_}, {"skipped_in_a_row", skipped_in_a_row_}};
  if (scaler_) j["loss_scale"] = scaler_->state();
  j["lr_schedule"] = lr_.state();
  return j;
}

void TrainStep::restore(const nlohmann::json& state, int64_t step) {
  // The manifest's loop state may be anything: integers in range (never more skipped steps than steps).
  auto count = [&](const char* key) {
    return state.contains(key) ? manifest_integer(state.at(key), fmt::format("manifest extra.{}", key), 0, step) : 0;
  };
  skipped_total_ = count("skipped_total");
  skipped_in_a_row_ = count("skipped_in_a_row");
  if (scaler_ && state.contains("loss_scale")) scaler_->restore(state.at("loss_scale"));
  const std::string schedule = lr_.restore(state.value("lr_schedule", nlohmann::json()), step);
  if (!schedule.empty()) log_progress("{}", schedule);
  optimizer_->set_steps(step - skipped_total_);
}

}  // namespace llmtrain::trainer
