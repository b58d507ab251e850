#include "trainer/loop/memory.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "common/recipe/recipe_check.h"
#include "common/strings.h"
#include "parallel/grad_sync.h"
#include "parallel/pipeline_executor.h"
#include "trainer/loop/train_step.h"
#include "trainer/model/model.h"
#include "trainer/optim/offload.h"

namespace llmtrain::trainer {

MemoryAccount memory_plan(const Recipe& r, const Layout& layout, const parallel::MeshCoord& coord) {
  MemoryAccount out;
  const ModelConfig& mc = r.model;

  // This stage's schedule sets how many micro-batches keep activations at once, and the receive
  // buffers between stages. A schedule this build refuses with the recipe's recomputation is
  // planned as the 1f1b it would need instead (the refusal itself: unsupported_features).
  Layout planned = layout;
  for (const NotSupported& n : unsupported_features(r))
    if (n.feature == NotYet::zero_bubble_recompute) {
      planned.schedule = PipelineSchedule::one_f_one_b;
      planned.virtual_stages = 1;
      out.notes.push_back(fmt::format("activations as with 1f1b: not supported yet: {}", n.text));
    }
  const std::vector<parallel::PipeOp> schedule = step_schedule(planned, coord.pp, r.grad_accum_steps());
  const ModelOptions mo = step_model_options(r, planned, coord.pp, schedule);
  const ModelMemory model = model_memory_plan(mc, mo, layout.tp, coord.tp);
  out.parameters = model.params;
  out.gradients = model.grads;
  out.activations = model.activations();
  out.head_logits = model.head_logits;

  // AdamW keeps two fp32 moments (and, with 16-bit parameters, their fp32 master) over the ranges
  // the gradient sync gives this rank to own: the whole stage at ZeRO stage 0; at stages 1-3 this
  // rank's chunk of every sharding unit (parameter groups merged as buckets are, in bytes of the
  // parameters' dtype). The sync's gradient pool (and stage 3's gathered-parameter pool), in that
  // dtype, is communication memory: what the ZeRO paper counts as model states is the owned
  // shards. At stage 2 the gradients are the owned chunk (fp32); at stage 3 the parameters are too
  // (fp32: with 16-bit storage the owned values are the master).
  const int64_t element = int64_t(kernels::dtype_size(mo.dtype));
  // Moments, and a master for 16-bit parameters (at ZeRO 3 the owned values are the master and
  // count as parameters).
  const int64_t fp32_states = layout.fp32_master() ? 3 : 2;
  const std::vector<ModelParam> params = model_param_layout(mc, mo, layout.tp, coord.tp);
  int64_t numel = 0;
  for (const ModelParam& p : params) numel += p.numel();
  out.optimizer = fp32_states * numel * 4;
  int64_t zero_pools = 0;
  int64_t owned_numel = numel;
  if (layout.optimizer_sharded()) {
    const int shard = layout.shard_group;
    // The units of the parameters that are (or are not) sharded experts: those ZeRO shards over the
    // expert-data-parallel group (make_step_grad_sync), the rest over dp × cp.
    const std::vector<std::vector<int>> groups = grad_ready_groups(mo.stage, params);
    auto units_of = [&](bool experts) {
      std::vector<parallel::ParamRange> ranges;
      std::vector<int> index(params.size(), -1);
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].expert_shard == experts) {
          index[i] = int(ranges.size());
          ranges.push_back({params[i].offset, params[i].numel()});
        }
      std::vector<std::vector<int>> mine(groups.size());
      for (size_t g = 0; g < groups.size(); ++g)
        for (int i : groups[g])
          if (index[size_t(i)] >= 0) mine[g].push_back(index[size_t(i)]);
      return parallel::shard_units(ranges, mine, layout.bucket_mb, size_t(element));
    };
    const std::vector<parallel::ShardUnit> units = units_of(false);
    // The rank's index in the dp × cp group (cp fastest), whose consecutive runs the shards span.
    const int replica = coord.dp * layout.cp + coord.cp;
    int64_t owned = parallel::owned_numel(units, shard, replica % shard);
    // Stages 2 and 3 give a tied embedding's unit, held through a whole pass, a slot of its own.
    const int held = parallel::unit_of_group(units, held_group(mc, mo.stage));
    zero_pools =
        std::max<int64_t>(parallel::grad_pool_numel(units, shard, layout.gradients_sharded() ? held : -1), 1) * element;
    const bool experts = std::any_of(params.begin(), params.end(), [](const ModelParam& p) { return p.expert_shard; });
    if (experts) {  // sharded experts at ZeRO 1: every edp rank owns a chunk of each expert unit
      const std::vector<parallel::ShardUnit> expert_units = units_of(true);
      owned += parallel::owned_numel(expert_units, layout.expert_replicas(), replica / layout.ep);
      zero_pools +=
          std::max<int64_t>(parallel::grad_pool_numel(expert_units, layout.expert_replicas(), -1), 1) * element;
    }
    owned_numel = owned;
    out.optimizer = fp32_states * owned * 4;
    if (layout.gradients_sharded()) {
      // The model holds no gradient buffer (mo.external_grads); the sync keeps the owned shard.
      out.gradients = std::max<int64_t>(owned, 1) * 4;
      // With 16-bit parameters one fp32 chunk widens what the pool reduced before it is added into
      // the shard.
      if (element != 4) {
        int64_t chunk = 0;
        for (const parallel::ShardUnit& u : units)
          if (u.range.numel() > 0) chunk = std::max(chunk, (u.range.numel() + shard - 1) / shard);
        zero_pools += std::max<int64_t>(chunk, 1) * 4;
      }
    }
    if (layout.parameters_sharded()) {  // the model holds no parameter buffer (mo.external_params)
      out.parameters = std::max<int64_t>(owned, 1) * 4;
      if (r.parallel.offload_params) {  // the values in the offload store: one unit's chunk at a time here
        int64_t chunk = 0;
        for (const parallel::ShardUnit& u : units)
          if (u.range.numel() > 0) chunk = std::max(chunk, (u.range.numel() + shard - 1) / shard);
        out.parameters = std::max<int64_t>(chunk, 1) * 4;
      }
      zero_pools += std::max<int64_t>(parallel::param_pool_numel(units, shard, held), 1) * element;
    }
  }

  if (r.parallel.offload != OffloadKind::none) {
    const kernels::Device device = r.train.device == DeviceKind::cuda ? kernels::Device::cuda : kernels::Device::cpu;
    // offload_params: ZeRO 3's owned values are the store's third array. The CPU update (host on
    // cuda ranks) always keeps a master, and page-locked copies of the owned gradients and values.
    const bool cpu_update = offload_updates_on_cpu(r, layout.parameters_sharded());
    const int arrays =
        cpu_update ? 3 : int(fp32_states) + (r.parallel.offload_params && layout.parameters_sharded() ? 1 : 0);
    const OffloadBytes b = offload_bytes(r.parallel.offload, device, arrays, owned_numel);
    if (cpu_update)
      out.offload_host +=
          owned_numel * ((layout.gradients_sharded() ? 4 : element) + (r.parallel.offload_params ? 0 : element));
    out.offload_disk = r.parallel.offload == OffloadKind::nvme ? b.store : 0;
    if (device == kernels::Device::cuda) {
      out.optimizer = b.device_slots;
      out.offload_host += b.host_slots + (r.parallel.offload == OffloadKind::host ? b.store : 0);
    } else {
      out.optimizer = b.host_slots;
    }
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
    for (const ModelParam& p : params)
      if (!p.tied_copy && !p.tp_replica) (p.expert_shard ? experts : dense) += p.numel();
    const int replica = coord.dp * layout.cp + coord.cp;  // index in the dp × cp group
    const int64_t written = (replica == 0 ? dense : 0) + (replica < layout.ep ? experts : 0);
    const bool first_copy = layout.optimizer_sharded() ? replica < layout.shard_group : written > 0;
    const int64_t owned_written = layout.optimizer_sharded() ? owned_numel : written;
    const bool params_owned = layout.fp32_master() || layout.parameters_sharded();
    const int64_t params_written = params_owned ? (first_copy ? owned_written : 0) : written;
    out.checkpoint_snapshot = (params_written + (first_copy ? 2 * owned_written : 0)) * 4;
    out.snapshot_on_host = r.train.device != DeviceKind::cpu;
  }

  const parallel::PipelineExecutor::ReceiveSlots slots = parallel::PipelineExecutor::receive_slots(schedule);
  // A message is a micro-batch's residual stream in the storage dtype: with sequence parallelism
  // this rank's 1/tp of its rows.
  const int64_t activation_message = int64_t(r.train.micro_batch) * layout.local_seq(mc.seq_len) * mc.hidden * element /
                                     (mo.sequence_parallel ? layout.tp : 1);
  out.communication = int64_t(slots.activation_buffers + slots.grad_buffers) * activation_message + zero_pools;
  // pp > 1 with a tied word embedding: the first and the last stage receive the other's gradient of
  // it (TrainStep), the embedding's tensor-parallel shard, in the gradients' dtype.
  if (layout.pp > 1 && mc.tie_embeddings && (coord.pp == 0 || coord.pp == layout.pp - 1))
    out.communication += mc.padded_vocab() / layout.tp * int64_t(mc.hidden) * element;
  return out;
}

MemoryAccount memory_measured(kernels::Device device, bool peak) {
  auto get = [&](kernels::MemoryKind kind) {
    const kernels::MemoryUse u = kernels::memory_use(device, kind);
    return peak ? u.peak : u.current;
  };
  MemoryAccount out;
  out.parameters = get(kernels::MemoryKind::parameters);
  out.gradients = get(kernels::MemoryKind::gradients);
  out.optimizer = get(kernels::MemoryKind::optimizer);
  out.activations = get(kernels::MemoryKind::activations);
  out.communication = get(kernels::MemoryKind::communication);
  return out;
}

std::string format_memory(const MemoryAccount& m) {
  auto b = [](int64_t bytes) { return format_bytes(double(bytes)); };
  std::string out = fmt::format("parameters {}, gradients {}, optimizer {}, activations {}, communication {}",
                                b(m.parameters), b(m.gradients), b(m.optimizer), b(m.activations), b(m.communication));
  if (m.checkpoint_snapshot > 0 && !m.snapshot_on_host)
    out += fmt::format(", checkpoint snapshot {}", b(m.checkpoint_snapshot));
  out += fmt::format("; total {}", b(m.total()));
  std::vector<std::string> host;
  if (m.offload_host > 0) host.push_back("optimizer state " + b(m.offload_host));
  if (m.checkpoint_snapshot > 0 && m.snapshot_on_host)
    host.push_back("checkpoint snapshot " + b(m.checkpoint_snapshot));
  if (!host.empty()) out += "; host memory: " + join(host, ", ");
  if (m.offload_disk > 0) out += fmt::format("; disk (offload_path): optimizer state {}", b(m.offload_disk));
  return out;
}

}  // namespace llmtrain::trainer
