// The one-rank communicator. Every collective over one rank is the identity, or a copy when input
// and output are different buffers. Host buffers only; device buffers of a one-rank job go through
// the NCCL backend, which handles one rank itself.
#include <cstring>
#include <string>

#include "common/enum_names.h"
#include "common/error.h"
#include "parallel/comm.h"

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

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool done() override { return true; }
};

void copy(Tensor in, Tensor out) {
  LT_CHECK(in.bytes() == out.bytes() && in.dtype == out.dtype, "one-rank copy of {} {} into {} {}", in.numel(),
           kernels::to_string(in.dtype), out.numel(), kernels::to_string(out.dtype));
  LT_CHECK(in.device == kernels::Device::cpu && out.device == kernels::Device::cpu, "one-rank comm on device memory");
  if (in.data != out.data && in.bytes() > 0) std::memmove(out.data, in.data, in.bytes());
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
    copy(in, out);
  }
  void all_gather(Tensor in, Tensor out) override { copy(in, out); }
  void broadcast(Tensor, int root) override { LT_CHECK(root == 0, "broadcast from rank {} in a one-rank group", root); }
  void send(Tensor, int peer, int) override { LT_CHECK(false, "send to rank {} in one-rank group {}", peer, name_); }
  void recv(Tensor, int peer, int) override { LT_CHECK(false, "recv from rank {} in one-rank group {}", peer, name_); }
  void all_to_all(Tensor in, Tensor out) override { copy(in, out); }
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
