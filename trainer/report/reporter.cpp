#include "trainer/report/reporter.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "common/clock.h"
#include "common/log.h"
#include "trainer/placement/memory.h"

namespace llmtrain::trainer {
namespace {
kernels::Device device_of(const Recipe& r) {
  return r.train.device == DeviceKind::cuda ? kernels::Device::cuda : kernels::Device::cpu;
}
}  // namespace

Reporter::Reporter(const Recipe& recipe, parallel::Comm& world, int64_t start_step, double flops_per_token,
                   double peak_flops, int dp)
    : recipe_(recipe),
      world_(world),
      on_(world.rank() == 0),
      terminal_(on_ && isatty(STDERR_FILENO)),
      report_comm_(dp > 1),
      start_step_(start_step),
      flops_per_token_(flops_per_token),
      peak_flops_(peak_flops),
      tokens_per_step_(int64_t(recipe.train.global_batch) * recipe.model.seq_len),
      bar_(stderr, terminal_, 0, recipe.name),
      start_s_(now_s()),
      interval_start_s_(start_s_),
      compute_s_(size_t(world.size())) {
  if (on_) metrics_.emplace(recipe.log.dir, start_step);
  if (on_ && recipe.log.tensorboard) tensorboard_.emplace(recipe.log.dir + "/tensorboard", start_step + 1);
}

Reporter::Stragglers Reporter::find_stragglers() {
  const int n = world_.size();
  if (n == 1) return {};
  float mine = float(interval_times_.compute());
  world_.all_gather(kernels::host_tensor(&mine, {1}), kernels::host_tensor(compute_s_.data(), {n}));
  std::vector<float> sorted = compute_s_;
  std::sort(sorted.begin(), sorted.end());
  Stragglers out;
  // The lower median: with two ranks, the faster one (the mean of two would halve any slowdown).
  out.median = sorted[size_t((n - 1) / 2)];
  if (!(out.median > 0)) return {};
  for (int r = 0; r < n; ++r)
    if (compute_s_[size_t(r)] > recipe_.log.straggler_factor * out.median) out.ranks.push_back(r);
  out.slowest_vs_median = double(sorted.back()) / out.median;
  return out;
}

void Reporter::step_done(int64_t step, const StepOutcome& outcome, const parallel::GradBucketStats& comm) {
  ++interval_steps_;
  interval_times_ += outcome.times;
  if (!outcome.skipped) {
    loss_sum_ += outcome.loss;
    ++loss_count_;
  }
  const int64_t total = recipe_.train.steps;
  if (step % recipe_.log.every == 0 || step == total) {
    const Stragglers stragglers = find_stragglers();
    if (on_) {
      const double t = now_s(), interval = std::max(1e-9, t - interval_start_s_);
      StepMetrics sm;
      sm.step = step;
      sm.steps_total = total;
      sm.loss = loss_count_ ? loss_sum_ / double(loss_count_) : double(outcome.loss);
      sm.lr = outcome.lr;
      sm.grad_norm = outcome.grad_norm;
      sm.moe = outcome.moe;
      sm.tokens_per_s = double(interval_steps_ * tokens_per_step_) / interval;
      sm.mfu = flops_per_token_ * sm.tokens_per_s / peak_flops_;
      sm.elapsed_s = t - start_s_;
      sm.eta_s = sm.elapsed_s / double(step - start_step_) * double(total - step);
      sm.tokens = step * tokens_per_step_;
      sm.skipped_steps = outcome.skipped_total;
      sm.loss_scale = outcome.loss_scale;
      if (report_comm_) {
        sm.comm_exposed = (comm.exposed_s - exposed_at_interval_) / interval;
        exposed_at_interval_ = comm.exposed_s;
      }
      const double per = 1.0 / double(interval_steps_);
      const PhaseTimes& it = interval_times_;
      sm.per_step = {it.data * per,      it.forward * per,   it.backward * per,
                     it.grad_sync * per, it.optimizer * per, it.checkpoint * per};
      sm.stragglers = stragglers.ranks;
      sm.slowest_vs_median = stragglers.slowest_vs_median;
      metrics_->write(sm);
      if (tensorboard_) tensorboard_write_step(*tensorboard_, sm, memory_measured(device_of(recipe_), /*peak=*/true));
      end_line();
      log_progress("{}", format_step_line(sm));
      for (int r : stragglers.ranks)
        log_warn(
            "rank {} is a straggler: its compute took {:.2f}× the median rank's ({:.1f} vs {:.1f} ms per step over "
            "steps {}-{}; log.straggler_factor {})",
            r, compute_s_[size_t(r)] / stragglers.median, 1e3 * compute_s_[size_t(r)] * per,
            1e3 * stragglers.median * per, step - interval_steps_ + 1, step, recipe_.log.straggler_factor);
      interval_start_s_ = t;
    }
    interval_steps_ = 0;
    loss_sum_ = 0;
    loss_count_ = 0;
    interval_times_ = {};
  }
  if (terminal_) bar_.update(double(step) / double(total), fmt::format("step {}/{}", step, total));
}

double Reporter::elapsed_s() const { return now_s() - start_s_; }

void Reporter::eval_done(int64_t step, float val_loss) {
  if (!on_) return;
  EvalMetrics em{step, val_loss, std::exp(double(val_loss)), step * tokens_per_step_};
  metrics_->write(em);
  if (tensorboard_) tensorboard_write_eval(*tensorboard_, em);
  log_progress("{}", format_eval_line(em));
}

void Reporter::end_line() {
  if (terminal_) bar_.finish();
}

}  // namespace llmtrain::trainer
