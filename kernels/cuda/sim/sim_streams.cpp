// The simulated device's streams, events and copies: the part of CUDA's runtime API that orders
// work (the model is in kernels/cuda/sim/sim.h).
//
// Work given to a stream (a launch, an asynchronous copy or memset, an event's record, a wait for
// an event, a library's work such as a cuBLASLt product or an NCCL operation) is queued and runs
// later, when the host needs it: a synchronization, an event query, a copy to pageable host memory,
// a host-to-device copy from pageable memory (which CUDA orders after the stream's earlier work), a
// free. When it runs, work that nothing orders runs in the order CUDA allows but does not promise:
// of the streams whose first queued item may run, the one whose item was queued last goes first. So
// a stream that reads what another stream writes, without waiting for an event recorded after the
// write, reads the old contents here, and a test catches the missing wait instead of passing by luck.
//
// Every call that takes a stream accepts only a stream cudaStreamCreate* made and has not
// destroyed: the legacy default stream (stream 0, cudaStreamLegacy, cudaStreamPerThread) is refused
// unless a test allows it (sim_rules.h). Allowed, it is synchronous here: its work waits for every
// blocking stream (cudaStreamCreate without cudaStreamNonBlocking), as CUDA's does, then runs at
// once. Non-blocking streams are not ordered with it.
//
// Several host threads may share the device (ranks as threads). A rendezvous item (an NCCL
// operation's part on one rank, sim_nccl.cpp) completes only together with its peers' parts on
// other streams, queued by other threads: a host that waits for work behind one releases the
// device and sleeps until another thread queues or completes work, bounded (LLMTRAIN_SIM_HANG_SECONDS) so that a
// rendezvous nobody joins ends the process with a message instead of hanging it.
//
// The rule a reader could get wrong: a copy to pinned host memory (cudaMallocHost) is asynchronous
// like a kernel; the host may read the destination only after an event recorded behind the copy has
// completed. A copy to pageable host memory returns when it is done, as CUDA's does.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "kernels/cuda/sim/sim_internal.h"
#include "kernels/cuda/sim/sim_rules.h"

namespace llmtrain::cuda_sim {

struct EventState {
  uint64_t issued = 0;     // records asked for
  uint64_t completed = 0;  // records that have run
  bool timing = true;
  std::chrono::steady_clock::time_point time;
};

// One queued item of a stream.
struct Item {
  enum class Kind : uint8_t { work, wait, record, rendezvous };
  Kind kind = Kind::work;
  uint64_t sequence = 0;       // when it was queued, over every stream
  std::function<void()> work;  // Kind::work
  std::shared_ptr<EventState> event;
  uint64_t generation = 0;  // wait: the record it waits for; record: the one it completes
  std::shared_ptr<Rendezvous> rendezvous;
};

}  // namespace llmtrain::cuda_sim

struct CUstream_st {
  bool blocking = true;  // ordered with the legacy default stream
  int device = 0;        // the device current when it was made
  std::deque<llmtrain::cuda_sim::Item> queue;
};
struct CUevent_st {
  std::shared_ptr<llmtrain::cuda_sim::EventState> state = std::make_shared<llmtrain::cuda_sim::EventState>();
};

namespace llmtrain::cuda_sim {
namespace {

// How long a host may wait for work that needs another host thread (a rendezvous's peers) before
// the simulator declares the process hung: LLMTRAIN_SIM_HANG_SECONDS, default 300 s, longer than
// the parallel.timeout the tests use, so that the watchdogs above (comm_nccl.cpp) speak first.
}  // namespace

double hang_seconds() {
  static const double seconds = [] {
    const char* v = std::getenv("LLMTRAIN_SIM_HANG_SECONDS");
    char* end = nullptr;
    const double x = v != nullptr ? std::strtod(v, &end) : 0;
    return v != nullptr && end != v && *end == '\0' && x > 0 ? x : 300.0;
  }();
  return seconds;
}

namespace {

struct Scheduler {
  std::mutex mutex;
  std::condition_variable changed;    // work queued or completed, or a library's state changed
  std::vector<CUstream_st*> streams;  // live ones, in the order they were created
  uint64_t sequence = 0;
};

Scheduler& scheduler() {
  static Scheduler s;
  return s;
}

std::atomic<int> g_legacy_allowed{0};

bool is_legacy(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
}

bool live(const Scheduler& s, cudaStream_t stream) {
  return std::find(s.streams.begin(), s.streams.end(), stream) != s.streams.end();
}

std::string check_stream(const Scheduler& s, cudaStream_t stream) {
  if (is_legacy(stream)) {
    if (legacy_stream_allowed()) return {};
    return "the legacy default stream (stream 0): llmtrain puts every kernel, copy, event and library call on a "
           "stream it created (docs/cuda.md, \"Streams\")";
  }
  if (!live(s, stream)) return "a stream the runtime did not create, or has destroyed";
  return {};
}

bool may_run(const Item& item) { return item.kind != Item::Kind::wait || item.event->completed >= item.generation; }

void run(Item& item) {
  switch (item.kind) {
    case Item::Kind::work: {
      DeviceAccess access;
      item.work();
      break;
    }
    case Item::Kind::record:
      item.event->completed = std::max(item.event->completed, item.generation);
      item.event->time = std::chrono::steady_clock::now();
      break;
    case Item::Kind::wait:
    case Item::Kind::rendezvous:
      break;
  }
}

// One step of the device: completes every rendezvous at the front of its stream that can complete
// (its peers are at the front of theirs), else runs one item: of the streams whose first item may
// run, the one queued last. False when nothing could advance.
bool step(Scheduler& s) {
  bool advanced = false;
  for (CUstream_st* st : s.streams)
    while (!st->queue.empty() && st->queue.front().kind == Item::Kind::rendezvous &&
           st->queue.front().rendezvous->progress()) {
      st->queue.pop_front();
      advanced = true;
    }
  if (advanced) return true;
  CUstream_st* pick = nullptr;
  for (CUstream_st* st : s.streams)
    if (!st->queue.empty() && st->queue.front().kind != Item::Kind::rendezvous && may_run(st->queue.front()) &&
        (pick == nullptr || st->queue.front().sequence > pick->queue.front().sequence))
      pick = st;
  if (pick == nullptr) return false;
  Item item = std::move(pick->queue.front());
  pick->queue.pop_front();
  run(item);
  return true;
}

bool rendezvous_pending(const Scheduler& s) {
  return std::any_of(s.streams.begin(), s.streams.end(), [](const CUstream_st* st) {
    return std::any_of(st->queue.begin(), st->queue.end(),
                       [](const Item& i) { return i.kind == Item::Kind::rendezvous; });
  });
}

std::string blocked_fronts(const Scheduler& s) {
  std::string text;
  for (size_t i = 0; i < s.streams.size(); ++i) {
    const CUstream_st* st = s.streams[i];
    if (st->queue.empty()) continue;
    const Item& f = st->queue.front();
    text += "\n  stream " + std::to_string(i) + " (" + std::to_string(st->queue.size()) + " queued): ";
    text += f.kind == Item::Kind::rendezvous ? f.rendezvous->describe()
            : f.kind == Item::Kind::wait     ? std::string("a wait for an event not yet recorded")
                                             : std::string("runnable work");
  }
  return text;
}

enum class Mode { wait, query };

// Runs queued work until `done`. Device memory stays accessible for a batch of work: opening and
// closing it remaps every allocation, which per item would cost more than the kernels. When
// nothing can run: a query returns false at once; a wait sleeps until another host thread changes
// the device (a rendezvous's peer queues its part), bounded by hang_seconds().
template <class Done>
bool run_until(std::unique_lock<std::mutex>& lock, Scheduler& s, Done done, Mode mode = Mode::wait) {
  std::optional<DeviceAccess> access;
  bool advanced = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(hang_seconds());
  while (!done()) {
    if (!access) access.emplace();
    if (step(s)) {
      advanced = true;
      continue;
    }
    if (mode == Mode::query) break;
    // Within one host thread every wait names a record queued before it, so only work that needs
    // another thread (a rendezvous) can be blocked.
    if (!rendezvous_pending(s)) fatal("every stream waits for an event that no queued work records");
    access.reset();
    if (advanced) s.changed.notify_all();
    advanced = false;
    if (s.changed.wait_until(lock, deadline) == std::cv_status::timeout)
      fatal("the device has waited " + std::to_string(int(hang_seconds())) +
            " s for work that another host thread never queued (an NCCL operation one rank never started?):" +
            blocked_fronts(s));
    deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(hang_seconds());
  }
  if (advanced) s.changed.notify_all();
  return done();
}

bool blocking_streams_idle(const Scheduler& s) {
  return std::all_of(s.streams.begin(), s.streams.end(),
                     [](const CUstream_st* st) { return !st->blocking || st->queue.empty(); });
}

// Every stream of `device` has run its work (what a device-wide synchronization waits for: another
// device's streams, another rank's when ranks are threads on several devices, are not waited for).
bool device_idle(const Scheduler& s, int device) {
  return std::all_of(s.streams.begin(), s.streams.end(),
                     [device](const CUstream_st* st) { return st->device != device || st->queue.empty(); });
}

bool complete(const EventState& e) { return e.completed >= e.issued; }

// Queues `item` on `stream` (checked by the caller); on the legacy default stream it runs now, after
// the blocking streams.
void submit(std::unique_lock<std::mutex>& lock, Scheduler& s, cudaStream_t stream, Item item) {
  if (is_legacy(stream)) {
    run_until(lock, s, [&] { return blocking_streams_idle(s); });
    if (item.kind == Item::Kind::wait) run_until(lock, s, [&] { return item.event->completed >= item.generation; });
    if (item.kind == Item::Kind::rendezvous) {
      // A library's work on the legacy stream: queued nowhere, so it waits for its peers here.
      Item held = std::move(item);
      std::optional<DeviceAccess> access;
      while (!held.rendezvous->progress()) {
        access.reset();
        s.changed.wait(lock);
        access.emplace();
      }
      s.changed.notify_all();
      return;
    }
    run(item);
    return;
  }
  item.sequence = ++s.sequence;
  stream->queue.push_back(std::move(item));
  s.changed.notify_all();
}

// Pinned host allocations (cudaMallocHost), by address, with their sizes.
struct Pinned {
  std::mutex mutex;
  std::map<uintptr_t, size_t> ranges;
};
Pinned& pinned() {
  static Pinned p;
  return p;
}

bool is_pinned_range(const void* p, size_t bytes) {
  Pinned& pin = pinned();
  std::lock_guard lock(pin.mutex);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = pin.ranges.upper_bound(a);
  if (it == pin.ranges.begin()) return false;
  --it;
  return a - it->first <= it->second && bytes <= it->second - (a - it->first);
}

}  // namespace

LegacyStreamAllowed::LegacyStreamAllowed() { ++g_legacy_allowed; }
LegacyStreamAllowed::~LegacyStreamAllowed() { --g_legacy_allowed; }
bool legacy_stream_allowed() { return g_legacy_allowed.load() > 0; }

std::string stream_problem(cudaStream_t stream) {
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  return check_stream(s, stream);
}

cudaError_t enqueue(cudaStream_t stream, std::function<void()> work, const char* what) {
  Scheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  if (std::string why = check_stream(s, stream); !why.empty())
    return fail_because(cudaErrorInvalidResourceHandle, std::string(what) + " on " + why);
  Item item;
  item.work = std::move(work);
  submit(lock, s, stream, std::move(item));
  return cudaSuccess;
}

std::string enqueue_rendezvous(cudaStream_t stream, std::shared_ptr<Rendezvous> rendezvous) {
  Scheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  if (std::string why = check_stream(s, stream); !why.empty()) return why;
  Item item;
  item.kind = Item::Kind::rendezvous;
  item.rendezvous = std::move(rendezvous);
  submit(lock, s, stream, std::move(item));
  return {};
}

void advance() {
  Scheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  run_until(
      lock, s, [] { return false; }, Mode::query);
}

void notify_device_state() {
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  s.changed.notify_all();
}

void drain_device() {
  const int device = current_device();
  Scheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  run_until(lock, s, [&] { return device_idle(s, device); });
}

}  // namespace llmtrain::cuda_sim

using llmtrain::cuda_sim::count_pageable_upload;
using llmtrain::cuda_sim::count_read;
using llmtrain::cuda_sim::count_synchronization;
using llmtrain::cuda_sim::fail;
using llmtrain::cuda_sim::fail_because;
using llmtrain::cuda_sim::is_device_range;

namespace {

// Whether a copy of `kind` between these ranges is legal: each device pointer on the side `kind`
// names, inside one allocation.
bool copy_sides_ok(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  const bool dst_dev = is_device_range(dst, count), src_dev = is_device_range(src, count);
  switch (kind) {
    case cudaMemcpyHostToHost:
      return !dst_dev && !src_dev;
    case cudaMemcpyHostToDevice:
      return dst_dev && !src_dev;
    case cudaMemcpyDeviceToHost:
      return !dst_dev && src_dev;
    case cudaMemcpyDeviceToDevice:
      return dst_dev && src_dev;
    case cudaMemcpyDefault:
      return true;
  }
  return false;
}

using namespace llmtrain::cuda_sim;

// The stream's problem as a failed call's return value, or success.
cudaError_t refuse(const Scheduler& s, cudaStream_t stream, const char* call) {
  const std::string why = check_stream(s, stream);
  return why.empty() ? cudaSuccess : fail_because(cudaErrorInvalidResourceHandle, std::string(call) + " on " + why);
}

}  // namespace

extern "C" {

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  // A device pointer on the wrong side, or a range past its allocation's end.
  if (!copy_sides_ok(dst, src, count, kind)) return fail(cudaErrorInvalidValue);
  const bool dst_dev = is_device_range(dst, count), src_dev = is_device_range(src, count);
  Scheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  if (const cudaError_t e = refuse(s, stream, "cudaMemcpyAsync"); e != cudaSuccess) return e;
  if (src_dev && !dst_dev) count_read();
  auto copy = [dst, src, count] { std::memmove(dst, src, count); };
  if (!dst_dev && !src_dev) {
    copy();
    return cudaSuccess;
  }
  Item item;
  item.work = copy;
  if (is_legacy(stream)) {
    submit(lock, s, stream, std::move(item));
    return cudaSuccess;
  }
  if (!src_dev && !is_pinned_range(src, count)) {
    // From pageable memory CUDA first waits for the stream's earlier work, then stages the source:
    // the host may reuse it as soon as the call returns.
    count_pageable_upload();
    run_until(lock, s, [&] { return stream->queue.empty(); });
    DeviceAccess access;
    copy();
    return cudaSuccess;
  }
  submit(lock, s, stream, std::move(item));
  // To pageable memory the call returns when the copy is done.
  if (!dst_dev && !is_pinned_range(dst, count)) run_until(lock, s, [&] { return stream->queue.empty(); });
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, count, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (!is_device_range(ptr, count)) return fail(cudaErrorInvalidValue);
  return llmtrain::cuda_sim::enqueue(
      stream, [ptr, value, count] { std::memset(ptr, value, count); }, "cudaMemsetAsync");
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) { return cudaMemsetAsync(ptr, value, count, nullptr); }

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  void* p = std::aligned_alloc(256, (std::max<size_t>(size, 1) + 255) / 256 * 256);
  if (p == nullptr) {
    *ptr = nullptr;
    return fail(cudaErrorMemoryAllocation);
  }
  Pinned& pin = pinned();
  std::lock_guard lock(pin.mutex);
  pin.ranges.emplace(reinterpret_cast<uintptr_t>(p), size);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  drain_device();  // CUDA synchronizes the device before freeing pinned memory
  Pinned& pin = pinned();
  std::lock_guard lock(pin.mutex);
  if (pin.ranges.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) return fail(cudaErrorInvalidValue);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr || (flags & ~unsigned(cudaStreamNonBlocking)) != 0) return fail(cudaErrorInvalidValue);
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  *stream = new CUstream_st;
  (*stream)->blocking = (flags & cudaStreamNonBlocking) == 0;
  (*stream)->device = current_device();
  s.streams.push_back(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Scheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  if (is_legacy(stream) || !live(s, stream))
    return fail_because(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of " + check_stream(s, stream));
  // CUDA returns at once and finishes the stream's work before releasing it.
  run_until(lock, s, [&] { return stream->queue.empty(); });
  s.streams.erase(std::find(s.streams.begin(), s.streams.end(), stream));
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  count_synchronization();
  Scheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  if (const cudaError_t e = refuse(s, stream, "cudaStreamSynchronize"); e != cudaSuccess) return e;
  if (is_legacy(stream))
    run_until(lock, s, [&] { return blocking_streams_idle(s); });
  else
    run_until(lock, s, [&] { return stream->queue.empty(); });
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Scheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  if (const cudaError_t e = refuse(s, stream, "cudaStreamQuery"); e != cudaSuccess) return e;
  auto idle = [&] { return is_legacy(stream) ? blocking_streams_idle(s) : stream->queue.empty(); };
  if (idle()) return cudaSuccess;
  // Not done when asked; the device goes on (as far as it can without other host threads), so a
  // later query sees it done.
  run_until(lock, s, idle, Mode::query);
  return cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Scheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  if (const cudaError_t e = refuse(s, stream, "cudaStreamWaitEvent"); e != cudaSuccess) return e;
  if (event->state->issued == 0) return cudaSuccess;  // never recorded: nothing to wait for
  Item item;
  item.kind = Item::Kind::wait;
  item.event = event->state;
  item.generation = event->state->issued;  // the latest record asked for
  submit(lock, s, stream, std::move(item));
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr || (flags & ~unsigned(cudaEventDisableTiming | cudaEventBlockingSync)) != 0)
    return fail(cudaErrorInvalidValue);
  *event = new CUevent_st;
  (*event)->state->timing = (flags & cudaEventDisableTiming) == 0;
  llmtrain::cuda_sim::count_event();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  // Records still queued keep the event's state alive until they run.
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Scheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  if (const cudaError_t e = refuse(s, stream, "cudaEventRecord"); e != cudaSuccess) return e;
  Item item;
  item.kind = Item::Kind::record;
  item.event = event->state;
  item.generation = ++event->state->issued;
  submit(lock, s, stream, std::move(item));
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Scheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  EventState& e = *event->state;
  if (complete(e)) return cudaSuccess;
  // Not done when asked; the device goes on (as far as it can without other host threads), so a
  // later query sees it done.
  run_until(
      lock, s, [&] { return complete(e); }, Mode::query);
  return cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  count_synchronization();
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Scheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  run_until(lock, s, [&] { return complete(*event->state); });
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  const EventState &a = *start->state, &b = *end->state;
  if (!a.timing || !b.timing || a.issued == 0 || b.issued == 0) return fail(cudaErrorInvalidResourceHandle);
  if (!complete(a) || !complete(b)) return fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b.time - a.time).count();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  count_synchronization();
  drain_device();
  return cudaSuccess;
}

}  // extern "C"
