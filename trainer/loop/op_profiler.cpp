#include "trainer/loop/op_profiler.h"

#include <filesystem>

#include "common/log.h"

namespace llmtrain::trainer {

namespace {

// The pool's headroom over the warm-up step's scopes (a later step may open a few more: a data-
// dependent op count, a library call that takes another path).
int64_t pool_for(int64_t counted) { return counted + counted / 4 + 16; }

}  // namespace

OpProfiler::OpProfiler(const LogConfig& log, kernels::Device device)
    : device_(device), steps_(log.profile == ProfileMode::ops ? log.profile_steps : 0), profile_(device) {
  if (enabled()) step_marks_ = std::make_unique<kernels::DeviceMarks>(device, 2);
}

void OpProfiler::step_begin() {
  pass_ = Pass::none;
  if (!enabled() || done()) return;
  if (seen_++ == 0) {
    pass_ = Pass::counting;
    profile_.begin_counting();
    return;
  }
  pass_ = Pass::timing;
  step_marks_->record(0);
  profile_.begin_timing();
}

void OpProfiler::step_end(PhaseTimes&) {
  switch (pass_) {
    case Pass::none:
      return;
    case Pass::counting:
      profile_.end();
      profile_.reserve(pool_for(profile_.counted()));
      break;
    case Pass::timing:
      step_marks_->record(1);
      profile_.end();  // reads the ops' marks: waits for the last
      step_s_ += step_marks_->seconds(0, 1);
      ++timed_;
      break;
  }
  pass_ = Pass::none;
}

OpProfileSummary OpProfiler::summary(int rank, int64_t start_step) const {
  OpProfileSummary s;
  s.device = device_ == kernels::Device::cuda ? "cuda" : "cpu";
  s.rank = rank;
  s.first_step = start_step + 2;  // the progress line's numbers: the warm-up is start_step + 1
  s.steps = timed_;
  s.step_seconds = step_s_;
  s.dropped = profile_.dropped();
  for (const kernels::OpTotal& t : profile_.totals())
    s.rows.push_back({t.name, t.inside ? t.inside : "", t.side_stream, t.calls, t.seconds});
  return s;
}

void report_op_profile(const Recipe& recipe, const OpProfiler& profiler, int rank, int64_t start_step, FileSystem& fs) {
  if (!profiler.enabled() || rank != 0) return;
  const OpProfileSummary s = profiler.summary(rank, start_step);
  for (const std::string& line : op_profile_table(s)) log_progress("{}", line);
  const std::string path = (std::filesystem::path(recipe.log.dir) / "op_profile.json").string();
  write_file_atomic(fs, path, op_profile_json(s).dump(1) + "\n");
  log_progress("op profile written to {}", path);
}

}  // namespace llmtrain::trainer
