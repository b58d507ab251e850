// The one-rank communicator. Every collective over one rank is the identity, or a copy when input
// and output are different buffers, on the host or on the device (a device copy is queued on the
// compute stream, so it is ordered with the ops around it).
#include <cstring>
#include <string>

#include "common/enum_names.h"
#include "common/error.h"
#include "kernels/ops.h"
#include "parallel/comm/comm.h"

namespace llmtrain::parallel {

const char* to_string(ReduceOp op) {
  static constexpr EnumName<ReduceOp> kNames[] = {
      {"sum", ReduceOp::sum}, {"avg", ReduceOp::avg}, {"max", ReduceOp::max}};
  return enum_name(kNames, op);
}

const char* to_string(Accumulate a) { return a == Accumulate::fp32 ? "fp32" : "in_dtype"; }

bool Reduction::sums_in_16_bits(kernels::DType dtype) const {
  return accumulate == Accumulate::in_dtype && op != ReduceOp::max &&
         (dtype == kernels::DType::bf16 || dtype == kernels::DType::fp16);
}

size_t wire_element_size(const Reduction& r, kernels::DType dtype) {
  const bool sixteen = dtype == kernels::DType::bf16 || dtype == kernels::DType::fp16;
  return sixteen && !r.sums_in_16_bits(dtype) ? sizeof(float) : kernels::dtype_size(dtype);
}

std::string to_string(const Reduction& r, kernels::DType dtype) {
  std::string out = to_string(r.op);
  if (r.sums_in_16_bits(dtype)) out += std::string(" in ") + kernels::to_string(dtype);
  return out;
}

bool reduce_supported(kernels::DType dtype, ReduceOp op) {
  using kernels::DType;
  return op != ReduceOp::avg || dtype == DType::fp32 || dtype == DType::bf16 || dtype == DType::fp16;
}

void wait_all(std::vector<WorkHandle>& works) {
  for (auto& w : works)
    if (w) w->wait();
}

namespace {

// Several pending operations as one.
class GroupWork final : public Work {
 public:
  explicit GroupWork(std::vector<WorkHandle> works) : works_(std::move(works)) {}
  void wait() override { wait_all(works_); }
  bool done() override {
    bool all = true;
    for (auto& w : works_) all = (!w || w->done()) && all;  // every one polled: each progresses
    return all;
  }

 private:
  std::vector<WorkHandle> works_;
};

}  // namespace

WorkHandle Comm::exchange_async(std::vector<Transfer> transfers) {
  std::vector<WorkHandle> works;
  // Receives first: a backend that matches messages to posted receives finds them there.
  for (const Transfer& t : transfers)
    if (t.kind == Transfer::Kind::recv) works.push_back(recv_async(t.buf, t.peer, t.tag));
  for (const Transfer& t : transfers)
    if (t.kind == Transfer::Kind::send) works.push_back(send_async(t.buf, t.peer, t.tag));
  return std::make_unique<GroupWork>(std::move(works));
}

WorkHandle Comm::all_to_all_v_async(Tensor in, const std::vector<int64_t>& send_counts, Tensor out,
                                    const std::vector<int64_t>& recv_counts) {
  const int n = size(), me = rank();
  LT_CHECK(int(send_counts.size()) == n && int(recv_counts.size()) == n,
           "all_to_all_v on group '{}' of {} ranks with {} send and {} receive counts", name(), n, send_counts.size(),
           recv_counts.size());
  LT_CHECK(in.dtype == out.dtype && in.device == out.device, "all_to_all_v from {} {} to {} {}",
           kernels::to_string(in.dtype), kernels::to_string(in.device), kernels::to_string(out.dtype),
           kernels::to_string(out.device));
  int64_t send_total = 0, recv_total = 0;
  for (int r = 0; r < n; ++r) {
    LT_CHECK(send_counts[size_t(r)] >= 0 && recv_counts[size_t(r)] >= 0, "negative all_to_all_v count");
    send_total += send_counts[size_t(r)];
    recv_total += recv_counts[size_t(r)];
  }
  LT_CHECK(send_total <= in.numel() && recv_total <= out.numel(),
           "all_to_all_v of {} elements from {} and {} into {} on group '{}'", send_total, in.numel(), recv_total,
           out.numel(), name());
  LT_CHECK(send_counts[size_t(me)] == recv_counts[size_t(me)], "all_to_all_v sends {} to itself but receives {}",
           send_counts[size_t(me)], recv_counts[size_t(me)]);
  std::vector<Transfer> transfers;
  int64_t sent = 0, received = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t s = send_counts[size_t(r)], g = recv_counts[size_t(r)];
    if (r == me) {
      if (s > 0) kernels::copy(out.flat(received, g), in.flat(sent, s));
    } else {
      if (g > 0) transfers.push_back({Transfer::Kind::recv, out.flat(received, g), r, kAllToAllTag});
      if (s > 0) transfers.push_back({Transfer::Kind::send, in.flat(sent, s), r, kAllToAllTag});
    }
    sent += s;
    received += g;
  }
  return exchange_async(std::move(transfers));
}

namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool done() override { return true; }
};

void copy_one_rank(Tensor in, Tensor out) {
  LT_CHECK(in.bytes() == out.bytes() && in.dtype == out.dtype, "one-rank copy of {} {} into {} {}", in.numel(),
           kernels::to_string(in.dtype), out.numel(), kernels::to_string(out.dtype));
  LT_CHECK(in.device == out.device, "one-rank copy from {} to {} memory", kernels::to_string(in.device),
           kernels::to_string(out.device));
  if (in.data == out.data || in.bytes() == 0) return;
  if (in.device == kernels::Device::cpu)
    std::memmove(out.data, in.data, in.bytes());
  else
    kernels::copy(out, in);
}

class LocalComm final : public Comm {
 public:
  explicit LocalComm(std::string name) : name_(std::move(name)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

  void set_timeout(double seconds) override { timeout_s_ = seconds; }
  double timeout() const override { return timeout_s_; }
  void progress() override {}
  std::unique_ptr<Comm> split(int color, int key, std::string name) override {
    LT_CHECK(color >= 0, "split of one-rank group {} with color {}", name_, color);
    auto c = make_local_comm(std::move(name));
    c->set_timeout(timeout_s_);
    return c;
  }

  void all_reduce(Tensor buf, Reduction op) override {
    LT_CHECK(reduce_supported(buf.dtype, op.op), "{} of {} in group {}", to_string(op, buf.dtype),
             kernels::to_string(buf.dtype), name_);
  }
  void reduce_scatter(Tensor in, Tensor out, Reduction op) override {
    LT_CHECK(reduce_supported(in.dtype, op.op), "{} of {} in group {}", to_string(op, in.dtype),
             kernels::to_string(in.dtype), name_);
    copy_one_rank(in, out);
  }
  void all_gather(Tensor in, Tensor out) override { copy_one_rank(in, out); }
  void broadcast(Tensor, int root) override { LT_CHECK(root == 0, "broadcast from rank {} in a one-rank group", root); }
  void send(Tensor, int peer, int) override { LT_CHECK(false, "send to rank {} in one-rank group {}", peer, name_); }
  void recv(Tensor, int peer, int) override { LT_CHECK(false, "recv from rank {} in one-rank group {}", peer, name_); }
  void all_to_all(Tensor in, Tensor out) override { copy_one_rank(in, out); }
  void barrier() override {}

  WorkHandle all_reduce_async(Tensor buf, Reduction op) override {
    all_reduce(buf, op);
    return std::make_unique<DoneWork>();
  }
  WorkHandle reduce_scatter_async(Tensor in, Tensor out, Reduction op) override {
    reduce_scatter(in, out, op);
    return std::make_unique<DoneWork>();
  }
  WorkHandle all_gather_async(Tensor in, Tensor out) override {
    all_gather(in, out);
    return std::make_unique<DoneWork>();
  }
  WorkHandle broadcast_async(Tensor buf, int root) override {
    broadcast(buf, root);
    return std::make_unique<DoneWork>();
  }
  WorkHandle all_to_all_async(Tensor in, Tensor out) override {
    all_to_all(in, out);
    return std::make_unique<DoneWork>();
  }
  WorkHandle barrier_async() override { return std::make_unique<DoneWork>(); }
  WorkHandle send_async(Tensor buf, int peer, int tag) override {
    send(buf, peer, tag);
    return nullptr;
  }
  WorkHandle recv_async(Tensor buf, int peer, int tag) override {
    recv(buf, peer, tag);
    return nullptr;
  }

 private:
  std::string name_;
  double timeout_s_ = 300.0;
};

}  // namespace

std::unique_ptr<Comm> make_local_comm(std::string name) { return std::make_unique<LocalComm>(std::move(name)); }

}  // namespace llmtrain::parallel
