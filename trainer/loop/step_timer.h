// The step's timer: a StepObserver (trainer/loop/train_step.h) that times the phases of each step
// (data, forward, backward, gradient sync, optimizer: StepOutcome::times, which the progress line and
// metrics.jsonl report), and keeps, over the last kScheduleTimesKept steps, this rank's time in the
// pipeline schedule, its compute time in it, and each compute op's time: with every stage's, the
// measured idle time per stage and the schedule's bubble at the measured op times
// (report_pipeline_idle).
//
// The rule a reader could get wrong: the timer never makes the device wait inside a step. It marks
// each boundary on the device's own stream of work (kernels::DeviceMarks: the host clock on the CPU,
// events on cuda) and reads the marks in step_end, after the step's scalars are on the host; on cuda
// the phases are therefore device time, and host-only work (the control groups' scalar collectives)
// takes none of it. Without a timer (TrainStep::set_observer(nullptr)) nothing is timed at all.
#pragma once

#include <cstddef>
#include <vector>

#include "common/recipe/recipe.h"
#include "kernels/device_marks.h"
#include "parallel/comm/comm.h"
#include "trainer/loop/train_step.h"

namespace llmtrain::trainer {

class StepTimer final : public StepObserver {
 public:
  // For the steps of `schedule` (this stage's list) on `device`. Allocates everything a step's
  // timing needs here: a timed step allocates nothing.
  StepTimer(kernels::Device device, const std::vector<parallel::PipeOp>& schedule);

  void step_begin() override;
  void phase_end(StepPhase phase) override;
  void schedule_begin() override;
  void schedule_end() override;
  void op_begin() override;
  void op_data_read() override;
  void op_end(StepPhase phase) override;
  void step_end(PhaseTimes& times) override;

  // This rank's time in the pipeline schedule of each of the last kScheduleTimesKept steps (oldest
  // first), and of that the time it computed or read data (forward, backward, data reads): with
  // every stage's, the measured idle time. Stages start a step's schedule together (the previous
  // step ends in collectives over every rank).
  static constexpr size_t kScheduleTimesKept = 4096;
  const std::vector<float>& schedule_times() const { return schedule_s_; }
  const std::vector<float>& busy_times() const { return busy_s_; }
  // The seconds each of this stage's compute ops took (a forward with its data read), in list
  // order, compute_ops() per step, for the same steps as schedule_times().
  const std::vector<float>& op_times() const { return op_s_; }
  size_t compute_ops() const { return compute_ops_; }

 private:
  enum class Mark : uint8_t { step_begin, phase_end, schedule_begin, schedule_end, op_begin, op_data_read, op_end };
  void mark(Mark kind, StepPhase phase = StepPhase::optimizer);

  kernels::DeviceMarks marks_;
  std::vector<Mark> kinds_;  // per mark of the current step
  std::vector<StepPhase> phases_;
  int used_ = 0;
  size_t compute_ops_ = 0;
  std::vector<float> schedule_s_, busy_s_, op_s_;
};

// The schedule's bubble, step by step, when each compute op takes the time it took in that step
// (StepTimer::op_times, all-gathered over `pp`: collective over it) and communication none
// (parallel::simulate_step), summed as the measured idle time is (idle over span, over the steps):
// the bubble the schedule leaves on these stages with their imbalance, their real forward:backward
// ratios and their op-to-op variation, without transfer costs.
double measured_schedule_bubble(const Recipe& recipe, int micro_batches, const StepTimer& timer, parallel::Comm& pp);

// At the end of a pipelined run (pp > 1): logs each stage's measured idle time in the schedule next
// to the schedule's unit-time bubble and its bubble at the measured op times. Collective over
// `control_pp`; every rank must have timed the same steps.
void report_pipeline_idle(const Recipe& recipe, int micro_batches, const StepTimer& timer, parallel::Comm& control_pp);

}  // namespace llmtrain::trainer
