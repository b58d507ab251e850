// The op profile of a run (log.profile: ops; docs/metrics.md "Per-op timing"): a StepObserver that
// times every op and library call of log.profile_steps steps, by name (kernels/op_profile.h), and
// the report train() makes of it at the end of the run: rank 0's table in its log and
// `<log.dir>/op_profile.json`.
//
// Which steps: the first step the observer sees (this run's first, a resumed run's too) is the
// warm-up: its ops are counted, not timed, and the pool of marks is sized from that count after it;
// the next log.profile_steps steps are timed; later steps are not observed at all.
//
// The rules a reader could get wrong: the profile is an observer, never part of the step; it marks
// the step's work on the device's stream and reads the marks in step_end, after the step's scalars
// are on the host, which on cuda waits for the step's last op (the step's timer waits there too).
// A profiled step allocates nothing (tests/trainer/loop/test_train_step.cpp); with log.profile none
// the observer is not set at all (enabled() is false) and an op costs one null check.
#pragma once

#include <cstdint>
#include <memory>

#include "common/file_io.h"
#include "common/recipe/recipe.h"
#include "kernels/device_marks.h"
#include "kernels/op_profile.h"
#include "trainer/loop/train_step.h"
#include "trainer/report/op_profile_report.h"

namespace llmtrain::trainer {

class OpProfiler final : public StepObserver {
 public:
  // Times `log.profile_steps` steps on `device` when log.profile is ops; else it times nothing.
  OpProfiler(const LogConfig& log, kernels::Device device);

  bool enabled() const { return steps_ > 0; }
  // The steps timed so far, and whether all log.profile_steps of them are.
  int64_t steps_timed() const { return timed_; }
  bool done() const { return timed_ == steps_; }

  void step_begin() override;
  void phase_end(StepPhase) override {}
  void schedule_begin() override {}
  void schedule_end() override {}
  void op_begin() override {}
  void op_data_read() override {}
  void op_end(StepPhase) override {}
  void step_end(PhaseTimes& times) override;

  // The totals so far. `start_step`: the steps done before the first step observed (a resumed run's
  // checkpoint step), for the step numbers.
  OpProfileSummary summary(int rank, int64_t start_step) const;

 private:
  enum class Pass : uint8_t { none, counting, timing };
  kernels::Device device_;
  int64_t steps_ = 0, seen_ = 0, timed_ = 0;
  Pass pass_ = Pass::none;
  kernels::OpProfile profile_;
  std::unique_ptr<kernels::DeviceMarks> step_marks_;  // a timed step's begin and end
  double step_s_ = 0;
};

// The end of a run with log.profile ops (a no-op without): rank 0 logs the table and writes
// `<log.dir>/op_profile.json` atomically; the other ranks write nothing.
void report_op_profile(const Recipe& recipe, const OpProfiler& profiler, int rank, int64_t start_step, FileSystem& fs);

}  // namespace llmtrain::trainer
