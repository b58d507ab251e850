// MpiComm: the Comm interface over an MPI communicator, for host buffers (the CPU backend, and the
// bootstrap channel of every job).
//
// How it works, and the rules a reader could get wrong:
//  - Every operation is nonblocking underneath: the blocking form is the asynchronous one plus
//    wait(). A wait polls MPI_Test with a deadline (the communicator's timeout): eagerly while
//    data is expected to move, with short sleeps otherwise, so that a waiting rank does not take a
//    core from a rank that computes (parallel/comm/wait_poll.h). A wait that runs out throws
//    llmtrain::Error naming the operation, the group, its size and, for send/recv, the peer.
//  - Progress: Open MPI advances nonblocking collectives only inside MPI calls, and the job runs
//    at MPI_THREAD_FUNNELED (no progress thread, see parallel/bootstrap.h). Overlap comes from
//    polling: Comm::progress() tests every pending operation of this communicator; the gradient
//    bucket reducer calls it each time a parameter's gradient is ready.
//  - Every MPI call of an operation is issued when the operation starts, never later from a poll:
//    collectives must be issued in the same order on every rank, and polls happen at different
//    times on different ranks. Local finishing steps (avg's division, bf16 conversion, copies out
//    of scratch buffers) run once the requests completed, from wait(), done() or progress().
//  - Element counts beyond max_count() (INT_MAX, MPI's int counts) go in pieces: contiguous
//    pieces for all-reduce, broadcast and send/recv (which go in 1 MiB pieces anyway, see
//    kPieceBytes), strided datatypes for all-gather and all-to-all, and a packed copy of the
//    input for reduce-scatter.
//  - Reductions: fp32, int32, int64, uint8, uint16 reduce natively; bf16 and fp16 are widened to an
//    fp32 scratch buffer, reduced in fp32 and rounded once at the end, or (Accumulate::in_dtype)
//    moved as 16-bit words and summed by a user-defined MPI op that rounds each addition. avg is an MPI sum followed
//    by a division by the group size in the reduction type (x / n, as torch's `/ world_size`);
//    every rank gets bitwise the same result because Open MPI's algorithms combine the same
//    operands in the same order on every rank (the multi-rank test checks it).
//  - Scratch buffers live in the Work; a Work destroyed before it completed (an error unwinding)
//    leaks them on purpose, since MPI may still write into them until the job is aborted.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/comm.h"

namespace llmtrain::parallel {

class MpiWork;

// All-reduce, broadcast and send/recv go in pieces of at most this many bytes, all started at
// once. Each completed piece tells a wait that data is moving (parallel/comm/wait_poll.h), and pieces
// pipeline. Measured on 2 ranks (shared memory, no single-copy): a 16 MiB all-reduce in 1 MiB
// pieces took 1.2-1.4× a blocking MPI_Allreduce, in one piece with the same waits 10×.
inline constexpr int64_t kPieceBytes = int64_t(1) << 20;

class MpiComm final : public Comm {
 public:
  // Takes ownership of `comm` and frees it on destruction (unless MPI is finalised by then).
  // Errors must be set to return on `comm` (bootstrap sets MPI_ERRORS_RETURN on the world).
  MpiComm(MPI_Comm comm, std::string name, double timeout_s);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  MPI_Comm handle() const { return comm_; }
  // The MPI_COMM_WORLD rank of this group's rank `rank` (for messages).
  int world_rank_of(int rank) const;

  // Largest element count one MPI call carries (INT_MAX unless lowered). Tests lower it to run
  // the piecewise path on small buffers; split() passes it on.
  void set_max_count(int64_t elements);
  int64_t max_count() const { return max_count_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  void set_timeout(double seconds) override;
  double timeout() const override { return timeout_s_; }
  void progress() override;
  std::unique_ptr<Comm> split(int color, int key, std::string name) override;

  WorkHandle all_reduce_async(Tensor buf, Reduction op) override;
  WorkHandle reduce_scatter_async(Tensor in, Tensor out, Reduction op) override;
  WorkHandle all_gather_async(Tensor in, Tensor out) override;
  WorkHandle broadcast_async(Tensor buf, int root) override;
  WorkHandle send_async(Tensor buf, int peer, int tag = 0) override;
  WorkHandle recv_async(Tensor buf, int peer, int tag = 0) override;
  WorkHandle all_to_all_async(Tensor in, Tensor out) override;
  WorkHandle barrier_async() override;

 private:
  friend class MpiWork;
  struct Op;  // what an operation is, for messages

  std::unique_ptr<MpiWork> begin(const Op& op);
  WorkHandle launch(std::unique_ptr<MpiWork> work);
  void check_thread(const char* op) const;
  void check_peer(int peer, const char* op) const;
  WorkHandle transfer(bool send, Tensor buf, int peer, int tag);  // send_async, recv_async
  void forget(MpiWork* work);
  // Elements per MPI call for operations sent in progress pieces (see kPieceBytes).
  int64_t piece_elements(size_t element_size) const;

  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  double timeout_s_;
  int64_t max_count_;
  std::thread::id owner_;
  std::vector<MpiWork*> pending_;  // started, not yet seen complete; progress() polls them
  std::vector<int> world_ranks_;   // MPI_COMM_WORLD rank of each member
};

// A duplicate of MPI_COMM_WORLD named `name`, so that our traffic never matches anyone else's.
// MPI must be initialised (parallel::bootstrap does it).
std::unique_ptr<MpiComm> make_mpi_world_comm(double timeout_s, std::string name = "world");

}  // namespace llmtrain::parallel
