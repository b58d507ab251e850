// Schedule generators, the checker and the timeline. Every generator produces only the order of
// the computation (which forward or backward comes next); with_communication() then adds the sends
// and receives the same way for all of them, so a new schedule is one function of compute order.
//
// The timeline and the deadlock check are one simulation of the executor's rules
// (parallel/pipeline_executor.h): a stage posts sends and receives when it reaches them, starts a
// forward once its input arrived, and starts a backward once its output gradient arrived, the
// activation it sent for that micro-batch was received, and every gradient it sent before was
// received (the stage may then overwrite those buffers). A message moves once both sides posted it
// (the pessimistic, rendezvous case: a send never completes on its own), forward and backward take
// one unit of time and communication none. If no stage can move and some have work left, the lists
// deadlock.
#include "parallel/pipeline_schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string_view>
#include <tuple>

#include "common/enum_names.h"
#include "common/error.h"

namespace llmtrain::parallel {

namespace {

using K = PipeOpKind;

bool first_virtual(int stage, int chunk) { return stage == 0 && chunk == 0; }
bool last_virtual(int stages, int chunks, int stage, int chunk) { return stage == stages - 1 && chunk == chunks - 1; }

void check_spec(const ScheduleSpec& s) {
  LT_CHECK(s.stages >= 1, "pipeline schedule for {} stages", s.stages);
  LT_CHECK(s.stage >= 0 && s.stage < s.stages, "pipeline schedule for stage {} of {}", s.stage, s.stages);
  LT_CHECK(s.micro_batches >= 1, "pipeline schedule for {} micro-batches", s.micro_batches);
  LT_CHECK(s.chunks >= 1, "pipeline schedule for {} chunks per stage", s.chunks);
}

// Adds the communication to one stage's compute order: each receive is placed before the piece of
// work that precedes its consumer (so the executor has it posted while that work runs), each send
// right after its producer.
std::vector<PipeOp> with_communication(const std::vector<PipeOp>& compute, const ScheduleSpec& spec) {
  auto recv_for = [&](const PipeOp& op) -> std::optional<PipeOp> {
    if (op.kind == K::forward && !first_virtual(spec.stage, op.chunk))
      return PipeOp{K::recv_activation, op.micro_batch, op.chunk};
    if ((op.kind == K::backward || op.kind == K::backward_input) &&
        !last_virtual(spec.stages, spec.chunks, spec.stage, op.chunk))
      return PipeOp{K::recv_grad, op.micro_batch, op.chunk};
    return std::nullopt;
  };
  auto send_after = [&](const PipeOp& op) -> std::optional<PipeOp> {
    if (op.kind == K::forward && !last_virtual(spec.stages, spec.chunks, spec.stage, op.chunk))
      return PipeOp{K::send_activation, op.micro_batch, op.chunk};
    if ((op.kind == K::backward || op.kind == K::backward_input) && !first_virtual(spec.stage, op.chunk))
      return PipeOp{K::send_grad, op.micro_batch, op.chunk};
    return std::nullopt;
  };
  std::vector<PipeOp> out;
  if (!compute.empty())
    if (auto r = recv_for(compute[0])) out.push_back(*r);
  for (size_t j = 0; j < compute.size(); ++j) {
    if (j + 1 < compute.size())
      if (auto r = recv_for(compute[j + 1])) out.push_back(*r);
    out.push_back(compute[j]);
    if (auto s = send_after(compute[j])) out.push_back(*s);
  }
  return out;
}

}  // namespace

std::string to_string(const PipeOp& op) {
  static constexpr EnumName<K> kPrefixes[] = {
      {"F", K::forward},       {"B", K::backward},      {"sendA", K::send_activation}, {"recvA", K::recv_activation},
      {"sendG", K::send_grad}, {"recvG", K::recv_grad}, {"I", K::backward_input},      {"W", K::backward_weight}};
  const char* prefix = enum_name(kPrefixes, op.kind);
  if (op.chunk != 0) return fmt::format("{}{}c{}", prefix, op.micro_batch, op.chunk);
  return fmt::format("{}{}", prefix, op.micro_batch);
}

std::string format_ops(const std::vector<PipeOp>& ops) {
  std::string s;
  for (const PipeOp& op : ops) {
    if (!s.empty()) s += ' ';
    s += to_string(op);
  }
  return s;
}

bool is_compute(PipeOpKind kind) {
  return kind == K::forward || kind == K::backward || kind == K::backward_input || kind == K::backward_weight;
}

int pipe_boundary(const PipeOp& op, int stages, int stage) {
  const int v = op.chunk * stages + stage;
  switch (op.kind) {
    case K::send_activation:
    case K::recv_grad:
      return v;
    case K::recv_activation:
    case K::send_grad:
      return v - 1;
    default:
      LT_CHECK(false, "{} crosses no stage boundary", to_string(op));
  }
  return -1;
}

// ---- Generators ----

std::vector<PipeOp> one_stage_schedule(int micro_batches) {
  check_spec({.micro_batches = micro_batches});
  std::vector<PipeOp> ops;
  for (int m = 0; m < micro_batches; ++m) {
    ops.push_back({K::forward, m});
    ops.push_back({K::backward, m});
  }
  return ops;
}

std::vector<PipeOp> gpipe_schedule(const ScheduleSpec& spec) {
  check_spec(spec);
  LT_CHECK(spec.chunks == 1, "GPipe has one chunk per stage, not {}", spec.chunks);
  std::vector<PipeOp> compute;
  for (int m = 0; m < spec.micro_batches; ++m) compute.push_back({K::forward, m});
  for (int m = 0; m < spec.micro_batches; ++m) compute.push_back({K::backward, m});
  return with_communication(compute, spec);
}

std::vector<PipeOp> one_f_one_b_schedule(const ScheduleSpec& spec) {
  check_spec(spec);
  LT_CHECK(spec.chunks == 1, "1F1B has one chunk per stage, not {}", spec.chunks);
  const int m = spec.micro_batches;
  // Stage s forwards p - s - 1 micro-batches before its first backward can arrive from the last
  // stage; from then on each forward is followed by the oldest backward, so at most p - s
  // micro-batches are alive at once.
  const int warmup = std::min(spec.stages - spec.stage - 1, m);
  const int steady = m - warmup;
  std::vector<PipeOp> compute;
  for (int i = 0; i < warmup; ++i) compute.push_back({K::forward, i});
  for (int i = 0; i < steady; ++i) {
    compute.push_back({K::forward, warmup + i});
    compute.push_back({K::backward, i});
  }
  for (int i = steady; i < m; ++i) compute.push_back({K::backward, i});
  return with_communication(compute, spec);
}

std::vector<PipeOp> interleaved_schedule(const ScheduleSpec& spec) {
  check_spec(spec);
  const int p = spec.stages, v = spec.chunks, m = spec.micro_batches;
  LT_CHECK(m % p == 0, "the interleaved schedule needs micro-batches ({}) divisible by stages ({})", m, p);
  // Megatron-LM's interleaved 1F1B: the k-th forward (and the k-th backward) of the stage is
  // virtual micro-batch k of m · v. They come in groups of p · v: the first p are chunk 0 of p
  // micro-batches, the next p chunk 1 of the same micro-batches, ...; backwards walk the chunks
  // from the last. Warm-up forwards (p - s - 1) · 2 + (v - 1) · p of them (all of them when
  // m == p), then one forward and one backward alternate, then the remaining backwards.
  const int total = m * v, group = p * v;
  auto virtual_op = [&](PipeOpKind kind, int k) {
    const int in_group = k % group;
    int chunk = in_group / p;
    if (kind == K::backward) chunk = v - 1 - chunk;
    return PipeOp{kind, (k / group) * p + in_group % p, chunk};
  };
  const int warmup = m == p ? total : std::min((p - spec.stage - 1) * 2 + (v - 1) * p, total);
  std::vector<PipeOp> compute;
  for (int k = 0; k < warmup; ++k) compute.push_back(virtual_op(K::forward, k));
  for (int k = 0; k < total - warmup; ++k) {
    compute.push_back(virtual_op(K::forward, warmup + k));
    compute.push_back(virtual_op(K::backward, k));
  }
  for (int k = total - warmup; k < total; ++k) compute.push_back(virtual_op(K::backward, k));
  return with_communication(compute, spec);
}

std::vector<PipeOp> zero_bubble_schedule(const ScheduleSpec& spec) {
  check_spec(spec);
  LT_CHECK(spec.chunks == 1, "ZB-H1 has one chunk per stage, not {}", spec.chunks);
  const int p = spec.stages, m = spec.micro_batches;
  // Every stage in unit time (F, I and W one unit each, communication none), greedily: the next
  // input gradient as soon as its output gradient is there (it is on the critical path), else the
  // next forward while fewer than p - s micro-batches wait for their I (1F1B's bound) and fewer
  // than 2p - 1 - s wait for their W (ZB-H1 lets stage s defer W by p - 1 - s micro-batches, so
  // that the first stages fill the tail of the step with them), else the oldest deferred weight
  // gradient, else idle. Stage s's list is its order of work. A micro-batch keeps its activations
  // until its W: stage s keeps up to 2p - 1 - s of them (1F1B: p - s).
  std::vector<std::vector<int>> f_done(size_t(p), std::vector<int>(size_t(m), -1));
  std::vector<std::vector<int>> i_done = f_done;
  std::vector<int> next_f(size_t(p), 0), next_i(size_t(p), 0), next_w(size_t(p), 0);
  std::vector<std::vector<PipeOp>> order(static_cast<size_t>(p));
  for (int t = 0, finished = 0; finished < p; ++t) {
    // Decide every stage's work at t from what finished by t (end times of earlier slots).
    std::vector<std::optional<PipeOp>> pick(static_cast<size_t>(p));
    for (int st = 0; st < p; ++st) {
      const size_t u = size_t(st);
      const int fi = next_f[u], ii = next_i[u], wi = next_w[u];
      const bool i_ready = ii < fi && (st == p - 1 ? f_done[u][size_t(ii)] >= 0 && f_done[u][size_t(ii)] <= t
                                                   : i_done[u + 1][size_t(ii)] >= 0 && i_done[u + 1][size_t(ii)] <= t);
      const bool f_ready = fi < m && fi - ii < p - st && fi - wi < 2 * p - 1 - st &&
                           (st == 0 || (f_done[u - 1][size_t(fi)] >= 0 && f_done[u - 1][size_t(fi)] <= t));
      if (i_ready)
        pick[u] = PipeOp{K::backward_input, ii};
      else if (f_ready)
        pick[u] = PipeOp{K::forward, fi};
      else if (wi < ii)
        pick[u] = PipeOp{K::backward_weight, wi};
    }
    for (int st = 0; st < p; ++st) {
      const size_t u = size_t(st);
      if (!pick[u]) continue;
      const PipeOp op = *pick[u];
      order[u].push_back(op);
      if (op.kind == K::forward) f_done[u][size_t(next_f[u]++)] = t + 1;
      if (op.kind == K::backward_input) i_done[u][size_t(next_i[u]++)] = t + 1;
      if (op.kind == K::backward_weight && ++next_w[u] == m) ++finished;
    }
  }
  return with_communication(order[size_t(spec.stage)], spec);
}

std::vector<PipeOp> make_schedule(PipelineSchedule kind, const ScheduleSpec& spec) {
  check_spec(spec);
  if (spec.stages == 1 && spec.chunks == 1) return one_stage_schedule(spec.micro_batches);
  switch (kind) {
    case PipelineSchedule::gpipe:
      return gpipe_schedule(spec);
    case PipelineSchedule::one_f_one_b:
      return one_f_one_b_schedule(spec);
    case PipelineSchedule::interleaved:
      if (spec.micro_batches % spec.stages != 0)
        throw Error(fmt::format("the interleaved schedule needs micro-batches per step ({}) divisible by pp {}",
                                spec.micro_batches, spec.stages),
                    "raise train.global_batch or change train.micro_batch so that the micro-batch count is a "
                    "multiple of pp");
      return interleaved_schedule(spec);
    case PipelineSchedule::zero_bubble:
      if (spec.chunks == 1) return zero_bubble_schedule(spec);
      break;
  }
  throw Error(fmt::format("not supported yet: the {} pipeline schedule ({} stages, {} virtual chunks each)",
                          to_string(kind), spec.stages, spec.chunks),
              "use parallel.pp_schedule: 1f1b (or gpipe) with virtual_stages: 1");
}

std::vector<std::vector<PipeOp>> make_schedules(PipelineSchedule kind, const ScheduleSpec& spec) {
  std::vector<std::vector<PipeOp>> lists;
  for (int s = 0; s < spec.stages; ++s) {
    ScheduleSpec one = spec;
    one.stage = s;
    lists.push_back(make_schedule(kind, one));
  }
  return lists;
}

int max_in_flight(const std::vector<PipeOp>& ops) {
  int alive = 0, most = 0;
  for (const PipeOp& op : ops) {
    if (op.kind == K::forward) most = std::max(most, ++alive);
    if (op.kind == K::backward || op.kind == K::backward_weight) --alive;
  }
  return most;
}

int max_in_flight_per_chunk(const std::vector<PipeOp>& ops) {
  std::vector<int> alive;
  int most = 0;
  for (const PipeOp& op : ops) {
    if (op.chunk >= int(alive.size())) alive.resize(size_t(op.chunk) + 1, 0);
    if (op.kind == K::forward) most = std::max(most, ++alive[size_t(op.chunk)]);
    if (op.kind == K::backward || op.kind == K::backward_weight) --alive[size_t(op.chunk)];
  }
  return most;
}

// ---- Checker ----

std::vector<PipeOp> forward_only_schedule(const std::vector<PipeOp>& ops) {
  std::vector<PipeOp> out;
  for (const PipeOp& op : ops)
    if (op.kind == K::forward || op.kind == K::send_activation || op.kind == K::recv_activation) out.push_back(op);
  return out;
}

bool is_forward_only(const std::vector<PipeOp>& ops) {
  return std::none_of(ops.begin(), ops.end(), [](const PipeOp& op) {
    return op.kind == K::backward || op.kind == K::backward_input || op.kind == K::backward_weight ||
           op.kind == K::send_grad || op.kind == K::recv_grad;
  });
}

std::string check_stage_schedule(const std::vector<PipeOp>& ops, const ScheduleSpec& spec) {
  if (spec.stages < 1 || spec.stage < 0 || spec.stage >= spec.stages || spec.micro_batches < 1 || spec.chunks < 1)
    return fmt::format("bad schedule spec: stage {} of {}, {} micro-batches, {} chunks", spec.stage, spec.stages,
                       spec.micro_batches, spec.chunks);
  const int n = spec.micro_batches * spec.chunks;
  const bool forward_only = is_forward_only(ops);
  // How often each (micro-batch, chunk) was seen as each kind so far.
  struct Seen {
    int forward = 0, backward = 0, send_activation = 0, recv_activation = 0, send_grad = 0, recv_grad = 0;
    int backward_input = 0, backward_weight = 0;
  };
  std::vector<Seen> seen(n);
  auto problem = [&](size_t i, const PipeOp& op, std::string_view what) {
    return fmt::format("stage {}: op {} ({}): {}", spec.stage, i, to_string(op), what);
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const PipeOp& op = ops[i];
    if (op.micro_batch < 0 || op.micro_batch >= spec.micro_batches)
      return problem(i, op, fmt::format("micro-batch outside [0, {})", spec.micro_batches));
    if (op.chunk < 0 || op.chunk >= spec.chunks)
      return problem(i, op, fmt::format("chunk outside [0, {})", spec.chunks));
    const bool first = first_virtual(spec.stage, op.chunk);
    const bool last = last_virtual(spec.stages, spec.chunks, spec.stage, op.chunk);
    Seen& s = seen[op.micro_batch * spec.chunks + op.chunk];
    switch (op.kind) {
      case K::recv_activation:
        if (first) return problem(i, op, "the first stage has no previous stage to receive from");
        if (s.recv_activation++) return problem(i, op, "received twice");
        if (s.forward) return problem(i, op, "received after its forward");
        break;
      case K::forward:
        if (s.forward++) return problem(i, op, "forwarded twice");
        if (!first && !s.recv_activation) return problem(i, op, "forward without a receive of its input before it");
        break;
      case K::send_activation:
        if (last) return problem(i, op, "the last stage has no next stage to send to");
        if (!s.forward) return problem(i, op, "sent before its forward");
        if (s.send_activation++) return problem(i, op, "sent twice");
        break;
      case K::recv_grad:
        if (last) return problem(i, op, "the last stage has no next stage to receive from");
        if (s.recv_grad++) return problem(i, op, "received twice");
        if (s.backward || s.backward_input) return problem(i, op, "received after its backward");
        break;
      case K::backward:
      case K::backward_input:
        if (!s.forward) return problem(i, op, "backward before its forward");
        if (s.backward || s.backward_input) return problem(i, op, "backwarded twice");
        ++(op.kind == K::backward ? s.backward : s.backward_input);
        if (!last && !s.recv_grad) return problem(i, op, "backward without a receive of its output gradient before it");
        break;
      case K::backward_weight:
        if (!s.backward_input) return problem(i, op, "weight gradient before its input gradient");
        if (s.backward_weight++) return problem(i, op, "weight gradient twice");
        break;
      case K::send_grad:
        if (first) return problem(i, op, "the first stage has no previous stage to send to");
        if (!s.backward && !s.backward_input) return problem(i, op, "sent before its backward");
        if (s.send_grad++) return problem(i, op, "sent twice");
        break;
      default:
        break;
    }
  }
  for (int k = 0; k < n; ++k) {
    const PipeOp f{K::forward, k / spec.chunks, k % spec.chunks};
    const Seen& s = seen[k];
    const bool first = first_virtual(spec.stage, f.chunk);
    const bool last = last_virtual(spec.stages, spec.chunks, spec.stage, f.chunk);
    auto missing = [&](std::string_view what) {
      return fmt::format("stage {}: micro-batch {} chunk {} is never {}", spec.stage, f.micro_batch, f.chunk, what);
    };
    if (!s.forward) return missing("forwarded");
    if (!last && !s.send_activation) return missing("sent on (activation)");
    if (forward_only) continue;
    if (!s.backward && !s.backward_input) return missing("backwarded");
    if (s.backward_input && !s.backward_weight) return missing("given its weight gradient");
    if (!first && !s.send_grad) return missing("sent back (gradient)");
  }
  return "";
}

namespace {

// A link (parallel/pipe_links.h): (from stage, to stage, gradient?). Every chunk's messages of one
// kind between two stages share it, and the k-th send on a link matches its k-th receive.
using Channel = std::tuple<int, int, bool>;

Channel channel_of(const PipeOp& op, int stages, int stage) {
  const int next = (stage + 1) % stages, prev = (stage + stages - 1) % stages;
  switch (op.kind) {
    case K::send_activation:
      return {stage, next, false};
    case K::recv_activation:
      return {prev, stage, false};
    case K::send_grad:
      return {stage, prev, true};
    case K::recv_grad:
      return {next, stage, true};
    default:
      LT_CHECK(false, "{} is not communication", to_string(op));
  }
  return {};
}

struct Endpoints {
  std::vector<std::pair<int, int>> sends, recvs;  // (stage, op index), in list order
};

struct Simulation {
  std::vector<std::vector<std::pair<double, PipeOp>>> work;  // per stage: (start, compute op)
  std::vector<double> busy, end;                             // per stage: time computing, last op's end
  std::string deadlock;                                      // "" when every stage finished
};

// The executor's rules, each compute op taking `duration(stage, op)` (unit time when none is given;
// see the top of this file). The lists must pass the per-stage and matching checks.
Simulation simulate(const std::vector<std::vector<PipeOp>>& lists, const OpDuration& duration = {}) {
  const int p = static_cast<int>(lists.size());
  std::map<Channel, Endpoints> channels;
  // For each comm op: its partner (stage, index) once known through the channel order.
  std::vector<std::vector<std::pair<int, int>>> partner(p);
  for (int s = 0; s < p; ++s) {
    partner[s].assign(lists[s].size(), {-1, -1});
    for (size_t i = 0; i < lists[s].size(); ++i) {
      const PipeOp& op = lists[s][i];
      if (is_compute(op.kind)) continue;
      Endpoints& e = channels[channel_of(op, p, s)];
      (op.kind == K::send_activation || op.kind == K::send_grad ? e.sends : e.recvs).push_back({s, int(i)});
    }
  }
  for (auto& [ch, e] : channels)
    for (size_t k = 0; k < std::min(e.sends.size(), e.recvs.size()); ++k) {
      partner[e.sends[k].first][e.sends[k].second] = e.recvs[k];
      partner[e.recvs[k].first][e.recvs[k].second] = e.sends[k];
    }

  // What each compute op waits for: indices of this stage's comm ops whose transfer must be done.
  std::vector<std::vector<std::vector<int>>> deps(p);
  for (int s = 0; s < p; ++s) {
    const auto& ops = lists[s];
    deps[s].resize(ops.size());
    // The comm ops seen so far by (kind, micro-batch, chunk); the lists passed the per-stage check,
    // so each is there once, receives before their consumer and sends before the backward that
    // releases them.
    std::map<std::tuple<PipeOpKind, int, int>, int> seen;
    auto find = [&](PipeOpKind kind, const PipeOp& op) {
      auto it = seen.find({kind, op.micro_batch, op.chunk});
      return it == seen.end() ? -1 : it->second;
    };
    std::vector<int> grad_sends;  // since the previous backward, which waited for the earlier ones
    for (size_t i = 0; i < ops.size(); ++i) {
      const PipeOp& op = ops[i];
      if (!is_compute(op.kind)) seen[{op.kind, op.micro_batch, op.chunk}] = int(i);
      if (op.kind == K::send_grad) grad_sends.push_back(int(i));
      if (op.kind == K::forward) {
        if (int r = find(K::recv_activation, op); r >= 0) deps[s][i].push_back(r);
      } else if (op.kind == K::backward || op.kind == K::backward_input) {
        if (int r = find(K::recv_grad, op); r >= 0) deps[s][i].push_back(r);
        if (int a = find(K::send_activation, op); a >= 0) deps[s][i].push_back(a);
        deps[s][i].insert(deps[s][i].end(), grad_sends.begin(), grad_sends.end());
        grad_sends.clear();
      }
    }
  }

  std::vector<std::vector<double>> posted(p);  // post time of each comm op, -1 before
  for (int s = 0; s < p; ++s) posted[s].assign(lists[s].size(), -1);
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0);
  Simulation sim;
  sim.work.resize(p);
  sim.busy.assign(p, 0.0);
  sim.end.assign(p, 0.0);
  auto transfer_done = [&](int s, int i) {  // when the message of comm op i moved, or -1
    auto [ps, pi] = partner[s][i];
    if (ps < 0 || posted[s][i] < 0 || posted[ps][pi] < 0) return -1.0;
    return std::max(posted[s][i], posted[ps][pi]);
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < p; ++s) {
      const auto& ops = lists[s];
      while (pc[s] < ops.size()) {
        const size_t i = pc[s];
        if (!is_compute(ops[i].kind)) {
          posted[s][i] = clock[s];
        } else {
          double start = clock[s];
          bool ready = true;
          for (int d : deps[s][i]) {
            const double t = transfer_done(s, d);
            if (t < 0) ready = false;
            start = std::max(start, t);
          }
          if (!ready) break;
          const double took = duration ? duration(s, ops[i]) : 1.0;
          sim.work[s].push_back({start, ops[i]});
          clock[s] = sim.end[s] = start + took;
          sim.busy[s] += took;
        }
        ++pc[s];
        moved = true;
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    if (pc[s] == lists[s].size()) continue;
    const size_t i = pc[s];
    std::string waits;
    for (int d : deps[s][i])
      if (transfer_done(s, d) < 0) waits += (waits.empty() ? "" : ", ") + to_string(lists[s][d]);
    sim.deadlock += fmt::format("{}stage {} waits before {} for {}", sim.deadlock.empty() ? "deadlock: " : "; ", s,
                                to_string(lists[s][i]), waits);
  }
  return sim;
}

}  // namespace

std::string check_schedule(const std::vector<std::vector<PipeOp>>& lists, int micro_batches, int chunks) {
  const int p = static_cast<int>(lists.size());
  if (p < 1) return "no stages";
  for (int s = 0; s < p; ++s)
    if (std::string e = check_stage_schedule(lists[s], {p, s, micro_batches, chunks}); !e.empty()) return e;

  std::map<Channel, std::pair<std::vector<PipeOp>, std::vector<PipeOp>>> seq;  // sends, receives
  for (int s = 0; s < p; ++s)
    for (const PipeOp& op : lists[s]) {
      if (is_compute(op.kind)) continue;
      auto& [sends, recvs] = seq[channel_of(op, p, s)];
      (op.kind == K::send_activation || op.kind == K::send_grad ? sends : recvs).push_back(op);
    }
  // Each message is (micro-batch, boundary): the same micro-batch crosses a link once per chunk.
  for (const auto& [ch, sr] : seq) {
    const auto& [from, to, grad] = ch;
    std::vector<std::pair<int, int>> sent, received;
    for (const PipeOp& op : sr.first) sent.push_back({op.micro_batch, pipe_boundary(op, p, from)});
    for (const PipeOp& op : sr.second) received.push_back({op.micro_batch, pipe_boundary(op, p, to)});
    if (sent == received) continue;
    // Micro-batches, with the boundary where the link carries more than one (several chunks).
    std::set<int> boundaries;
    for (const auto& ms : {sent, received})
      for (auto [mb, b] : ms) boundaries.insert(b);
    const bool one_boundary = boundaries.size() <= 1;
    auto names = [&](const std::vector<std::pair<int, int>>& ms) {
      std::vector<std::string> out;
      for (auto [mb, b] : ms) out.push_back(one_boundary ? std::to_string(mb) : fmt::format("{}@{}", mb, b));
      return fmt::format("{}", fmt::join(out, " "));
    };
    return fmt::format(
        "stage {} sends {} of micro-batches [{}] to stage {}, which receives them as [{}]{}", from,
        grad ? "gradients" : "activations", names(sent), to, names(received),
        one_boundary ? "" : " (micro-batch@boundary: every chunk's messages share the link between two stages)");
  }
  return simulate(lists).deadlock;
}

int64_t Timeline::idle_slots() const {
  int64_t idle = 0;
  for (const auto& row : rows)
    for (const auto& cell : row) idle += !cell.has_value();
  return idle;
}

double Timeline::bubble_fraction() const {
  const int64_t all = int64_t(stages()) * slots();
  return all == 0 ? 0.0 : double(idle_slots()) / double(all);
}

Timeline schedule_timeline(const std::vector<std::vector<PipeOp>>& lists, int micro_batches, int chunks) {
  const std::string problem = check_schedule(lists, micro_batches, chunks);
  LT_CHECK(problem.empty(), "timeline of an invalid schedule: {}", problem);
  Simulation sim = simulate(lists);  // unit time: every start is a whole number of slots
  int begin = -1, end = 0;
  for (const auto& w : sim.work)
    for (const auto& [start, op] : w) {
      const int t = int(std::lround(start));
      begin = begin < 0 ? t : std::min(begin, t);
      end = std::max(end, t + 1);
    }
  Timeline tl;
  tl.rows.assign(lists.size(), std::vector<std::optional<PipeOp>>(begin < 0 ? 0 : end - begin));
  for (size_t s = 0; s < sim.work.size(); ++s)
    for (const auto& [start, op] : sim.work[s]) tl.rows[s][int(std::lround(start)) - begin] = op;
  return tl;
}

double SimulatedStep::span() const { return end.empty() ? 0.0 : *std::max_element(end.begin(), end.end()); }

SimulatedStep simulate_step(const std::vector<std::vector<PipeOp>>& lists, const OpDuration& duration) {
  Simulation sim = simulate(lists, duration);
  LT_CHECK(sim.deadlock.empty(), "simulating an invalid schedule: {}", sim.deadlock);
  return {std::move(sim.busy), std::move(sim.end)};
}

std::string format_timeline(const Timeline& tl) {
  size_t width = 1;
  for (const auto& row : tl.rows)
    for (const auto& cell : row)
      if (cell) width = std::max(width, to_string(*cell).size());
  const size_t label = fmt::format("stage {}", tl.stages() - 1).size();
  std::string out;
  for (int s = 0; s < tl.stages(); ++s) {
    std::string line = fmt::format("{:<{}} |", fmt::format("stage {}", s), label);
    for (const auto& cell : tl.rows[s]) line += fmt::format(" {:<{}}", cell ? to_string(*cell) : ".", width);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  }
  out += fmt::format("bubble {:.1f}% ({} of {} stage-slots idle)\n", 100.0 * tl.bubble_fraction(), tl.idle_slots(),
                     int64_t(tl.stages()) * tl.slots());
  return out;
}

}  // namespace llmtrain::parallel
