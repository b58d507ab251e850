// The simulated device's streams, events and copies: the part of CUDA's runtime API that orders
// work (the model is in kernels/cuda/sim/sim.h).
//
// Work given to a stream (a launch, an asynchronous copy or memset, an event's record, a wait for
// an event) is queued and runs later, when the host needs it: a synchronization, an event query,
// a copy to pageable host memory, a host-to-device copy from pageable memory (which CUDA orders
// after the stream's earlier work), a free. When it runs, work that nothing orders runs in the
// order CUDA allows but does not promise: of the streams whose first queued item may run, the one
// whose item was queued last goes first. So a stream that reads what another stream writes, without
// waiting for an event recorded after the write, reads the old contents here, and a test catches
// the missing wait instead of passing by luck.
//
// The legacy default stream (stream 0) is synchronous here: its work waits for every blocking
// stream (cudaStreamCreate without cudaStreamNonBlocking), as CUDA's does, then runs at once.
// Non-blocking streams are not ordered with it.
//
// The rule a reader could get wrong: a copy to pinned host memory (cudaMallocHost) is asynchronous
// like a kernel; the host may read the destination only after an event recorded behind the copy has
// completed. A copy to pageable host memory returns when it is done, as CUDA's does.
#include <algorithm>
#include <chrono>
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

namespace llmtrain::cuda_sim {

struct EventState {
  uint64_t issued = 0;     // records asked for
  uint64_t completed = 0;  // records that have run
  bool timing = true;
  std::chrono::steady_clock::time_point time;
};

// One queued item of a stream.
struct Item {
  enum class Kind : uint8_t { work, wait, record };
  Kind kind = Kind::work;
  uint64_t sequence = 0;       // when it was queued, over every stream
  std::function<void()> work;  // Kind::work
  std::shared_ptr<EventState> event;
  uint64_t generation = 0;  // wait: the record it waits for; record: the one it completes
};

}  // namespace llmtrain::cuda_sim

struct CUstream_st {
  bool blocking = true;  // ordered with the legacy default stream
  std::deque<llmtrain::cuda_sim::Item> queue;
};
struct CUevent_st {
  std::shared_ptr<llmtrain::cuda_sim::EventState> state = std::make_shared<llmtrain::cuda_sim::EventState>();
};

namespace llmtrain::cuda_sim {
namespace {

struct Scheduler {
  std::recursive_mutex mutex;
  std::vector<CUstream_st*> streams;  // live ones, in the order they were created
  uint64_t sequence = 0;
};

Scheduler& scheduler() {
  static Scheduler s;
  return s;
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
      break;
  }
}

// Runs one queued item: of the streams whose first item may run, the one queued last.
void run_one(Scheduler& s) {
  CUstream_st* pick = nullptr;
  for (CUstream_st* st : s.streams)
    if (!st->queue.empty() && may_run(st->queue.front()) &&
        (pick == nullptr || st->queue.front().sequence > pick->queue.front().sequence))
      pick = st;
  // Every wait names a record queued before it, so some first item can always run.
  if (pick == nullptr) fatal("every stream waits for an event that no queued work records");
  Item item = std::move(pick->queue.front());
  pick->queue.pop_front();
  run(item);
}

// Runs queued work until `done`. Device memory stays accessible for the whole batch: opening and
// closing it remaps every allocation, which per item would cost more than the kernels.
template <class Done>
void run_until(Scheduler& s, Done done) {
  std::optional<DeviceAccess> access;
  while (!done()) {
    if (!access) access.emplace();
    run_one(s);
  }
}

bool blocking_streams_idle(const Scheduler& s) {
  return std::all_of(s.streams.begin(), s.streams.end(),
                     [](const CUstream_st* st) { return !st->blocking || st->queue.empty(); });
}

bool all_idle(const Scheduler& s) {
  return std::all_of(s.streams.begin(), s.streams.end(), [](const CUstream_st* st) { return st->queue.empty(); });
}

bool complete(const EventState& e) { return e.completed >= e.issued; }

// Queues `item` on `stream`; on the legacy default stream it runs now, after the blocking streams.
void submit(cudaStream_t stream, Item item) {
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  if (stream == nullptr) {
    run_until(s, [&] { return blocking_streams_idle(s); });
    if (item.kind == Item::Kind::wait) run_until(s, [&] { return item.event->completed >= item.generation; });
    run(item);
    return;
  }
  item.sequence = ++s.sequence;
  stream->queue.push_back(std::move(item));
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

void enqueue(cudaStream_t stream, std::function<void()> work) {
  Item item;
  item.work = std::move(work);
  submit(stream, std::move(item));
}

void drain_all() {
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  run_until(s, [&] { return all_idle(s); });
}

}  // namespace llmtrain::cuda_sim

using llmtrain::cuda_sim::count_pageable_upload;
using llmtrain::cuda_sim::count_read;
using llmtrain::cuda_sim::count_synchronization;
using llmtrain::cuda_sim::fail;
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

}  // namespace

extern "C" {

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  using namespace llmtrain::cuda_sim;
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  // A device pointer on the wrong side, or a range past its allocation's end.
  if (!copy_sides_ok(dst, src, count, kind)) return fail(cudaErrorInvalidValue);
  const bool dst_dev = is_device_range(dst, count), src_dev = is_device_range(src, count);
  if (src_dev && !dst_dev) count_read();
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  auto copy = [dst, src, count] { std::memmove(dst, src, count); };
  if (!dst_dev && !src_dev) {
    copy();
    return cudaSuccess;
  }
  if (stream == nullptr) {
    enqueue(nullptr, copy);
    return cudaSuccess;
  }
  if (!src_dev && !is_pinned_range(src, count)) {
    // From pageable memory CUDA first waits for the stream's earlier work, then stages the source:
    // the host may reuse it as soon as the call returns.
    count_pageable_upload();
    run_until(s, [&] { return stream->queue.empty(); });
    DeviceAccess access;
    copy();
    return cudaSuccess;
  }
  enqueue(stream, copy);
  // To pageable memory the call returns when the copy is done.
  if (!dst_dev && !is_pinned_range(dst, count)) run_until(s, [&] { return stream->queue.empty(); });
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, count, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (!is_device_range(ptr, count)) return fail(cudaErrorInvalidValue);
  llmtrain::cuda_sim::enqueue(stream, [ptr, value, count] { std::memset(ptr, value, count); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) { return cudaMemsetAsync(ptr, value, count, nullptr); }

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  using namespace llmtrain::cuda_sim;
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
  using namespace llmtrain::cuda_sim;
  if (ptr == nullptr) return cudaSuccess;
  drain_all();  // CUDA synchronizes the device before freeing pinned memory
  Pinned& pin = pinned();
  std::lock_guard lock(pin.mutex);
  if (pin.ranges.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) return fail(cudaErrorInvalidValue);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  using namespace llmtrain::cuda_sim;
  if (stream == nullptr || (flags & ~unsigned(cudaStreamNonBlocking)) != 0) return fail(cudaErrorInvalidValue);
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  *stream = new CUstream_st;
  (*stream)->blocking = (flags & cudaStreamNonBlocking) == 0;
  s.streams.push_back(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  using namespace llmtrain::cuda_sim;
  if (stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  // CUDA returns at once and finishes the stream's work before releasing it.
  run_until(s, [&] { return stream->queue.empty(); });
  s.streams.erase(std::find(s.streams.begin(), s.streams.end(), stream));
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  using namespace llmtrain::cuda_sim;
  count_synchronization();
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  if (stream == nullptr)
    run_until(s, [&] { return blocking_streams_idle(s); });
  else
    run_until(s, [&] { return stream->queue.empty(); });
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  using namespace llmtrain::cuda_sim;
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  const bool idle = stream == nullptr ? blocking_streams_idle(s) : stream->queue.empty();
  if (idle) return cudaSuccess;
  // Not done when asked; the device goes on, so a later query sees it done.
  if (stream == nullptr)
    run_until(s, [&] { return blocking_streams_idle(s); });
  else
    run_until(s, [&] { return stream->queue.empty(); });
  return cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  using namespace llmtrain::cuda_sim;
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (event->state->issued == 0) return cudaSuccess;  // never recorded: nothing to wait for
  Item item;
  item.kind = Item::Kind::wait;
  item.event = event->state;
  item.generation = event->state->issued;  // the latest record asked for
  submit(stream, std::move(item));
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr || (flags & ~unsigned(cudaEventDisableTiming | cudaEventBlockingSync)) != 0)
    return fail(cudaErrorInvalidValue);
  *event = new CUevent_st;
  (*event)->state->timing = (flags & cudaEventDisableTiming) == 0;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  // Records still queued keep the event's state alive until they run.
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  using namespace llmtrain::cuda_sim;
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  Item item;
  item.kind = Item::Kind::record;
  item.event = event->state;
  item.generation = ++event->state->issued;
  submit(stream, std::move(item));
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  using namespace llmtrain::cuda_sim;
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  EventState& e = *event->state;
  if (complete(e)) return cudaSuccess;
  // Not done when asked; the device goes on, so a later query sees it done.
  run_until(s, [&] { return complete(e); });
  return cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  using namespace llmtrain::cuda_sim;
  count_synchronization();
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Scheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  run_until(s, [&] { return complete(*event->state); });
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  using namespace llmtrain::cuda_sim;
  if (ms == nullptr || start == nullptr || end == nullptr) return fail(cudaErrorInvalidResourceHandle);
  const EventState &a = *start->state, &b = *end->state;
  if (!a.timing || !b.timing || a.issued == 0 || b.issued == 0) return fail(cudaErrorInvalidResourceHandle);
  if (!complete(a) || !complete(b)) return fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b.time - a.time).count();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  llmtrain::cuda_sim::count_synchronization();
  llmtrain::cuda_sim::drain_all();
  return cudaSuccess;
}

}  // extern "C"
