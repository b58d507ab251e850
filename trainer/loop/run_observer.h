// What watches a run (train(), trainer/loop/trainer.cpp) at its points, as StepObserver watches a
// step: the loop is the sequence of the run, and what only looks on hangs off it here — its
// report (RunReport, trainer/loop/run_report.h) and, in the tests of failure handling, fault
// injection (FaultInjector, trainer/loop/fault_injection.h).
//
// Rules a reader could get wrong:
//  - step_done comes before anything of the step is reported or saved, and an observer may add to
//    the outcome's times (the slow fault's sleep is forward time); so the order of RunObservers
//    matters: fault injection before the report.
//  - step_boundary comes after the step's evaluation and checkpoint, before the stop agreement: a
//    fault that kills the rank there leaves that step's checkpoint written.
//  - Every rank calls each at the same points (run_end's pipeline report is collective over pp).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>

#include "common/error.h"
#include "trainer/report/metrics.h"

namespace llmtrain::trainer {

// How a run ends: all train.steps done, or stopped by a signal (its checkpoint written, exit 75).
enum class RunEnd : uint8_t { done, interrupted };

class RunObserver {
 public:
  virtual ~RunObserver() = default;
  // Step `step` (steps done) was taken with `outcome`.
  virtual void step_done(int64_t step, StepOutcome& outcome) = 0;
  // Everything of step `step` is done (evaluation, checkpoint); the loop may stop after it.
  virtual void step_boundary(int64_t step) = 0;
  // The run ends at `step`, its last checkpoint written.
  virtual void run_end(int64_t step, RunEnd end) = 0;
};

// Several observers of one run, told in the order given; null entries are left out.
class RunObservers final : public RunObserver {
 public:
  RunObservers(std::initializer_list<RunObserver*> observers) {
    LT_CHECK(observers.size() <= size_t(kMax), "{} run observers (at most {})", observers.size(), kMax);
    for (RunObserver* o : observers)
      if (o) list_[size_++] = o;
  }
  void step_done(int64_t step, StepOutcome& outcome) override {
    for (RunObserver* o : list()) o->step_done(step, outcome);
  }
  void step_boundary(int64_t step) override {
    for (RunObserver* o : list()) o->step_boundary(step);
  }
  void run_end(int64_t step, RunEnd end) override {
    for (RunObserver* o : list()) o->run_end(step, end);
  }

 private:
  static constexpr int kMax = 4;
  std::span<RunObserver* const> list() const { return {list_, size_t(size_)}; }
  RunObserver* list_[kMax] = {};
  int size_ = 0;
};

}  // namespace llmtrain::trainer
