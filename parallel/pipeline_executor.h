// The one executor that runs any pipeline schedule (parallel/pipeline_schedule.h) on one stage: it
// walks the stage's instruction list, calls the stage's forward and backward, and moves
// activations and their gradients to the neighbouring stages with non-blocking sends and receives.
// The trainer implements PipelineStage on its model; the executor knows nothing of layers.
//
// Rules a reader could get wrong:
//  - The stage is the rank in the pp group: stage s receives activations from pp rank s - 1 and
//    sends them to s + 1; gradients go the other way. Each kind and direction has its own link
//    (parallel/pipe_links.h), where sends and receives match in list order: no tags, and no
//    receive needs to be posted before its send.
//  - Memory contract between executor and stage (no copies are made on either side):
//      * the `input` passed to forward(mb, c) is an executor buffer that stays valid and unchanged
//        until backward(mb, c) (or backward_weight(mb, c) of a split backward) returns, so the
//        stage may keep it as a saved activation;
//      * `grad_output` passed to backward(mb, c) or backward_input(mb, c) is valid only during
//        that call;
//      * the tensor output(mb, c) returns must stay valid and unchanged until the executor calls
//        backward(mb, c) or backward_input(mb, c) (its send is waited for before that call);
//      * a forward-only list (evaluation, forward_only_schedule): the input passed to forward(mb, c)
//        is valid only during that call, and output(mb, c) must stay valid and unchanged until the
//        next forward of chunk c (its send is waited for before that call), so one output buffer
//        per chunk is enough;
//      * the tensor input_grad(mb, c) returns must stay valid and unchanged until the executor's
//        next backward or backward_input call or the end of run() (its send is waited for before
//        either), so one buffer for every micro-batch's input gradient is enough.
//  - Receives are posted where the list puts them (one piece of work ahead of their use) and
//    waited for just before their data is used; sends are posted right after their producer and
//    waited for as late as the contract above allows; run() returns only after every send
//    completed. Every wait is bounded by the pp communicator's timeout and a timeout names the
//    operation, the micro-batch and the stage.
//  - Asynchronous transfers advance only inside communicator calls: the executor calls
//    links.progress() after every forward and backward. A stage that computes for long may call it
//    itself between layers.
//  - After run() throws, the executor and the pp group are unusable (a receive may still land in
//    an executor buffer): the error goes to the rank's top level, which ends the job.
#pragma once

#include <memory>
#include <vector>

#include "kernels/buffer.h"
#include "parallel/comm/comm.h"
#include "parallel/pipe_links.h"
#include "parallel/pipeline_schedule.h"

namespace llmtrain::parallel {

// What a pipeline stage does, as the executor sees it (the trainer implements it on its Model).
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // What crosses between stages, per micro-batch: the stage's output activation and the gradient
  // of its input have this shape, dtype and device on every stage.
  virtual kernels::Shape activation_shape() const = 0;
  virtual kernels::DType activation_dtype() const = 0;
  virtual kernels::Device activation_device() const = 0;
  // `input` is undefined (Tensor{}) on the first stage, which reads its own micro-batch;
  // `grad_output` is undefined on the last stage, which computes the loss.
  virtual void forward(int micro_batch, int chunk, Tensor input) = 0;
  virtual void backward(int micro_batch, int chunk, Tensor grad_output) = 0;
  // Zero-bubble schedules: backward split in two. backward_input computes what backward sends on
  // (input_grad) and keeps what the weight gradients need; backward_weight then accumulates the
  // micro-batch's weight gradients. A stage that cannot split refuses (the default).
  virtual void backward_input(int micro_batch, int chunk, Tensor grad_output);
  virtual void backward_weight(int micro_batch, int chunk);
  // Valid after forward(micro_batch, chunk): what is sent to the next stage (not called on the
  // last stage).
  virtual Tensor output(int micro_batch, int chunk) = 0;
  // Valid after backward(micro_batch, chunk) or backward_input: what is sent to the previous stage
  // (not called on the first stage).
  virtual Tensor input_grad(int micro_batch, int chunk) = 0;
};

// Constructed once per list (per training run) and run every step: the receive buffers — as many
// as the list keeps receives pending or in use at once — are allocated here, so a step allocates
// no tensor memory.
class PipelineExecutor {
 public:
  // `ops`: this stage's list, for stage links.stage of links.stages (checked with
  // check_stage_schedule). The stage and the links must outlive the executor.
  PipelineExecutor(std::vector<PipeOp> ops, PipelineStage& stage, PipeLinks& links);

  // One step: every op of the list, in order.
  void run();

  const std::vector<PipeOp>& ops() const { return ops_; }

  // The receive buffers a list needs (each of PipelineStage::activation_shape()), and which one
  // each receive lands in: what the constructor allocates, for memory plans made without
  // allocating (trainer/placement/memory.h).
  struct ReceiveSlots {
    std::vector<int> slot;  // per op: the buffer a receive lands in, -1 for other ops
    int activation_buffers = 0, grad_buffers = 0;
  };
  static ReceiveSlots receive_slots(const std::vector<PipeOp>& ops);

  int activation_buffers() const { return static_cast<int>(activation_bufs_.size()); }
  int grad_buffers() const { return static_cast<int>(grad_bufs_.size()); }

 private:
  // What the executor does at each op, worked out once from the list.
  struct Plan {
    int slot = -1;       // receives: the buffer they land in
    int wait_recv = -1;  // forward/backward: the receive to wait for (op index), or -1
    int wait_send = -1;  // backward: the activation send of the same micro-batch, or -1; forward of a
                         // forward-only list: the previous activation send of the same chunk, or -1
  };

  // Waits for the transfer of op i; `user` is the op that needs it (nullptr: the end of the step).
  void wait_for(size_t i, const PipeOp* user);
  // The link op i moves its message on.
  Comm& link_of(const PipeOp& op) const;

  std::vector<PipeOp> ops_;
  std::vector<Plan> plan_;
  PipelineStage& stage_;
  PipeLinks& links_;
  bool forward_only_ = false;  // the list has no backward work (evaluation)
  kernels::Shape shape_;
  kernels::DType dtype_;
  std::vector<kernels::Buffer> activation_bufs_, grad_bufs_;
  std::vector<WorkHandle> pending_;      // by op index: sends and receives not yet waited for
  std::vector<int> grad_sends_pending_;  // op indices of gradient sends not yet waited for
};

}  // namespace llmtrain::parallel
