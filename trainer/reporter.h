// What the training loop reports as it goes: metrics.jsonl records and the console line every
// log.every steps (and at the last step), evaluation records, and on a terminal a progress bar
// (trainer/metrics.h has the record formats, docs/metrics.md their fields), and with log.tensorboard
// the same records as TensorBoard scalars in <log.dir>/tensorboard/ (trainer/tensorboard.h).
//
// Rules a reader could get wrong:
//  - Only the job's reporting rank (world rank 0) writes anything; the others keep no state.
//  - A record's loss is the mean over the steps since the previous record, leaving out steps
//    skipped as non-finite (with log.every: 1, that step's exact loss); tokens/s and the share of
//    exposed communication are over the same interval.
#pragma once

#include <cstdint>
#include <optional>

#include "common/recipe/recipe.h"
#include "parallel/grad_buckets.h"
#include "trainer/metrics.h"
#include "trainer/progress_bar.h"
#include "trainer/tensorboard.h"
#include "trainer/train_step.h"

namespace llmtrain::trainer {

class Reporter {
 public:
  // `start_step`: the step training starts from (a resumed run's). `peak_flops`: the whole job's,
  // for MFU. `dp`: data-parallel ranks (communication is reported when there are several).
  Reporter(const Recipe& recipe, bool reporting_rank, int64_t start_step, double flops_per_token, double peak_flops,
           int dp);

  // After step `step` (steps done) completed with `outcome`; `comm` are the gradient sync's totals.
  void step_done(int64_t step, const StepOutcome& outcome, const parallel::GradBucketStats& comm);
  void eval_done(int64_t step, float val_loss);
  // Ends the progress bar's line (before a message of the loop's own, and at the end).
  void end_line();
  // Seconds since training started in this process.
  double elapsed_s() const;
  int64_t start_step() const { return start_step_; }

 private:
  const Recipe& recipe_;
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
};

}  // namespace llmtrain::trainer
