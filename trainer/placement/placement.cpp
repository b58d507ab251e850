// The placement (trainer/placement/placement.h): every decision of what a rank holds where, in one
// function, from the same layout code the step's buffers are then allocated with (the model's
// parameter layout, the gradient sync's sharding units, the pipeline executor's receive slots, the
// offload store's geometry).
#include "trainer/placement/placement.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "common/recipe/recipe_check.h"
#include "parallel/pipeline_executor.h"
#include "trainer/model/model_spec.h"
#include "trainer/optim/muon.h"
#include "trainer/optim/offload.h"

namespace llmtrain::trainer {
namespace {

// The options of the model a stage builds for training with `schedule` (its slots are the
// micro-batches the schedule keeps in flight).
ModelOptions stage_model_options(const Recipe& r, const Layout& l, int stage,
                                 const std::vector<parallel::PipeOp>& schedule) {
  ModelOptions mo;
  mo.stage = pipeline_stage_layout(r.model, l, stage);
  mo.micro_batch = r.train.micro_batch;
  mo.seq_len = int(l.local_seq(r.model.seq_len));  // context parallelism: this rank's two chunks
  mo.context_parallel = l.cp;
  mo.cp_comm = l.cp_comm;
  mo.expert_parallel = l.ep;
  mo.experts_sharded = l.experts_sharded();
  mo.checkpointing = l.recompute;
  mo.dtype = precision_dtype(l.precision);
  mo.activation_slots = parallel::max_in_flight_per_chunk(schedule);
  mo.split_backward = std::any_of(schedule.begin(), schedule.end(), [](const parallel::PipeOp& op) {
    return op.kind == parallel::PipeOpKind::backward_input;
  });
  mo.external_grads = l.gradients_sharded();    // the gradient sync hands out gradient storage
  mo.external_params = l.parameters_sharded();  // ... and parameter storage
  // With pp > 1 each stage sends its tp rank's 1/tp of the token rows to the same tp rank of the
  // next stage (Megatron's sequence-parallel pipelines): Model::stage_activation_shape.
  mo.sequence_parallel = l.sequence_parallel;
  mo.device = l.device == DeviceKind::cuda ? kernels::Device::cuda : kernels::Device::cpu;
  return mo;
}

// parallel.offload host on a cuda rank runs AdamW on the CPU over the page-locked state, except at
// ZeRO 3 without offload_params, whose owned values stay on the device (there the unit goes to the
// device and the device updates it, as with nvme).
bool updates_on_cpu(const Recipe& r, const Layout& l) {
  return r.parallel.offload == OffloadKind::host && l.device == DeviceKind::cuda &&
         (!l.parameters_sharded() || r.parallel.offload_params);
}

// Such a CPU update runs beside backward when the update is known before the gradient norm: no
// clipping, no fp16 loss scaling, and a non-finite step stops the run rather than being skipped
// after some units were updated.
bool updates_during_backward(const Recipe& r, const Layout& l) {
  return updates_on_cpu(r, l) && r.train.grad_clip <= 0 && l.precision != Precision::fp16 &&
         r.train.on_nonfinite == NonFiniteAction::stop;
}

// The largest chunk a rank of a shard group of `shard` holds of any unit (one unit's chunk).
int64_t largest_chunk(const std::vector<parallel::ShardUnit>& units, int shard) {
  int64_t chunk = 0;
  for (const parallel::ShardUnit& u : units)
    if (u.range.numel() > 0) chunk = std::max(chunk, (u.range.numel() + shard - 1) / shard);
  return chunk;
}

}  // namespace

const char* to_string(Residence r) {
  switch (r) {
    case Residence::none:
      return "none";
    case Residence::device:
      return "device";
    case Residence::pinned_host:
      return "page-locked host memory";
    case Residence::file:
      return "file";
  }
  return "?";
}

int grad_group_of(const StageLayout& st, ParamPlace place, int layer) {
  // With virtual chunks the blocks count from the last chunk's last block down to chunk 0's first.
  const int blocks = st.blocks();
  switch (place) {
    case ParamPlace::head:
      return 0;
    case ParamPlace::block: {
      const int local = st.local(layer);
      LT_CHECK(local >= 0, "layer {} outside the stage [{}, {}) ({} chunks)", layer, st.layer_begin, st.layer_end,
               st.chunks);
      return 1 + (blocks - 1 - local);
    }
    case ParamPlace::embedding:
      return 1 + blocks;
  }
  LT_CHECK(false, "parameter place {}", int(place));
  return 0;
}

std::vector<std::vector<int>> grad_ready_groups(const StageLayout& st, const std::vector<ModelParam>& params) {
  std::vector<std::vector<int>> groups(size_t(st.blocks()) + 2);
  for (size_t i = 0; i < params.size(); ++i)
    groups[size_t(grad_group_of(st, params[i].spec.place, params[i].spec.layer))].push_back(int(i));
  return groups;
}

std::vector<parallel::PipeOp> step_schedule(const Layout& layout, int stage, int micro_batches) {
  return parallel::make_schedule(layout.schedule, {layout.pp, stage, micro_batches, layout.virtual_stages});
}

int64_t cpu_update_bytes_per_element(const Layout& l, bool values_offloaded) {
  const int64_t element = int64_t(kernels::dtype_size(precision_dtype(l.precision)));
  // The owned gradients down (fp32 when the sync holds them: ZeRO 2 and 3), the updated values up
  // in the parameters' dtype (none with offload_params: they stay in the store).
  return (l.gradients_sharded() ? 4 : element) + (values_offloaded ? 0 : element);
}

int64_t offload_unit_for(int64_t numel) { return offload_unit(numel); }

Placement place(const Recipe& r, const Layout& layout, const parallel::MeshCoord& coord) {
  Placement p;
  p.layout = layout;
  p.coord = coord;
  const ModelConfig& mc = r.model;

  // This stage's schedule sets how many micro-batches keep activations at once, and the receive
  // buffers between stages. A schedule this build refuses with the recipe's recomputation is
  // placed as the 1f1b it would need instead (the refusal itself: unsupported_features).
  Layout planned = layout;
  for (const NotSupported& n : unsupported_features(r))
    if (n.feature == NotYet::zero_bubble_recompute) {
      planned.schedule = PipelineSchedule::one_f_one_b;
      planned.virtual_stages = 1;
      p.notes.push_back(fmt::format("activations as with 1f1b: not supported yet: {}", n.text));
    }
  p.schedule = step_schedule(planned, coord.pp, r.grad_accum_steps());
  p.model = stage_model_options(r, planned, coord.pp, p.schedule);
  p.params = model_param_layout(mc, p.model, layout.tp, coord.tp);
  p.groups = grad_ready_groups(p.model.stage, p.params);
  p.held_group = tied_in_stage(mc, p.model.stage) ? grad_group_of(p.model.stage, ParamPlace::embedding, -1) : -1;
  for (const ModelParam& mp : p.params) p.stage_numel += mp.numel();
  p.experts_sharded =
      std::any_of(p.params.begin(), p.params.end(), [](const ModelParam& mp) { return mp.expert_shard; });

  const kernels::DType dtype = p.model.dtype;
  const int64_t element = int64_t(kernels::dtype_size(dtype));
  const ModelMemory model = model_memory_plan(mc, p.model, layout.tp, coord.tp);
  p.values = {Residence::device, dtype, model.params / element};
  p.grads = {Residence::device, dtype, model.grads / element};
  p.activation_bytes = model.activations();
  p.head_logit_bytes = model.head_logits;

  // AdamW keeps two moments (fp32, or bf16 with optimizer.state_dtype; with 16-bit parameters also
  // their fp32 master) over the ranges
  // the gradient sync gives this rank to own: the whole stage at ZeRO stage 0; at stages 1-3 this
  // rank's chunk of every sharding unit (parameter groups merged as buckets are, in bytes of the
  // parameters' dtype). The sync's gradient pool (and stage 3's gathered-parameter pool), in that
  // dtype, is communication memory: what the ZeRO paper counts as model states is the owned
  // shards. At stage 2 the gradients are the owned chunk (fp32); at stage 3 the parameters are too
  // (fp32: with 16-bit storage the owned values are the master).
  p.owned = p.stage_numel;
  if (layout.optimizer_sharded()) {
    const int shard = layout.shard_group;
    // The units of the parameters that are (or are not) sharded experts: those ZeRO shards over the
    // expert-data-parallel group (make_step_grad_sync), the rest over dp × cp.
    auto units_of = [&](bool experts) {
      std::vector<parallel::ParamRange> ranges;
      std::vector<int> index(p.params.size(), -1);
      for (size_t i = 0; i < p.params.size(); ++i)
        if (p.params[i].expert_shard == experts) {
          index[i] = int(ranges.size());
          ranges.push_back({p.params[i].offset, p.params[i].numel()});
        }
      std::vector<std::vector<int>> mine(p.groups.size());
      for (size_t g = 0; g < p.groups.size(); ++g)
        for (int i : p.groups[g])
          if (index[size_t(i)] >= 0) mine[g].push_back(index[size_t(i)]);
      return parallel::shard_units(ranges, mine, layout.bucket_mb, size_t(element));
    };
    p.units = units_of(false);
    // The rank's index in the dp × cp group (cp fastest), whose consecutive runs the shards span.
    const int replica = coord.dp * layout.cp + coord.cp;
    int64_t owned = parallel::owned_numel(p.units, shard, replica % shard);
    // Stages 2 and 3 give a tied embedding's unit, held through a whole pass, a slot of its own.
    const int held = parallel::unit_of_group(p.units, p.held_group);
    int64_t pools =
        std::max<int64_t>(parallel::grad_pool_numel(p.units, shard, layout.gradients_sharded() ? held : -1), 1) *
        element;
    if (p.experts_sharded) {  // sharded experts at ZeRO 1: every edp rank owns a chunk of each expert unit
      p.expert_units = units_of(true);
      owned += parallel::owned_numel(p.expert_units, layout.expert_replicas(), replica / layout.ep);
      pools += std::max<int64_t>(parallel::grad_pool_numel(p.expert_units, layout.expert_replicas(), -1), 1) * element;
    }
    p.owned = owned;
    if (layout.gradients_sharded()) {
      // The model holds no gradient buffer (external_grads); the sync keeps the owned shard.
      p.grads = {Residence::device, kernels::DType::fp32, std::max<int64_t>(owned, 1)};
      // With 16-bit parameters one fp32 chunk widens what the pool reduced before it is added into
      // the shard.
      if (element != 4) pools += std::max<int64_t>(largest_chunk(p.units, shard), 1) * 4;
    }
    if (layout.parameters_sharded()) {  // the model holds no parameter buffer (external_params)
      p.values = {Residence::device, kernels::DType::fp32, std::max<int64_t>(owned, 1)};
      if (r.parallel.offload_params) {  // the values in the offload store: one unit's chunk at a time here
        p.values_offloaded = true;
        p.values.numel = std::max<int64_t>(largest_chunk(p.units, shard), 1);
      }
      pools += std::max<int64_t>(parallel::param_pool_numel(p.units, shard, held), 1) * element;
    }
    p.sync_pool_bytes = pools;
  }
  // Moments, and a master for 16-bit parameters (at ZeRO 3 the owned values are the master and
  // count as parameters).
  p.moments = {Residence::device,
               r.optimizer.state_dtype == StateDtype::bf16 ? kernels::DType::bf16 : kernels::DType::fp32, p.owned, 2};
  if (layout.fp32_master()) p.master = {Residence::device, kernels::DType::fp32, p.owned};
  // Muon's scratch, sized for the stage's largest matrix (trainer/optim/muon.h; its momentum is in
  // `moments`' first array, and the second still spans the matrices), with a piece's more where ZeRO
  // cuts matrices over a shard group of more than one rank.
  if (r.optimizer.name == OptimizerName::muon) {
    const bool sharded =
        layout.zero >= 1 && (layout.shard_group > 1 || (layout.experts_sharded() && layout.expert_replicas() > 1));
    p.muon_workspace_bytes = muon_workspace_bytes(
        muon_matrices(p.params),
        r.optimizer.muon.ns_dtype == StateDtype::bf16 ? kernels::DType::bf16 : kernels::DType::fp32, p.moments.dtype,
        sharded);
  }

  if (r.parallel.offload != OffloadKind::none) {
    const kernels::Device device = p.model.device;
    p.offload = r.parallel.offload;
    p.update = updates_on_cpu(r, layout) ? UpdateSite::cpu : UpdateSite::device;
    p.update_during_backward = updates_during_backward(r, layout);
    // offload_params: ZeRO 3's owned values are the store's third array. The CPU update (host on
    // cuda ranks) always keeps a master, and page-locked copies of the owned gradients and values.
    const bool cpu = p.update == UpdateSite::cpu;
    const int states = layout.fp32_master() ? 3 : 2;
    p.offload_arrays = cpu ? 3 : states + (p.values_offloaded ? 1 : 0);
    const OffloadBytes b = offload_bytes(p.offload, device, p.offload_arrays, p.owned);
    p.offload_store = {p.offload == OffloadKind::nvme ? Residence::file : Residence::pinned_host, kernels::DType::fp32,
                       b.store / 4};
    if (cpu) p.cpu_update_copies = p.owned * cpu_update_bytes_per_element(layout, p.values_offloaded);
    p.offload_device_slots = device == kernels::Device::cuda ? b.device_slots : 0;
    p.offload_host_slots = b.host_slots;
    // The state is in the store: the moments and master are no longer the device's.
    p.moments.where = Residence::none;
    p.master.where = Residence::none;
  }

  if (r.checkpoint.async) {
    // What checkpoint_slices marks as this rank's to write (trainer/checkpoint/checkpoint.h), fp32:
    // whole parameters on dp rank 0 (tied copies and tensor-parallel replicas are not written);
    // with a master (16-bit) or at ZeRO 3 the owned ranges instead, on the ranks that write the
    // moments (GradSync::first_copy(): dp rank 0, or with ZeRO the first shard group), which
    // write both moments of their owned ranges. At ZeRO ≥ 1 an owned chunk may cover a tied copy
    // or a replica, which is counted though not written: the plan is then an upper bound.
    // Sharded experts (rank_checkpoint_slices): the first rank of each edp group (replica < ep)
    // writes its experts, and at ZeRO 0 their moments (at ZeRO 1 every edp rank its owned chunk).
    int64_t dense = 0, experts = 0;
    for (const ModelParam& mp : p.params)
      if (!mp.tied_copy && !mp.tp_replica) (mp.expert_shard ? experts : dense) += mp.numel();
    const int replica = coord.dp * layout.cp + coord.cp;  // index in the dp × cp group
    const int64_t written = (replica == 0 ? dense : 0) + (replica < layout.ep ? experts : 0);
    const bool first_copy = layout.optimizer_sharded() ? replica < layout.shard_group : written > 0;
    const int64_t owned_written = layout.optimizer_sharded() ? p.owned : written;
    const bool params_owned = layout.fp32_master() || layout.parameters_sharded();
    const int64_t params_written = params_owned ? (first_copy ? owned_written : 0) : written;
    p.snapshot_bytes = (params_written + (first_copy ? 2 * owned_written : 0)) * 4;
    p.snapshot_on_host = layout.device != DeviceKind::cpu;
  }

  const parallel::PipelineExecutor::ReceiveSlots slots = parallel::PipelineExecutor::receive_slots(p.schedule);
  // A message is a micro-batch's residual stream in the storage dtype: with sequence parallelism
  // this rank's 1/tp of its rows.
  const int64_t activation_message = int64_t(r.train.micro_batch) * layout.local_seq(mc.seq_len) * mc.hidden * element /
                                     (p.model.sequence_parallel ? layout.tp : 1);
  p.receive_bytes = int64_t(slots.activation_buffers + slots.grad_buffers) * activation_message;
  // pp > 1 with a tied word embedding: the first and the last stage receive the other's gradient of
  // it (TrainStep), the embedding's tensor-parallel shard, in the gradients' dtype.
  if (layout.pp > 1 && mc.tie_embeddings && (coord.pp == 0 || coord.pp == layout.pp - 1))
    p.tied_exchange_bytes = mc.padded_vocab() / layout.tp * int64_t(mc.hidden) * element;
  return p;
}

}  // namespace llmtrain::trainer
