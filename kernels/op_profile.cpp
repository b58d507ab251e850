// OpProfile (kernels/op_profile.h): the pool of marks, the scopes of a timing pass, and their totals.
#include "kernels/op_profile.h"

#include <cstring>

#include "common/error.h"
#include "kernels/device_marks.h"

namespace llmtrain::kernels {

namespace detail {
thread_local OpProfile* active_op_profile = nullptr;
}

namespace {

bool same_name(const char* a, const char* b) { return a == b || (a && b && std::strcmp(a, b) == 0); }

// Rows distinct names fill before the totals grow (an allocation after a timing pass, not in it).
constexpr size_t kRowsReserved = 256;

}  // namespace

OpProfile::OpProfile(Device device) : device_(device) { totals_.reserve(kRowsReserved); }

OpProfile::~OpProfile() {
  if (active()) detail::active_op_profile = nullptr;
}

void OpProfile::activate() {
  LT_CHECK(detail::active_op_profile == nullptr || active(), "two op profiles active on one thread");
  detail::active_op_profile = this;
  used_ = 0, depth_ = 0;
}

void OpProfile::begin_counting() {
  activate();
  timing_ = false;
  counted_ = 0;
}

void OpProfile::begin_timing() {
  activate();
  timing_ = true;
}

void OpProfile::end() {
  LT_CHECK(active(), "OpProfile::end without its begin on this thread");
  detail::active_op_profile = nullptr;
  if (timing_) collect();
  timing_ = false;
}

void OpProfile::reserve(int64_t scopes) {
  LT_CHECK(!active(), "OpProfile::reserve during a pass");
  LT_CHECK(scopes >= 0 && scopes < (int64_t(1) << 30), "an op profile of {} scopes", scopes);
  if (scopes <= capacity()) return;
  marks_ = std::make_unique<DeviceMarks>(device_, int(2 * scopes));
  scopes_.resize(size_t(scopes));
}

void OpProfile::record(int mark, const cuda::Stream* stream) {
  if (stream)
    marks_->record(mark, *stream);
  else
    marks_->record(mark);
}

int OpProfile::open(const char* name, const cuda::Stream* stream) {
  if (!timing_) {
    ++counted_;
    return -1;
  }
  if (used_ == int(scopes_.size()) || depth_ == kMaxDepth) {
    ++dropped_;
    return -1;
  }
  const int i = used_++;
  const char* inside = depth_ > 0 ? scopes_[size_t(stack_[depth_ - 1])].name : nullptr;
  scopes_[size_t(i)] = {name, inside, stream, 2 * i, -1};
  stack_[depth_++] = i;
  record(2 * i, stream);
  return i;
}

void OpProfile::close(int scope) {
  if (scope < 0) return;
  LT_CHECK(depth_ > 0 && stack_[depth_ - 1] == scope, "op profile scope {} closed out of order", scope);
  Scope& s = scopes_[size_t(scope)];
  s.end_mark = 2 * scope + 1;
  record(s.end_mark, s.stream);
  --depth_;
}

void OpProfile::collect() {
  for (int i = 0; i < used_; ++i) {
    const Scope& s = scopes_[size_t(i)];
    if (s.end_mark < 0) continue;  // left by an exception
    const double seconds = marks_->seconds(s.begin_mark, s.end_mark);
    const bool side = s.stream != nullptr;
    OpTotal* row = nullptr;
    for (OpTotal& t : totals_)
      if (t.side_stream == side && same_name(t.name, s.name) && same_name(t.inside, s.inside)) {
        row = &t;
        break;
      }
    if (!row) row = &totals_.emplace_back(OpTotal{s.name, s.inside, side, 0, 0.0});
    row->calls += 1;
    row->seconds += seconds;
  }
  used_ = 0;
}

}  // namespace llmtrain::kernels
