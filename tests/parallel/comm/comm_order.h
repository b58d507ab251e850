// OrderLog: every operation the ranks of an in-process job start on their tensor groups, and a
// replay of them under NCCL's rules — the property the NCCL communicator (parallel/comm/comm_nccl.h)
// needs from the code above Comm, checked for every layout without a GPU
// (tests/trainer/loop/test_collective_order.cpp). Test code.
//
// NCCL's rules, as the replay applies them:
//  - One communicator per group, its operations run one after another in the order the rank
//    started them (one stream): an operation starts once the rank's previous one on the group has
//    completed.
//  - An operation also waits for what the compute stream had queued when it was started, which
//    includes every earlier operation (on any group) the rank had waited for (wait(), or done()
//    seen true): those must complete first.
//  - The k-th collective of a rank on a group meets the k-th collective of every other rank there,
//    and must be the same one (kind, element count, dtype, reduction, root); it completes once
//    every rank has started it.
//  - Sends and receives have no tags: the k-th send from rank a to rank b on a group is the k-th
//    receive at b from a, of the same size and dtype. A grouped exchange (and a send or receive
//    alone) completes once the other side of each of its transfers has been started.
//  - A group's communicator ends in ncclCommFinalize, logged when the wrapped communicator is
//    destroyed: a collective that the rank waits in (the next thing it starts waits for it), so
//    ranks that tear their groups down in different orders are found stuck, as they would be.
// The in-process communicator itself runs with MPI's rules (tags, nothing serialised), so a job
// that completes there can still hang under NCCL: the replay finds that, naming the operations each
// stuck rank waits in.
//
// Only tensor groups are logged: groups named "world" or "... control" carry host scalars over MPI
// on every backend (parallel/mesh_comms.h).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/comm.h"

namespace llmtrain::parallel {

struct LoggedTransfer {
  bool send = false;
  int peer = 0;  // rank in the group
  int64_t count = 0;
  kernels::DType dtype = kernels::DType::fp32;
};

struct LoggedOp {
  std::string group;  // the group's identity: its path of splits from the world ("world/tp#0")
  int group_size = 1;
  int rank = 0;  // in the group
  // Collectives: what every rank must agree on ("all_reduce of 96 fp32 (sum)"); empty for sends,
  // receives and exchanges, which list their transfers.
  std::string collective;
  std::vector<LoggedTransfer> transfers;
  std::string what;  // for messages
  // How many of the rank's observed completions (OrderLog::observed) preceded this start.
  size_t observed_before = 0;
};

class OrderLog {
 public:
  explicit OrderLog(int world_size);

  // Rank `world`'s communicator, wrapped so that every group split from it (and from those) logs
  // its operations here.
  std::unique_ptr<Comm> wrap(std::unique_ptr<Comm> world);

  // Replays every rank's operations under NCCL's rules; "" when all complete, else what went wrong
  // first (a mismatch, or the operations each stuck rank waits in).
  std::string check_nccl_order() const;

  size_t operations() const;

  // A rank's operation started (its index among the rank's), and its wait for operation `index`
  // seen complete: what the wrapped communicators record, and what the replay's own tests feed it.
  size_t add(int world_rank, LoggedOp op);
  void observe(int world_rank, size_t index);

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<LoggedOp>> ops_;        // per world rank, in start order
  std::vector<std::vector<size_t>> observed_;     // per world rank: indices of ops waited for, in order
  std::vector<std::vector<bool>> observed_seen_;  // per world rank and op: already in observed_
};

}  // namespace llmtrain::parallel
