// One optimizer step as its own unit (docs/architecture.md §2, docs/architecture.md "One step"):
//
//   zero grads -> the pipeline schedule over the step's micro-batches (forward, backward; gradient
//   groups handed to the gradient sync as backward completes them) -> finish the gradient sync ->
//   global gradient norm over every group that splits parameters -> clip, or skip a non-finite step
//   -> AdamW on the flat ranges this rank owns -> gather the parameters other ranks updated.
//
// At ZeRO 2 the model has no gradient buffer: the ModelStage forwards its grad-storage hook to
// GradSync::group_grads, and the norm and AdamW read the sync's compact owned shard (owned_grads).
// At ZeRO 3 it has no parameter buffer either: its param-storage hook goes to GradSync::group_params,
// AdamW updates the sync's owned_params() in place, and the model is handed that shard
// (Model::set_param_shard) for initialisation and checkpoints: build the TrainStep, then
// init_parameters or load.
//
// train() (trainer/loop/trainer.cpp) owns everything around it: set-up, resume, reporting, evaluation,
// checkpoints and the stop agreement. The step's timing is not the step's: an observer (StepObserver;
// the timer, trainer/loop/step_timer.h) is told its boundaries, and without one nothing is timed.
//
// Rules a reader could get wrong:
//  - Scalars (the loss, squared norms) cross ranks on the host control groups (comms.control), never
//    on the tensor groups; the per-micro-batch losses are copied off the model's device once per step.
//  - A non-finite loss or gradient norm is the same on every rank (both are all-reduced before the
//    decision), so every rank stops, or skips the same step, together.
//  - Pipeline parallelism (pp > 1): each stage runs its own list; only the last stage computes the
//    loss, which it broadcasts over the pp control group. A tied word embedding has a copy on the
//    first and the last stage; after the schedule the two exchange their gradients over the pp group
//    and each adds the other's (before the data-parallel reduction of that group), so the copies
//    take identical updates. The global norm counts the copy once (ModelParam::tied_copy).
//  - Skipped steps still consume their samples; the optimizer's step count (bias corrections) only
//    counts updates taken.
//  - fp16 (trainer/optim/loss_scaler.h): backward runs on the loss times the scale; the norm is of the
//    scaled gradients and AdamW divides the scale out with the clip factor. An overflow anywhere
//    (a non-finite gradient with a finite loss) is agreed over every rank and skips the step
//    without counting towards max_skipped_steps, unless the scale is already at its minimum.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>

#include "common/error.h"
#include "common/recipe/layout.h"
#include "common/recipe/recipe.h"
#include "kernels/buffer.h"
#include "parallel/grad_sync.h"
#include "parallel/mesh_comms.h"
#include "parallel/pipeline_executor.h"
#include "parallel/pipeline_schedule.h"
#include "trainer/checkpoint/checkpointed_step.h"
#include "trainer/data/micro_batches.h"
#include "trainer/model/model.h"
#include "trainer/optim/loss_scaler.h"
#include "trainer/optim/lr_schedule.h"
#include "trainer/optim/optimizer.h"
#include "trainer/placement/placement.h"
#include "trainer/report/metrics.h"

namespace llmtrain::trainer {

// What a step is made of, for an observer of it (its timer, trainer/loop/step_timer.h).
enum class StepPhase : uint8_t { data, forward, backward, grad_sync, optimizer };

// Watches a step at its boundaries; TrainStep::run calls it only when one is set, so a step without
// one costs nothing (and, on a GPU, waits for nothing but its scalars). Each call marks the point
// after the work queued so far: the work between two boundaries is the phase the later names.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void step_begin() = 0;
  virtual void phase_end(StepPhase phase) = 0;  // the work since the previous boundary was `phase`'s
  // The pipeline schedule's start and end (boundaries both; its waits belong to no phase), and each
  // compute op in it: a forward reports when its micro-batch is read (what came before is data).
  virtual void schedule_begin() = 0;
  virtual void schedule_end() = 0;
  virtual void op_begin() = 0;
  virtual void op_data_read() = 0;
  virtual void op_end(StepPhase phase) = 0;  // forward or backward
  // After the step's last work, its scalars read (or after a skipped step's decision): the times.
  virtual void step_end(PhaseTimes& times) = 0;
};

// Several observers of one step (the timer, and the op profile with log.profile ops), told in the
// order given; null entries are left out.
class StepObservers final : public StepObserver {
 public:
  StepObservers(std::initializer_list<StepObserver*> observers) {
    LT_CHECK(observers.size() <= size_t(kMax), "{} step observers (at most {})", observers.size(), kMax);
    for (StepObserver* o : observers)
      if (o) list_[size_++] = o;
  }
  void step_begin() override {
    for (StepObserver* o : list()) o->step_begin();
  }
  void phase_end(StepPhase phase) override {
    for (StepObserver* o : list()) o->phase_end(phase);
  }
  void schedule_begin() override {
    for (StepObserver* o : list()) o->schedule_begin();
  }
  void schedule_end() override {
    for (StepObserver* o : list()) o->schedule_end();
  }
  void op_begin() override {
    for (StepObserver* o : list()) o->op_begin();
  }
  void op_data_read() override {
    for (StepObserver* o : list()) o->op_data_read();
  }
  void op_end(StepPhase phase) override {
    for (StepObserver* o : list()) o->op_end(phase);
  }
  void step_end(PhaseTimes& times) override {
    for (StepObserver* o : list()) o->step_end(times);
  }

 private:
  static constexpr int kMax = 4;
  std::span<StepObserver* const> list() const { return {list_, size_t(size_)}; }
  StepObserver* list_[kMax] = {};
  int size_ = 0;
};

class TrainStep : public CheckpointedStep {
 public:
  // `model`, `batches` and `comms` must outlive the step. `placement`: this rank's
  // (trainer/placement/placement.h), which the model was built with (Placement::model): the step
  // runs its schedule, syncs its gradient groups and updates where and when it says, and checks
  // that what it allocates is what it counts.
  TrainStep(const Recipe& recipe, const Placement& placement, Model& model, parallel::MeshComms& comms,
            MicroBatchReader& batches);
  ~TrainStep();
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  // Takes optimizer step `step` (0-based: the update that makes `step + 1` steps done) on the
  // global batch that starts after `consumed_samples`. Throws llmtrain::Error on a non-finite step
  // with on_nonfinite: stop, or after max_skipped_steps skipped in a row.
  StepOutcome run(int64_t step, int64_t consumed_samples);

  AdamW& optimizer() override { return *optimizer_; }
  // 16-bit parameters (the optimizer keeps an fp32 master; no-ops without one): the master from
  // the initialised parameters, and the parameters from a master loaded from a checkpoint (rounded
  // into the owned ranges, then gathered on every data-parallel rank; collective over dp).
  void master_from_params();
  void params_from_master() override;
  const LossScaler* loss_scaler() const { return scaler_.get(); }  // precision fp16 only, else null
  // The CPU update (offload host): how many of the store's units had their gradients start down to
  // host memory during the last updated step's backward, and by its update (the rest of them as
  // their reductions completed in the sync's finish()); the update copies the others itself.
  // Updating during backward (updates_during_backward), also how many units the CPU had updated by
  // the time the step reached its update (the rest of backward, the norm and the loss ran beside).
  struct EarlyCopies {
    int64_t in_backward = 0, before_update = 0, updated_early = 0;
  };
  const EarlyCopies& early_copies() const { return early_copies_; }
  // The CPU update runs during backward (AdamW::update_as_gradients_arrive): offload host, and the
  // update is known before the gradient norm — no clipping, no loss scaling, and a non-finite step
  // stops the run rather than being skipped.
  bool updates_during_backward() const;
  // Fault injection for tests: when `at(step)` is true, this rank's gradients hold an inf after the
  // gradient sync (on this rank only), as an fp16 overflow would leave them.
  void set_overflow_injection(std::function<bool(int64_t step)> at) { inject_overflow_ = std::move(at); }
  // The observer of the following steps (null: none; StepOutcome::times stay zero). It must outlive
  // them.
  void set_observer(StepObserver* observer) { observer_ = observer; }
  // This stage's instruction list for one step.
  const std::vector<parallel::PipeOp>& schedule() const { return executor_->ops(); }
  const parallel::GradSync& grad_sync() const override { return *sync_; }
  const Layout& layout() const override { return placement_.layout; }
  const Placement& placement() const { return placement_; }

  // What a checkpoint keeps of the step's own state (the skip counters), and its restoration with
  // the step a checkpoint was written at.
  nlohmann::json state() const override;
  void restore(const nlohmann::json& state, int64_t step) override;

 private:
  class ModelStage;

  const Recipe& recipe_;
  const Placement placement_;
  const Layout& layout_ = placement_.layout;
  Model& model_;
  parallel::MeshComms& comms_;
  int micro_batches_ = 0;
  // MoE blocks: this stage's (global layers, in the model's local order) and the model's MoE layer
  // count; each micro-batch's routing statistics land in scalars_ after the losses and norm parts.
  std::vector<int> moe_layers_;
  int moe_total_ = 0;
  int64_t moe_width_ = 0;  // floats per block and micro-batch: 2 · experts + 2
  // ZeRO 3 with offload_params: the owned values' reader over the optimizer's store (before the sync,
  // which takes from it, and outliving it).
  std::unique_ptr<parallel::OwnedValues> owned_values_;
  std::unique_ptr<parallel::GradSync> sync_;
  std::unique_ptr<AdamW> optimizer_;
  kernels::Buffer initial_shard_;  // offload_params: the model's initial values, until master_from_params
  std::unique_ptr<ModelStage> stage_;
  std::unique_ptr<parallel::PipelineExecutor> executor_;
  // The step's scalars on the model's device: the micro-batch losses [micro_batches], then the
  // gradient norm's parts [norm_pieces_] (trainer/optim/optimizer.h); read by the host in one copy
  // a step, into scalars_host_.
  kernels::Buffer scalars_;
  std::vector<float> scalars_host_;
  int64_t norm_pieces_ = 0;
  std::vector<parallel::FlatRange> norm_ranges_;  // the owned ranges whose squares this rank counts
  std::optional<GradNormPlan> norm_plan_;         // their pieces' Σ g² in one op
  bool norm_over_world_ = false;                  // summed over the world (else the model-parallel group)
  int64_t skipped_total_ = 0, skipped_in_a_row_ = 0;
  EarlyCopies early_copies_, copies_now_;  // of the last update, and of the step being taken
  std::unique_ptr<LossScaler> scaler_;
  LrScheduler lr_;  // the recipe's schedule, continued after a resume that moved its end
  std::function<bool(int64_t)> inject_overflow_;
  // pp > 1 with tied embeddings, on the first and the last stage: the token embedding's index in
  // model.parameters(), the other stage's pp rank, and where its gradient lands.
  int tied_param_ = -1, tied_peer_ = -1;
  StepObserver* observer_ = nullptr;
  kernels::Buffer tied_scratch_;

  StepOutcome take_step(int64_t step, int64_t consumed_samples);  // the sequence run() observes
  // The step's MoE statistics from the scalars read (host), summed over the pipeline stages and
  // averaged (auxiliary losses) or summed (picks) over the data-parallel ranks.
  std::vector<MoeLayerStats> moe_stats(std::span<const float> host);
  void phase_end(StepPhase phase) {
    if (observer_) observer_->phase_end(phase);
  }
  void sum_tied_grads();
  kernels::Tensor step_params() const;  // what the optimizer updates: the flat parameters, or ZeRO 3's owned values
};

// The step's gradient sync of `model` (built with `placement`'s options; its parameter groups,
// Placement::groups): make_grad_sync over dp × cp at the layout's ZeRO stage, or with sharded
// experts (Placement::experts_sharded) the expert-parallel sync (parallel::make_expert_grad_sync:
// their gradients over the edp group). `owned_values`: ZeRO 3's owned values outside the sync
// (parallel::GradSyncLayout::owned_values), which must outlive it.
std::unique_ptr<parallel::GradSync> make_step_grad_sync(const Placement& placement, const Model& model,
                                                        parallel::MeshComms& comms,
                                                        parallel::OwnedValues* owned_values = nullptr);

// The bubble of the recipe's schedule over `micro_batches` micro-batches: idle stage-slots over all
// of them when forward and backward take one unit (parallel::Timeline::bubble_fraction). Throws
// for a schedule make_schedule refuses.
double schedule_bubble(const Recipe& recipe, int micro_batches);

}  // namespace llmtrain::trainer
