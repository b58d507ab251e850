// What a run tells the user around its steps (docs/metrics.md): the Reporter's records and console
// lines (trainer/report/reporter.h), and the lines of the run's start and end that read the loop's
// parts — what MFU is measured against, the memory measured after the first step and the peaks at
// the end, offloaded optimizer state and its traffic, the pipeline's idle time (the StepTimer's)
// and the op profile (the OpProfiler's). An observer of the run (trainer/loop/run_observer.h):
// train() tells it where the run is, and it reports.
//
// Rule a reader could get wrong: every rank makes one, and every rank's calls are needed, though
// only world rank 0 writes: record steps gather every rank's compute time (the straggler report)
// and the end's pipeline report is collective over pp.
#pragma once

#include <cstdint>

#include "common/file_io.h"
#include "common/recipe/recipe.h"
#include "kernels/backend_info.h"
#include "trainer/loop/op_profiler.h"
#include "trainer/loop/run_observer.h"
#include "trainer/loop/step_timer.h"
#include "trainer/loop/train_step.h"
#include "trainer/loop/trainer.h"
#include "trainer/report/reporter.h"

namespace llmtrain::trainer {

class RunReport final : public RunObserver {
 public:
  // After the resume: the run trains from `start_step`, `micro_batches` micro-batches a step on each
  // data-parallel rank, on `device`. Logs the run's size and what MFU is measured against.
  // Everything given must outlive it.
  RunReport(const TrainContext& ctx, TrainStep& step, kernels::Device device, const StepTimer& timer,
            const OpProfiler& profile, FileSystem& fs, int64_t start_step, int micro_batches);

  // The loop's own work, for the records: a checkpoint's seconds, an evaluation's loss.
  void checkpoint_done(double seconds) { reporter_.checkpoint_done(seconds); }
  void eval_done(int64_t step, float val_loss) { reporter_.eval_done(step, val_loss); }
  // Ends the progress bar's line (before a line of the loop's own).
  void end_line() { reporter_.end_line(); }

  void step_done(int64_t step, StepOutcome& outcome) override;
  void step_boundary(int64_t) override {}
  void run_end(int64_t step, RunEnd end) override;

 private:
  const Recipe& recipe_;
  parallel::MeshComms& comms_;
  TrainStep& step_;
  kernels::Device device_;
  const StepTimer& timer_;
  const OpProfiler& profile_;
  FileSystem& fs_;
  int micro_batches_;
  const kernels::CpuPeak rank_peak_;  // measured before the reporter's clock starts
  Reporter reporter_;
};

// The line about offloaded optimizer state (parallel.offload) at the start of a run: its size,
// where it lives and how AdamW reaches it. Nothing without offload.
void log_offload(const Recipe& recipe, const AdamW& optimizer, kernels::Device device);

}  // namespace llmtrain::trainer
