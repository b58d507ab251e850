// What a run reports: `metrics.jsonl` in the run directory (one JSON object per logged step and one
// per evaluation; fields in docs/metrics.md) and the console line every log.every steps, with a
// progress bar when stderr is a terminal.
//
// Rule a reader could get wrong: a resumed run first drops the records of steps after the step it
// resumes from (a killed run may have logged steps whose checkpoint never completed), so the file
// always describes one consistent trajectory.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace llmtrain::trainer {

// Seconds this rank spent in each phase (Megatron's timers): reading micro-batches, forward,
// backward, waiting for the gradient sync after backward (the communication backward did not
// hide), the optimizer (norm, clip, update, parameter gather); checkpoints are timed by the loop.
// compute() leaves out every wait for other ranks, so it differs between ranks only by how fast
// each computes (the straggler report compares it).
struct PhaseTimes {
  double data = 0, forward = 0, backward = 0, grad_sync = 0, optimizer = 0, checkpoint = 0;
  double compute() const { return data + forward + backward + optimizer; }
  PhaseTimes& operator+=(const PhaseTimes& o);
};

// One MoE block's routing over a step (docs/metrics.md, "Mixture of experts"): the top-k picks each
// expert received (summed over the step's micro-batches and the data-parallel ranks, before any
// capacity drop), the picks dropped over capacity, and the auxiliary losses (each the mean over
// micro-batches and data-parallel ranks of the per-micro-batch value, without its coefficient's
// scaling undone: what joined the objective).
struct MoeLayerStats {
  int layer = 0;
  std::vector<double> tokens;  // per expert
  double dropped = 0;
  double aux_loss = 0, z_loss = 0;

  double tokens_min() const;
  double tokens_max() const;
  double tokens_cv() const;  // coefficient of variation: standard deviation / mean (0: balanced)
};

// One optimizer step's outcome, as TrainStep::run returns it (trainer/loop/train_step.h) and the
// reporter reads it (trainer/report/reporter.h).
struct StepOutcome {
  float loss = 0;        // mean over the step's micro-batches and data-parallel ranks
  double grad_norm = 0;  // global, before clipping
  double lr = 0;
  bool skipped = false;            // non-finite or a loss-scale overflow: no update
  int64_t skipped_total = 0;       // steps skipped so far in the run, this one included
  bool overflow = false;           // fp16: the scaled gradients overflowed on some rank (skipped)
  double loss_scale = 0;           // fp16: the scale this step's backward used (0 without loss scaling)
  std::vector<MoeLayerStats> moe;  // every MoE block's routing, on every rank (empty for a dense model)
  PhaseTimes times;
};

struct StepMetrics {
  int64_t step = 0;  // optimizer steps completed, 1-based
  int64_t steps_total = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;  // over the steps since the last record
  double mfu = 0;           // fraction of the peak × ranks (docs/metrics.md, "MFU")
  double elapsed_s = 0;     // since this process started training
  double eta_s = 0;
  int64_t tokens = 0;  // tokens consumed since step 0
  int64_t skipped_steps = 0;
  double loss_scale = 0;           // fp16: the loss scale of the step (0 without loss scaling: not written)
  double comm_exposed = -1;        // data parallelism: share of step time waiting for gradient all-reduces
                                   // that backward did not hide (-1 without data parallelism)
  PhaseTimes per_step;             // seconds per step in each phase, over the steps since the last record
  std::vector<int> stragglers;     // world ranks whose compute time exceeded log.straggler_factor × median
  double slowest_vs_median = 0;    // the slowest rank's compute time over the median (several ranks)
  std::vector<MoeLayerStats> moe;  // the logged step's, per MoE block (empty for a dense model)
};

struct EvalMetrics {
  int64_t step = 0;
  double val_loss = 0;
  double val_ppl = 0;
  int64_t tokens = 0;
};

class MetricsLog {
 public:
  // Opens `<dir>/metrics.jsonl` for appending; with `resume_step` >= 0, first keeps only the records
  // of steps <= resume_step. `dir` empty: no file (ranks other than the logging one).
  MetricsLog(const std::string& dir, int64_t resume_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void write(const StepMetrics& m);
  void write(const EvalMetrics& m);
  const std::string& path() const { return path_; }

 private:
  void append(const nlohmann::json& j);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// The console line for a step: "step 120/2000 | loss 2.3140 | lr 9.98e-04 | ...".
std::string format_step_line(const StepMetrics& m);
std::string format_eval_line(const EvalMetrics& m);

}  // namespace llmtrain::trainer
