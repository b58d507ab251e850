// Per-op device timing (log.profile: ops; the training loop's side is trainer/loop/op_profiler.h):
// while an OpProfile is active on a thread, every op that thread dispatches (kernels/dispatch.cpp,
// the one dispatch point) and every library call inside one that opens a ProfileScope is bracketed
// by two device marks (kernels/device_marks.h: the host clock on the CPU, events on cuda), and the
// profile adds the time between them to a total per name.
//
// A library call site inside an op names its own row, which the table shows inside the op's:
//
//   kernels::ProfileScope scope("linear_forward: cuBLASLt");          // on the compute stream
//   kernels::ProfileScope scope("all_reduce: NCCL", comm_stream);     // a cuda::Stream of ours
//
// Rules a reader could get wrong:
//  - Off, the hook is one thread-local load and a null check per op: no profile is active unless a
//    caller activated one on this thread, and ops other threads dispatch (the CPU update's thread
//    with parallel.offload host, a reader thread) are never counted.
//  - Timing allocates nothing: the marks are a pool sized beforehand (reserve(), from the scopes a
//    counting pass saw); a scope beyond the pool is dropped (counted in dropped()), never grown into.
//  - Recording waits for nothing; end() of a timing reads the marks, which on cuda waits for the
//    last one (call it where the device may be waited for: after the step's scalars).
//  - Names are not copied: pass string literals (or strings that outlive the profile).
//  - This header is included by CUDA sources that nvcc compiles: it uses nothing of fmt.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/tensor.h"

namespace llmtrain::kernels {

namespace cuda {
class Stream;
}
class DeviceMarks;
class OpProfile;

namespace detail {
extern thread_local OpProfile* active_op_profile;  // set by OpProfile::begin_*, cleared by end()
}

// One row of the profile: the time of every scope of one name, opened inside the same scope (or at
// the top level) on the same kind of stream, summed.
struct OpTotal {
  const char* name = nullptr;
  const char* inside = nullptr;  // the name of the scope these ran inside; null: none (a top-level op)
  bool side_stream = false;      // timed on a stream of their own, beside the compute stream's work
  int64_t calls = 0;
  double seconds = 0;
};

class OpProfile {
 public:
  explicit OpProfile(Device device);
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  // A counting pass: until end(), the scopes this thread opens are counted (counted()), not timed.
  void begin_counting();
  // A timing pass: until end(), the scopes this thread opens are timed, up to the pool's capacity.
  void begin_timing();
  // Deactivates; after a timing pass, reads its marks (on cuda: waits for the last) and adds each
  // scope's time to its row of totals().
  void end();
  bool active() const { return detail::active_op_profile == this; }

  // The scopes the last counting pass saw.
  int64_t counted() const { return counted_; }
  // A pool of marks for `scopes` scopes a timing pass (allocates: call between passes).
  void reserve(int64_t scopes);
  int64_t capacity() const { return int64_t(scopes_.size()); }

  // The rows, in the order their names were first timed.
  const std::vector<OpTotal>& totals() const { return totals_; }
  // Scopes not timed: the pool was full, or they nested deeper than kMaxDepth.
  int64_t dropped() const { return dropped_; }
  static constexpr int kMaxDepth = 8;

  // ProfileScope's hooks: a scope's index, or -1 when it is not timed.
  int open(const char* name, const cuda::Stream* stream);
  void close(int scope);

 private:
  struct Scope {
    const char* name;
    const char* inside;
    const cuda::Stream* stream;
    int begin_mark, end_mark;  // end -1: still open
  };
  void activate();
  void collect();
  void record(int mark, const cuda::Stream* stream);

  Device device_;
  bool timing_ = false;
  int64_t counted_ = 0, dropped_ = 0;
  std::unique_ptr<DeviceMarks> marks_;  // two per scope of the pool
  std::vector<Scope> scopes_;           // the pool: scopes_.size() is the capacity
  int used_ = 0;                        // scopes of this pass
  int stack_[kMaxDepth] = {};           // the open scopes, innermost last
  int depth_ = 0;
  std::vector<OpTotal> totals_;
};

// Times the code in its lifetime under `name` when a profile is active on this thread; else it
// costs a null check. On the compute stream, or on `stream` (a side stream of ours: its row is
// marked side_stream, and its time overlaps the compute stream's).
class ProfileScope {
 public:
  explicit ProfileScope(const char* name) : profile_(detail::active_op_profile) {
    if (profile_) scope_ = profile_->open(name, nullptr);
  }
  ProfileScope(const char* name, const cuda::Stream& stream) : profile_(detail::active_op_profile) {
    if (profile_) scope_ = profile_->open(name, &stream);
  }
  ~ProfileScope() {
    if (profile_) profile_->close(scope_);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  OpProfile* profile_;
  int scope_ = -1;
};

}  // namespace llmtrain::kernels
