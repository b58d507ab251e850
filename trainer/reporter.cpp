#include "trainer/reporter.h"

#include <unistd.h>

#include <chrono>
#include <cmath>

#include "common/log.h"
#include "trainer/memory.h"

namespace llmtrain::trainer {
namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

Reporter::Reporter(const Recipe& recipe, bool reporting_rank, int64_t start_step, double flops_per_token,
                   double peak_flops, int dp)
    : recipe_(recipe),
      on_(reporting_rank),
      terminal_(reporting_rank && isatty(STDERR_FILENO)),
      report_comm_(dp > 1),
      start_step_(start_step),
      flops_per_token_(flops_per_token),
      peak_flops_(peak_flops),
      tokens_per_step_(int64_t(recipe.train.global_batch) * recipe.model.seq_len),
      bar_(stderr, terminal_, 0, recipe.name),
      start_s_(now_s()),
      interval_start_s_(start_s_) {
  if (on_) metrics_.emplace(recipe.log.dir, start_step);
  if (on_ && recipe.log.tensorboard) tensorboard_.emplace(recipe.log.dir + "/tensorboard", start_step + 1);
}

void Reporter::step_done(int64_t step, const StepOutcome& outcome, const parallel::GradBucketStats& comm) {
  if (!on_) return;
  ++interval_steps_;
  if (!outcome.skipped) {
    loss_sum_ += outcome.loss;
    ++loss_count_;
  }
  const int64_t total = recipe_.train.steps;
  if (step % recipe_.log.every == 0 || step == total) {
    const double t = now_s(), interval = std::max(1e-9, t - interval_start_s_);
    StepMetrics sm;
    sm.step = step;
    sm.steps_total = total;
    sm.loss = loss_count_ ? loss_sum_ / double(loss_count_) : double(outcome.loss);
    sm.lr = outcome.lr;
    sm.grad_norm = outcome.grad_norm;
    sm.tokens_per_s = double(interval_steps_ * tokens_per_step_) / interval;
    sm.mfu = flops_per_token_ * sm.tokens_per_s / peak_flops_;
    sm.elapsed_s = t - start_s_;
    sm.eta_s = sm.elapsed_s / double(step - start_step_) * double(total - step);
    sm.tokens = step * tokens_per_step_;
    sm.skipped_steps = outcome.skipped_total;
    if (report_comm_) {
      sm.comm_exposed = (comm.exposed_s - exposed_at_interval_) / interval;
      exposed_at_interval_ = comm.exposed_s;
    }
    metrics_->write(sm);
    if (tensorboard_) {
      const auto device = recipe_.train.device == DeviceKind::cuda ? kernels::Device::cuda : kernels::Device::cpu;
      tensorboard_write_step(*tensorboard_, sm, memory_measured(device, /*peak=*/true));
    }
    end_line();
    log_progress("{}", format_step_line(sm));
    interval_start_s_ = t;
    interval_steps_ = 0;
    loss_sum_ = 0;
    loss_count_ = 0;
  }
  if (terminal_) bar_.update(double(step) / double(total), fmt::format("step {}/{}", step, total));
}

void Reporter::eval_done(int64_t step, float val_loss) {
  if (!on_) return;
  EvalMetrics em{step, val_loss, std::exp(double(val_loss)), step * tokens_per_step_};
  metrics_->write(em);
  if (tensorboard_) tensorboard_write_eval(*tensorboard_, em);
  log_progress("{}", format_eval_line(em));
}

double Reporter::elapsed_s() const { return now_s() - start_s_; }

void Reporter::end_line() {
  if (terminal_) bar_.finish();
}

}  // namespace llmtrain::trainer
