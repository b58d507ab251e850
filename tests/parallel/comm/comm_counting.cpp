#include "tests/parallel/comm/comm_counting.h"

#include <numeric>

#include "common/error.h"

namespace llmtrain::parallel {

CountingComm::CountingComm(std::unique_ptr<Comm> inner) : inner_(std::move(inner)) {
  LT_CHECK(inner_ != nullptr, "CountingComm over no communicator");
}

int64_t CountingComm::bytes_sent() const { return std::accumulate(bytes_.begin(), bytes_.end(), int64_t(0)); }

void CountingComm::reset() {
  bytes_.fill(0);
  calls_.fill(0);
}

void CountingComm::count(Op op, int64_t bytes, int64_t num, int64_t den) {
  ++calls_[size_t(op)];
  if (size() > 1) bytes_[size_t(op)] += bytes * num / den;
}

void CountingComm::ring(Op op, const Tensor& t, size_t element_size) {
  const int64_t n = size(), bytes = t.numel() * int64_t(element_size);
  count(op, bytes, op == all_reduce_op ? 2 * (n - 1) : n - 1, n);
}

std::unique_ptr<Comm> CountingComm::split(int color, int key, std::string name) {
  return inner_->split(color, key, std::move(name));
}

WorkHandle CountingComm::all_reduce_async(Tensor buf, Reduction op) {
  ring(all_reduce_op, buf, wire_element_size(op, buf.dtype));
  return inner_->all_reduce_async(buf, op);
}
WorkHandle CountingComm::reduce_scatter_async(Tensor in, Tensor out, Reduction op) {
  ring(reduce_scatter_op, in, wire_element_size(op, in.dtype));
  return inner_->reduce_scatter_async(in, out, op);
}
WorkHandle CountingComm::all_gather_async(Tensor in, Tensor out) {
  ring(all_gather_op, out, kernels::dtype_size(out.dtype));
  return inner_->all_gather_async(in, out);
}
WorkHandle CountingComm::broadcast_async(Tensor buf, int root) {
  count(broadcast_op, rank() == root ? buf.numel() * int64_t(kernels::dtype_size(buf.dtype)) : 0, 1, 1);
  return inner_->broadcast_async(buf, root);
}
WorkHandle CountingComm::send_async(Tensor buf, int peer, int tag) {
  count(send_op, buf.numel() * int64_t(kernels::dtype_size(buf.dtype)), 1, 1);
  return inner_->send_async(buf, peer, tag);
}
WorkHandle CountingComm::recv_async(Tensor buf, int peer, int tag) { return inner_->recv_async(buf, peer, tag); }
WorkHandle CountingComm::all_to_all_async(Tensor in, Tensor out) {
  ring(all_to_all_op, in, kernels::dtype_size(in.dtype));
  return inner_->all_to_all_async(in, out);
}
WorkHandle CountingComm::barrier_async() { return inner_->barrier_async(); }

}  // namespace llmtrain::parallel
