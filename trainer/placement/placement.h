// The placement: what lives where on one rank, decided once (docs/architecture.md §3 "One
// placement"). From the resolved recipe, its layout (common/recipe/layout.h) and the rank's mesh
// coordinates, place() says every piece of the step's state the rank holds — the model's flat
// parameters and gradients, the gradient sync's owned shards and pools, AdamW's moments and fp32
// master, the pipeline's receive buffers — with its elements, dtype and residence (the compute
// device, host memory, page-locked host memory, a file), where and when the update runs, and which
// experts the rank holds. train() computes it once; the Model is built with its options, the
// TrainStep with its schedule, gradient groups and update, the memory account sums it
// (trainer/placement/memory.h), and the planner reads it (planner/perf_model.cpp, layout_search.cpp):
// none of them derives any of it from the recipe again. New state (FP8 scales, other optimizers'
// state, 16-bit moments) is added here, not beside it.
//
// Rules a reader could get wrong:
//  - A Held's numel counts ONE array of its kind: the moments are two arrays of `moments.numel`
//    elements each (Held::arrays says how many).
//  - The owned elements (`owned`) are those whose update this rank makes: the whole stage at ZeRO
//    0, this rank's chunk of every sharding unit at ZeRO 1-3 (plus, with sharded experts, its chunk
//    of the expert units over the expert-data-parallel group). The gradient sync computes the same
//    units from the model it is given; TrainStep checks that the two agree.
//  - A recipe this build refuses for a feature not built yet (the zero-bubble schedule with
//    recomputation) is placed as what this build would run instead, said in `notes`: the dry run
//    and the planner show that; a run never gets here (it refuses such a recipe first).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/recipe/layout.h"
#include "common/recipe/recipe.h"
#include "kernels/tensor.h"
#include "parallel/grad_sync.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_schedule.h"
#include "trainer/model/model.h"

namespace llmtrain::trainer {

// Where a piece of a rank's state lives.
enum class Residence : uint8_t {
  none,         // not held by this rank
  device,       // the compute device's memory (the host's on a cpu rank)
  pinned_host,  // page-locked host memory beside a cuda rank's device
  file          // a file under parallel.offload_path
};
const char* to_string(Residence r);

// One kind of a rank's state: `arrays` arrays of `numel` elements of `dtype`, at `where`.
struct Held {
  Residence where = Residence::none;
  kernels::DType dtype = kernels::DType::fp32;
  int64_t numel = 0;
  int arrays = 1;
  int64_t bytes() const { return where == Residence::none ? 0 : arrays * numel * int64_t(kernels::dtype_size(dtype)); }
};

// Where and when AdamW updates the owned elements.
enum class UpdateSite : uint8_t {
  device,  // on the compute device (on a cpu rank: the host), after backward
  cpu      // on the host's cores over page-locked state (parallel.offload host on a cuda rank)
};

struct Placement {
  Layout layout;
  parallel::MeshCoord coord;

  // This stage's pipeline instructions for one optimizer step, and the options the Model is built
  // with (its stage, micro-batch, slots, dtype, device, what the gradient sync holds instead).
  std::vector<parallel::PipeOp> schedule;
  ModelOptions model;
  // The parameters this rank holds, in the flat buffers' layout (model_param_layout), and their
  // groups in the order backward completes them (grad_ready_groups); the group held through a
  // whole pass (the tied word embedding on a stage with both ends), or -1.
  std::vector<ModelParam> params;
  std::vector<std::vector<int>> groups;
  int held_group = -1;
  int64_t stage_numel = 0;  // elements of every parameter of the stage

  // Expert parallelism at ZeRO 0/1 (Layout::experts_sharded): this rank holds its ep rank's
  // experts only, reduced (and at ZeRO 1 sharded) over the expert-data-parallel group.
  bool experts_sharded = false;
  // ZeRO 1-3: the sharding units, over dp × cp and (sharded experts) over the edp group.
  std::vector<parallel::ShardUnit> units, expert_units;
  int64_t owned = 0;  // elements this rank updates

  // The state. values/grads: the model's flat buffers, or at ZeRO 3 / ZeRO 2 the gradient sync's
  // owned fp32 values / gradients (the model then holds none). moments: AdamW's two arrays (fp32,
  // or bf16 with optimizer.state_dtype); master: its fp32 copy of 16-bit values (none at ZeRO 3,
  // whose owned values are fp32).
  Held values, grads, moments, master;
  // optimizer.name muon: the Newton–Schulz workspace (MuonWorkspace::bytes_for its largest matrix).
  int64_t muon_workspace_bytes = 0;
  // The values' chunk a ZeRO-3 rank holds at a time when the owned values are offloaded
  // (offload_params: the store keeps them; `values` then is that chunk).
  bool values_offloaded = false;

  // parallel.offload: AdamW's state (and with offload_params ZeRO 3's owned values) in the
  // OffloadStore (trainer/optim/offload.h): `offload_arrays` arrays of `owned` elements, at
  // `offload_store.where`; its staging slots on the compute device and in host memory.
  OffloadKind offload = OffloadKind::none;
  int offload_arrays = 0;
  Held offload_store;
  int64_t offload_device_slots = 0, offload_host_slots = 0;
  // Where AdamW runs, and whether it updates each unit beside backward as its gradients arrive
  // (the CPU update without clipping, loss scaling or skipped steps: AdamW::update_as_gradients_arrive).
  UpdateSite update = UpdateSite::device;
  bool update_during_backward = false;
  // The CPU update's page-locked copies of the owned gradients and values.
  int64_t cpu_update_copies = 0;

  // The model's activation arena (model_memory_plan: what its slots keep from forward to backward and
  // the backward's work buffers), and of it the LM head's logits.
  int64_t activation_bytes = 0, head_logit_bytes = 0;

  // Communication buffers: the gradient sync's pools (ZeRO 1-3: the gradient slots, ZeRO 3's
  // gathered-parameter slots, 16-bit ZeRO 2's widening chunk), the pipeline's receive buffers, and
  // the tied embedding's gradient exchanged between the first and last stage.
  int64_t sync_pool_bytes = 0, receive_bytes = 0, tied_exchange_bytes = 0;

  // checkpoint.async: the host snapshot of what this rank writes (fp32), and whether it is host
  // memory beside a device (a cuda rank) or the rank's own memory (a cpu rank).
  int64_t snapshot_bytes = 0;
  bool snapshot_on_host = false;

  std::vector<std::string> notes;
};

// The placement of the rank at `coord` (Mesh coordinates) of a resolved recipe and its layout
// (layout_of(recipe)). Throws llmtrain::Error for a model the Model itself would refuse.
Placement place(const Recipe& recipe, const Layout& layout, const parallel::MeshCoord& coord);

// Bytes per owned element the CPU update moves between the device and page-locked host memory each
// step (the gradients down, the updated values up): the same count the memory account keeps of the
// page-locked copies and the planner prices on the host link.
int64_t cpu_update_bytes_per_element(const Layout& layout, bool values_offloaded);

// The unit an OffloadStore of `numel` elements is cut into (offload_unit, trainer/optim/offload.h),
// for the planner's price of the CPU update beside backward.
int64_t offload_unit_for(int64_t numel);

// The instruction list of stage `stage` for one optimizer step of `micro_batches` micro-batches, as
// the layout's pipeline and schedule say (with one stage: F0 B0 F1 B1 ...).
std::vector<parallel::PipeOp> step_schedule(const Layout& layout, int stage, int micro_batches);

// The parameters in groups in the order backward completes them: the head, the blocks from the last
// to the first, the embedding (a tied embedding is complete only after the embedding's backward).
// Group g lists indices into `params` (model_param_layout's, or Model::parameters()).
std::vector<std::vector<int>> grad_ready_groups(const StageLayout& stage, const std::vector<ModelParam>& params);
// The group of grad_ready_groups a parameter at (place, layer) of the stage belongs to: what the
// model's grad-ready hook reports.
int grad_group_of(const StageLayout& stage, ParamPlace place, int layer);

}  // namespace llmtrain::trainer
