// The in-process communicator (parallel/comm/comm_threads.h).
//
// How it works:
//  - A Job is one in-process world and every group split from it. It holds the one lock, the one
//    condition variable every wait sleeps on, and the job's failure. One lock for everything keeps
//    the failure rule simple (a failure wakes every waiter of every group) and costs nothing that
//    matters at test sizes.
//  - A collective is matched by its sequence number on the group: the k-th collective a rank
//    starts on a group meets the k-th of every other rank there. The first rank to start it
//    records what it is; every later one must start the same, or the collective breaks. The last
//    one carries it out, outside the lock: it reads every input into a staging buffer first and
//    only then writes every output, so that in-place forms (all_gather into this rank's block,
//    reduce_scatter onto this rank's block, all_to_all with in == out) need no special cases.
//  - A send or receive waits in a queue per (source, destination, tag); the second side to arrive
//    takes the oldest entry of the other kind and copies, which keeps messages of one pair and tag
//    in order and lets different tags pass each other.
//  - An operation that was started is running or done, or may still be carried out by another
//    thread, which would write into this rank's buffers. So every way out of it other than its
//    completion (a timeout, a failure, a handle dropped while an error unwinds) first fails the
//    whole job, under the lock: from then on nobody carries out anything that is still waiting.
#include "parallel/comm/comm_threads.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "common/error.h"
#include "common/strings.h"
#include "kernels/dtype_convert.h"

namespace llmtrain::parallel {
namespace {

using kernels::DType;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kMismatchHint =
    "every rank of a group starts the same collectives in the same order, with the same element counts, dtypes, "
    "reduce ops and roots, and receives exactly what is sent to it (parallel/comm/comm.h): the calling code has a bug";
constexpr double kLongestWait = 1e7;  // seconds; longer timeouts would overflow the clock's arithmetic
constexpr std::string_view kFailedHint =
    "another rank of this in-process job failed first; its error is the one to fix";

// One in-process world and every group split from it.
struct Job {
  explicit Job(int n) : returned(static_cast<size_t>(n), false) {}
  std::mutex mu;
  std::condition_variable cv;  // notified on every change of an operation's state and of the job's
  std::string failure;         // why the job failed, empty while it has not
  int failed_rank = -1;        // the rank (of the world) that failed first
  std::vector<bool> returned;  // by world rank: its function in run_ranks_in_threads returned
};

// Under the lock. The first failure is the one every rank reports.
void fail_job(Job& job, int world_rank, std::string_view why) {
  if (job.failure.empty()) {
    job.failure = fmt::format("rank {} of the in-process job failed: {}", world_rank, why);
    job.failed_rank = world_rank;
  }
  job.cv.notify_all();
}

struct Group;
struct Collective;
struct PointToPoint;

// What an operation is, for matching ranks and for messages.
struct OpDesc {
  std::string_view kind;  // "all_reduce", "send", ...
  int64_t count = 0;      // elements (per rank for all_gather's input, reduce_scatter's output and all_to_all's blocks)
  DType dtype = DType::fp32;
  std::optional<Reduction> reduce = std::nullopt;
  int root = -1;  // broadcast
  int peer = -1;  // send/recv
  int tag = 0;

  bool same_collective(const OpDesc& o) const {
    return kind == o.kind && count == o.count && dtype == o.dtype && reduce == o.reduce && root == o.root;
  }
  std::string str() const {
    std::vector<std::string> args;
    if (reduce) args.emplace_back(to_string(*reduce, dtype));
    if (kind != "barrier" && kind != "split") args.push_back(fmt::format("{} {}", count, kernels::to_string(dtype)));
    if (kind == "broadcast") args.push_back(fmt::format("root {}", root));
    if (kind == "send" || kind == "recv") args.push_back(fmt::format("tag {}", tag));
    return fmt::format("{}({})", kind, join(args, ", "));
  }
};

enum class State {
  waiting,  // not every rank taking part has started it
  running,  // being carried out by one thread, outside the lock
  done,
  broken,  // ranks disagree on it, or carrying it out failed: `error` says why
};

// One operation as every rank taking part sees it.
struct Op {
  virtual ~Op() = default;
  // A rank of `g` that this operation still needs but whose function has returned, or -1.
  virtual int needs_returned_rank(const Group& g) const = 0;
  State state = State::waiting;
  std::string error;
};

struct Group {
  Group(std::shared_ptr<Job> job, std::vector<int> world_ranks)
      : job(std::move(job)), world_ranks(std::move(world_ranks)) {}
  int size() const { return static_cast<int>(world_ranks.size()); }
  bool has_returned(int rank) const {
    return job->returned[static_cast<size_t>(world_ranks[static_cast<size_t>(rank)])];
  }

  std::shared_ptr<Job> job;
  std::vector<int> world_ranks;  // of each member
  // Under job->mu from here on.
  std::unordered_map<uint64_t, std::shared_ptr<Collective>> open;  // started by some ranks, by sequence number
  using Channel = std::tuple<int, int, int>;                       // source, destination, tag
  std::map<Channel, std::deque<std::shared_ptr<PointToPoint>>> sends, recvs;  // unmatched, oldest first
};

struct Collective final : Op {
  Collective(const OpDesc& desc, int n)
      : desc(desc),
        arrived(static_cast<size_t>(n), false),
        in(static_cast<size_t>(n)),
        out(static_cast<size_t>(n)),
        color(static_cast<size_t>(n)),
        key(static_cast<size_t>(n)),
        new_group(static_cast<size_t>(n)),
        new_rank(static_cast<size_t>(n)) {}
  int needs_returned_rank(const Group& g) const override {
    for (int r = 0; r < g.size(); ++r)
      if (!arrived[static_cast<size_t>(r)] && g.has_returned(r)) return r;
    return -1;
  }

  OpDesc desc;  // as the first rank to start it described it
  std::vector<bool> arrived;
  int arrivals = 0;
  std::vector<Tensor> in, out;  // by rank
  // split: each rank's arguments, and its new group and rank there
  std::vector<int> color, key;
  std::vector<std::shared_ptr<Group>> new_group;
  std::vector<int> new_rank;
};

struct PointToPoint final : Op {
  int needs_returned_rank(const Group& g) const override {
    if (!sender_posted && g.has_returned(src)) return src;
    if (!receiver_posted && g.has_returned(dst)) return dst;
    return -1;
  }
  int src = 0, dst = 0;  // ranks of the group
  bool sender_posted = false, receiver_posted = false;
  Tensor send, recv;
};

// --- carrying out a collective ---------------------------------------------------------------

void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

template <typename T>
T combine(T a, T b, ReduceOp op) {
  if (op == ReduceOp::max) return b > a ? b : a;
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // wraps as MPI's integer sums do, without signed overflow
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

// acc = in[0] op in[1] op ... in rank order; `load` reads element i of a rank's buffer.
template <typename Acc, typename Load>
void reduce_in_rank_order(const std::vector<Tensor>& in, int64_t count, ReduceOp op, Acc* acc, Load load) {
  for (int64_t i = 0; i < count; ++i) acc[i] = load(in[0].data, i);
  for (size_t r = 1; r < in.size(); ++r)
    for (int64_t i = 0; i < count; ++i) acc[i] = combine(acc[i], load(in[r].data, i), op);
}

template <typename T>
void reduce_native(const std::vector<Tensor>& in, int64_t count, ReduceOp op, std::vector<std::byte>& out) {
  reduce_in_rank_order(in, count, op, reinterpret_cast<T*>(out.data()),
                       [](const void* p, int64_t i) { return static_cast<const T*>(p)[i]; });
}

// The reduction of every rank's `in` (all of the same dtype and count), in that dtype.
std::vector<std::byte> reduce_ranks(const std::vector<Tensor>& in, Reduction reduction) {
  const ReduceOp op = reduction.op;
  const DType dtype = in[0].dtype;
  const int64_t count = in[0].numel();
  const float n = static_cast<float>(in.size());
  std::vector<std::byte> out(std::max<size_t>(1, in[0].bytes()));
  switch (dtype) {
    case DType::fp32: {
      reduce_native<float>(in, count, op, out);
      float* sum = reinterpret_cast<float*>(out.data());
      if (op == ReduceOp::avg)
        for (int64_t i = 0; i < count; ++i) sum[i] /= n;
      break;
    }
    case DType::bf16:
    case DType::fp16: {
      // Widened in rank order; Accumulate::in_dtype also rounds every partial sum to 16 bits.
      std::vector<float> wide(static_cast<size_t>(count));
      const auto load = [dtype](const void* p, int64_t i) {
        const uint16_t x = static_cast<const uint16_t*>(p)[i];
        return dtype == DType::bf16 ? kernels::bf16_to_fp32(x) : kernels::fp16_to_fp32(x);
      };
      if (reduction.sums_in_16_bits(dtype)) {
        const auto round = [dtype](float x) {
          return dtype == DType::bf16 ? kernels::bf16_to_fp32(kernels::fp32_to_bf16(x))
                                      : kernels::fp16_to_fp32(kernels::fp32_to_fp16(x));
        };
        for (int64_t i = 0; i < count; ++i) wide[size_t(i)] = load(in[0].data, i);
        for (size_t r = 1; r < in.size(); ++r)
          for (int64_t i = 0; i < count; ++i) wide[size_t(i)] = round(wide[size_t(i)] + load(in[r].data, i));
      } else {
        reduce_in_rank_order(in, count, op, wide.data(), load);
      }
      if (op == ReduceOp::avg)
        for (float& x : wide) x /= n;
      auto* narrow = reinterpret_cast<uint16_t*>(out.data());
      for (int64_t i = 0; i < count; ++i)
        narrow[i] = dtype == DType::bf16 ? kernels::fp32_to_bf16(wide[static_cast<size_t>(i)])
                                         : kernels::fp32_to_fp16(wide[static_cast<size_t>(i)]);
      break;
    }
    case DType::int32:
      reduce_native<int32_t>(in, count, op, out);
      break;
    case DType::int64:
      reduce_native<int64_t>(in, count, op, out);
      break;
    case DType::uint8:
      reduce_native<uint8_t>(in, count, op, out);
      break;
    case DType::uint16:
      reduce_native<uint16_t>(in, count, op, out);
      break;
  }
  return out;
}

// Every rank's inputs are read (into staging) before any output is written.
void carry_out(Collective& c, const Group& g) {
  const int n = g.size();
  const auto rank = [](int r) { return static_cast<size_t>(r); };
  const std::string_view kind = c.desc.kind;
  if (kind == "all_reduce") {
    const std::vector<std::byte> sum = reduce_ranks(c.in, *c.desc.reduce);
    for (int r = 0; r < n; ++r) copy_bytes(c.out[rank(r)].data, sum.data(), c.out[rank(r)].bytes());
  } else if (kind == "reduce_scatter") {
    const std::vector<std::byte> sum = reduce_ranks(c.in, *c.desc.reduce);
    const size_t block = c.out[0].bytes();
    for (int r = 0; r < n; ++r) copy_bytes(c.out[rank(r)].data, sum.data() + rank(r) * block, block);
  } else if (kind == "all_gather") {
    const size_t block = c.in[0].bytes();
    std::vector<std::byte> staged(std::max<size_t>(1, block * rank(n)));
    for (int r = 0; r < n; ++r) copy_bytes(staged.data() + rank(r) * block, c.in[rank(r)].data, block);
    for (int r = 0; r < n; ++r) copy_bytes(c.out[rank(r)].data, staged.data(), block * rank(n));
  } else if (kind == "broadcast") {
    const Tensor& root = c.in[rank(c.desc.root)];
    for (int r = 0; r < n; ++r)
      if (r != c.desc.root) copy_bytes(c.out[rank(r)].data, root.data, root.bytes());
  } else if (kind == "all_to_all") {
    const size_t all = c.in[0].bytes(), block = all / rank(n);
    std::vector<std::byte> staged(std::max<size_t>(1, all * rank(n)));  // rank s's input at s * all
    for (int s = 0; s < n; ++s) copy_bytes(staged.data() + rank(s) * all, c.in[rank(s)].data, all);
    for (int r = 0; r < n; ++r)
      for (int s = 0; s < n; ++s)
        copy_bytes(static_cast<std::byte*>(c.out[rank(r)].data) + rank(s) * block,
                   staged.data() + rank(s) * all + rank(r) * block, block);
  } else if (kind == "split") {
    std::map<int, std::vector<std::pair<int, int>>> by_color;  // color -> (key, rank here)
    for (int r = 0; r < n; ++r) by_color[c.color[rank(r)]].emplace_back(c.key[rank(r)], r);
    for (auto& [color, members] : by_color) {
      std::sort(members.begin(), members.end());
      std::vector<int> world;
      for (const auto& m : members) world.push_back(g.world_ranks[rank(m.second)]);
      auto group = std::make_shared<Group>(g.job, std::move(world));
      for (size_t i = 0; i < members.size(); ++i) {
        c.new_group[rank(members[i].second)] = group;
        c.new_rank[rank(members[i].second)] = static_cast<int>(i);
      }
    }
  }
  // barrier: nothing to move
}

// --- waiting -----------------------------------------------------------------------------------

class ThreadWork final : public Work {
 public:
  ThreadWork(std::shared_ptr<Group> group, std::shared_ptr<Op> op, const OpDesc& desc, std::string group_name, int rank,
             double timeout_s)
      : group_(std::move(group)),
        op_(std::move(op)),
        desc_(desc),
        group_name_(std::move(group_name)),
        rank_(rank),
        timeout_s_(timeout_s) {}

  ~ThreadWork() override {
    Job& job = *group_->job;
    std::unique_lock lock(job.mu);
    // Another thread may be writing into this rank's buffers right now; it finishes soon (a copy).
    job.cv.wait(lock, [&] { return op_->state != State::running; });
    // Waiting in a failed job: nobody carries it out any more.
    if (op_->state != State::waiting || !job.failure.empty()) return;
    // The buffers of an operation that never completed are about to go away: nobody may carry it
    // out any more.
    fail_job(job, world_rank(), fmt::format("abandoned {} {} before it completed", desc_.str(), where()));
    lock.unlock();
    LT_CHECK(std::uncaught_exceptions() > 0, "{} {} dropped before it completed: wait() for every handle", desc_.str(),
             where());
  }

  void wait() override {
    Job& job = *group_->job;
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(std::min(timeout_s_, kLongestWait)));
    std::unique_lock lock(job.mu);
    while (!check(lock)) {
      if (Clock::now() >= deadline) {
        const std::string what =
            fmt::format("timed out after {} waiting for {} {}", format_duration(timeout_s_), desc_.str(), where());
        fail_job(job, world_rank(), what);
        throw environment_error(
            what, fmt::format("the other ranks of group '{}' did not complete it in time: one is stuck, has failed or "
                              "called a different operation; if they are only slow, raise the timeout",
                              group_name_));
      }
      job.cv.wait_until(lock, deadline);
    }
  }

  bool done() override {
    std::unique_lock lock(group_->job->mu);
    return check(lock);
  }

  const std::shared_ptr<Op>& op() const { return op_; }

 private:
  int world_rank() const { return group_->world_ranks[static_cast<size_t>(rank_)]; }

  // "on group 'tp' (2 ranks; this is its rank 0)", or for send/recv the peer first.
  std::string where() const {
    std::string who = fmt::format("on group '{}'", group_name_);
    if (desc_.kind == "send" || desc_.kind == "recv")
      who = fmt::format("{} rank {} (world rank {}) of group '{}'", desc_.kind == "send" ? "to" : "from", desc_.peer,
                        group_->world_ranks[static_cast<size_t>(desc_.peer)], group_name_);
    return fmt::format("{} ({} ranks; this is its rank {})", who, group_->size(), rank_);
  }

  // Under the lock: true once done; false while it may still complete; throws when it cannot.
  bool check(std::unique_lock<std::mutex>& lock) {
    Job& job = *group_->job;
    for (;;) {
      switch (op_->state) {
        case State::done:
          return true;
        case State::broken:
          throw environment_error(op_->error, std::string(kMismatchHint));
        case State::running:
          job.cv.wait(lock);  // a copy by another thread, no other rank needed
          continue;
        case State::waiting:
          break;
      }
      break;
    }
    if (!job.failure.empty())
      throw environment_error(fmt::format("gave up waiting for {} {}: {}", desc_.str(), where(), job.failure),
                              std::string(kFailedHint));
    if (const int gone = op_->needs_returned_rank(*group_); gone >= 0) {
      const std::string what = fmt::format(
          "{} {} can never complete: rank {} (world rank {}) of group '{}' returned from its function "
          "without starting its side of it",
          desc_.str(), where(), gone, group_->world_ranks[static_cast<size_t>(gone)], group_name_);
      fail_job(job, world_rank(), what);
      throw environment_error(what,
                              "every rank starts every collective of its groups, and every receive or send matching "
                              "another's, before its function returns");
    }
    return false;
  }

  std::shared_ptr<Group> group_;
  std::shared_ptr<Op> op_;
  OpDesc desc_;
  std::string group_name_;  // as this rank named it
  int rank_;
  double timeout_s_;
};

// --- the communicator --------------------------------------------------------------------------

class ThreadComm final : public Comm {
 public:
  ThreadComm(std::shared_ptr<Group> group, int rank, std::string name, double timeout_s)
      : group_(std::move(group)), rank_(rank), name_(std::move(name)), timeout_s_(timeout_s) {}

  const std::shared_ptr<Job>& job() const { return group_->job; }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  const std::string& name() const override { return name_; }
  void set_timeout(double seconds) override {
    LT_CHECK(seconds > 0, "timeout {} s for group {}", seconds, name_);
    timeout_s_ = seconds;
  }
  double timeout() const override { return timeout_s_; }
  // Operations move when their last rank starts them; nothing is left to advance.
  void progress() override {}

  std::unique_ptr<Comm> split(int color, int key, std::string name) override {
    LT_CHECK(color >= 0, "split of group {} with color {}", name_, color);
    auto work = start_collective(OpDesc{.kind = "split"}, Tensor{}, Tensor{}, color, key);
    work->wait();
    const auto& c = static_cast<const Collective&>(*work->op());
    const size_t me = static_cast<size_t>(rank_);
    return std::make_unique<ThreadComm>(c.new_group[me], c.new_rank[me], std::move(name), timeout_s_);
  }

  WorkHandle all_reduce_async(Tensor buf, Reduction op) override {
    host_only(buf, "all_reduce");
    LT_CHECK(reduce_supported(buf.dtype, op.op), "{} of {} on group {}", to_string(op, buf.dtype),
             kernels::to_string(buf.dtype), name_);
    return start_collective({.kind = "all_reduce", .count = buf.numel(), .dtype = buf.dtype, .reduce = op}, buf, buf);
  }
  WorkHandle reduce_scatter_async(Tensor in, Tensor out, Reduction op) override {
    host_only(in, "reduce_scatter");
    host_only(out, "reduce_scatter");
    LT_CHECK(in.dtype == out.dtype && in.numel() == out.numel() * size(),
             "reduce_scatter of {} {} into {} {} on group '{}' of {} ranks", in.numel(), kernels::to_string(in.dtype),
             out.numel(), kernels::to_string(out.dtype), name_, size());
    LT_CHECK(reduce_supported(in.dtype, op.op), "{} of {} on group {}", to_string(op, in.dtype),
             kernels::to_string(in.dtype), name_);
    return start_collective({.kind = "reduce_scatter", .count = out.numel(), .dtype = out.dtype, .reduce = op}, in,
                            out);
  }
  WorkHandle all_gather_async(Tensor in, Tensor out) override {
    host_only(in, "all_gather");
    host_only(out, "all_gather");
    LT_CHECK(in.dtype == out.dtype && out.numel() == in.numel() * size(),
             "all_gather of {} {} into {} {} on group '{}' of {} ranks", in.numel(), kernels::to_string(in.dtype),
             out.numel(), kernels::to_string(out.dtype), name_, size());
    // As MpiComm: the input may be this rank's block of the output, and no other part of it.
    const bool in_place = in.data == static_cast<char*>(out.data) + static_cast<size_t>(rank_) * in.bytes();
    LT_CHECK(in_place || !overlap(in, out),
             "all_gather on group '{}': input overlaps the output but is not this rank's block of it", name_);
    return start_collective({.kind = "all_gather", .count = in.numel(), .dtype = in.dtype}, in, out);
  }
  WorkHandle broadcast_async(Tensor buf, int root) override {
    host_only(buf, "broadcast");
    LT_CHECK(root >= 0 && root < size(), "broadcast from rank {} in group '{}' of {} ranks", root, name_, size());
    return start_collective({.kind = "broadcast", .count = buf.numel(), .dtype = buf.dtype, .root = root}, buf, buf);
  }
  WorkHandle all_to_all_async(Tensor in, Tensor out) override {
    host_only(in, "all_to_all");
    host_only(out, "all_to_all");
    LT_CHECK(in.dtype == out.dtype && in.numel() == out.numel() && in.numel() % size() == 0,
             "all_to_all of {} {} into {} {} on group '{}' of {} ranks", in.numel(), kernels::to_string(in.dtype),
             out.numel(), kernels::to_string(out.dtype), name_, size());
    return start_collective({.kind = "all_to_all", .count = in.numel() / size(), .dtype = in.dtype}, in, out);
  }
  WorkHandle barrier_async() override { return start_collective({.kind = "barrier"}, Tensor{}, Tensor{}); }
  WorkHandle send_async(Tensor buf, int peer, int tag) override { return start_transfer(true, buf, peer, tag); }
  WorkHandle recv_async(Tensor buf, int peer, int tag) override { return start_transfer(false, buf, peer, tag); }

 private:
  static bool overlap(const Tensor& a, const Tensor& b) {
    const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
    return a.bytes() > 0 && b.bytes() > 0 && a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
  }
  void host_only(const Tensor& t, const char* op) const {
    LT_CHECK(t.device == kernels::Device::cpu, "in-process {} on group '{}' with {} memory (host memory only)", op,
             name_, kernels::to_string(t.device));
  }
  int world_rank() const { return group_->world_ranks[static_cast<size_t>(rank_)]; }
  std::unique_ptr<ThreadWork> make_work(std::shared_ptr<Op> op, const OpDesc& desc) const {
    return std::make_unique<ThreadWork>(group_, std::move(op), desc, name_, rank_, timeout_s_);
  }

  // Under the lock: a failed job starts nothing.
  void refuse_if_failed(const OpDesc& desc) const {
    const Job& job = *group_->job;
    if (!job.failure.empty())
      throw environment_error(fmt::format("cannot start {} on group '{}' ({} ranks; this is its rank {}): {}",
                                          desc.str(), name_, size(), rank_, job.failure),
                              std::string(kFailedHint));
  }

  // Under the lock: `op` can never complete; the error every rank taking part gets.
  Error break_op(Op& op, std::string why) const {
    op.state = State::broken;
    op.error = std::move(why);
    fail_job(*group_->job, world_rank(), op.error);
    return environment_error(op.error, std::string(kMismatchHint));
  }

  std::unique_ptr<ThreadWork> start_collective(const OpDesc& desc, Tensor in, Tensor out, int color = 0, int key = 0) {
    Job& job = *group_->job;
    const uint64_t seq = next_collective_++;
    std::unique_lock lock(job.mu);
    refuse_if_failed(desc);
    std::shared_ptr<Collective>& slot = group_->open[seq];
    if (!slot) slot = std::make_shared<Collective>(desc, size());
    const std::shared_ptr<Collective> c = slot;
    if (!c->desc.same_collective(desc)) {
      int first = 0;
      while (!c->arrived[static_cast<size_t>(first)]) ++first;
      group_->open.erase(seq);
      throw break_op(*c,
                     fmt::format("collective mismatch on group '{}' ({} ranks): rank {} started {} as its collective "
                                 "#{} on this group, where rank {} started {}",
                                 name_, size(), rank_, desc.str(), seq, first, c->desc.str()));
    }
    const size_t me = static_cast<size_t>(rank_);
    c->arrived[me] = true;
    c->in[me] = in;
    c->out[me] = out;
    c->color[me] = color;
    c->key[me] = key;
    auto work = make_work(c, desc);
    if (++c->arrivals < size()) return work;

    // The last rank to arrive carries it out, outside the lock: the others only wait for its state.
    group_->open.erase(seq);
    c->state = State::running;
    lock.unlock();
    std::string failure;
    try {
      carry_out(*c, *group_);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    lock.lock();
    if (failure.empty()) {
      c->state = State::done;
      job.cv.notify_all();
      return work;
    }
    Error error = break_op(*c, fmt::format("{} on group '{}' failed: {}", desc.str(), name_, failure));
    lock.unlock();  // before `work` goes, whose destructor takes the lock
    throw error;
  }

  std::unique_ptr<ThreadWork> start_transfer(bool sending, Tensor buf, int peer, int tag) {
    const char* kind = sending ? "send" : "recv";
    host_only(buf, kind);
    LT_CHECK(peer >= 0 && peer < size() && peer != rank_, "{} with peer {} in group '{}' of {} ranks (this is rank {})",
             kind, peer, name_, size(), rank_);
    const OpDesc desc{.kind = kind, .count = buf.numel(), .dtype = buf.dtype, .peer = peer, .tag = tag};
    Job& job = *group_->job;
    std::unique_lock lock(job.mu);
    refuse_if_failed(desc);
    const Group::Channel channel{sending ? rank_ : peer, sending ? peer : rank_, tag};
    auto& partners = sending ? group_->recvs : group_->sends;
    const auto it = partners.find(channel);
    if (it == partners.end()) {  // first side: wait in the queue for the other
      auto t = std::make_shared<PointToPoint>();
      t->src = std::get<0>(channel), t->dst = std::get<1>(channel);
      (sending ? t->send : t->recv) = buf;
      (sending ? t->sender_posted : t->receiver_posted) = true;
      (sending ? group_->sends : group_->recvs)[channel].push_back(t);
      return make_work(std::move(t), desc);
    }
    const std::shared_ptr<PointToPoint> t = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) partners.erase(it);
    (sending ? t->send : t->recv) = buf;
    (sending ? t->sender_posted : t->receiver_posted) = true;
    if (t->send.dtype != t->recv.dtype || t->send.numel() != t->recv.numel())
      throw break_op(
          *t, fmt::format("send/recv mismatch on group '{}' ({} ranks): rank {} sends {} {} with tag {} and rank {} "
                          "receives it into {} {}",
                          name_, size(), t->src, t->send.numel(), kernels::to_string(t->send.dtype), tag, t->dst,
                          t->recv.numel(), kernels::to_string(t->recv.dtype)));
    t->state = State::running;
    lock.unlock();
    copy_bytes(t->recv.data, t->send.data, t->recv.bytes());
    lock.lock();
    t->state = State::done;
    job.cv.notify_all();
    return make_work(t, desc);
  }

  std::shared_ptr<Group> group_;
  int rank_;
  std::string name_;
  double timeout_s_;
  uint64_t next_collective_ = 0;  // sequence number of this rank's next collective on the group
};

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

std::vector<std::unique_ptr<Comm>> make_thread_comms(int n, std::string name, double timeout_s) {
  LT_CHECK(n >= 1, "{} in-process ranks", n);
  LT_CHECK(timeout_s > 0, "timeout {} s for group {}", timeout_s, name);
  std::vector<int> world(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) world[static_cast<size_t>(r)] = r;
  auto group = std::make_shared<Group>(std::make_shared<Job>(n), std::move(world));
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<ThreadComm>(group, r, name, timeout_s));
  return comms;
}

void run_ranks_in_threads(int n, const std::function<void(Comm& world)>& fn, double timeout_s) {
  std::vector<std::unique_ptr<Comm>> comms = make_thread_comms(n, "world", timeout_s);
  const std::shared_ptr<Job> job = static_cast<ThreadComm&>(*comms[0]).job();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  // No exception leaves a rank's thread: it is kept, and fails the job so that no rank waits for
  // this one.
  auto rank_main = [&](int r) {
    const size_t me = static_cast<size_t>(r);
    try {
      omp_set_num_threads(1);
      fn(*comms[me]);
    } catch (...) {
      errors[me] = std::current_exception();
    }
    std::lock_guard lock(job->mu);
    if (errors[me])
      fail_job(*job, r, what_of(errors[me]));
    else
      job->returned[me] = true;
    job->cv.notify_all();
  };
  std::vector<std::thread> threads;
  try {
    for (int r = 0; r < n; ++r) threads.emplace_back(rank_main, r);
  } catch (const std::system_error& e) {
    {
      std::lock_guard lock(job->mu);
      fail_job(*job, static_cast<int>(threads.size()), fmt::format("could not start its thread: {}", e.what()));
    }
    for (std::thread& t : threads) t.join();
    throw environment_error(
        fmt::format("could not start thread {} of {} in-process ranks: {}", threads.size(), n, e.what()));
  }
  for (std::thread& t : threads) t.join();

  if (job->failed_rank < 0) return;
  // The rank that failed first; a rank that caught the error and returned still failed the job.
  const int r = job->failed_rank;
  const std::exception_ptr first = errors[static_cast<size_t>(r)];
  if (!first) throw environment_error(job->failure, std::string(kFailedHint));
  try {
    std::rethrow_exception(first);
  } catch (const Error& e) {
    throw Error(fmt::format("rank {} of {} in-process ranks failed: {}", r, n, e.what()), e.hint(), e.kind());
  } catch (...) {
    throw environment_error(fmt::format("rank {} of {} in-process ranks failed: {}", r, n, what_of(first)));
  }
}

}  // namespace llmtrain::parallel
