// The NCCL device communicator (parallel/comm_nccl.h).
#include "parallel/comm_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/strings.h"
#include "kernels/buffer.h"
#include "kernels/cuda/stream.h"
#include "kernels/ops.h"
#include "parallel/bootstrap.h"
#include "parallel/comm_libraries.h"
#include "parallel/wait_poll.h"

namespace llmtrain::parallel {
namespace {

using kernels::Buffer;
using kernels::Device;
using kernels::DType;
using Clock = std::chrono::steady_clock;

// How often the watchdog looks at pending operations. A hang is noticed at most this late after
// its timeout; an event query costs about a microsecond.
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(20);

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
      break;  // no NCCL type: moved as pairs of bytes by nccl_bytes below
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

// One NCCL communicator and what the watchdog needs to know of it; shared by the communicator
// (main thread) and the watchdog, under `mutex`.
struct NcclState {
  std::mutex mutex;
  ncclComm_t comm = nullptr;
  std::string name;
  int rank = 0, size = 0;
  double timeout_s = 300;
  int device = 0;
  bool aborted = false;

  struct Pending {
    std::shared_ptr<kernels::cuda::Event> done;
    std::string what;
    Clock::time_point started;
  };
  std::deque<Pending> pending;  // in call order

  std::string describe() const { return fmt::format("group '{}' ({} ranks; this is its rank {})", name, size, rank); }
};

// The process's watchdog: one thread over every NCCL communicator, started with the first.
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
    bool device_set = false;
    std::unique_lock lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, kWatchdogPeriod, [this] { return stop_; });
      if (stop_) break;
      std::erase_if(states_, [](const std::weak_ptr<NcclState>& w) { return w.expired(); });
      for (const auto& weak : states_) {
        std::shared_ptr<NcclState> s = weak.lock();
        if (!s) continue;
        if (!device_set) {
          cudaSetDevice(s->device);  // event queries from this thread, on the rank's device
          device_set = true;
        }
        std::string failure;
        try {
          failure = check(*s);
        } catch (const std::exception& e) {  // a CUDA error querying an event: the device failed
          failure = fmt::format("the NCCL watchdog could not query {}'s operations: {}", s->describe(), e.what());
        }
        if (!failure.empty()) {
          lock.unlock();
          abort_job(failure, kExitFailure);
        }
      }
    }
  }

  // Drops completed operations; returns the error that ends the job, or "".
  static std::string check(NcclState& s) {
    std::lock_guard lock(s.mutex);
    if (s.aborted || s.comm == nullptr) return {};
    while (!s.pending.empty() && s.pending.front().done->done()) s.pending.pop_front();
    ncclResult_t async = ncclSuccess;
    std::string failure;
    if (ncclCommGetAsyncError(s.comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
      failure = fmt::format("NCCL reported an error on {}: {} ({}){}", s.describe(), ncclGetErrorString(async),
                            ncclGetLastError(s.comm),
                            s.pending.empty() ? "" : fmt::format(", during {}", s.pending.front().what));
    } else if (!s.pending.empty()) {
      const double age = std::chrono::duration<double>(Clock::now() - s.pending.front().started).count();
      if (age > s.timeout_s)
        failure = fmt::format(
            "timed out after {} waiting for {} on {}: the other ranks of the group did not complete it within "
            "parallel.timeout (one is stuck, has crashed or called a different operation; its own output says "
            "which); if they are only slow, raise parallel.timeout",
            format_duration(s.timeout_s), s.pending.front().what, s.describe());
    }
    if (!failure.empty()) {
      ncclCommAbort(s.comm);  // releases the kernels waiting in it, so the process can end
      s.aborted = true;
    }
    return failure;
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::weak_ptr<NcclState>> states_;
  std::thread thread_;
  bool stop_ = false;
};

class NcclComm;

class NcclWork final : public Work {
 public:
  NcclWork(NcclComm* comm, std::shared_ptr<kernels::cuda::Event> done, std::function<void()> finish,
           std::vector<Buffer> held)
      : comm_(comm), done_(std::move(done)), finish_(std::move(finish)), held_(std::move(held)) {}
  void wait() override;
  bool done() override;

 private:
  NcclComm* comm_;
  std::shared_ptr<kernels::cuda::Event> done_;
  std::function<void()> finish_;  // on the compute stream, after the operation (fp32's rounding back)
  std::vector<Buffer> held_;      // its fp32 scratch, back to the communicator's pool at wait()
};

class NcclComm final : public Comm {
 public:
  explicit NcclComm(std::unique_ptr<Comm> host) : host_(std::move(host)), s_(std::make_shared<NcclState>()) {
    s_->name = host_->name();
    s_->rank = host_->rank();
    s_->size = host_->size();
    s_->timeout_s = host_->timeout();
    check_cuda(cudaGetDevice(&s_->device), "cudaGetDevice");
    join();
    Watchdog::get().watch(s_);
  }
  ~NcclComm() override {
    std::lock_guard lock(s_->mutex);
    if (s_->comm != nullptr && !s_->aborted) {
      // Every operation queued has been waited for by its caller; destroying a communicator with
      // work in flight would block, so an unfinished one is aborted instead.
      if (s_->pending.empty() || cudaStreamQuery(stream_.get()) == cudaSuccess)
        ncclCommDestroy(s_->comm);
      else
        ncclCommAbort(s_->comm);
    }
    s_->comm = nullptr;
  }
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
      Tensor wide = take_scratch(held, buf.numel());
      kernels::convert(wide, buf.view({buf.numel()}));
      return launch(
          what, -1,
          [&](cudaStream_t st) {
            return ncclAllReduce(wide.data, wide.data, nccl_count(wide), ncclFloat32, nccl_op(op.op), s_->comm, st);
          },
          [buf, wide] { kernels::convert(buf.view({buf.numel()}), wide); }, std::move(held));
    }
    return launch(what, -1, [&](cudaStream_t st) {
      return ncclAllReduce(buf.data, buf.data, nccl_count(buf), nccl_type(buf.dtype), nccl_op(op.op), s_->comm, st);
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
      Tensor wide = take_scratch(held, in.numel());
      const Tensor wide_out = wide.slice(rank() * out.numel(), (rank() + 1) * out.numel());
      kernels::convert(wide, in.view({in.numel()}));
      return launch(
          what, -1,
          [&](cudaStream_t st) {
            return ncclReduceScatter(wide.data, wide_out.data, nccl_count(wide_out), ncclFloat32, nccl_op(op.op),
                                     s_->comm, st);
          },
          [out, wide_out] { kernels::convert(out.view({out.numel()}), wide_out); }, std::move(held));
    }
    return launch(what, -1, [&](cudaStream_t st) {
      return ncclReduceScatter(in.data, out.data, nccl_count(out), nccl_type(in.dtype), nccl_op(op.op), s_->comm, st);
    });
  }

  WorkHandle all_gather_async(Tensor in, Tensor out) override {
    if (in.device == Device::cpu) return host_->all_gather_async(in, out);
    LT_CHECK(out.numel() == in.numel() * size() && in.dtype == out.dtype, "all_gather of {} into {} over {} ranks",
             in.numel(), out.numel(), size());
    return launch(fmt::format("all_gather of {} {}", in.numel(), kernels::to_string(in.dtype)), -1,
                  [&](cudaStream_t st) {
                    return ncclAllGather(in.data, out.data, nccl_count(in), nccl_type(in.dtype), s_->comm, st);
                  });
  }

  WorkHandle broadcast_async(Tensor buf, int root) override {
    if (buf.device == Device::cpu) return host_->broadcast_async(buf, root);
    return launch(fmt::format("broadcast of {} {} from rank {}", buf.numel(), kernels::to_string(buf.dtype), root),
                  root, [&](cudaStream_t st) {
                    return ncclBroadcast(buf.data, buf.data, nccl_count(buf), nccl_type(buf.dtype), root, s_->comm, st);
                  });
  }

  WorkHandle send_async(Tensor buf, int peer, int tag) override {
    if (buf.device == Device::cpu) return host_->send_async(buf, peer, tag);
    return launch(
        fmt::format("send of {} {} to rank {}", buf.numel(), kernels::to_string(buf.dtype), peer), peer,
        [&](cudaStream_t st) { return ncclSend(buf.data, nccl_count(buf), nccl_type(buf.dtype), peer, s_->comm, st); });
  }

  WorkHandle recv_async(Tensor buf, int peer, int tag) override {
    if (buf.device == Device::cpu) return host_->recv_async(buf, peer, tag);
    return launch(
        fmt::format("recv of {} {} from rank {}", buf.numel(), kernels::to_string(buf.dtype), peer), peer,
        [&](cudaStream_t st) { return ncclRecv(buf.data, nccl_count(buf), nccl_type(buf.dtype), peer, s_->comm, st); });
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
    return exchange_as(fmt::format("all_to_all of {} {}", in.numel(), kernels::to_string(in.dtype)), transfers);
  }

  WorkHandle exchange_async(std::vector<Transfer> transfers) override {
    bool any_device = false, any_host = false;
    for (const Transfer& t : transfers) (t.buf.device == Device::cpu ? any_host : any_device) = true;
    LT_CHECK(!(any_device && any_host), "exchange on group '{}' mixes host and device buffers", name());
    if (!any_device) return host_->exchange_async(std::move(transfers));
    return exchange_as(fmt::format("exchange of {} transfers", transfers.size()), transfers);
  }

  WorkHandle barrier_async() override { return host_->barrier_async(); }

  // Queues `call` on the communication stream behind the compute stream's work so far; `finish`
  // runs on the compute stream once the operation is waited for.
  template <class Call>
  WorkHandle launch(std::string what, int peer, Call&& call, std::function<void()> finish = nullptr,
                    std::vector<Buffer> held = {}) {
    fail_if_aborted();
    ready_.record();
    ready_.wait_on(stream_);
    settle(call(stream_.get()), what, peer);
    return track(std::move(what), std::move(finish), std::move(held));
  }

  // Scratch handed back by a waited operation. Its later reuse is ordered on the compute stream:
  // the next conversion into it runs after this operation's conversion out of it, which its wait()
  // queued there.
  void give_back(std::vector<Buffer>& held) {
    for (Buffer& b : held) free_.push_back(std::move(b));
    held.clear();
  }

  void fail_if_aborted() {
    std::lock_guard lock(s_->mutex);
    if (s_->aborted || s_->comm == nullptr)
      throw environment_error(fmt::format("NCCL communicator of {} was aborted after an error", s_->describe()));
  }

 private:
  WorkHandle exchange_as(std::string what, const std::vector<Transfer>& transfers) {
    fail_if_aborted();
    ready_.record();
    ready_.wait_on(stream_);
    settle(ncclGroupStart(), what, -1);
    for (const Transfer& t : transfers) {
      if (t.buf.numel() == 0) continue;
      LT_CHECK(t.peer >= 0 && t.peer < size(), "peer {} of group '{}' ({} ranks)", t.peer, name(), size());
      const ncclResult_t r =
          t.kind == Transfer::Kind::send
              ? ncclSend(t.buf.data, nccl_count(t.buf), nccl_type(t.buf.dtype), t.peer, s_->comm, stream_.get())
              : ncclRecv(t.buf.data, nccl_count(t.buf), nccl_type(t.buf.dtype), t.peer, s_->comm, stream_.get());
      if (r != ncclSuccess && r != ncclInProgress) {
        ncclGroupEnd();
        settle(r, what, t.peer);
      }
    }
    settle(ncclGroupEnd(), what, -1);
    return track(std::move(what), nullptr, {});
  }

  WorkHandle track(std::string what, std::function<void()> finish, std::vector<Buffer> held) {
    auto done = std::make_shared<kernels::cuda::Event>();
    done->record(stream_);
    {
      std::lock_guard lock(s_->mutex);
      s_->pending.push_back({done, std::move(what), Clock::now()});
    }
    return std::make_unique<NcclWork>(this, std::move(done), std::move(finish), std::move(held));
  }

  // A 16-bit sum or average that accumulates in fp32 goes through an fp32 scratch.
  static bool widens(DType dtype, const Reduction& op) {
    return is_16_bit_float(dtype) && op.op != ReduceOp::max && !op.sums_in_16_bits(dtype);
  }

  // An fp32 scratch of at least `numel` elements, held by one operation until its wait(): the
  // smallest free one that fits, or a new one (one per operation in flight at most).
  Tensor take_scratch(std::vector<Buffer>& held, int64_t numel) {
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i].numel() >= numel && (best == free_.size() || free_[i].numel() < free_[best].numel())) best = i;
    if (best == free_.size()) {
      held.emplace_back(DType::fp32, kernels::Shape{numel}, Device::cuda, kernels::MemoryKind::communication);
    } else {
      held.push_back(std::move(free_[best]));
      free_.erase(free_.begin() + std::ptrdiff_t(best));
    }
    return held.back().tensor().slice(0, numel);
  }

  // Joins the group's NCCL communicator: rank 0's unique id broadcast over the host group, then a
  // non-blocking init polled against the timeout.
  void join() {
    ncclUniqueId id{};
    if (rank() == 0) settle_init(ncclGetUniqueId(&id), "ncclGetUniqueId");
    Tensor id_bytes(&id, DType::uint8, {static_cast<int64_t>(sizeof id)});
    host_->broadcast(id_bytes, 0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size(), id, rank(), &config);
    s_->comm = comm;
    settle(r, "joining the NCCL communicator", -1);
  }

  void settle_init(ncclResult_t r, const char* call) {
    if (r != ncclSuccess)
      throw environment_error(fmt::format("NCCL's {} failed for {}: {}", call, s_->describe(), ncclGetErrorString(r)),
                              "check `llmtrain env` (the NCCL version) and the NCCL_* settings");
  }

  // A call's result on the non-blocking communicator: in progress is polled to its end against the
  // timeout; an error aborts the communicator and throws, naming the operation, group and peer.
  void settle(ncclResult_t r, const std::string& what, int peer) {
    if (r == ncclInProgress && s_->comm != nullptr) {
      const double waited = wait_poll(
          [&] {
            ncclResult_t async = ncclSuccess;
            const ncclResult_t q = ncclCommGetAsyncError(s_->comm, &async);
            if (q != ncclSuccess) {
              r = q;
              return Poll::done;
            }
            r = async;
            return async == ncclInProgress ? Poll::pending : Poll::done;
          },
          timeout());
      if (waited < 0) fail(fmt::format("timed out after {} in NCCL {}", format_duration(timeout()), what), peer);
    }
    if (r != ncclSuccess)
      fail(fmt::format("NCCL failed in {}: {} ({})", what, ncclGetErrorString(r),
                       s_->comm != nullptr ? ncclGetLastError(s_->comm) : "no communicator"),
           peer);
  }

  [[noreturn]] void fail(const std::string& text, int peer) {
    {
      std::lock_guard lock(s_->mutex);
      if (s_->comm != nullptr && !s_->aborted) ncclCommAbort(s_->comm);
      s_->aborted = true;
    }
    throw environment_error(
        fmt::format("{} on {}{}", text, s_->describe(), peer >= 0 ? fmt::format(", peer rank {}", peer) : ""),
        "see the other ranks' output; NCCL_DEBUG=WARN in the environment makes NCCL say more; "
        "parallel.device_comm: staged moves device memory through MPI instead");
  }

  static void check_cuda(cudaError_t e, const char* call) {
    if (e != cudaSuccess) throw environment_error(fmt::format("{} failed: {}", call, cudaGetErrorString(e)));
  }

  std::unique_ptr<Comm> host_;
  std::shared_ptr<NcclState> s_;
  kernels::cuda::Stream stream_;  // this group's communication stream
  kernels::cuda::Event ready_;    // the compute stream's work before an operation
  std::vector<Buffer> free_;      // fp32 scratch of waited operations
};

void NcclWork::wait() {
  if (!done_) return;
  comm_->fail_if_aborted();
  done_->make_compute_wait();
  if (finish_) finish_();
  comm_->give_back(held_);
  done_.reset();
}

bool NcclWork::done() {
  if (!done_) return true;
  comm_->fail_if_aborted();
  return done_->done();
}

}  // namespace

bool nccl_built() { return true; }

int nccl_version_code() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

std::string nccl_version() {
  const int v = nccl_version_code();
  if (v == 0) return "unknown (ncclGetVersion failed)";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
}

std::unique_ptr<Comm> make_nccl_comm(std::unique_ptr<Comm> host) {
  LT_CHECK(host != nullptr);
  if (host->size() == 1) return make_local_comm(host->name());
  return std::make_unique<NcclComm>(std::move(host));
}

}  // namespace llmtrain::parallel
