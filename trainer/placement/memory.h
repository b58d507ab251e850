// The one memory account: the bytes a rank holds, by kind — parameters, gradients, optimizer state,
// activations, communication buffers.
//
//  - memory_account() sums them WITHOUT allocating from the rank's placement
//    (trainer/placement/placement.h), which says what the step allocates, from the same layout code
//    the buffers are allocated with: the Model's arena (model_memory_plan), the optimizer's owned
//    ranges, the pipeline executor's receive buffers for this stage's schedule. `llmtrain run
//    --dry-run` prints it for a 70B recipe on a laptop; the planner checks layouts with it.
//  - memory_measured() reads what the allocator counted for Buffers of each kind
//    (kernels/buffer.h): the run prints the peaks, which must equal the plan. The asynchronous
//    checkpoint's snapshot is not one of those kinds: the run logs its size when it takes it
//    (Checkpointer::snapshot_bytes()), which must equal the plan's checkpoint_snapshot.
//
// Rule a reader could get wrong: the account is what THIS build would allocate for the recipe. Where
// a recipe asks for something not built yet (the zero-bubble schedule with recomputation), the
// placement says so in `notes` and places what this build would allocate instead; the work that
// builds those features extends the placement, so that account and measurement stay equal.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/buffer.h"
#include "trainer/placement/placement.h"

namespace llmtrain::trainer {

struct MemoryAccount {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;      // AdamW's two moments over the owned ranges
  int64_t activations = 0;    // kept between forward and backward, the backward's work buffers
  int64_t communication = 0;  // pipeline receive buffers; ZeRO 1-3's gradient pool (the slots units are
                              // reduce-scattered from) and ZeRO 3's gathered-parameter pool (stage 0
                              // buckets reduce in place). The ZeRO paper's model states are the
                              // other three kinds.
  int64_t head_logits = 0;    // of activations: the LM head's logits, [tokens, padded vocab / tp] per slot
  // checkpoint.async: the host copy of the slices this rank writes (fp32 parameters or master, and
  // both moments), allocated when the run starts. On a cpu rank it shares the host with the rest and
  // counts in total(); on a cuda rank it is host memory beside the device's (`snapshot_on_host`).
  int64_t checkpoint_snapshot = 0;
  bool snapshot_on_host = false;
  // parallel.offload (trainer/optim/offload.h): `optimizer` is then only the staging slots in this
  // rank's memory; the state is in host memory beside a cuda rank's device (offload_host: host
  // offload's store, nvme's slots) or on disk under offload_path (offload_disk).
  int64_t offload_host = 0, offload_disk = 0;
  std::vector<std::string> notes;

  int64_t total() const {
    return parameters + gradients + optimizer + activations + communication +
           (snapshot_on_host ? 0 : checkpoint_snapshot);
  }
};

// What the rank of `placement` allocates, by kind.
MemoryAccount memory_account(const Placement& placement);
// The same for the rank at `coord` of a resolved recipe's layout (layout_of(recipe)):
// memory_account(place(recipe, layout, coord)). Throws llmtrain::Error for a model the Model itself
// would refuse.
MemoryAccount memory_plan(const Recipe& recipe, const Layout& layout, const parallel::MeshCoord& coord);

// What this process's Buffers on `device` hold now (peak = false) or held at most (peak = true),
// by kind; `other` Buffers are not counted.
MemoryAccount memory_measured(kernels::Device device, bool peak);

// "parameters 4.3 MiB, gradients 4.3 MiB, optimizer 8.6 MiB, activations 12 MiB, communication 0 B;
// total 29 MiB"
std::string format_memory(const MemoryAccount& m);

}  // namespace llmtrain::trainer
