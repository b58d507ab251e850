// The staged device communicator (parallel/comm/comm_staged.h).
#include "parallel/comm/comm_staged.h"

#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/strings.h"
#include "kernels/device_stream.h"
#include "parallel/comm/wait_poll.h"

namespace llmtrain::parallel {
namespace {

using kernels::Device;
using kernels::DeviceEvent;
using kernels::PinnedBuffer;

// One operation on its way: staged in, run on the host, copied back.
struct StagedOp {
  enum class State { staging, started, returning, finished };

  std::string what;  // "all_reduce of 4096 bf16", for errors
  State state = State::staging;
  bool ordered = false;           // the communication stream waits for the compute stream's work before it
  bool staged_on_device = false;  // its input went through the communication stream
  DeviceEvent staged;             // recorded behind the copies of the inputs
  std::function<WorkHandle()> start;
  WorkHandle host;
  std::vector<std::pair<Tensor, Tensor>> copy_back;  // (device destination, pinned source)
  bool returns_to_device = false;
  DeviceEvent returned;  // recorded behind the copies back
  std::vector<PinnedBuffer> pinned;
};

class StagedComm;

// Every staged communicator of this thread (a Comm and its work belong to the thread that made it).
// A wait on one advances them all, as an MPI call progresses every request of the process: across
// ranks, one group's operation may wait for another group's — a pipeline stage blocked on a
// receive on one link while its send on another link has yet to start on the host.
thread_local std::vector<StagedComm*> t_staged;
void progress_every_staged_comm();

class StagedWork final : public Work {
 public:
  StagedWork(StagedComm* comm, std::shared_ptr<StagedOp> op) : comm_(comm), op_(std::move(op)) {}
  void wait() override;
  bool done() override;

 private:
  StagedComm* comm_;
  std::shared_ptr<StagedOp> op_;
};

class StagedComm final : public Comm {
 public:
  explicit StagedComm(std::unique_ptr<Comm> host) : host_(std::move(host)) { t_staged.push_back(this); }
  ~StagedComm() override { std::erase(t_staged, this); }
  StagedComm(const StagedComm&) = delete;
  StagedComm& operator=(const StagedComm&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }
  void set_timeout(double seconds) override { host_->set_timeout(seconds); }
  double timeout() const override { return host_->timeout(); }

  void progress() override { progress_every_staged_comm(); }

  // This communicator's share of progress_every_staged_comm(). Never blocks.
  void progress_own() {
    host_->progress();
    advance();
  }

  std::unique_ptr<Comm> split(int color, int key, std::string name) override {
    drain();
    return std::make_unique<StagedComm>(host_->split(color, key, std::move(name)));
  }

  WorkHandle all_reduce_async(Tensor buf, Reduction op) override {
    auto s = begin(fmt::format("all_reduce of {} {}", buf.numel(), kernels::to_string(buf.dtype)));
    Tensor b = stage_in(*s, buf);
    return submit(s, [this, b, op] { return host_->all_reduce_async(b, op); }, {{buf, b}});
  }

  WorkHandle reduce_scatter_async(Tensor in, Tensor out, Reduction op) override {
    auto s = begin(fmt::format("reduce_scatter of {} {}", in.numel(), kernels::to_string(in.dtype)));
    Tensor i = stage_in(*s, in), o = host_side(*s, out);
    return submit(s, [this, i, o, op] { return host_->reduce_scatter_async(i, o, op); }, {{out, o}});
  }

  WorkHandle all_gather_async(Tensor in, Tensor out) override {
    auto s = begin(fmt::format("all_gather of {} {}", in.numel(), kernels::to_string(in.dtype)));
    Tensor i = stage_in(*s, in), o = host_side(*s, out);
    return submit(s, [this, i, o] { return host_->all_gather_async(i, o); }, {{out, o}});
  }

  WorkHandle broadcast_async(Tensor buf, int root) override {
    auto s = begin(fmt::format("broadcast of {} {} from rank {}", buf.numel(), kernels::to_string(buf.dtype), root));
    Tensor b = rank() == root ? stage_in(*s, buf) : host_side(*s, buf);
    return submit(s, [this, b, root] { return host_->broadcast_async(b, root); }, {{buf, b}});
  }

  WorkHandle send_async(Tensor buf, int peer, int tag) override {
    auto s = begin(fmt::format("send of {} {} to rank {}", buf.numel(), kernels::to_string(buf.dtype), peer));
    Tensor b = stage_in(*s, buf);
    return submit(s, [this, b, peer, tag] { return host_->send_async(b, peer, tag); }, {});
  }

  WorkHandle recv_async(Tensor buf, int peer, int tag) override {
    auto s = begin(fmt::format("recv of {} {} from rank {}", buf.numel(), kernels::to_string(buf.dtype), peer));
    Tensor b = host_side(*s, buf);
    return submit(s, [this, b, peer, tag] { return host_->recv_async(b, peer, tag); }, {{buf, b}});
  }

  WorkHandle all_to_all_async(Tensor in, Tensor out) override {
    auto s = begin(fmt::format("all_to_all of {} {}", in.numel(), kernels::to_string(in.dtype)));
    Tensor i = stage_in(*s, in), o = host_side(*s, out);
    return submit(s, [this, i, o] { return host_->all_to_all_async(i, o); }, {{out, o}});
  }

  WorkHandle exchange_async(std::vector<Transfer> transfers) override {
    auto s = begin(fmt::format("exchange of {} transfers", transfers.size()));
    std::vector<Transfer> host_transfers;
    std::vector<std::pair<Tensor, Tensor>> results;
    for (const Transfer& t : transfers) {
      Transfer h = t;
      if (t.kind == Transfer::Kind::send) {
        h.buf = stage_in(*s, t.buf);
      } else {
        h.buf = host_side(*s, t.buf);
        results.emplace_back(t.buf, h.buf);
      }
      host_transfers.push_back(h);
    }
    return submit(
        s, [this, host_transfers] { return host_->exchange_async(host_transfers); }, std::move(results));
  }

  WorkHandle barrier_async() override {
    auto s = begin("barrier");
    return submit(s, [this] { return host_->barrier_async(); }, {});
  }

  // Waits until `op`'s host operation has started (every earlier one has), bounded by the timeout.
  void wait_started(StagedOp& op) {
    advance();
    if (op.state != StagedOp::State::staging) return;
    const double waited = wait_poll(
        [&] {
          progress_every_staged_comm();
          return op.state != StagedOp::State::staging ? Poll::done : Poll::pending;
        },
        timeout());
    if (waited < 0)
      throw environment_error(
          fmt::format("timed out after {} waiting for the device to copy the input of {} on group '{}' to the host",
                      format_duration(timeout()), op.what, name()),
          "the device did not finish the work queued before the operation within parallel.timeout: a kernel is "
          "stuck or the device failed (see the rank's log and `nvidia-smi`)");
  }

  // Copies `op`'s result back (once its host operation is done) and makes the compute stream wait.
  void finish(StagedOp& op) {
    if (op.state == StagedOp::State::started) {
      // Polled rather than waited for, so that the thread's other staged communicators keep
      // starting their host operations meanwhile; the host wait then returns at once (or throws).
      const double waited = wait_poll(
          [&] {
            progress_every_staged_comm();
            return op.state != StagedOp::State::started || op.host->done() ? Poll::done : Poll::pending;
          },
          timeout());
      if (waited < 0)
        throw environment_error(
            fmt::format("timed out after {} waiting for {} on group '{}' ({} ranks; this is its rank {})",
                        format_duration(timeout()), op.what, name(), size(), rank()),
            fmt::format("the other ranks of group '{}' did not complete it within parallel.timeout: one is stuck, has "
                        "crashed or called a different operation (its own output says which); if they are only "
                        "slow, raise parallel.timeout",
                        name()));
    }
    if (op.state == StagedOp::State::started) {
      op.host->wait();
      return_to_device(op);
    }
    if (op.returns_to_device) op.returned.make_compute_wait();
  }

  // Whether `op` has completed, its result back in device memory. Never blocks.
  bool completed(StagedOp& op) {
    progress_every_staged_comm();
    if (op.state == StagedOp::State::staging || op.state == StagedOp::State::started) return false;
    return !op.returns_to_device || op.returned.done();
  }

 private:
  std::shared_ptr<StagedOp> begin(std::string what) {
    auto s = std::make_shared<StagedOp>();
    s->what = std::move(what);
    return s;
  }

  PinnedBuffer& pinned_for(StagedOp& op, const Tensor& t) {
    const size_t bytes = t.bytes();
    // The smallest pooled buffer that fits, or a new one.
    size_t best = pool_.size();
    for (size_t i = 0; i < pool_.size(); ++i)
      if (pool_[i].bytes() >= bytes && (best == pool_.size() || pool_[i].bytes() < pool_[best].bytes())) best = i;
    if (best == pool_.size()) {
      op.pinned.emplace_back(bytes);
    } else {
      op.pinned.push_back(std::move(pool_[best]));
      pool_.erase(pool_.begin() + std::ptrdiff_t(best));
    }
    return op.pinned.back();
  }

  // Where the host operation finds `t`: `t` itself on the host, else pinned memory (not filled).
  Tensor host_side(StagedOp& op, const Tensor& t) {
    if (t.device == Device::cpu) return t;
    return pinned_for(op, t).tensor(t.dtype, t.shape);
  }

  // Like host_side, and a device tensor's contents copied there on the communication stream once
  // the compute stream's work queued so far has run.
  Tensor stage_in(StagedOp& op, const Tensor& t) {
    Tensor h = host_side(op, t);
    if (t.device == Device::cpu) return h;
    order_after_compute(op);
    stream_->copy_async(h, t);
    op.staged_on_device = true;
    return h;
  }

  // Makes the communication stream's work from here on wait for the compute stream's work queued
  // so far, once per operation: its inputs are written, and nothing queued before it (a new
  // buffer's zero fill, say) can land on its outputs after the copy back.
  void order_after_compute(StagedOp& op) {
    if (op.ordered) return;
    if (!stream_) stream_ = std::make_unique<kernels::DeviceStream>();
    DeviceEvent queued;
    queued.record_compute();
    queued.make_wait(*stream_);
    op.ordered = true;
  }

  WorkHandle submit(const std::shared_ptr<StagedOp>& op, std::function<WorkHandle()> start,
                    std::vector<std::pair<Tensor, Tensor>> results) {
    if (op->staged_on_device) op->staged.record(*stream_);
    op->start = std::move(start);
    for (auto& [dst, src] : results)
      if (dst.device == Device::cuda) {
        order_after_compute(*op);
        op->copy_back.emplace_back(dst, src);
      }
    pending_.push_back(op);
    advance();
    return std::make_unique<StagedWork>(this, op);
  }

  void return_to_device(StagedOp& op) {
    if (!op.copy_back.empty()) {
      if (!stream_) stream_ = std::make_unique<kernels::DeviceStream>();
      for (auto& [dst, src] : op.copy_back) stream_->copy_async(dst, src);
      op.returned.record(*stream_);
      op.returns_to_device = true;
    }
    op.host.reset();
    op.state = StagedOp::State::returning;
  }

  // Starts host operations in call order as their inputs arrive, copies finished ones back, and
  // returns the pinned memory of those whose copies back have run to the pool. Never blocks.
  void advance() {
    bool may_start = true;
    for (auto& p : pending_) {
      StagedOp& op = *p;
      if (op.state == StagedOp::State::staging) {
        if (may_start && (!op.staged_on_device || op.staged.done())) {
          op.host = op.start();
          op.start = nullptr;
          op.state = StagedOp::State::started;
        } else {
          may_start = false;
        }
      }
      if (op.state == StagedOp::State::started && op.host->done()) return_to_device(op);
    }
    while (!pending_.empty()) {
      StagedOp& front = *pending_.front();
      if (front.state != StagedOp::State::returning || (front.returns_to_device && !front.returned.done())) break;
      front.state = StagedOp::State::finished;
      for (PinnedBuffer& b : front.pinned) pool_.push_back(std::move(b));
      front.pinned.clear();
      pending_.pop_front();
    }
  }

  // Every pending operation finished on the host (before a split, which is a host collective).
  void drain() {
    for (auto& p : pending_) {
      wait_started(*p);
      finish(*p);
    }
    advance();
  }

  std::unique_ptr<Comm> host_;
  std::unique_ptr<kernels::DeviceStream> stream_;  // the communication stream, made at first use
  std::deque<std::shared_ptr<StagedOp>> pending_;
  std::vector<PinnedBuffer> pool_;
};

void progress_every_staged_comm() {
  for (size_t i = 0; i < t_staged.size(); ++i) t_staged[i]->progress_own();
}

void StagedWork::wait() {
  if (!op_) return;
  comm_->wait_started(*op_);
  comm_->finish(*op_);
  op_.reset();
}

bool StagedWork::done() { return !op_ || comm_->completed(*op_); }

}  // namespace

std::unique_ptr<Comm> make_staged_comm(std::unique_ptr<Comm> host) {
  return std::make_unique<StagedComm>(std::move(host));
}

}  // namespace llmtrain::parallel
