// The simulator's NCCL: the part of NVIDIA's nccl.h API that llmtrain calls (parallel/comm/comm_nccl.cpp),
// for ranks that are threads of one process on the simulated device, with NCCL's semantics and the
// rules NCCL's documentation sets, so that the SIM build runs our real NCCL call sites. Ranks in
// other processes cannot join (a unique id names its process): across processes the staged
// communicator serves the simulator (parallel/comm/device_comm.h).
//
// What it models (docs/cuda.md, "The simulator's NCCL"):
//  - communicators: ncclGetUniqueId, ncclCommInitRankConfig (blocking, or non-blocking: ncclInProgress
//    until every rank has joined), one device per rank ("Duplicate GPU detected" otherwise: this
//    NCCL is 2.28, before several ranks of a communicator could share one), ncclCommFinalize (the
//    state is ncclInProgress until this rank's work is done and every rank has finalized: "globally
//    quiescent"), ncclCommDestroy (after a finalize that completed; without one it finalizes first
//    and BLOCKS until that completes, as NCCL does; during one it is an error), ncclCommAbort (this
//    rank's queued work is released undone; its peers' work that needs this rank never completes:
//    they hang until they abort too), ncclCommGetAsyncError, ncclGetLastError;
//  - operations, each one item on the stream it is given (a stream the runtime made; the legacy
//    default stream and destroyed streams are refused), completing when every participant's item
//    has reached the front of its stream (all the work queued before it there has run):
//    all-reduce, reduce-scatter, all-gather, broadcast (sum, prod, max, min, avg; the in-place forms
//    NCCL defines, any other overlap refused), and send/receive, matched in order per pair of ranks,
//    grouped by ncclGroupStart/End into one item per rank. A 16-bit sum rounds each partial sum,
//    in rank order (deterministic; NCCL's order depends on its algorithm). Ranks that start
//    different collectives as the same one (kind, count, type, op, root) get ncclInvalidUsage from
//    ncclCommGetAsyncError, and that operation moves nothing;
//  - the non-blocking rule: on a communicator made with blocking = 0 every call returns
//    ncclInProgress, and the next call before ncclCommGetAsyncError has reported ncclSuccess is an
//    error ("If any NCCL function returns ncclInProgress, users must query the communicator state
//    until it becomes ncclSuccess before calling another NCCL function").
// Errors say why in ncclGetLastError.
//
// The rule a reader could get wrong: the data moves when the simulator runs the streams (a host
// waits, queries or synchronizes), on whichever host thread runs them, never at the call.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/sim/sim_internal.h"

namespace llmtrain::cuda_sim {
namespace {

constexpr uint64_t kIdMagic = 0x4c54534d4e43434cull;  // "LTSMNCCL"

thread_local std::string tl_last_error;

ncclResult_t failed(ncclResult_t r, std::string why) {
  tl_last_error = "simulator's NCCL: " + std::move(why);
  return r;
}

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return "int8";
    case ncclUint8:
      return "uint8";
    case ncclFloat16:
      return "float16";
    case ncclBfloat16:
      return "bfloat16";
    case ncclInt32:
      return "int32";
    case ncclUint32:
      return "uint32";
    case ncclFloat32:
      return "float32";
    case ncclInt64:
      return "int64";
    case ncclUint64:
      return "uint64";
    case ncclFloat64:
      return "float64";
    default:
      return "?";
  }
}

enum class Kind : uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, send, recv };
const char* kind_name(Kind k) {
  const char* names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv"};
  return names[int(k)];
}

// One rank's arguments of an operation.
struct Args {
  Kind kind = Kind::all_reduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // all_gather: the send count; reduce_scatter: the receive count
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int root = 0;  // broadcast; send/recv: the peer
  std::string text() const {
    std::string t = std::string(kind_name(kind)) + " of " + std::to_string(count) + " " + type_name(type);
    if (kind == Kind::all_reduce || kind == Kind::reduce_scatter) t += " (op " + std::to_string(int(op)) + ")";
    if (kind == Kind::broadcast) t += " from rank " + std::to_string(root);
    if (kind == Kind::send) t += " to rank " + std::to_string(root);
    if (kind == Kind::recv) t += " from rank " + std::to_string(root);
    return t;
  }
};

struct Part;
struct Clique;

// One operation over its participants: a collective (every rank) or one send matched with its
// receive (two ranks, or one rank's send to itself). It executes once every participant's item is
// at the front of its stream. Participants are keyed by rank · 2 + (1 for a receive), so a rank's
// send to itself and its receive are two.
struct Op {
  std::vector<int> keys;                     // participants
  std::map<int, Args> args;                  // by key, as they call
  std::map<int, std::weak_ptr<Part>> parts;  // the item each participant queued it in (gone: released)
  bool executed = false, failed = false;
};
int key_of(int rank, Kind kind) { return rank * 2 + (kind == Kind::recv ? 1 : 0); }

}  // namespace
}  // namespace llmtrain::cuda_sim

// nccl.h declares `struct ncclComm` and leaves it to the library.
struct ncclComm {
  std::shared_ptr<llmtrain::cuda_sim::Clique> clique;
  int rank = 0, nranks = 0, device = 0;
  bool blocking = true;
  enum class State : uint8_t { joining, ready, finalizing, destroyed, aborted } state = State::joining;
  bool call_in_progress = false;  // a non-blocking call returned ncclInProgress, not yet polled
  ncclResult_t async_error = ncclSuccess;
  std::string async_text;
  uint64_t collectives = 0;  // collectives started so far (their index matches them across ranks)
  int outstanding = 0;       // items queued, not yet complete
};

namespace llmtrain::cuda_sim {
namespace {

// Every rank's communicator of one unique id.
struct Clique {
  int nranks = 0;
  std::vector<ncclComm*> comms;  // by rank; null until it joins
  int joined = 0, finalized = 0;
  std::map<uint64_t, std::shared_ptr<Op>> collectives;                  // by index
  std::map<std::pair<int, int>, std::vector<std::shared_ptr<Op>>> p2p;  // (sender, receiver): in order
  std::map<std::pair<int, int>, size_t> sends_made, recvs_made;
};

struct Model {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<uint64_t, std::shared_ptr<Clique>> cliques;  // by the id's serial number
  std::set<const ncclComm*> live;                       // made and not destroyed (aborted ones stay known)
  uint64_t next_id = 0;
};
Model& model() {
  static Model m;
  return m;
}

// One rank's item on its stream: the operations it takes part in (one, or a group's).
struct Part final : Rendezvous {
  ncclComm* comm = nullptr;
  std::vector<std::shared_ptr<Op>> ops;
  bool arrived = false, complete = false;

  bool progress() override;
  std::string describe() const override {
    std::string t = "NCCL rank " + std::to_string(comm->rank) + " of " + std::to_string(comm->nranks) + ": ";
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& op = *ops[i];
      std::string mine = "?";
      for (const auto& [key, a] : op.args)
        if (key / 2 == comm->rank) mine = a.text();
      t += (i ? ", " : "") + mine;
      for (int key : op.keys) {
        auto p = op.parts.find(key);
        const std::shared_ptr<Part> part = p == op.parts.end() ? nullptr : p->second.lock();
        if (!part || !part->arrived) t += " (waits for rank " + std::to_string(key / 2) + ")";
      }
    }
    return t;
  }
};

template <class T>
double to_double(const void* p, size_t i) {
  if constexpr (std::is_same_v<T, __half>)
    return double(__half2float(static_cast<const __half*>(p)[i]));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return double(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
  else
    return double(static_cast<const T*>(p)[i]);
}

template <class T>
T combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclProd:
      return T(a * b);
    case ncclMax:
      return a > b ? a : b;
    case ncclMin:
      return a < b ? a : b;
    default:
      return T(a + b);  // sum, and avg before its division
  }
}

// out[i] = the reduction of in[r][i] over r, in rank order; 16-bit floats round each partial.
template <class T>
void reduce(void* out, const std::vector<const void*>& in, size_t count, ncclRedOp_t op) {
  const int n = int(in.size());
  std::vector<unsigned char> result(count * sizeof(T));
  T* res = reinterpret_cast<T*>(result.data());
  for (size_t i = 0; i < count; ++i) {
    if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
      auto widen = [](T x) {
        if constexpr (std::is_same_v<T, __half>)
          return __half2float(x);
        else
          return __bfloat162float(x);
      };
      auto narrow = [](float x) {
        if constexpr (std::is_same_v<T, __half>)
          return __float2half_rn(x);
        else
          return __float2bfloat16_rn(x);
      };
      float acc = widen(static_cast<const T*>(in[0])[i]);
      for (int r = 1; r < n; ++r) acc = widen(narrow(combine(acc, widen(static_cast<const T*>(in[size_t(r)])[i]), op)));
      if (op == ncclAvg) acc = acc / float(n);
      res[i] = narrow(acc);
    } else {
      T acc = static_cast<const T*>(in[0])[i];
      for (int r = 1; r < n; ++r) acc = combine(acc, static_cast<const T*>(in[size_t(r)])[i], op);
      if (op == ncclAvg) acc = T(acc / T(n));
      res[i] = acc;
    }
  }
  std::memcpy(out, result.data(), result.size());
}

void reduce_typed(ncclDataType_t t, void* out, const std::vector<const void*>& in, size_t count, ncclRedOp_t op) {
  switch (t) {
    case ncclInt8:
      return reduce<int8_t>(out, in, count, op);
    case ncclUint8:
      return reduce<uint8_t>(out, in, count, op);
    case ncclInt32:
      return reduce<int32_t>(out, in, count, op);
    case ncclUint32:
      return reduce<uint32_t>(out, in, count, op);
    case ncclInt64:
      return reduce<int64_t>(out, in, count, op);
    case ncclUint64:
      return reduce<uint64_t>(out, in, count, op);
    case ncclFloat16:
      return reduce<__half>(out, in, count, op);
    case ncclBfloat16:
      return reduce<__nv_bfloat16>(out, in, count, op);
    case ncclFloat32:
      return reduce<float>(out, in, count, op);
    case ncclFloat64:
      return reduce<double>(out, in, count, op);
    default:
      fatal("the simulator's NCCL reduced an unknown type");
  }
}

// The ranks' arguments agree (a collective); "" or what differs.
std::string mismatch(const Op& op) {
  const Args& first = op.args.begin()->second;
  for (const auto& [key, a] : op.args)
    if (a.kind != first.kind || a.count != first.count || a.type != first.type || a.op != first.op ||
        a.root != first.root)
      return "rank " + std::to_string(op.args.begin()->first / 2) + " started " + first.text() + ", rank " +
             std::to_string(key / 2) + " " + a.text() + " as the same collective";
  return {};
}

// Moves the data of `op` (every participant's item at the front of its stream; device memory open).
void execute(Op& op, Clique& clique) {
  if (op.args.begin()->second.kind == Kind::send || op.args.begin()->second.kind == Kind::recv) {
    const Args *send = nullptr, *recv = nullptr;
    for (const auto& [r, a] : op.args) (a.kind == Kind::send ? send : recv) = &a;
    if (send == nullptr || recv == nullptr || send->count != recv->count || send->type != recv->type) {
      op.failed = true;
      const std::string why =
          "a send of " + (send ? send->text() : "?") + " met a receive of " + (recv ? recv->text() : "?");
      for (int key : op.keys) {
        clique.comms[size_t(key / 2)]->async_error = ncclInvalidUsage;
        clique.comms[size_t(key / 2)]->async_text = why;
      }
      return;
    }
    std::memmove(recv->recv, send->send, send->count * type_bytes(send->type));
    return;
  }
  if (std::string why = mismatch(op); !why.empty()) {
    op.failed = true;
    for (int key : op.keys) {
      clique.comms[size_t(key / 2)]->async_error = ncclInvalidUsage;
      clique.comms[size_t(key / 2)]->async_text = why;
    }
    return;
  }
  const Args& a0 = op.args.begin()->second;
  const size_t bytes = type_bytes(a0.type), n = size_t(clique.nranks);
  switch (a0.kind) {
    case Kind::all_reduce: {
      std::vector<const void*> in;
      for (const auto& [r, a] : op.args) in.push_back(a.send);
      std::vector<unsigned char> out(a0.count * bytes);
      reduce_typed(a0.type, out.data(), in, a0.count, a0.op);
      for (const auto& [r, a] : op.args) std::memcpy(a.recv, out.data(), out.size());
      break;
    }
    case Kind::reduce_scatter: {
      std::vector<std::vector<unsigned char>> outs(n);
      for (size_t chunk = 0; chunk < n; ++chunk) {
        std::vector<const void*> in;
        for (const auto& [r, a] : op.args) in.push_back(static_cast<const char*>(a.send) + chunk * a.count * bytes);
        outs[chunk].resize(a0.count * bytes);
        reduce_typed(a0.type, outs[chunk].data(), in, a0.count, a0.op);
      }
      for (const auto& [key, a] : op.args) std::memcpy(a.recv, outs[size_t(key / 2)].data(), a0.count * bytes);
      break;
    }
    case Kind::all_gather: {
      std::vector<unsigned char> all(n * a0.count * bytes);
      for (const auto& [key, a] : op.args)
        std::memcpy(all.data() + size_t(key / 2) * a.count * bytes, a.send, a.count * bytes);
      for (const auto& [r, a] : op.args) std::memcpy(a.recv, all.data(), all.size());
      break;
    }
    case Kind::broadcast: {
      std::vector<unsigned char> data(a0.count * bytes);
      std::memcpy(data.data(), op.args.at(key_of(a0.root, Kind::broadcast)).send, data.size());
      for (const auto& [r, a] : op.args) std::memcpy(a.recv, data.data(), data.size());
      break;
    }
    default:
      break;
  }
}

bool Part::progress() {
  Model& m = model();
  std::lock_guard lock(m.mutex);
  if (complete) return true;
  if (comm->state == ncclComm::State::aborted) {
    complete = true;  // released undone
  } else {
    arrived = true;
    bool all = true;
    for (const std::shared_ptr<Op>& op : ops) {
      if (!op->executed) {
        const bool ready =
            op->args.size() == op->keys.size() && std::all_of(op->keys.begin(), op->keys.end(), [&](int key) {
              auto p = op->parts.find(key);
              const std::shared_ptr<Part> part = p == op->parts.end() ? nullptr : p->second.lock();
              return part && part->arrived && part->comm->state != ncclComm::State::aborted;
            });
        if (ready) {
          execute(*op, *comm->clique);
          op->executed = true;
        }
      }
      all = all && op->executed;
    }
    complete = all;
  }
  if (complete) {
    --comm->outstanding;
    m.changed.notify_all();
  }
  return complete;
}

// The checks every call on a communicator makes; "" when it may go on.
std::string usable(const ncclComm* comm) {
  Model& m = model();
  if (comm == nullptr) return "a null communicator";
  if (m.live.count(comm) == 0) return "a communicator that was destroyed (or never made)";
  switch (comm->state) {
    case ncclComm::State::aborted:
      return "a communicator that was aborted";
    case ncclComm::State::joining:
      return "a communicator still joining: poll ncclCommGetAsyncError until it reports ncclSuccess first";
    case ncclComm::State::finalizing:
      return "a communicator being finalized";
    default:
      break;
  }
  if (comm->call_in_progress)
    return "a call before ncclCommGetAsyncError reported ncclSuccess for the last one, which returned "
           "ncclInProgress";
  return {};
}

bool finalize_complete(const ncclComm& c) { return c.outstanding == 0 && c.clique->finalized == c.clique->nranks; }

// What a blocking finalize (or a destroy without one) does: waits, running the device as far as it
// goes, until the communicator is quiescent. NCCL would wait forever for a rank that never
// finalizes; the simulator ends the process after hang_seconds() with the reason.
void wait_quiescent(std::unique_lock<std::mutex>& lock, ncclComm& c, const char* call) {
  Model& m = model();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(hang_seconds());
  while (!finalize_complete(c)) {
    if (std::chrono::steady_clock::now() > deadline)
      fatal(std::string(call) + " of NCCL rank " + std::to_string(c.rank) + " blocked " +
            std::to_string(int(hang_seconds())) + " s: " + std::to_string(c.clique->finalized) + " of " +
            std::to_string(c.clique->nranks) + " ranks finalized, " + std::to_string(c.outstanding) +
            " of its operations not complete (NCCL would wait forever)");
    lock.unlock();
    advance();
    lock.lock();
    if (!finalize_complete(c)) m.changed.wait_for(lock, std::chrono::milliseconds(20));
  }
}

// The group being built on this thread (ncclGroupStart .. End): each communicator's operations.
struct Group {
  int depth = 0;
  struct Entry {
    ncclComm* comm;
    cudaStream_t stream;
    std::vector<Args> args;
  };
  std::vector<Entry> entries;
  std::string error;
};
thread_local Group tl_group;

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}

// The buffer checks of one rank's arguments; "" or what is wrong.
std::string check_buffers(const ncclComm& c, const Args& a) {
  const size_t bytes = type_bytes(a.type);
  if (bytes == 0) return "an unknown data type " + std::to_string(int(a.type));
  const size_t n = size_t(c.nranks), unit = a.count * bytes;
  size_t send_bytes = unit, recv_bytes = unit;
  if (a.kind == Kind::reduce_scatter) send_bytes = unit * n;
  if (a.kind == Kind::all_gather) recv_bytes = unit * n;
  const bool sends = a.kind != Kind::recv && !(a.kind == Kind::broadcast && a.root != c.rank);
  const bool receives = a.kind != Kind::send;
  if (a.count == 0) return {};
  if (sends && !is_device_range(a.send, send_bytes))
    return "the send buffer of " + a.text() + " is not device memory of its size";
  if (receives && !is_device_range(a.recv, recv_bytes))
    return "the receive buffer of " + a.text() + " is not device memory of its size";
  if (sends && receives && a.send != a.recv) {
    // The in-place forms NCCL defines; any other overlap is undefined there, refused here.
    const char* s = static_cast<const char*>(a.send);
    const char* r = static_cast<const char*>(a.recv);
    const bool in_place = (a.kind == Kind::all_gather && s == r + size_t(c.rank) * unit) ||
                          (a.kind == Kind::reduce_scatter && r == s + size_t(c.rank) * unit);
    if (!in_place && overlaps(a.send, send_bytes, a.recv, recv_bytes))
      return "the send and receive buffers of " + a.text() + " overlap other than in NCCL's in-place form";
  }
  if ((a.kind == Kind::broadcast || a.kind == Kind::send || a.kind == Kind::recv) && (a.root < 0 || a.root >= c.nranks))
    return "rank " + std::to_string(a.root) + " in " + a.text() + " of a communicator of " + std::to_string(c.nranks);
  return {};
}

// Queues one rank's item of `args` (a single operation, or a group's) on `stream`. Called without
// the model's lock.
ncclResult_t enqueue_ops(ncclComm* comm, cudaStream_t stream, const std::vector<Args>& args) {
  Model& m = model();
  auto part = std::make_shared<Part>();
  part->comm = comm;
  // The device's lock before the model's, never the other way (Part::progress runs under the first).
  if (std::string why = stream_problem(stream); !why.empty()) return failed(ncclInvalidUsage, "an operation on " + why);
  {
    std::lock_guard lock(m.mutex);
    if (std::string why = usable(comm); !why.empty()) return failed(ncclInvalidUsage, "an operation on " + why);
    for (const Args& a : args)
      if (std::string why = check_buffers(*comm, a); !why.empty()) return failed(ncclInvalidArgument, why);
    Clique& q = *comm->clique;
    for (const Args& a : args) {
      std::shared_ptr<Op> op;
      if (a.kind == Kind::send || a.kind == Kind::recv) {
        const std::pair<int, int> pair =
            a.kind == Kind::send ? std::pair{comm->rank, a.root} : std::pair{a.root, comm->rank};
        size_t& made = a.kind == Kind::send ? q.sends_made[pair] : q.recvs_made[pair];
        std::vector<std::shared_ptr<Op>>& list = q.p2p[pair];
        if (made == list.size()) {
          list.push_back(std::make_shared<Op>());
          list.back()->keys = {key_of(pair.first, Kind::send), key_of(pair.second, Kind::recv)};
        }
        op = list[made++];
      } else {
        std::shared_ptr<Op>& slot = q.collectives[comm->collectives++];
        if (!slot) {
          slot = std::make_shared<Op>();
          for (int r = 0; r < q.nranks; ++r) slot->keys.push_back(key_of(r, Kind::all_reduce));
        }
        op = slot;
      }
      op->args[key_of(comm->rank, a.kind)] = a;
      op->parts[key_of(comm->rank, a.kind)] = part;
      part->ops.push_back(op);
    }
    ++comm->outstanding;
  }
  if (std::string why = enqueue_rendezvous(stream, part); !why.empty())
    fatal("the simulator's NCCL lost an operation: " + why);  // the stream was checked above
  if (!comm->blocking) {
    std::lock_guard lock(m.mutex);
    comm->call_in_progress = true;
    return ncclInProgress;
  }
  return ncclSuccess;
}

// One operation: queued now, or kept for ncclGroupEnd inside a group.
ncclResult_t operation(ncclComm* comm, cudaStream_t stream, const Args& args) {
  Group& g = tl_group;
  if (g.depth == 0) return enqueue_ops(comm, stream, {args});
  if (args.kind != Kind::send && args.kind != Kind::recv)
    return failed(ncclInvalidUsage, "a collective inside a group (the model groups sends and receives only)");
  for (Group::Entry& e : g.entries)
    if (e.comm == comm) {
      if (e.stream != stream)
        return failed(ncclInvalidUsage, "one communicator's operations of a group on two streams");
      e.args.push_back(args);
      return ncclSuccess;
    }
  g.entries.push_back({comm, stream, {args}});
  return ncclSuccess;
}

std::atomic<uint64_t> g_id_serial{0};

}  // namespace
}  // namespace llmtrain::cuda_sim

using namespace llmtrain::cuda_sim;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return failed(ncclInvalidArgument, "ncclGetVersion(null)");
  *version = NCCL_VERSION_CODE;  // the headers the simulator was built against
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return tl_last_error.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return failed(ncclInvalidArgument, "ncclGetUniqueId(null)");
  std::memset(id, 0, sizeof(*id));
  const uint64_t words[3] = {kIdMagic, uint64_t(getpid()), ++g_id_serial};
  std::memcpy(id->internal, words, sizeof(words));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (out == nullptr) return failed(ncclInvalidArgument, "ncclCommInitRankConfig with a null communicator pointer");
  *out = nullptr;
  uint64_t words[3];
  std::memcpy(words, id.internal, sizeof(words));
  if (words[0] != kIdMagic) return failed(ncclInvalidArgument, "a unique id that ncclGetUniqueId did not make");
  if (words[1] != uint64_t(getpid()))
    return failed(ncclInvalidUsage,
                  "a unique id of another process: the simulator's NCCL joins ranks that are threads of one process "
                  "(across processes the staged communicator serves the simulator)");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return failed(ncclInvalidArgument, "rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  if (config != nullptr && (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t)))
    return failed(ncclInvalidArgument, "a config not initialized with NCCL_CONFIG_INITIALIZER");
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return failed(ncclUnhandledCudaError, "cudaGetDevice failed");
  Model& m = model();
  std::unique_lock lock(m.mutex);
  std::shared_ptr<Clique>& q = m.cliques[words[2]];
  if (!q) {
    q = std::make_shared<Clique>();
    q->nranks = nranks;
    q->comms.assign(size_t(nranks), nullptr);
  }
  if (q->nranks != nranks)
    return failed(ncclInvalidArgument, "rank " + std::to_string(rank) + " joins with " + std::to_string(nranks) +
                                           " ranks, others with " + std::to_string(q->nranks));
  if (q->comms[size_t(rank)] != nullptr)
    return failed(ncclInvalidUsage, "rank " + std::to_string(rank) + " joined twice");
  for (const ncclComm* other : q->comms)
    if (other != nullptr && other->device == device)
      return failed(ncclInvalidUsage, "Duplicate GPU detected: rank " + std::to_string(rank) + " and rank " +
                                          std::to_string(other->rank) + " both on device " + std::to_string(device) +
                                          " (NCCL " + std::to_string(NCCL_VERSION_CODE) +
                                          " takes one rank of a communicator per GPU)");
  auto* c = new ncclComm;
  c->clique = q;
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  c->blocking = config == nullptr || config->blocking != 0;
  q->comms[size_t(rank)] = c;
  m.live.insert(c);
  if (++q->joined == nranks)
    for (ncclComm* x : q->comms) x->state = ncclComm::State::ready;
  m.changed.notify_all();
  *out = c;
  if (!c->blocking) return ncclInProgress;
  const bool all = m.changed.wait_for(lock, std::chrono::seconds(300), [&] { return q->joined == nranks; });
  if (!all) return failed(ncclSystemError, "the other ranks did not join within 300 s");
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (error == nullptr) return failed(ncclInvalidArgument, "ncclCommGetAsyncError with a null result pointer");
  Model& m = model();
  bool finalizing = false;
  {
    std::lock_guard lock(m.mutex);
    if (comm == nullptr || m.live.count(comm) == 0) return failed(ncclInvalidArgument, "a destroyed communicator");
    if (comm->state == ncclComm::State::aborted) return failed(ncclInvalidUsage, "an aborted communicator");
    finalizing = comm->state == ncclComm::State::finalizing;
  }
  if (finalizing) advance();  // the work finalize waits for runs as far as it can
  std::lock_guard lock(m.mutex);
  if (comm->async_error != ncclSuccess) {
    tl_last_error = "simulator's NCCL: " + comm->async_text;
    *error = comm->async_error;
  } else if (comm->state == ncclComm::State::joining ||
             (comm->state == ncclComm::State::finalizing && !finalize_complete(*comm))) {
    *error = ncclInProgress;
  } else {
    comm->call_in_progress = false;
    *error = ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  Model& m = model();
  std::unique_lock lock(m.mutex);
  if (std::string why = usable(comm); !why.empty()) return failed(ncclInvalidUsage, "ncclCommFinalize of " + why);
  comm->state = ncclComm::State::finalizing;
  ++comm->clique->finalized;
  m.changed.notify_all();
  if (!comm->blocking) return ncclInProgress;
  wait_quiescent(lock, *comm, "ncclCommFinalize");
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  Model& m = model();
  std::unique_lock lock(m.mutex);
  if (comm == nullptr || m.live.count(comm) == 0)
    return failed(ncclInvalidArgument, "ncclCommDestroy of a destroyed communicator");
  if (comm->state == ncclComm::State::aborted)
    return failed(ncclInvalidUsage, "ncclCommDestroy of an aborted communicator");
  if (comm->state == ncclComm::State::finalizing && !finalize_complete(*comm))
    return failed(ncclInvalidUsage,
                  "ncclCommDestroy while ncclCommFinalize is in progress (poll ncclCommGetAsyncError to ncclSuccess)");
  if (comm->state != ncclComm::State::finalizing) {
    // Without a finalize NCCL finalizes here, and blocks until the communicator is quiescent.
    comm->state = ncclComm::State::finalizing;
    ++comm->clique->finalized;
    m.changed.notify_all();
    wait_quiescent(lock, *comm, "ncclCommDestroy (without a finalize first)");
  }
  comm->state = ncclComm::State::destroyed;
  m.live.erase(comm);  // the object stays, so that a later use is reported, not a crash
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  Model& m = model();
  {
    std::lock_guard lock(m.mutex);
    if (comm == nullptr || m.live.count(comm) == 0)
      return failed(ncclInvalidArgument, "ncclCommAbort of a destroyed communicator");
    comm->state = ncclComm::State::aborted;
    comm->call_in_progress = false;
    m.live.erase(comm);  // freed, as NCCL frees it; its queued items complete undone
    m.changed.notify_all();
  }
  notify_device_state();
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return operation(comm, stream, Args{Kind::all_reduce, send, recv, count, type, op, 0});
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  return operation(comm, stream, Args{Kind::reduce_scatter, send, recv, recvcount, type, op, 0});
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return operation(comm, stream, Args{Kind::all_gather, send, recv, sendcount, type, ncclSum, 0});
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return operation(comm, stream, Args{Kind::broadcast, send, recv, count, type, ncclSum, root});
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return operation(comm, stream, Args{Kind::send, send, nullptr, count, type, ncclSum, peer});
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  return operation(comm, stream, Args{Kind::recv, nullptr, recv, count, type, ncclSum, peer});
}

ncclResult_t ncclGroupStart() {
  ++tl_group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  Group& g = tl_group;
  if (g.depth == 0) return failed(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g.depth > 0) return ncclSuccess;
  std::vector<Group::Entry> entries = std::move(g.entries);
  g.entries.clear();
  ncclResult_t result = ncclSuccess;
  for (Group::Entry& e : entries) {
    const ncclResult_t r = enqueue_ops(e.comm, e.stream, e.args);
    if (r != ncclSuccess && r != ncclInProgress) return r;
    if (r == ncclInProgress) result = ncclInProgress;
  }
  return result;
}

}  // extern "C"
