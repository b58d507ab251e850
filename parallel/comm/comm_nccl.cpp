// The NCCL device communicator (parallel/comm/comm_nccl.h).
//
// Who owns what. NcclComm (the rank's main thread) owns its communication stream and makes every
// call; the watchdog thread polls every communicator's pending operations and asynchronous error;
// a handle (NcclWork) may outlive its communicator. What they share is a NcclState behind a
// shared_ptr: the NCCL communicator itself, the pending operations and their events, under one
// mutex that every NCCL call on that communicator holds — enqueueing, polling, aborting, finalizing
// and destroying — so that the watchdog's abort never frees a communicator under a call of the main
// thread, and neither thread holds the watchdog's own lock while it calls NCCL.
#include "parallel/comm/comm_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/strings.h"
#include "kernels/buffer.h"
#include "kernels/cuda/stream.h"
#include "kernels/op_profile.h"
#include "kernels/ops.h"
#include "parallel/bootstrap.h"
#include "parallel/comm/comm_libraries.h"
#include "parallel/comm/wait_poll.h"

namespace llmtrain::parallel {
namespace {

using kernels::Buffer;
using kernels::Device;
using kernels::DType;
using Clock = std::chrono::steady_clock;

// How often the watchdog looks at pending operations. A hang is noticed at most this late after
// its timeout; an event query costs about a microsecond.
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(20);
// An operation that has not started on the device is held up by this rank's own work before it (the
// compute stream), not by its peers; it is bounded more loosely than parallel.timeout.
constexpr double kNotStartedFactor = 4, kNotStartedMinSeconds = 60;

std::atomic<bool> g_dropped_handles_fatal{
#ifdef NDEBUG
    false
#else
    true
#endif
};
std::atomic<bool> g_plant_abort_on_teardown{false};

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::fp32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::fp16:
      return ncclFloat16;
    case DType::int32:
      return ncclInt32;
    case DType::int64:
      return ncclInt64;
    case DType::uint8:
      return ncclUint8;
    case DType::uint16:
      break;  // no NCCL type: moved as pairs of bytes by nccl_count below
  }
  return ncclUint8;
}

// Elements NCCL counts for `t`: uint16 (token ids) goes as bytes.
size_t nccl_count(const Tensor& t) { return t.dtype == DType::uint16 ? t.bytes() : static_cast<size_t>(t.numel()); }

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
  }
  return ncclSum;
}

bool is_16_bit_float(DType d) { return d == DType::bf16 || d == DType::fp16; }

using EventPtr = std::shared_ptr<kernels::cuda::Event>;

// Events without timing (cudaEventDisableTiming), reused: an event goes back to the pool when the
// last of its users (the pending list, the handle that waits on it) lets it go. Any thread may.
class EventPool : public std::enable_shared_from_this<EventPool> {
 public:
  EventPtr take() {
    kernels::cuda::Event* e = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        e = free_.back().release();
        free_.pop_back();
      }
    }
    if (e == nullptr) e = new kernels::cuda::Event(/*timing=*/false);
    return EventPtr(e, [pool = weak_from_this()](kernels::cuda::Event* x) {
      if (auto p = pool.lock()) {
        std::lock_guard lock(p->mutex_);
        p->free_.emplace_back(x);
      } else {
        delete x;
      }
    });
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<kernels::cuda::Event>> free_;
};

// fp32 device scratch of widened 16-bit reductions: held by an operation until its wait(), then
// back here. The main thread only (allocation and free are device calls of the rank's thread).
struct ScratchPool {
  std::vector<Buffer> free;

  // At least `numel` elements: the smallest free one that fits, or a new one.
  Tensor take(std::vector<Buffer>& held, int64_t numel) {
    size_t best = free.size();
    for (size_t i = 0; i < free.size(); ++i)
      if (free[i].numel() >= numel && (best == free.size() || free[i].numel() < free[best].numel())) best = i;
    if (best == free.size()) {
      held.emplace_back(DType::fp32, kernels::Shape{numel}, Device::cuda, kernels::MemoryKind::communication);
    } else {
      held.push_back(std::move(free[best]));
      free.erase(free.begin() + std::ptrdiff_t(best));
    }
    return held.back().tensor().slice(0, numel);
  }
  void give_back(std::vector<Buffer>& held) {
    for (Buffer& b : held) free.push_back(std::move(b));
    held.clear();
  }
};

// One NCCL communicator and what the watchdog needs to know of it (see the top of this file).
struct NcclState {
  std::mutex mutex;  // every NCCL call on `comm`, and every field below
  ncclComm_t comm = nullptr;
  std::string name;
  int rank = 0, size = 0;
  double timeout_s = 300;
  int device = 0;
  bool aborted = false;  // comm was aborted after a failure (by the watchdog, or a call that failed)
  bool closed = false;   // comm was finalized and destroyed: the communicator's end, not a failure
  std::string failure;   // why it was aborted

  struct Pending {
    EventPtr started;  // recorded on the communication stream just before the NCCL call
    EventPtr done;     // recorded just after it
    std::string what;
    Clock::time_point queued;                     // when the host queued it
    std::optional<Clock::time_point> started_at;  // when the watchdog first saw it started
  };
  std::deque<Pending> pending;       // in call order
  Clock::time_point last_completed;  // when the watchdog saw the last operation before `pending` done

  std::string describe() const { return fmt::format("group '{}' ({} ranks; this is its rank {})", name, size, rank); }

  // Aborts the communicator (the caller holds `mutex`): ncclCommAbort releases the kernels waiting
  // in it, so the process can end. Idempotent.
  void abort_locked(std::string why) {
    if (aborted || closed) return;
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
    failure = std::move(why);
    aborted = true;
  }
};

// The process's watchdog: one thread over every NCCL communicator, started with the first. It
// never holds its own lock while it calls NCCL or CUDA: a communicator being torn down (whose calls
// may take a while) delays only its own checks.
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog w;
    return w;
  }
  void watch(const std::shared_ptr<NcclState>& s) {
    std::lock_guard lock(mutex_);
    states_.push_back(s);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  void unwatch(const NcclState* s) {
    std::lock_guard lock(mutex_);
    std::erase_if(states_, [s](const std::weak_ptr<NcclState>& w) {
      const auto p = w.lock();
      return !p || p.get() == s;
    });
  }
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  Watchdog() = default;

  void run() {
    int device = -1;
    while (true) {
      std::vector<std::shared_ptr<NcclState>> states;
      {
        std::unique_lock lock(mutex_);
        wake_.wait_for(lock, kWatchdogPeriod, [this] { return stop_; });
        if (stop_) return;
        for (const auto& w : states_)
          if (auto s = w.lock()) states.push_back(std::move(s));
      }
      for (const std::shared_ptr<NcclState>& s : states) {
        if (s->device != device) {
          cudaSetDevice(s->device);  // event queries from this thread, on that rank's device
          device = s->device;
        }
        std::string failure;
        try {
          failure = check(*s);
        } catch (const std::exception& e) {  // a CUDA error querying an event: the device failed
          failure = fmt::format("the NCCL watchdog could not query {}'s operations: {}", s->describe(), e.what());
          std::lock_guard lock(s->mutex);
          s->abort_locked(failure);
        }
        if (!failure.empty()) abort_job(failure, kExitFailure);
      }
    }
  }

  // Retires completed operations; returns the error that ends the job (having aborted the
  // communicator), or "".
  static std::string check(NcclState& s) {
    std::lock_guard lock(s.mutex);
    if (s.aborted || s.closed || s.comm == nullptr) return {};
    const Clock::time_point now = Clock::now();
    for (NcclState::Pending& p : s.pending)
      if (!p.started_at && p.started->done()) p.started_at = now;
    while (!s.pending.empty() && s.pending.front().done->done()) {
      s.pending.pop_front();
      s.last_completed = now;
    }
    ncclResult_t async = ncclSuccess;
    std::string failure;
    if (ncclCommGetAsyncError(s.comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
      failure = fmt::format("NCCL reported an error on {}: {} ({}){}", s.describe(), ncclGetErrorString(async),
                            ncclGetLastError(s.comm),
                            s.pending.empty() ? "" : fmt::format(", during {}", s.pending.front().what));
    } else if (!s.pending.empty()) {
      const NcclState::Pending& p = s.pending.front();
      if (p.started_at) {
        const double age = std::chrono::duration<double>(now - *p.started_at).count();
        if (age > s.timeout_s)
          failure = fmt::format(
              "timed out after {} waiting for {} on {}: it started on the device {} ago and has not completed (the "
              "other ranks of the group did not join it within parallel.timeout: one is stuck, has crashed or "
              "called a different operation; its own output says which); if they are only slow, raise "
              "parallel.timeout",
              format_duration(s.timeout_s), p.what, s.describe(), format_duration(age));
      } else {
        // Not started: this rank's own work before it on the device has not finished. Counted from
        // when it was queued, or from the completion of the operation before it if that was later.
        const Clock::time_point since = std::max(p.queued, s.last_completed);
        const double age = std::chrono::duration<double>(now - since).count();
        const double bound = std::max(kNotStartedFactor * s.timeout_s, kNotStartedMinSeconds);
        if (age > bound)
          failure = fmt::format(
              "timed out after {} waiting for {} on {} to start: it was queued {} ago and has not started on the "
              "device, because this rank's work before it there has not finished (a kernel that does not end, or "
              "a step far slower than parallel.timeout); operations that have not started are bounded by {} × "
              "parallel.timeout, at least {}",
              format_duration(bound), p.what, s.describe(), format_duration(age), kNotStartedFactor,
              format_duration(kNotStartedMinSeconds));
      }
    }
    if (!failure.empty()) s.abort_locked(failure);
    return failure;
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::weak_ptr<NcclState>> states_;
  std::thread thread_;
  bool stop_ = false;
};

void fail_if_aborted(const NcclState& s) {
  if (s.aborted)
    throw environment_error(
        fmt::format("NCCL communicator of {} was aborted{}", s.describe(), s.failure.empty() ? "" : ": " + s.failure));
}

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclState> state, EventPtr done, std::string what, std::function<void()> finish,
           std::vector<Buffer> held, std::shared_ptr<ScratchPool> pool)
      : state_(std::move(state)),
        done_(std::move(done)),
        what_(std::move(what)),
        finish_(std::move(finish)),
        held_(std::move(held)),
        pool_(std::move(pool)),
        unwinding_(std::uncaught_exceptions()) {}
  ~NcclWork() override;
  void wait() override;
  bool done() override;

 private:
  void complete();

  std::shared_ptr<NcclState> state_;
  EventPtr done_;
  std::string what_;
  std::function<void()> finish_;  // on the compute stream, after the operation (fp32's rounding back)
  std::vector<Buffer> held_;      // its fp32 scratch, back to the pool at wait()
  std::shared_ptr<ScratchPool> pool_;
  int unwinding_;  // exceptions in flight when it was made: dropped during an unwind is not a bug
};

void NcclWork::complete() {
  done_->make_compute_wait();
  if (finish_) finish_();
  finish_ = nullptr;
  if (pool_) pool_->give_back(held_);
  done_.reset();
}

void NcclWork::wait() {
  if (!done_) return;
  {
    std::lock_guard lock(state_->mutex);
    fail_if_aborted(*state_);
  }
  complete();
}

bool NcclWork::done() {
  if (!done_) return true;
  {
    std::lock_guard lock(state_->mutex);
    fail_if_aborted(*state_);
  }
  return done_->done();
}

NcclWork::~NcclWork() {
  if (!done_) return;
  // Dropped without wait(): a bug of the caller unless an error is unwinding. The compute stream
  // still waits for it and its rounding back still runs, so the result means what it says.
  const bool unwinding = std::uncaught_exceptions() > unwinding_;
  if (!unwinding && g_dropped_handles_fatal.load())
    LT_CHECK(false, "the handle of NCCL {} on {} was dropped without wait()", what_, state_->describe());
  try {
    bool aborted;
    {
      std::lock_guard lock(state_->mutex);
      aborted = state_->aborted;
    }
    if (!aborted) complete();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: completing a dropped NCCL handle (%s) failed: %s\n", what_.c_str(), e.what());
  }
}

class NcclComm final : public Comm {
 public:
  explicit NcclComm(std::unique_ptr<Comm> host)
      : host_(std::move(host)),
        s_(std::make_shared<NcclState>()),
        events_(std::make_shared<EventPool>()),
        scratch_(std::make_shared<ScratchPool>()) {
    s_->name = host_->name();
    s_->rank = host_->rank();
    s_->size = host_->size();
    s_->timeout_s = host_->timeout();
    s_->last_completed = Clock::now();
    check_cuda(cudaGetDevice(&s_->device), "cudaGetDevice");
    join();
    Watchdog::get().watch(s_);
  }
  ~NcclComm() override { close(); }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }
  void set_timeout(double seconds) override {
    host_->set_timeout(seconds);
    std::lock_guard lock(s_->mutex);
    s_->timeout_s = seconds;
  }
  double timeout() const override { return host_->timeout(); }
  void progress() override { host_->progress(); }

  std::unique_ptr<Comm> split(int color, int key, std::string name) override {
    std::unique_ptr<Comm> h = host_->split(color, key, std::move(name));
    if (h->size() == 1) return make_local_comm(h->name());
    return std::make_unique<NcclComm>(std::move(h));
  }

  WorkHandle all_reduce_async(Tensor buf, Reduction op) override {
    if (buf.device == Device::cpu) return host_->all_reduce_async(buf, op);
    LT_CHECK(reduce_supported(buf.dtype, op.op) && buf.dtype != DType::uint16, "all_reduce {} of {}", to_string(op.op),
             kernels::to_string(buf.dtype));
    const std::string what = fmt::format("all_reduce of {} {}", buf.numel(), kernels::to_string(buf.dtype));
    if (widens(buf.dtype, op)) {
      std::vector<Buffer> held;
      Tensor wide = scratch_->take(held, buf.numel());
      kernels::convert(wide, buf.view({buf.numel()}));
      return launch(
          "NCCL all_reduce", what, -1,
          [&](cudaStream_t st, ncclComm_t c) {
            return ncclAllReduce(wide.data, wide.data, nccl_count(wide), ncclFloat32, nccl_op(op.op), c, st);
          },
          [buf, wide] { kernels::convert(buf.view({buf.numel()}), wide); }, std::move(held));
    }
    return launch("NCCL all_reduce", what, -1, [&](cudaStream_t st, ncclComm_t c) {
      return ncclAllReduce(buf.data, buf.data, nccl_count(buf), nccl_type(buf.dtype), nccl_op(op.op), c, st);
    });
  }

  WorkHandle reduce_scatter_async(Tensor in, Tensor out, Reduction op) override {
    if (in.device == Device::cpu) return host_->reduce_scatter_async(in, out, op);
    LT_CHECK(in.numel() == out.numel() * size() && in.dtype == out.dtype && in.dtype != DType::uint16 &&
                 reduce_supported(in.dtype, op.op),
             "reduce_scatter {} of {} {} into {} over {} ranks", to_string(op.op), in.numel(),
             kernels::to_string(in.dtype), out.numel(), size());
    const std::string what = fmt::format("reduce_scatter of {} {}", in.numel(), kernels::to_string(in.dtype));
    if (widens(in.dtype, op)) {
      // The fp32 copy of `in`, reduced in place: this rank's block of it is the result.
      std::vector<Buffer> held;
      Tensor wide = scratch_->take(held, in.numel());
      const Tensor wide_out = wide.slice(rank() * out.numel(), (rank() + 1) * out.numel());
      kernels::convert(wide, in.view({in.numel()}));
      return launch(
          "NCCL reduce_scatter", what, -1,
          [&](cudaStream_t st, ncclComm_t c) {
            return ncclReduceScatter(wide.data, wide_out.data, nccl_count(wide_out), ncclFloat32, nccl_op(op.op), c,
                                     st);
          },
          [out, wide_out] { kernels::convert(out.view({out.numel()}), wide_out); }, std::move(held));
    }
    return launch("NCCL reduce_scatter", what, -1, [&](cudaStream_t st, ncclComm_t c) {
      return ncclReduceScatter(in.data, out.data, nccl_count(out), nccl_type(in.dtype), nccl_op(op.op), c, st);
    });
  }

  WorkHandle all_gather_async(Tensor in, Tensor out) override {
    if (in.device == Device::cpu) return host_->all_gather_async(in, out);
    LT_CHECK(out.numel() == in.numel() * size() && in.dtype == out.dtype, "all_gather of {} into {} over {} ranks",
             in.numel(), out.numel(), size());
    return launch("NCCL all_gather", fmt::format("all_gather of {} {}", in.numel(), kernels::to_string(in.dtype)), -1,
                  [&](cudaStream_t st, ncclComm_t c) {
                    return ncclAllGather(in.data, out.data, nccl_count(in), nccl_type(in.dtype), c, st);
                  });
  }

  WorkHandle broadcast_async(Tensor buf, int root) override {
    if (buf.device == Device::cpu) return host_->broadcast_async(buf, root);
    return launch("NCCL broadcast",
                  fmt::format("broadcast of {} {} from rank {}", buf.numel(), kernels::to_string(buf.dtype), root),
                  root, [&](cudaStream_t st, ncclComm_t c) {
                    return ncclBroadcast(buf.data, buf.data, nccl_count(buf), nccl_type(buf.dtype), root, c, st);
                  });
  }

  WorkHandle send_async(Tensor buf, int peer, int tag) override {
    if (buf.device == Device::cpu) return host_->send_async(buf, peer, tag);
    return launch("NCCL send",
                  fmt::format("send of {} {} to rank {}", buf.numel(), kernels::to_string(buf.dtype), peer), peer,
                  [&](cudaStream_t st, ncclComm_t c) {
                    return ncclSend(buf.data, nccl_count(buf), nccl_type(buf.dtype), peer, c, st);
                  });
  }

  WorkHandle recv_async(Tensor buf, int peer, int tag) override {
    if (buf.device == Device::cpu) return host_->recv_async(buf, peer, tag);
    return launch("NCCL recv",
                  fmt::format("recv of {} {} from rank {}", buf.numel(), kernels::to_string(buf.dtype), peer), peer,
                  [&](cudaStream_t st, ncclComm_t c) {
                    return ncclRecv(buf.data, nccl_count(buf), nccl_type(buf.dtype), peer, c, st);
                  });
  }

  WorkHandle all_to_all_async(Tensor in, Tensor out) override {
    if (in.device == Device::cpu) return host_->all_to_all_async(in, out);
    LT_CHECK(in.numel() == out.numel() && in.numel() % size() == 0 && in.dtype == out.dtype,
             "all_to_all of {} into {} over {} ranks", in.numel(), out.numel(), size());
    const int64_t chunk = in.numel() / size();
    const Tensor flat_in = in.view({in.numel()}), flat_out = out.view({out.numel()});
    std::vector<Transfer> transfers;
    for (int r = 0; r < size(); ++r) {
      transfers.push_back({Transfer::Kind::send, flat_in.slice(r * chunk, (r + 1) * chunk), r, 0});
      transfers.push_back({Transfer::Kind::recv, flat_out.slice(r * chunk, (r + 1) * chunk), r, 0});
    }
    return exchange_as("NCCL all_to_all", fmt::format("all_to_all of {} {}", in.numel(), kernels::to_string(in.dtype)),
                       transfers);
  }

  WorkHandle exchange_async(std::vector<Transfer> transfers) override {
    bool any_device = false, any_host = false;
    for (const Transfer& t : transfers) (t.buf.device == Device::cpu ? any_host : any_device) = true;
    LT_CHECK(!(any_device && any_host), "exchange on group '{}' mixes host and device buffers", name());
    if (!any_device) return host_->exchange_async(std::move(transfers));
    return exchange_as("NCCL exchange", fmt::format("exchange of {} transfers", transfers.size()), transfers);
  }

  WorkHandle barrier_async() override { return host_->barrier_async(); }

 private:
  // Queues `call` on the communication stream behind the compute stream's work so far, between
  // the operation's two events; `finish` runs on the compute stream once it is waited for.
  // `row`: the operation's row in the op profile (log.profile: ops), timed on this stream.
  template <class Call>
  WorkHandle launch(const char* row, std::string what, int peer, Call&& call, std::function<void()> finish = nullptr,
                    std::vector<Buffer> held = {}) {
    ready_.record();
    ready_.wait_on(stream_);
    EventPtr started = events_->take();
    started->record(stream_);
    ncclResult_t r;
    {
      kernels::ProfileScope scope(row, stream_);
      std::lock_guard lock(s_->mutex);
      fail_if_aborted(*s_);
      r = call(stream_.get(), s_->comm);
    }
    settle(r, what, peer);
    return track(std::move(started), std::move(what), std::move(finish), std::move(held));
  }

  WorkHandle exchange_as(const char* row, std::string what, const std::vector<Transfer>& transfers) {
    ready_.record();
    ready_.wait_on(stream_);
    EventPtr started = events_->take();
    started->record(stream_);
    ncclResult_t r = ncclSuccess;
    int failed_peer = -1;
    {
      // The whole group under one hold of the lock: nothing may abort the communicator between
      // ncclGroupStart and ncclGroupEnd.
      kernels::ProfileScope scope(row, stream_);
      std::lock_guard lock(s_->mutex);
      fail_if_aborted(*s_);
      r = ncclGroupStart();
      for (const Transfer& t : transfers) {
        if (r != ncclSuccess && r != ncclInProgress) break;
        if (t.buf.numel() == 0) continue;
        LT_CHECK(t.peer >= 0 && t.peer < size(), "peer {} of group '{}' ({} ranks)", t.peer, name(), size());
        r = t.kind == Transfer::Kind::send
                ? ncclSend(t.buf.data, nccl_count(t.buf), nccl_type(t.buf.dtype), t.peer, s_->comm, stream_.get())
                : ncclRecv(t.buf.data, nccl_count(t.buf), nccl_type(t.buf.dtype), t.peer, s_->comm, stream_.get());
        if (r != ncclSuccess && r != ncclInProgress) failed_peer = t.peer;
      }
      const ncclResult_t end = ncclGroupEnd();
      if (r == ncclSuccess || r == ncclInProgress) r = end;
    }
    settle(r, what, failed_peer);
    return track(std::move(started), std::move(what), nullptr, {});
  }

  WorkHandle track(EventPtr started, std::string what, std::function<void()> finish, std::vector<Buffer> held) {
    EventPtr done = events_->take();
    done->record(stream_);
    {
      std::lock_guard lock(s_->mutex);
      // Operations already done give their events back now, not at the watchdog's next look.
      while (!s_->pending.empty() && s_->pending.front().done->done()) {
        s_->pending.pop_front();
        s_->last_completed = Clock::now();
      }
      s_->pending.push_back({std::move(started), done, what, Clock::now(), std::nullopt});
    }
    return std::make_unique<NcclWork>(s_, std::move(done), std::move(what), std::move(finish), std::move(held),
                                      scratch_);
  }

  // A 16-bit sum or average that accumulates in fp32 goes through an fp32 scratch.
  static bool widens(DType dtype, const Reduction& op) {
    return is_16_bit_float(dtype) && op.op != ReduceOp::max && !op.sums_in_16_bits(dtype);
  }

  // Joins the group's NCCL communicator: rank 0's unique id broadcast over the host group, then a
  // non-blocking init polled against the timeout.
  void join() {
    ncclUniqueId id{};
    if (rank() == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess)
        throw environment_error(
            fmt::format("NCCL's ncclGetUniqueId failed for {}: {}", s_->describe(), ncclGetErrorString(r)),
            "check `llmtrain env` (the NCCL version) and the NCCL_* settings");
    }
    Tensor id_bytes(&id, DType::uint8, {static_cast<int64_t>(sizeof id)});
    host_->broadcast(id_bytes, 0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size(), id, rank(), &config);
    {
      std::lock_guard lock(s_->mutex);
      s_->comm = comm;
    }
    settle(r, "joining the NCCL communicator", -1);
  }

  // A call's result on the non-blocking communicator: in progress is polled to its end against the
  // timeout (each poll under the lock); an error aborts the communicator and throws, naming the
  // operation, group and peer.
  void settle(ncclResult_t r, const std::string& what, int peer) {
    if (r == ncclInProgress) {
      const double waited = wait_poll(
          [&] {
            std::lock_guard lock(s_->mutex);
            if (s_->aborted) {
              r = ncclInvalidUsage;
              return Poll::done;
            }
            ncclResult_t async = ncclSuccess;
            const ncclResult_t q = ncclCommGetAsyncError(s_->comm, &async);
            r = q != ncclSuccess ? q : async;
            return r == ncclInProgress ? Poll::pending : Poll::done;
          },
          timeout());
      if (waited < 0) fail(fmt::format("timed out after {} in NCCL {}", format_duration(timeout()), what), peer);
    }
    if (r != ncclSuccess) {
      std::string last;
      {
        std::lock_guard lock(s_->mutex);
        last = s_->aborted ? s_->failure : std::string(ncclGetLastError(s_->comm));
      }
      fail(fmt::format("NCCL failed in {}: {} ({})", what, ncclGetErrorString(r), last), peer);
    }
  }

  [[noreturn]] void fail(const std::string& text, int peer) {
    const std::string message =
        fmt::format("{} on {}{}", text, s_->describe(), peer >= 0 ? fmt::format(", peer rank {}", peer) : "");
    {
      std::lock_guard lock(s_->mutex);
      s_->abort_locked(message);
    }
    throw environment_error(message,
                            "see the other ranks' output; NCCL_DEBUG=WARN in the environment makes NCCL say more; "
                            "parallel.device_comm: staged moves device memory through MPI instead");
  }

  // The end of the communicator, on the rank's thread. A healthy one is finalized and then
  // destroyed: its operations still in flight complete first (a peer still waiting in one would
  // otherwise hang until its timeout), finalize is polled until the group is quiescent (every rank
  // finalizes its communicator in the same order), then destroy frees it without blocking. Each
  // step is bounded by the timeout, and a communicator that fails one, or that is torn down while
  // an error unwinds (the job is ending), is aborted instead. None of it holds the watchdog's lock.
  void close() {
    Watchdog::get().unwatch(s_.get());
    const bool unwinding = std::uncaught_exceptions() > 0;
    auto abort = [&](const std::string& why) {
      std::lock_guard lock(s_->mutex);
      s_->abort_locked(why);
    };
    {
      std::lock_guard lock(s_->mutex);
      if (s_->aborted || s_->closed || s_->comm == nullptr) return;
    }
    if (unwinding || g_plant_abort_on_teardown.load()) return abort("closed while an error unwinds");
    const double bound = timeout();
    const auto deadline = Clock::now() + std::chrono::duration<double>(bound);
    auto poll_until = [&](const std::function<bool()>& ready) {
      while (!ready()) {
        if (Clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      return true;
    };
    try {
      // Its operations in flight, to their end on the device.
      const bool drained = poll_until([&] {
        std::lock_guard lock(s_->mutex);
        while (!s_->pending.empty() && s_->pending.front().done->done()) s_->pending.pop_front();
        return s_->pending.empty();
      });
      if (!drained) {
        warn_closing("its operations in flight did not complete");
        return abort("closed with operations that did not complete");
      }
      ncclResult_t r;
      {
        std::lock_guard lock(s_->mutex);
        r = ncclCommFinalize(s_->comm);
      }
      if (r == ncclInProgress) {
        if (!poll_until([&] {
              std::lock_guard lock(s_->mutex);
              ncclResult_t async = ncclSuccess;
              const ncclResult_t q = ncclCommGetAsyncError(s_->comm, &async);
              r = q != ncclSuccess ? q : async;
              return r != ncclInProgress;
            })) {
          warn_closing("ncclCommFinalize did not complete (a rank of the group did not finalize)");
          return abort("finalize did not complete");
        }
      }
      if (r != ncclSuccess) {
        warn_closing(fmt::format("ncclCommFinalize failed: {}", ncclGetErrorString(r)));
        return abort("finalize failed");
      }
      std::lock_guard lock(s_->mutex);
      r = ncclCommDestroy(s_->comm);
      s_->comm = nullptr;
      s_->closed = true;
      if (r != ncclSuccess)
        std::fprintf(stderr, "warning: ncclCommDestroy of %s failed: %s\n", s_->describe().c_str(),
                     ncclGetErrorString(r));
    } catch (const std::exception& e) {  // an event query failed: the device did
      warn_closing(e.what());
      abort("closing failed");
    }
  }

  void warn_closing(const std::string& why) const {
    std::fprintf(stderr, "warning: closing the NCCL communicator of %s: %s within %s; aborted instead\n",
                 s_->describe().c_str(), why.c_str(), format_duration(timeout()).c_str());
  }

  static void check_cuda(cudaError_t e, const char* call) {
    if (e != cudaSuccess) throw environment_error(fmt::format("{} failed: {}", call, cudaGetErrorString(e)));
  }

  std::unique_ptr<Comm> host_;
  std::shared_ptr<NcclState> s_;
  std::shared_ptr<EventPool> events_;
  std::shared_ptr<ScratchPool> scratch_;
  kernels::cuda::Stream stream_;                  // this group's communication stream
  kernels::cuda::Event ready_{/*timing=*/false};  // the compute stream's work before an operation
};

}  // namespace

bool nccl_built() { return true; }

bool nccl_spans_processes() {
#if LLMTRAIN_NCCL_SIMULATED
  return false;
#else
  return true;
#endif
}

int nccl_version_code() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

std::string nccl_version() {
  const int v = nccl_version_code();
  if (v == 0) return "unknown (ncclGetVersion failed)";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  std::string text = fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
#if LLMTRAIN_NCCL_SIMULATED
  text += " (the simulator's model of it: ranks that are threads of one process)";
#endif
  return text;
}

void set_dropped_nccl_handles_fatal(bool fatal) { g_dropped_handles_fatal = fatal; }
void plant_nccl_abort_on_teardown(bool on) { g_plant_abort_on_teardown = on; }

std::unique_ptr<Comm> make_nccl_comm(std::unique_ptr<Comm> host) {
  LT_CHECK(host != nullptr);
  if (host->size() == 1) return make_local_comm(host->name());
  return std::make_unique<NcclComm>(std::move(host));
}

}  // namespace llmtrain::parallel
