// OrderLog (tests/parallel/comm/comm_order.h).
#include "tests/parallel/comm/comm_order.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>
#include <utility>

#include "common/error.h"

namespace llmtrain::parallel {
namespace {

using kernels::DType;

bool host_group(const std::string& name) { return name == "world" || name.ends_with("control"); }

class LoggingComm;

class LoggingWork final : public Work {
 public:
  LoggingWork(WorkHandle inner, OrderLog* log, int world_rank, size_t index)
      : inner_(std::move(inner)), log_(log), world_rank_(world_rank), index_(index) {}
  void wait() override {
    inner_->wait();
    log_->observe(world_rank_, index_);
  }
  bool done() override {
    const bool d = inner_->done();
    if (d) log_->observe(world_rank_, index_);
    return d;
  }

 private:
  WorkHandle inner_;
  OrderLog* log_;
  int world_rank_;
  size_t index_;
};

class LoggingComm final : public Comm {
 public:
  LoggingComm(std::unique_ptr<Comm> inner, OrderLog* log, int world_rank, std::string key)
      : inner_(std::move(inner)),
        log_(log),
        world_rank_(world_rank),
        key_(std::move(key)),
        logged_(!host_group(inner_->name())) {}
  // The end of a group's communicator is NCCL's finalize (parallel/comm/comm_nccl.cpp's teardown):
  // collective, and the rank blocks in it until every rank of the group has finalized, so the order
  // in which ranks tear their groups down must agree as their operations' does.
  ~LoggingComm() override {
    if (!logged_) return;
    const size_t index = log_->add(world_rank_, LoggedOp{.group = key_,
                                                         .group_size = size(),
                                                         .rank = rank(),
                                                         .collective = "finalize",
                                                         .transfers = {},
                                                         .what = "ncclCommFinalize (the communicator's end)",
                                                         .observed_before = 0});
    log_->observe(world_rank_, index);
  }
  LoggingComm(const LoggingComm&) = delete;
  LoggingComm& operator=(const LoggingComm&) = delete;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  void set_timeout(double seconds) override { inner_->set_timeout(seconds); }
  double timeout() const override { return inner_->timeout(); }
  void progress() override { inner_->progress(); }

  std::unique_ptr<Comm> split(int color, int key, std::string name) override {
    const std::string child = fmt::format("{}/{}#{}", key_, name, color);
    return std::make_unique<LoggingComm>(inner_->split(color, key, std::move(name)), log_, world_rank_, child);
  }

  WorkHandle all_reduce_async(Tensor buf, Reduction op) override {
    return collective(
        fmt::format("all_reduce of {} {} ({})", buf.numel(), kernels::to_string(buf.dtype), to_string(op, buf.dtype)),
        inner_->all_reduce_async(buf, op));
  }
  WorkHandle reduce_scatter_async(Tensor in, Tensor out, Reduction op) override {
    return collective(
        fmt::format("reduce_scatter of {} {} ({})", in.numel(), kernels::to_string(in.dtype), to_string(op, in.dtype)),
        inner_->reduce_scatter_async(in, out, op));
  }
  WorkHandle all_gather_async(Tensor in, Tensor out) override {
    return collective(fmt::format("all_gather of {} {}", in.numel(), kernels::to_string(in.dtype)),
                      inner_->all_gather_async(in, out));
  }
  WorkHandle broadcast_async(Tensor buf, int root) override {
    return collective(fmt::format("broadcast of {} {} from {}", buf.numel(), kernels::to_string(buf.dtype), root),
                      inner_->broadcast_async(buf, root));
  }
  WorkHandle all_to_all_async(Tensor in, Tensor out) override {
    return collective(fmt::format("all_to_all of {} {}", in.numel(), kernels::to_string(in.dtype)),
                      inner_->all_to_all_async(in, out));
  }
  WorkHandle barrier_async() override { return collective("barrier", inner_->barrier_async()); }

  WorkHandle send_async(Tensor buf, int peer, int tag) override {
    return transfers(fmt::format("send of {} {} to {}", buf.numel(), kernels::to_string(buf.dtype), peer),
                     {{true, peer, buf.numel(), buf.dtype}}, inner_->send_async(buf, peer, tag));
  }
  WorkHandle recv_async(Tensor buf, int peer, int tag) override {
    return transfers(fmt::format("recv of {} {} from {}", buf.numel(), kernels::to_string(buf.dtype), peer),
                     {{false, peer, buf.numel(), buf.dtype}}, inner_->recv_async(buf, peer, tag));
  }
  WorkHandle exchange_async(std::vector<Transfer> list) override {
    std::vector<LoggedTransfer> logged;
    for (const Transfer& t : list)
      if (t.buf.numel() > 0) logged.push_back({t.kind == Transfer::Kind::send, t.peer, t.buf.numel(), t.buf.dtype});
    const std::string what = fmt::format("exchange of {} transfers", logged.size());
    return transfers(what, std::move(logged), inner_->exchange_async(std::move(list)));
  }

 private:
  WorkHandle collective(std::string what, WorkHandle inner) {
    if (!logged_) return inner;
    return logged(LoggedOp{.group = key_,
                           .group_size = size(),
                           .rank = rank(),
                           .collective = what,
                           .transfers = {},
                           .what = what,
                           .observed_before = 0},
                  std::move(inner));
  }
  WorkHandle transfers(std::string what, std::vector<LoggedTransfer> list, WorkHandle inner) {
    if (!logged_) return inner;
    return logged(LoggedOp{.group = key_,
                           .group_size = size(),
                           .rank = rank(),
                           .collective = {},
                           .transfers = std::move(list),
                           .what = what,
                           .observed_before = 0},
                  std::move(inner));
  }
  WorkHandle logged(LoggedOp op, WorkHandle inner) {
    const size_t index = log_->add(world_rank_, std::move(op));
    return std::make_unique<LoggingWork>(std::move(inner), log_, world_rank_, index);
  }

  std::unique_ptr<Comm> inner_;
  OrderLog* log_;
  int world_rank_;
  std::string key_;
  bool logged_;
};

// One rank's operation in the replay.
struct OpRef {
  int rank = 0;  // world rank
  size_t index = 0;
  bool operator<(const OpRef& o) const { return std::pair(rank, index) < std::pair(o.rank, o.index); }
};

}  // namespace

OrderLog::OrderLog(int world_size)
    : ops_(size_t(world_size)), observed_(size_t(world_size)), observed_seen_(size_t(world_size)) {}

std::unique_ptr<Comm> OrderLog::wrap(std::unique_ptr<Comm> world) {
  const int r = world->rank();
  return std::make_unique<LoggingComm>(std::move(world), this, r, "world");
}

size_t OrderLog::add(int world_rank, LoggedOp op) {
  std::lock_guard lock(mu_);
  op.observed_before = observed_[size_t(world_rank)].size();
  ops_[size_t(world_rank)].push_back(std::move(op));
  observed_seen_[size_t(world_rank)].push_back(false);
  return ops_[size_t(world_rank)].size() - 1;
}

void OrderLog::observe(int world_rank, size_t index) {
  std::lock_guard lock(mu_);
  if (observed_seen_[size_t(world_rank)][index]) return;
  observed_seen_[size_t(world_rank)][index] = true;
  observed_[size_t(world_rank)].push_back(index);
}

size_t OrderLog::operations() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& r : ops_) n += r.size();
  return n;
}

std::string OrderLog::check_nccl_order() const {
  std::lock_guard lock(mu_);
  const size_t world = ops_.size();

  // Per group: its members (world rank by group rank), each member's operations there in order, its
  // collectives in order, and each (sender, receiver) pair's sends and receives in order.
  struct Group {
    std::map<int, int> world_of;                                     // group rank -> world rank
    std::map<int, std::vector<size_t>> ops;                          // group rank -> op indices
    std::map<int, std::vector<size_t>> collectives;                  // group rank -> op indices of its collectives
    std::map<std::pair<int, int>, std::vector<OpRef>> sends, recvs;  // (from, to) group ranks
  };
  std::map<std::string, Group> groups;
  std::vector<std::vector<size_t>> kth(world);  // per op: its index among its rank's collectives on the group
  for (size_t r = 0; r < world; ++r) {
    kth[r].resize(ops_[r].size());
    for (size_t i = 0; i < ops_[r].size(); ++i) {
      const LoggedOp& op = ops_[r][i];
      Group& g = groups[op.group];
      g.world_of[op.rank] = int(r);
      g.ops[op.rank].push_back(i);
      if (!op.collective.empty()) {
        kth[r][i] = g.collectives[op.rank].size();
        g.collectives[op.rank].push_back(i);
      }
      for (const LoggedTransfer& t : op.transfers) {
        if (t.send)
          g.sends[{op.rank, t.peer}].push_back({int(r), i});
        else
          g.recvs[{t.peer, op.rank}].push_back({int(r), i});
      }
    }
  }

  // Static agreement: collectives, and sends against receives.
  for (const auto& [key, g] : groups) {
    const int size = ops_[size_t(g.world_of.begin()->second)][g.ops.begin()->second.front()].group_size;
    for (int a = 0; a < size; ++a) {
      const auto& mine = g.collectives.count(a) ? g.collectives.at(a) : std::vector<size_t>{};
      for (int b = 0; b < size; ++b) {
        const auto& theirs = g.collectives.count(b) ? g.collectives.at(b) : std::vector<size_t>{};
        if (theirs.size() != mine.size())
          return fmt::format("group {}: rank {} starts {} collectives, rank {} starts {}", key, a, mine.size(), b,
                             theirs.size());
        for (size_t k = 0; k < mine.size(); ++k) {
          const LoggedOp& x = ops_[size_t(g.world_of.at(a))][mine[k]];
          const LoggedOp& y = ops_[size_t(g.world_of.at(b))][theirs[k]];
          if (x.collective != y.collective)
            return fmt::format("group {}: collective {} is {} on rank {} but {} on rank {}", key, k, x.collective, a,
                               y.collective, b);
        }
      }
    }
    std::set<std::pair<int, int>> pairs;
    for (const auto& [p, v] : g.sends) pairs.insert(p);
    for (const auto& [p, v] : g.recvs) pairs.insert(p);
    for (const auto& p : pairs) {
      const auto& s = g.sends.count(p) ? g.sends.at(p) : std::vector<OpRef>{};
      const auto& v = g.recvs.count(p) ? g.recvs.at(p) : std::vector<OpRef>{};
      if (s.size() != v.size())
        return fmt::format("group {}: rank {} sends {} messages to rank {}, which receives {}", key, p.first, s.size(),
                           p.second, v.size());
    }
  }
  // The k-th transfer of an op to/from a peer, matched with its partner op, sizes compared.
  std::map<std::pair<OpRef, size_t>, OpRef> partner;  // (op, transfer index) -> the other side's op
  for (const auto& [key, g] : groups) {
    std::map<std::pair<int, int>, size_t> next_send, next_recv;
    for (size_t r = 0; r < world; ++r)
      for (size_t i = 0; i < ops_[r].size(); ++i) {
        const LoggedOp& op = ops_[r][i];
        if (op.group != key) continue;
        for (size_t t = 0; t < op.transfers.size(); ++t) {
          const LoggedTransfer& x = op.transfers[t];
          const std::pair<int, int> p = x.send ? std::pair(op.rank, x.peer) : std::pair(x.peer, op.rank);
          const size_t k = x.send ? next_send[p]++ : next_recv[p]++;
          const OpRef other = x.send ? g.recvs.at(p)[k] : g.sends.at(p)[k];
          const LoggedOp& o = ops_[size_t(other.rank)][other.index];
          bool sized = false;
          for (const LoggedTransfer& y : o.transfers)
            if (y.send != x.send && y.peer == op.rank && y.count == x.count && y.dtype == x.dtype) sized = true;
          if (!sized)
            return fmt::format(
                "group {}: the {}th message from rank {} to rank {} is {} on one side and {} on the "
                "other (without tags, NCCL matches them by order)",
                key, k, p.first, p.second, op.what, o.what);
          partner[{OpRef{int(r), i}, t}] = other;
        }
      }
  }

  // The replay.
  std::vector<std::vector<bool>> completed(world);
  std::vector<size_t> observed_done(world, 0);            // prefix of observed_[r] that has completed
  std::map<std::pair<size_t, std::string>, size_t> head;  // (world rank, group) -> position in its group list
  for (size_t r = 0; r < world; ++r) completed[r].assign(ops_[r].size(), false);
  auto group_list = [&](size_t r, const LoggedOp& op) -> const std::vector<size_t>& {
    return groups.at(op.group).ops.at(op.rank);
  };
  // Started: the rank's previous op on the group and everything it waited for before have completed.
  auto started = [&](size_t r, size_t i) {
    if (completed[r][i]) return true;
    const LoggedOp& op = ops_[r][i];
    const auto& list = group_list(r, op);
    const size_t h = head[{r, op.group}];
    return h < list.size() && list[h] == i && observed_done[r] >= op.observed_before;
  };
  size_t remaining = 0;
  for (size_t r = 0; r < world; ++r) remaining += ops_[r].size();
  for (bool progressed = true; progressed && remaining > 0;) {
    progressed = false;
    for (size_t r = 0; r < world; ++r)
      for (size_t i = 0; i < ops_[r].size(); ++i) {
        if (completed[r][i] || !started(r, i)) continue;
        const LoggedOp& op = ops_[r][i];
        bool can = true;
        if (!op.collective.empty()) {
          const Group& g = groups.at(op.group);
          for (const auto& [gr, list] : g.collectives)
            if (!started(size_t(g.world_of.at(gr)), list[kth[r][i]])) can = false;
        }
        for (size_t t = 0; t < op.transfers.size() && can; ++t) {
          const OpRef other = partner.at({OpRef{int(r), i}, t});
          if (!started(size_t(other.rank), other.index)) can = false;
        }
        if (!can) continue;
        completed[r][i] = true;
        --remaining;
        progressed = true;
        ++head[{r, op.group}];
        while (observed_done[r] < observed_[r].size() && completed[r][observed_[r][observed_done[r]]])
          ++observed_done[r];
      }
  }
  if (remaining == 0) return {};
  std::string stuck;
  for (size_t r = 0; r < world; ++r) {
    std::vector<std::string> waits;
    for (size_t i = 0; i < ops_[r].size() && waits.size() < 3; ++i)
      if (!completed[r][i] && started(r, i))
        waits.push_back(fmt::format("{} on {}", ops_[r][i].what, ops_[r][i].group));
    if (!waits.empty()) stuck += fmt::format("\n  rank {} waits in: {}", r, fmt::join(waits, "; "));
  }
  return fmt::format("{} operations never complete under NCCL's rules:{}", remaining, stuck);
}

}  // namespace llmtrain::parallel
