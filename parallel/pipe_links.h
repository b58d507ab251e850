// The links between neighbouring pipeline stages: each is a two-rank communicator that carries one
// kind of message (activations, or their gradients) one way between two stages, so its sends and
// receives match in the order they are made. Nothing relies on message tags or on a receive being
// posted before its send: a backend that runs one communicator's operations in order and has no
// tags (NCCL's point-to-point) sits behind the executor as MPI does.
//
// Rules a reader could get wrong:
//  - A link's rank 0 sends and its rank 1 receives; only one side ever sends, so in-order execution
//    of a link's operations can never put a receive in front of a send it waits for.
//  - Stage s sends activations to (s + 1) mod P and gradients to (s - 1) mod P: the wrap from the
//    last stage to the first carries the interleaved schedule's chunk boundaries. Every chunk's
//    messages between two stages share the link; every schedule sends on a link in the order its
//    other end receives (check_schedule, parallel/pipeline_schedule.h, checks it for every list).
//  - With two stages, stage 0 → 1 and 1 → 0 are different links although their ranks are the same.
//  - make_pipe_links is collective over the pp group (2 · P splits of it, every rank in the same
//    order); links inherit the group's timeout and its kind of memory (a staged communicator's
//    splits move device memory), and each moves its messages independently of the others.
//  - One stage (P = 1): no links, and a list of one stage has no transfers.
#pragma once

#include <memory>
#include <vector>

#include "parallel/comm/comm.h"

namespace llmtrain::parallel {

struct PipeLinks {
  int stages = 1;                        // the pp group's size
  int stage = 0;                         // this rank's stage (its rank in the pp group)
  std::unique_ptr<Comm> activation_out;  // to the next stage (this rank is the link's rank 0)
  std::unique_ptr<Comm> activation_in;   // from the previous stage (rank 1)
  std::unique_ptr<Comm> grad_out;        // to the previous stage (rank 0)
  std::unique_ptr<Comm> grad_in;         // from the next stage (rank 1)
  // The links in the order they were made, the same on every stage (boundary by boundary): the
  // order they are destroyed in. An NCCL communicator's end is collective and waits for the
  // link's other rank (ncclCommFinalize): destroyed as members are, in reverse declaration order,
  // stage 0 would end "gradients 1 to 0" first while stage 1 ends "gradients 0 to 1", each waiting
  // for the other (tests/parallel/comm/comm_order.h's replay finds it).
  std::vector<std::unique_ptr<Comm>*> made;

  PipeLinks() = default;
  PipeLinks(PipeLinks&& o) noexcept { *this = std::move(o); }
  PipeLinks& operator=(PipeLinks&& o) noexcept;
  ~PipeLinks();

  // Advances every link's transfers (Comm::progress).
  void progress();
  void set_timeout(double seconds);

 private:
  void end_links();  // destroys the links in `made` order
};

// The link's rank of the sender and of the receiver.
inline constexpr int kLinkSender = 0;
inline constexpr int kLinkReceiver = 1;

// This rank's four links, split from `pp` (named "pp activations 1 to 2", "pp gradients 2 to 1", ...).
PipeLinks make_pipe_links(Comm& pp);

}  // namespace llmtrain::parallel
