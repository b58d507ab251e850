// What the training loop reports as it goes: metrics.jsonl records and the console line every
// log.every steps (and at the last step), evaluation records, and on a terminal a progress bar
// (trainer/report/metrics.h has the record formats, docs/metrics.md their fields), and with log.tensorboard
// the same records as TensorBoard scalars in <log.dir>/tensorboard/ (trainer/report/tensorboard.h).
//
// Rules a reader could get wrong:
//  - Every rank calls step_done() for every step: with several ranks, each record step gathers
//    every rank's compute time over the world control group (the straggler report). Only the
//    reporting rank (world rank 0) writes anything.
//  - A record's loss is the mean over the steps since the previous record, leaving out steps
//    skipped as non-finite (with log.every: 1, that step's exact loss); tokens/s, phase times and
//    the share of exposed communication are over the same interval.
#pragma once

#include <cstdint>
#include <optional>

#include "common/recipe/recipe.h"
#include "parallel/comm/comm.h"
#include "parallel/grad_buckets.h"
#include "trainer/report/metrics.h"
#include "trainer/report/progress_bar.h"
#include "trainer/report/tensorboard.h"

namespace llmtrain::trainer {

class Reporter {
 public:
  // `start_step`: the step training starts from (a resumed run's). `peak_flops`: the whole job's,
  // for MFU. `world`: the world control group; `dp`: data-parallel ranks (communication is
  // reported when there are several).
  Reporter(const Recipe& recipe, parallel::Comm& world, int64_t start_step, double flops_per_token, double peak_flops,
           int dp);

  // After step `step` (steps done) completed with `outcome`; `comm` are the gradient sync's totals.
  // Collective over `world` on record steps.
  void step_done(int64_t step, const StepOutcome& outcome, const parallel::GradBucketStats& comm);
  // A checkpoint written after the last step took `seconds` (counted in the next record).
  void checkpoint_done(double seconds) { interval_times_.checkpoint += seconds; }
  void eval_done(int64_t step, float val_loss);
  // Ends the progress bar's line (before a message of the loop's own, and at the end).
  void end_line();
  // Seconds since training started in this process.
  double elapsed_s() const;
  int64_t start_step() const { return start_step_; }

 private:
  // World ranks whose compute time over the interval exceeds log.straggler_factor × the median
  // (every rank must call it on a record step; with one rank there are none).
  struct Stragglers {
    std::vector<int> ranks;
    double median = 0;             // seconds of compute over the interval
    double slowest_vs_median = 0;  // 0 with one rank
  };
  Stragglers find_stragglers();

  const Recipe& recipe_;
  parallel::Comm& world_;
  bool on_;
  bool terminal_;
  bool report_comm_;
  int64_t start_step_;
  double flops_per_token_, peak_flops_;
  int64_t tokens_per_step_;
  std::optional<MetricsLog> metrics_;
  std::optional<TensorBoardWriter> tensorboard_;  // log.tensorboard
  ProgressBar bar_;
  double start_s_, interval_start_s_;
  int64_t interval_steps_ = 0;
  double loss_sum_ = 0;
  int64_t loss_count_ = 0;
  double exposed_at_interval_ = 0;
  PhaseTimes interval_times_;
  std::vector<float> compute_s_;  // per world rank, gathered on record steps
};

}  // namespace llmtrain::trainer
