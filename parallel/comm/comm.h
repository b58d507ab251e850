// Comm: one interface for every communication between ranks, over host buffers (MPI backend) and
// device buffers (NCCL backend, with the CUDA work). A single-process run uses a one-rank Comm, so
// the trainer never asks "am I distributed?" (docs/architecture.md §3).
//
// Rules a reader could get wrong:
//  - Every rank of a group calls the same collectives in the same order with the same element
//    counts and dtypes; a mismatch is a bug of ours, not a user error.
//  - Every wait is bounded by the communicator's timeout (parallel.timeout); a wait that runs out
//    throws llmtrain::Error naming the operation, the group and, where there is one, the peer.
//  - Buffers passed to an asynchronous call must stay alive and untouched until its wait() returns.
//  - Asynchronous operations advance only while some call on the communicator runs (MPI progresses
//    nonblocking collectives inside MPI calls only): code that overlaps communication with
//    computation calls progress() between pieces of work, and every wait()/done() progresses too.
//  - A Comm and its pending Work belong to the thread that created the Comm (MPI runs at
//    MPI_THREAD_FUNNELED, see parallel/bootstrap.h); never call it from OpenMP workers.
//  - A wait that timed out leaves the group unusable: the caller lets the error reach the rank's
//    top level, which ends the job (abort_job).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/tensor.h"

namespace llmtrain::parallel {

using kernels::Tensor;

enum class ReduceOp { sum, avg, max };
const char* to_string(ReduceOp op);

// How a sum (or avg) of 16-bit floats (bf16, fp16) adds; other dtypes, and max, ignore it.
//  - fp32: each rank's values are widened, summed in fp32 and the result rounded once; fp32 moves
//    between ranks (twice the bytes of the buffer).
//  - in_dtype: the 16-bit words move as they are, and every partial sum is rounded to 16 bits (each
//    addition widens its two operands, adds in fp32 and rounds), as NCCL reduces bf16: half the
//    bytes, and the result depends on the backend's order of additions (parallel.grad_reduce_dtype).
enum class Accumulate { fp32, in_dtype };
const char* to_string(Accumulate a);

// What a reduction computes. Converts from a ReduceOp (accumulating in fp32), so `ReduceOp::sum`
// is a Reduction.
struct Reduction {
  Reduction(ReduceOp op, Accumulate accumulate = Accumulate::fp32) : op(op), accumulate(accumulate) {}  // NOLINT
  ReduceOp op;
  Accumulate accumulate;
  bool operator==(const Reduction&) const = default;
  // Whether a reduction of `dtype` sums in 16 bits (in_dtype on bf16/fp16, op sum or avg).
  bool sums_in_16_bits(kernels::DType dtype) const;
};
// Bytes one element of a `dtype` reduction moves between ranks in our backends: 4 for 16-bit
// floats widened to fp32, else the dtype's size.
size_t wire_element_size(const Reduction& r, kernels::DType dtype);
// "sum", or "sum in bf16" when it sums in 16 bits.
std::string to_string(const Reduction& r, kernels::DType dtype);

// Reductions every backend supports: sum and max on every dtype, avg on the floating-point ones
// (fp32, bf16, fp16). Anything else is a bug of the caller (checked).
bool reduce_supported(kernels::DType dtype, ReduceOp op);

// A pending asynchronous operation.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation completes, or throws on timeout.
  virtual void wait() = 0;
  // True once the operation has completed (never blocks).
  virtual bool done() = 0;
};
using WorkHandle = std::unique_ptr<Work>;

// One point-to-point transfer of an exchange (Comm::exchange_async): `buf` sent to or received
// from rank `peer` of the group.
struct Transfer {
  enum class Kind : uint8_t { send, recv };
  Kind kind = Kind::send;
  Tensor buf;
  int peer = 0;
  int tag = 0;
};

// The tag of all_to_all_v's transfers, clear of other point-to-point traffic on a group (tag 0).
inline constexpr int kAllToAllTag = 32000;

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's name for messages: "world", "tp", "dp", "pp", "model-parallel".
  virtual const std::string& name() const = 0;

  // How long any one wait on this communicator may block, in seconds (parallel.timeout). New
  // communicators made by split() inherit it.
  virtual void set_timeout(double seconds) = 0;
  virtual double timeout() const = 0;

  // Advances every pending asynchronous operation of this communicator without blocking.
  virtual void progress() = 0;

  // Collective over this communicator: a new one of the ranks that passed the same `color` (>= 0),
  // ranked by `key`, then by rank here. Mesh groups are made with it (parallel/mesh_comms.h).
  virtual std::unique_ptr<Comm> split(int color, int key, std::string name) = 0;

  // The operations, each started asynchronously, for overlapping communication with computation:
  // the returned handle's wait() completes the operation (and any finishing step, e.g. the division
  // of avg). A backend implements these; the blocking forms below wait for them.
  //
  // In place: every rank ends with the reduction of every rank's `buf`.
  virtual WorkHandle all_reduce_async(Tensor buf, Reduction op) = 0;
  // `in` holds size() equal chunks; rank r receives the reduction of every rank's chunk r in `out`.
  // In place: `out` may be exactly this rank's chunk of `in` (NCCL's in-place form, recvbuff ==
  // sendbuff + rank · recvcount; ZeRO reduces a slot onto its own chunk); the rest of `in` is then
  // unspecified afterwards (MPI reduces in it). Other overlaps cost the host backends a copy.
  virtual WorkHandle reduce_scatter_async(Tensor in, Tensor out, Reduction op) = 0;
  // `out` holds size() chunks of in.numel() elements; chunk r is rank r's `in`. In place: `in` may be
  // exactly rank r's chunk of `out` on rank r (NCCL's in-place form, sendbuff == recvbuff + rank ·
  // sendcount; ZeRO writes its owned chunk into its block of a slot and gathers the rest around
  // it). Any other overlap of `in` and `out` is a bug (the host backends check it).
  virtual WorkHandle all_gather_async(Tensor in, Tensor out) = 0;
  // Rank `root`'s `buf` is copied into every other rank's `buf`.
  virtual WorkHandle broadcast_async(Tensor buf, int root) = 0;
  // Point-to-point within the group; `peer` is a rank of this group.
  virtual WorkHandle send_async(Tensor buf, int peer, int tag = 0) = 0;
  virtual WorkHandle recv_async(Tensor buf, int peer, int tag = 0) = 0;
  // `in` and `out` hold size() equal chunks; chunk r of `in` goes to rank r, and chunk r of `out`
  // comes from rank r.
  virtual WorkHandle all_to_all_async(Tensor in, Tensor out) = 0;
  virtual WorkHandle barrier_async() = 0;
  // Sends and receives started together as one operation, as NCCL groups them: two ranks that
  // exchange both ways cannot deadlock, whatever order each lists its transfers in. The default
  // posts each with send_async/recv_async (non-blocking in every backend) under one handle.
  virtual WorkHandle exchange_async(std::vector<Transfer> transfers);
  // All-to-all with per-rank counts (expert parallelism's token exchange): `in` holds
  // send_counts[r] elements for rank r, one rank after another; `out` receives recv_counts[r]
  // elements from rank r, in rank order. send_counts[r] here equals rank r's recv_counts[this
  // rank] (the caller exchanged the counts). One exchange_async of every non-empty transfer; this
  // rank's own part is a copy.
  WorkHandle all_to_all_v_async(Tensor in, const std::vector<int64_t>& send_counts, Tensor out,
                                const std::vector<int64_t>& recv_counts);

  // Blocking forms: the asynchronous operation, waited for. A wrapper overrides one only to do more
  // around the call (the flight recorder records blocking calls under their own names).
  virtual void all_reduce(Tensor buf, Reduction op) { all_reduce_async(buf, op)->wait(); }
  virtual void reduce_scatter(Tensor in, Tensor out, Reduction op) { reduce_scatter_async(in, out, op)->wait(); }
  virtual void all_gather(Tensor in, Tensor out) { all_gather_async(in, out)->wait(); }
  virtual void broadcast(Tensor buf, int root) { broadcast_async(buf, root)->wait(); }
  virtual void send(Tensor buf, int peer, int tag = 0) { send_async(buf, peer, tag)->wait(); }
  virtual void recv(Tensor buf, int peer, int tag = 0) { recv_async(buf, peer, tag)->wait(); }
  virtual void all_to_all(Tensor in, Tensor out) { all_to_all_async(in, out)->wait(); }
  virtual void barrier() { barrier_async()->wait(); }
};

// A communicator of one rank: reductions and gathers copy (or do nothing, in place), point-to-point
// has no peer and is a bug. Single-process runs and trivial mesh groups use it.
std::unique_ptr<Comm> make_local_comm(std::string name = "world");

// Waits for every handle in order (null handles are skipped), each wait bounded by its timeout.
void wait_all(std::vector<WorkHandle>& works);

}  // namespace llmtrain::parallel
