// The pipeline executor. The constructor turns the list into a plan (which buffer each receive
// lands in, which transfer each forward and backward waits for) by walking it once the way run()
// will, so run() does no bookkeeping beyond posting and waiting.
//
// Buffer lifetimes, which the plan must respect: an activation buffer is taken when its receive is
// posted and given back after the backward of that micro-batch (the stage may keep the forward's
// input as a saved activation); a gradient buffer is taken when its receive is posted and given
// back after the backward that consumed it. Buffers are reused lowest-numbered first, so the counts
// are the most the list ever holds at once.
#include "parallel/pipeline_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "common/error.h"

namespace llmtrain::parallel {

namespace {

using K = PipeOpKind;

// Lowest-numbered free slot first; grows the pool when none is free.
int take_slot(std::vector<bool>& used) {
  for (size_t i = 0; i < used.size(); ++i)
    if (!used[i]) {
      used[i] = true;
      return static_cast<int>(i);
    }
  used.push_back(true);
  return static_cast<int>(used.size()) - 1;
}

// Drops the pending transfers while an exception leaves run(), so that their destructors see the
// unwinding (an incomplete handle dropped otherwise is a bug, see parallel/comm/comm.h).
class DropOnUnwind {
 public:
  explicit DropOnUnwind(std::vector<WorkHandle>& works) : works_(works), entry_(std::uncaught_exceptions()) {}
  ~DropOnUnwind() {
    if (std::uncaught_exceptions() > entry_)
      for (auto& w : works_) w.reset();
  }
  DropOnUnwind(const DropOnUnwind&) = delete;
  DropOnUnwind& operator=(const DropOnUnwind&) = delete;

 private:
  std::vector<WorkHandle>& works_;
  int entry_;
};

}  // namespace

void PipelineStage::backward_input(int micro_batch, int chunk, Tensor) {
  LT_CHECK(false, "this pipeline stage cannot split backward (I{} chunk {})", micro_batch, chunk);
}

void PipelineStage::backward_weight(int micro_batch, int chunk) {
  LT_CHECK(false, "this pipeline stage cannot split backward (W{} chunk {})", micro_batch, chunk);
}

PipelineExecutor::ReceiveSlots PipelineExecutor::receive_slots(const std::vector<PipeOp>& ops) {
  ReceiveSlots out;
  out.slot.assign(ops.size(), -1);
  std::vector<bool> act_used, grad_used;
  std::map<std::pair<int, int>, int> act_slot, grad_slot;  // (micro-batch, chunk) -> slot
  const bool forward_only = is_forward_only(ops);
  for (size_t i = 0; i < ops.size(); ++i) {
    const PipeOp& op = ops[i];
    const std::pair<int, int> key{op.micro_batch, op.chunk};
    if (op.kind == K::recv_activation) out.slot[i] = act_slot[key] = take_slot(act_used);
    if (op.kind == K::recv_grad) out.slot[i] = grad_slot[key] = take_slot(grad_used);
    // The input activation is given back after the micro-batch's last backward work (B or W), the
    // output gradient after the backward that consumes it (B or I).
    // A forward-only list gives it back after the forward.
    if (op.kind == K::backward || op.kind == K::backward_weight || (forward_only && op.kind == K::forward))
      if (auto it = act_slot.find(key); it != act_slot.end()) act_used[size_t(it->second)] = false;
    if (op.kind == K::backward || op.kind == K::backward_input)
      if (auto it = grad_slot.find(key); it != grad_slot.end()) grad_used[size_t(it->second)] = false;
  }
  out.activation_buffers = int(act_used.size());
  out.grad_buffers = int(grad_used.size());
  return out;
}

PipelineExecutor::PipelineExecutor(std::vector<PipeOp> ops, PipelineStage& stage, PipeLinks& links)
    : ops_(std::move(ops)),
      stage_(stage),
      links_(links),
      shape_(stage.activation_shape()),
      dtype_(stage.activation_dtype()) {
  const int stages = links.stages, me = links.stage;
  int micro_batches = 0, chunks = 1;
  for (const PipeOp& op : ops_) {
    if (op.kind == K::forward && op.chunk == 0) ++micro_batches;
    chunks = std::max(chunks, op.chunk + 1);
  }
  const std::string problem = check_stage_schedule(
      ops_, {.stages = stages, .stage = me, .micro_batches = std::max(micro_batches, 1), .chunks = chunks});
  LT_CHECK(problem.empty(), "pipeline executor on stage {} of {}: {}", me, stages, problem);

  // Walk the list as run() will: assign buffers and find what each piece of work waits for.
  plan_.resize(ops_.size());
  const ReceiveSlots slots = receive_slots(ops_);
  std::map<std::tuple<K, int, int>, int> transfers;  // (kind, micro-batch, chunk) -> op index
  forward_only_ = is_forward_only(ops_);
  std::map<int, int> last_send;  // forward-only: chunk -> its latest activation send (op index)
  for (size_t i = 0; i < ops_.size(); ++i) {
    const PipeOp& op = ops_[i];
    // The transfer of `kind` for this op's micro-batch and chunk listed before it, or -1.
    auto before = [&](K kind) {
      const auto it = transfers.find({kind, op.micro_batch, op.chunk});
      return it == transfers.end() ? -1 : it->second;
    };
    Plan& p = plan_[i];
    p.slot = slots.slot[i];
    switch (op.kind) {
      case K::recv_activation:
      case K::recv_grad:
      case K::send_activation:
      case K::send_grad:
        transfers[{op.kind, op.micro_batch, op.chunk}] = int(i);
        if (op.kind == K::send_activation) last_send[op.chunk] = int(i);
        break;
      case K::forward:
        p.wait_recv = before(K::recv_activation);
        // Forward only: the chunk's previous output must have left before this forward rewrites it.
        if (forward_only_)
          if (auto it = last_send.find(op.chunk); it != last_send.end()) p.wait_send = it->second;
        break;
      case K::backward:
      case K::backward_input:
        p.wait_recv = before(K::recv_grad);
        p.wait_send = before(K::send_activation);
        break;
      case K::backward_weight:
        break;
      default:
        LT_CHECK(false, "the executor cannot run {} yet", to_string(op));
    }
  }
  const kernels::Device device = stage.activation_device();
  for (int i = 0; i < slots.activation_buffers; ++i)
    activation_bufs_.emplace_back(dtype_, shape_, device, kernels::MemoryKind::communication);
  for (int i = 0; i < slots.grad_buffers; ++i)
    grad_bufs_.emplace_back(dtype_, shape_, device, kernels::MemoryKind::communication);
  pending_.resize(ops_.size());
  grad_sends_pending_.reserve(ops_.size());
}

Comm& PipelineExecutor::link_of(const PipeOp& op) const {
  Comm* link = op.kind == K::send_activation   ? links_.activation_out.get()
               : op.kind == K::recv_activation ? links_.activation_in.get()
               : op.kind == K::send_grad       ? links_.grad_out.get()
                                               : links_.grad_in.get();
  LT_CHECK(link != nullptr, "pipeline stage {} of {} has no link for {}", links_.stage, links_.stages, to_string(op));
  return *link;
}

void PipelineExecutor::wait_for(size_t i, const PipeOp* user) {
  WorkHandle& w = pending_[i];
  const std::string when = user ? "before " + to_string(*user) : std::string("at the end of the step");
  LT_CHECK(w != nullptr, "pipeline stage {}, {}: {} was never posted", links_.stage, when, to_string(ops_[i]));
  try {
    w->wait();
  } catch (const Error& e) {
    const PipeOp& op = ops_[i];
    const char* what = op.kind == K::recv_activation   ? "the input activation from the previous stage"
                       : op.kind == K::recv_grad       ? "the output gradient from the next stage"
                       : op.kind == K::send_activation ? "the next stage to take the activation sent to it"
                                                       : "the previous stage to take the gradient sent to it";
    throw Error(fmt::format("pipeline stage {} of {}, {}: waiting for {} ({}): {}", links_.stage, links_.stages, when,
                            what, to_string(op), e.what()),
                e.hint(), e.kind());
  }
  w.reset();
}

void PipelineExecutor::run() {
  DropOnUnwind drop(pending_);
  const size_t bytes = shape_.numel() * kernels::dtype_size(dtype_);
  auto check_sent = [&](const Tensor& t, const PipeOp& op) {
    LT_CHECK(t.defined() && t.bytes() == bytes && t.dtype == dtype_,
             "pipeline stage {}: the tensor to {} holds {} {} bytes, the activation is {} {}", links_.stage,
             to_string(op), t.bytes(), kernels::to_string(t.dtype), shape_.str(), kernels::to_string(dtype_));
  };
  grad_sends_pending_.clear();
  for (size_t i = 0; i < ops_.size(); ++i) {
    const PipeOp& op = ops_[i];
    const Plan& p = plan_[i];
    switch (op.kind) {
      case K::recv_activation:
        pending_[i] = link_of(op).recv_async(activation_bufs_[p.slot].tensor(), kLinkSender);
        break;
      case K::recv_grad:
        pending_[i] = link_of(op).recv_async(grad_bufs_[p.slot].tensor(), kLinkSender);
        break;
      case K::send_activation: {
        Tensor t = stage_.output(op.micro_batch, op.chunk);
        check_sent(t, op);
        pending_[i] = link_of(op).send_async(t, kLinkReceiver);
        break;
      }
      case K::send_grad: {
        Tensor t = stage_.input_grad(op.micro_batch, op.chunk);
        check_sent(t, op);
        pending_[i] = link_of(op).send_async(t, kLinkReceiver);
        grad_sends_pending_.push_back(int(i));
        break;
      }
      case K::forward: {
        if (p.wait_send >= 0) wait_for(p.wait_send, &op);
        Tensor input;
        if (p.wait_recv >= 0) {
          wait_for(p.wait_recv, &op);
          input = activation_bufs_[plan_[p.wait_recv].slot].tensor();
        }
        stage_.forward(op.micro_batch, op.chunk, input);
        links_.progress();
        break;
      }
      case K::backward:
      case K::backward_input: {
        // The stage may now overwrite this micro-batch's output and its one input-gradient buffer.
        if (p.wait_send >= 0) wait_for(p.wait_send, &op);
        for (int g : grad_sends_pending_) wait_for(g, &op);
        grad_sends_pending_.clear();
        Tensor grad_output;
        if (p.wait_recv >= 0) {
          wait_for(p.wait_recv, &op);
          grad_output = grad_bufs_[plan_[p.wait_recv].slot].tensor();
        }
        if (op.kind == K::backward)
          stage_.backward(op.micro_batch, op.chunk, grad_output);
        else
          stage_.backward_input(op.micro_batch, op.chunk, grad_output);
        links_.progress();
        break;
      }
      case K::backward_weight:
        stage_.backward_weight(op.micro_batch, op.chunk);
        links_.progress();
        break;
      default:
        LT_CHECK(false, "the executor cannot run {} yet", to_string(op));
    }
  }
  // Sends still in flight (the last gradient sends; activation sends are all waited by their
  // backward). Receives were all consumed.
  for (size_t i = 0; i < ops_.size(); ++i)
    if (pending_[i]) {
      LT_CHECK(ops_[i].kind == K::send_activation || ops_[i].kind == K::send_grad,
               "pipeline stage {}: {} was never used", links_.stage, to_string(ops_[i]));
      wait_for(i, nullptr);
    }
}

}  // namespace llmtrain::parallel
