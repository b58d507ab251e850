#include "trainer/loop/step_timer.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "common/error.h"
#include "common/log.h"
#include "common/strings.h"

namespace llmtrain::trainer {

namespace {

// Marks a step can make besides three per compute op: its begin, its phase ends (at most nine)
// and the schedule's begin and end.
constexpr int kStepMarks = 16;

double& phase_time(PhaseTimes& t, StepPhase phase) {
  switch (phase) {
    case StepPhase::data:
      return t.data;
    case StepPhase::forward:
      return t.forward;
    case StepPhase::backward:
      return t.backward;
    case StepPhase::grad_sync:
      return t.grad_sync;
    case StepPhase::optimizer:
      return t.optimizer;
  }
  LT_CHECK(false, "step phase {}", int(phase));
  return t.optimizer;
}

size_t count_compute_ops(const std::vector<parallel::PipeOp>& schedule) {
  return size_t(std::count_if(schedule.begin(), schedule.end(),
                              [](const parallel::PipeOp& op) { return parallel::is_compute(op.kind); }));
}

}  // namespace

StepTimer::StepTimer(kernels::Device device, const std::vector<parallel::PipeOp>& schedule)
    : marks_(device, kStepMarks + 3 * int(count_compute_ops(schedule))), compute_ops_(count_compute_ops(schedule)) {
  kinds_.resize(size_t(marks_.count()));
  phases_.resize(size_t(marks_.count()));
  schedule_s_.reserve(kScheduleTimesKept);  // a step allocates nothing
  busy_s_.reserve(kScheduleTimesKept);
  op_s_.reserve(kScheduleTimesKept * compute_ops_);
}

void StepTimer::mark(Mark kind, StepPhase phase) {
  LT_CHECK(used_ < marks_.count(), "a step of {} compute ops made more than {} timing marks", compute_ops_,
           marks_.count());
  kinds_[size_t(used_)] = kind;
  phases_[size_t(used_)] = phase;
  marks_.record(used_++);
}

void StepTimer::step_begin() {
  used_ = 0;
  mark(Mark::step_begin);
}
void StepTimer::phase_end(StepPhase phase) { mark(Mark::phase_end, phase); }
void StepTimer::schedule_begin() { mark(Mark::schedule_begin); }
void StepTimer::schedule_end() { mark(Mark::schedule_end); }
void StepTimer::op_begin() { mark(Mark::op_begin); }
void StepTimer::op_data_read() { mark(Mark::op_data_read); }
void StepTimer::op_end(StepPhase phase) { mark(Mark::op_end, phase); }

void StepTimer::step_end(PhaseTimes& times) {
  // The same window for all three: the last kScheduleTimesKept steps.
  const bool scheduled =
      std::any_of(kinds_.begin(), kinds_.begin() + used_, [](Mark k) { return k == Mark::schedule_end; });
  if (scheduled && schedule_s_.size() == kScheduleTimesKept) {
    schedule_s_.erase(schedule_s_.begin());
    busy_s_.erase(busy_s_.begin());
    op_s_.erase(op_s_.begin(), op_s_.begin() + long(compute_ops_));
  }
  int boundary = 0, schedule = -1, op = -1, read = -1;  // the latest of each kind of mark
  double busy = 0;
  for (int i = 1; i < used_; ++i) {
    const StepPhase phase = phases_[size_t(i)];
    switch (kinds_[size_t(i)]) {
      case Mark::step_begin:
        LT_CHECK(false, "a step begun twice");
        break;
      case Mark::phase_end:
        phase_time(times, phase) += marks_.seconds(boundary, i);
        boundary = i;
        break;
      case Mark::schedule_begin:
        schedule = boundary = i;
        break;
      case Mark::schedule_end:
        LT_CHECK(schedule >= 0, "a schedule's end without its begin");
        schedule_s_.push_back(float(marks_.seconds(schedule, i)));
        busy_s_.push_back(float(busy));
        boundary = i;
        break;
      case Mark::op_begin:
        op = i, read = -1;
        break;
      case Mark::op_data_read:
        times.data += marks_.seconds(op, i);
        read = i;
        break;
      case Mark::op_end: {
        const double took = marks_.seconds(op, i);
        phase_time(times, phase) += read >= 0 ? marks_.seconds(read, i) : took;
        op_s_.push_back(float(took));
        busy += took;
        break;
      }
    }
  }
  LT_CHECK(op_s_.size() % std::max<size_t>(compute_ops_, 1) == 0, "{} op times for {} compute ops a step", op_s_.size(),
           compute_ops_);
}

double measured_schedule_bubble(const Recipe& recipe, int micro_batches, const StepTimer& timer, parallel::Comm& pp) {
  const int v = recipe.parallel.virtual_stages, p = pp.size();
  const parallel::ScheduleSpec spec{p, 0, micro_batches, v};
  const std::vector<std::vector<parallel::PipeOp>> lists = parallel::make_schedules(recipe.parallel.pp_schedule, spec);
  // Every stage runs each micro-batch's forward and backward (or I and W) of each chunk: the same
  // number of compute ops. Where each op sits in its stage's list of them:
  using OpKey = std::tuple<parallel::PipeOpKind, int, int>;  // kind, micro-batch, chunk
  std::vector<std::map<OpKey, size_t>> position(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s)
    for (const parallel::PipeOp& op : lists[size_t(s)])
      if (parallel::is_compute(op.kind))
        position[size_t(s)].emplace(std::tuple{op.kind, op.micro_batch, op.chunk}, position[size_t(s)].size());
  const size_t ops = timer.compute_ops();
  LT_CHECK(position[0].size() == ops, "{} compute ops in the schedule, {} timed a step", position[0].size(), ops);
  const std::vector<float>& mine = timer.op_times();
  const int64_t steps = int64_t(mine.size() / std::max<size_t>(ops, 1));
  std::vector<float> all(size_t(p) * mine.size());
  pp.all_gather(kernels::host_tensor(mine.data(), {int64_t(mine.size())}),
                kernels::host_tensor(all.data(), {int64_t(all.size())}));
  double idle = 0, span = 0;
  for (int64_t k = 0; k < steps; ++k) {
    const parallel::SimulatedStep sim = parallel::simulate_step(lists, [&](int s, const parallel::PipeOp& op) {
      const size_t i = position[size_t(s)].at(std::tuple{op.kind, op.micro_batch, op.chunk});
      return double(all[size_t(s) * mine.size() + size_t(k) * ops + i]);
    });
    const double t = sim.span();
    for (double b : sim.busy) idle += t - b;
    span += t;
  }
  return span > 0 ? idle / (span * double(p)) : 0.0;
}

void report_pipeline_idle(const Recipe& recipe, int micro_batches, const StepTimer& timer, parallel::Comm& control_pp) {
  // Each stage's measured idle time in the schedule, next to the schedule's unit-time bubble: per
  // step, the step's span is the slowest stage's time in the schedule (stages start it together),
  // and a stage idles for the part of the span it did not compute in (waiting for the others).
  const int pp = control_pp.size();
  const std::vector<float>& wall = timer.schedule_times();
  const std::vector<float>& busy = timer.busy_times();
  const int64_t steps = int64_t(wall.size());
  std::vector<float> walls(size_t(pp * steps)), busys(size_t(pp * steps));
  std::vector<float> mine_wall = wall, mine_busy = busy;
  control_pp.all_gather(kernels::host_tensor(mine_wall.data(), {steps}),
                        kernels::host_tensor(walls.data(), {pp * steps}));
  control_pp.all_gather(kernels::host_tensor(mine_busy.data(), {steps}),
                        kernels::host_tensor(busys.data(), {pp * steps}));
  std::vector<double> idle_s(size_t(pp), 0.0);
  double span_s = 0;
  for (int64_t k = 0; k < steps; ++k) {
    double span = 0;
    for (int s = 0; s < pp; ++s) span = std::max(span, double(walls[size_t(s * steps + k)]));
    for (int s = 0; s < pp; ++s) idle_s[size_t(s)] += std::max(0.0, span - double(busys[size_t(s * steps + k)]));
    span_s += span;
  }
  std::vector<std::string> parts;
  double mean = 0;
  for (int s = 0; s < pp; ++s) {
    const double idle = span_s > 0 ? idle_s[size_t(s)] / span_s : 0.0;
    parts.push_back(fmt::format("stage {} {:.1f}%", s, 100.0 * idle));
    mean += idle / pp;
  }
  log_progress(
      "pipeline idle time per stage (measured): {}; mean {:.1f}%, the {} schedule's bubble {:.1f}%; at "
      "the measured op times {:.1f}%",
      join(parts, ", "), 100.0 * mean, to_string(recipe.parallel.pp_schedule),
      100.0 * schedule_bubble(recipe, micro_batches),
      100.0 * measured_schedule_bubble(recipe, micro_batches, timer, control_pp));
}

}  // namespace llmtrain::trainer
