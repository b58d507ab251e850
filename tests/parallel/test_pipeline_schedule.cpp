// Pipeline schedules as data: the one-stage list is the training loop's order; GPipe and 1F1B lists
// for small cases, written out by hand here; the checker over every small layout (and on broken
// lists, deadlock included); the in-flight bound; the printed timeline and its bubble; bad inputs.
// Also the executor on one stage: it calls the stage in list order; and every schedule on 2–4 stages
// as threads, over its links.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "common/error.h"
#include "parallel/comm/comm_threads.h"
#include "parallel/pipe_links.h"
#include "parallel/pipeline_executor.h"
#include "parallel/pipeline_schedule.h"

namespace llmtrain::parallel {
namespace {

using K = PipeOpKind;

constexpr PipelineSchedule kKinds[] = {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b};

std::vector<std::vector<PipeOp>> lists_of(PipelineSchedule kind, int stages, int micro_batches) {
  return make_schedules(kind, {.stages = stages, .micro_batches = micro_batches});
}

// The inverse of format_ops, for lists written by hand.
std::vector<PipeOp> parse_ops(const std::string& text) {
  std::vector<PipeOp> ops;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(at, end - at);
    at = end + 1;
    static const std::pair<const char*, PipeOpKind> kPrefixes[] = {{"sendA", K::send_activation},
                                                                   {"recvA", K::recv_activation},
                                                                   {"sendG", K::send_grad},
                                                                   {"recvG", K::recv_grad},
                                                                   {"F", K::forward},
                                                                   {"B", K::backward},
                                                                   {"I", K::backward_input},
                                                                   {"W", K::backward_weight}};
    for (const auto& [prefix, kind] : kPrefixes)
      if (word.rfind(prefix, 0) == 0) {
        PipeOp op{kind, 0, 0};
        std::string rest = word.substr(std::string(prefix).size());
        size_t c = rest.find('c');
        op.micro_batch = std::stoi(rest.substr(0, c));
        if (c != std::string::npos) op.chunk = std::stoi(rest.substr(c + 1));
        ops.push_back(op);
        break;
      }
  }
  return ops;
}

TEST(PipelineSchedule, OpsPrintAsLetters) {
  EXPECT_EQ(to_string({K::forward, 3}), "F3");
  EXPECT_EQ(to_string({K::backward, 3}), "B3");
  EXPECT_EQ(to_string({K::send_activation, 3}), "sendA3");
  EXPECT_EQ(to_string({K::recv_activation, 0}), "recvA0");
  EXPECT_EQ(to_string({K::send_grad, 12}), "sendG12");
  EXPECT_EQ(to_string({K::recv_grad, 1}), "recvG1");
  EXPECT_EQ(to_string({K::backward_input, 2}), "I2");
  EXPECT_EQ(to_string({K::backward_weight, 2}), "W2");
  EXPECT_EQ(to_string({K::forward, 3, 1}), "F3c1");
  EXPECT_EQ(parse_ops("recvA0 F3c1 W2"),
            (std::vector<PipeOp>{{K::recv_activation, 0}, {K::forward, 3, 1}, {K::backward_weight, 2}}));
}

// Exactly the order the training loop ran per micro-batch before pipelines: forward and backward of
// micro-batch 0, then of 1, ...
TEST(PipelineSchedule, OneStageIsTheTrainingLoopOrder) {
  EXPECT_EQ(format_ops(one_stage_schedule(1)), "F0 B0");
  EXPECT_EQ(format_ops(one_stage_schedule(4)), "F0 B0 F1 B1 F2 B2 F3 B3");
  for (PipelineSchedule kind : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b, PipelineSchedule::interleaved})
    for (int m = 1; m <= 8; ++m)
      EXPECT_EQ(make_schedule(kind, {.stages = 1, .stage = 0, .micro_batches = m}), one_stage_schedule(m))
          << to_string(kind) << " m " << m;
}

TEST(PipelineSchedule, GPipeListsByHand) {
  auto l = lists_of(PipelineSchedule::gpipe, 2, 3);
  EXPECT_EQ(format_ops(l[0]), "F0 sendA0 F1 sendA1 recvG0 F2 sendA2 recvG1 B0 recvG2 B1 B2");
  EXPECT_EQ(format_ops(l[1]), "recvA0 recvA1 F0 recvA2 F1 F2 B0 sendG0 B1 sendG1 B2 sendG2");

  // A middle stage of four, eight micro-batches.
  EXPECT_EQ(format_ops(gpipe_schedule({.stages = 4, .stage = 2, .micro_batches = 8})),
            "recvA0 recvA1 F0 sendA0 recvA2 F1 sendA1 recvA3 F2 sendA2 recvA4 F3 sendA3 recvA5 F4 sendA4 recvA6 F5 "
            "sendA5 recvA7 F6 sendA6 recvG0 F7 sendA7 recvG1 B0 sendG0 recvG2 B1 sendG1 recvG3 B2 sendG2 recvG4 B3 "
            "sendG3 recvG5 B4 sendG4 recvG6 B5 sendG5 recvG7 B6 sendG6 B7 sendG7");
}

TEST(PipelineSchedule, OneFOneBListsByHand) {
  auto l = lists_of(PipelineSchedule::one_f_one_b, 2, 3);
  // Stage 0: one warm-up forward, then forward/backward pairs, then the last backward.
  EXPECT_EQ(format_ops(l[0]), "F0 sendA0 recvG0 F1 sendA1 B0 recvG1 F2 sendA2 recvG2 B1 B2");
  // The last stage has no warm-up: F0 B0 F1 B1 ...
  EXPECT_EQ(format_ops(l[1]), "recvA0 F0 recvA1 B0 sendG0 F1 recvA2 B1 sendG1 F2 B2 sendG2");

  // Stage 1 of four, eight micro-batches: two warm-up forwards, six steady pairs, two cool-down
  // backwards.
  EXPECT_EQ(format_ops(one_f_one_b_schedule({.stages = 4, .stage = 1, .micro_batches = 8})),
            "recvA0 recvA1 F0 sendA0 recvA2 F1 sendA1 recvG0 F2 sendA2 recvA3 B0 sendG0 recvG1 F3 sendA3 recvA4 B1 "
            "sendG1 recvG2 F4 sendA4 recvA5 B2 sendG2 recvG3 F5 sendA5 recvA6 B3 sendG3 recvG4 F6 sendA6 recvA7 B4 "
            "sendG4 recvG5 F7 sendA7 recvG6 B5 sendG5 recvG7 B6 sendG6 B7 sendG7");
  // Fewer micro-batches than the warm-up wants: warm-up is cut to the micro-batches there are.
  EXPECT_EQ(format_ops(one_f_one_b_schedule({.stages = 4, .stage = 0, .micro_batches = 2})),
            "F0 sendA0 recvG0 F1 sendA1 recvG1 B0 B1");
}

TEST(PipelineSchedule, EveryLayoutPassesTheChecker) {
  for (PipelineSchedule kind : kKinds)
    for (int p = 1; p <= 4; ++p)
      for (int m = 1; m <= 8; ++m) {
        SCOPED_TRACE(fmt::format("{} p {} m {}", to_string(kind), p, m));
        auto lists = lists_of(kind, p, m);
        EXPECT_EQ(check_schedule(lists, m), "");
        for (int s = 0; s < p; ++s) {
          // Backwards in ascending micro-batch order on every stage: gradients sum as in one stage.
          int next_backward = 0;
          for (const PipeOp& op : lists[s]) {
            if (op.kind == K::backward) {
              EXPECT_EQ(op.micro_batch, next_backward++);
            }
          }
        }
      }
  // GPipe's own generator also at one stage (make_schedule gives the one-stage list there).
  for (int m = 1; m <= 8; ++m) {
    EXPECT_EQ(check_schedule({gpipe_schedule({.micro_batches = m})}, m), "");
  }
}

// Evaluation's lists: a schedule's forwards and activation transfers in its order, which the
// checker accepts as forward-only (and refuses with a forward missing); the executor gives each
// receive buffer back after its forward.
TEST(PipelineSchedule, ForwardOnlyLists) {
  auto l = lists_of(PipelineSchedule::gpipe, 2, 3);
  EXPECT_EQ(format_ops(forward_only_schedule(l[0])), "F0 sendA0 F1 sendA1 F2 sendA2");
  EXPECT_EQ(format_ops(forward_only_schedule(l[1])), "recvA0 recvA1 F0 recvA2 F1 F2");
  EXPECT_TRUE(is_forward_only(forward_only_schedule(l[1])));
  EXPECT_FALSE(is_forward_only(l[1]));
  EXPECT_EQ(PipelineExecutor::receive_slots(forward_only_schedule(l[1])).activation_buffers, 2);
  for (PipelineSchedule kind : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b, PipelineSchedule::interleaved,
                                PipelineSchedule::zero_bubble})
    for (int p : {2, 4}) {
      const int v = kind == PipelineSchedule::interleaved ? 2 : 1;
      for (int s = 0; s < p; ++s) {
        const ScheduleSpec spec{.stages = p, .stage = s, .micro_batches = 4, .chunks = v};
        EXPECT_EQ(check_stage_schedule(forward_only_schedule(make_schedule(kind, spec)), spec), "")
            << to_string(kind) << " pp " << p << " stage " << s;
      }
    }
  EXPECT_EQ(check_stage_schedule(parse_ops("F0 sendA0"), {.stages = 2, .stage = 0, .micro_batches = 2}),
            "stage 0: micro-batch 1 chunk 0 is never forwarded");
}

TEST(PipelineSchedule, InFlightBound) {
  for (int p = 1; p <= 4; ++p)
    for (int m = 1; m <= 8; ++m)
      for (int s = 0; s < p; ++s) {
        const ScheduleSpec spec{.stages = p, .stage = s, .micro_batches = m};
        EXPECT_EQ(max_in_flight(one_f_one_b_schedule(spec)), std::min(p - s, m))
            << "p " << p << " m " << m << " s " << s;
        EXPECT_EQ(max_in_flight(gpipe_schedule(spec)), m) << "p " << p << " m " << m << " s " << s;
      }
  EXPECT_EQ(max_in_flight(one_stage_schedule(8)), 1);
}

TEST(PipelineSchedule, TimelineOfOneFOneB) {
  const Timeline tl = schedule_timeline(lists_of(PipelineSchedule::one_f_one_b, 3, 4), 4);
  EXPECT_EQ(format_timeline(tl),
            "stage 0 | F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3\n"
            "stage 1 | .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .\n"
            "stage 2 | .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .\n"
            "bubble 33.3% (12 of 36 stage-slots idle)\n");
  const Timeline small = schedule_timeline(lists_of(PipelineSchedule::gpipe, 2, 3), 3);
  EXPECT_EQ(format_timeline(small),
            "stage 0 | F0 F1 F2 .  .  B0 B1 B2\n"
            "stage 1 | .  F0 F1 F2 B0 B1 B2 .\n"
            "bubble 25.0% (4 of 16 stage-slots idle)\n");
  const Timeline one = schedule_timeline({one_stage_schedule(2)}, 2);
  EXPECT_EQ(format_timeline(one), "stage 0 | F0 B0 F1 B1\nbubble 0.0% (0 of 4 stage-slots idle)\n");
}

// The bubble printed is idle stage-slots over all stage-slots of the step (stages × the step's
// length), which for F = B = 1 is (p - 1) / (m + p - 1) for both schedules; the step is
// 2 (m + p - 1) slots long.
TEST(PipelineSchedule, BubbleFraction) {
  for (PipelineSchedule kind : kKinds)
    for (int p = 1; p <= 4; ++p)
      for (int m = 1; m <= 8; ++m) {
        SCOPED_TRACE(fmt::format("{} p {} m {}", to_string(kind), p, m));
        const Timeline tl = schedule_timeline(lists_of(kind, p, m), m);
        EXPECT_EQ(tl.slots(), 2 * (m + p - 1));
        EXPECT_DOUBLE_EQ(tl.bubble_fraction(), double(p - 1) / double(m + p - 1));
        for (int s = 0; s < p; ++s)
          EXPECT_EQ(std::count_if(tl.rows[s].begin(), tl.rows[s].end(), [](const auto& c) { return c.has_value(); }),
                    2 * m);
      }
}

// The bubble of one simulated step (pipeline_schedule.h, simulate_step): the stages' mean idle time
// as a fraction of the span.
double simulated_bubble(const std::vector<std::vector<PipeOp>>& lists, int micro_batches, int chunks,
                        const OpDuration& duration) {
  EXPECT_EQ(check_schedule(lists, micro_batches, chunks), "");
  const SimulatedStep step = simulate_step(lists, duration);
  const double span = step.span();
  if (span <= 0) return 0.0;
  double idle = 0;
  for (double busy : step.busy) idle += span - busy;
  return idle / (span * double(lists.size()));
}

// The bubble simulated at given op times: with every op taking one unit it is the timeline's, for
// every kind; scaling every time leaves it; and an unequal pipeline works out as by hand.
TEST(PipelineSchedule, SimulatedBubbleAtOpTimes) {
  const OpDuration unit = [](int, const PipeOp&) { return 1.0; };
  const OpDuration slow = [](int, const PipeOp&) { return 0.37; };
  for (PipelineSchedule kind : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b, PipelineSchedule::interleaved,
                                PipelineSchedule::zero_bubble})
    for (int p = 2; p <= 4; ++p)
      for (int m = p; m <= 8; m += p) {
        const int v = kind == PipelineSchedule::interleaved ? 2 : 1;
        SCOPED_TRACE(fmt::format("{} p {} m {}", to_string(kind), p, m));
        const auto lists = make_schedules(kind, {.stages = p, .micro_batches = m, .chunks = v});
        const double want = schedule_timeline(lists, m, v).bubble_fraction();
        EXPECT_DOUBLE_EQ(simulated_bubble(lists, m, v, unit), want);
        EXPECT_NEAR(simulated_bubble(lists, m, v, slow), want, 1e-12);
      }
  // 1F1B, p 2, m 2, stage 1 twice as slow. Stage 0: F0 [0, 1], F1 [1, 2], B0 [5, 6] (after stage 1's
  // B0), B1 [9, 10]. Stage 1: F0 [1, 3], B0 [3, 5], F1 [5, 7], B1 [7, 9]. The span is 10; stage 0
  // idles 6, stage 1 2: (6 + 2) / (2 · 10).
  const auto lists = make_schedules(PipelineSchedule::one_f_one_b, {.stages = 2, .micro_batches = 2});
  EXPECT_DOUBLE_EQ(simulated_bubble(lists, 2, 1, [](int stage, const PipeOp&) { return stage == 1 ? 2.0 : 1.0; }), 0.4);
}

// Megatron's interleaved 1F1B at p 2, v 2, m 4, compute order written out from its rule: forwards
// in groups of p · v virtual micro-batches (chunk 0 of micro-batches 0 and 1, then chunk 1 of the
// same), backwards the same with the chunks reversed; stage s warms up with (p - s - 1) · 2 +
// (v - 1) · p forwards.
TEST(PipelineSchedule, InterleavedListsByHand) {
  auto compute_of = [](const std::vector<PipeOp>& ops) {
    std::vector<PipeOp> out;
    for (const PipeOp& op : ops)
      if (is_compute(op.kind)) out.push_back(op);
    return format_ops(out);
  };
  auto l = make_schedules(PipelineSchedule::interleaved, {.stages = 2, .micro_batches = 4, .chunks = 2});
  EXPECT_EQ(compute_of(l[0]), "F0 F1 F0c1 F1c1 F2 B0c1 F3 B1c1 F2c1 B0 F3c1 B1 B2c1 B3c1 B2 B3");
  EXPECT_EQ(compute_of(l[1]), "F0 F1 F0c1 B0c1 F1c1 B1c1 F2 B0 F3 B1 F2c1 B2c1 F3c1 B3c1 B2 B3");
  // Communication as for the other schedules: stage 0's chunk 1 receives from stage 1's chunk 0
  // and the last virtual stage (stage 1, chunk 1) sends nothing on.
  EXPECT_EQ(format_ops(l[1]),
            "recvA0 recvA1 F0 sendA0 recvA0c1 F1 sendA1 F0c1 recvA1c1 B0c1 sendG0c1 F1c1 recvA2 B1c1 sendG1c1 recvG0 "
            "F2 sendA2 recvA3 B0 sendG0 recvG1 F3 sendA3 recvA2c1 B1 sendG1 F2c1 recvA3c1 B2c1 sendG2c1 F3c1 recvG2 "
            "B3c1 sendG3c1 recvG3 B2 sendG2 B3 sendG3");
  // m == p: every forward is warm-up (as Megatron).
  auto all = make_schedules(PipelineSchedule::interleaved, {.stages = 2, .micro_batches = 2, .chunks = 2});
  EXPECT_EQ(compute_of(all[1]), "F0 F1 F0c1 F1c1 B0c1 B1c1 B0 B1");
}

// Every stage's list of every small interleaved layout: valid and deadlock-free, each chunk's
// backwards in ascending micro-batch order, the in-flight bounds, and the unit-time bubble
// (p - 1) / (v · m + p - 1), i.e. (p - 1) / (v · m) of the ideal time.
TEST(PipelineSchedule, InterleavedEveryLayout) {
  for (int p = 2; p <= 4; ++p)
    for (int v = 2; v <= 3; ++v)
      for (int m = p; m <= 3 * p; m += p) {
        SCOPED_TRACE(fmt::format("p {} v {} m {}", p, v, m));
        const ScheduleSpec spec{.stages = p, .micro_batches = m, .chunks = v};
        auto lists = make_schedules(PipelineSchedule::interleaved, spec);
        ASSERT_EQ(check_schedule(lists, m, v), "");
        for (int s = 0; s < p; ++s) {
          std::vector<int> next_backward(size_t(v), 0);
          for (const PipeOp& op : lists[s])
            if (op.kind == K::backward) {
              EXPECT_EQ(op.micro_batch, next_backward[size_t(op.chunk)]++);
            }
          // Chunk 0 of the first p micro-batches and all but the last chunk of ... : at most
          // (warm-up + 1) pairs alive, and per chunk never more than m.
          const int warmup = m == p ? m * v : std::min((p - s - 1) * 2 + (v - 1) * p, m * v);
          EXPECT_EQ(max_in_flight(lists[s]), std::min(warmup + 1, m * v)) << "stage " << s;
          EXPECT_LE(max_in_flight_per_chunk(lists[s]), m);
        }
        const Timeline tl = schedule_timeline(lists, m, v);
        EXPECT_DOUBLE_EQ(tl.bubble_fraction(), double(p - 1) / double(v * m + p - 1));
      }
}

// ZB-H1 at p 2, m 3 (F, I and W one unit each): both stages defer W0 and W1 past the next
// forward; stage 0 fills the slot where it waits for I2 with W0 and W1.
TEST(PipelineSchedule, ZeroBubbleListsByHand) {
  auto l = make_schedules(PipelineSchedule::zero_bubble, {.stages = 2, .micro_batches = 3});
  EXPECT_EQ(format_ops(l[0]), "F0 sendA0 recvG0 F1 sendA1 I0 recvG1 F2 sendA2 I1 W0 recvG2 W1 I2 W2");
  EXPECT_EQ(format_ops(l[1]), "recvA0 F0 recvA1 I0 sendG0 F1 I1 sendG1 recvA2 W0 F2 I2 sendG2 W1 W2");
  const Timeline tl = schedule_timeline(l, 3);
  EXPECT_EQ(format_timeline(tl),
            "stage 0 | F0 F1 .  I0 F2 I1 W0 W1 I2 W2\n"
            "stage 1 | .  F0 I0 F1 I1 W0 F2 I2 W1 W2\n"
            "bubble 10.0% (2 of 20 stage-slots idle)\n");
}

// Every small ZB-H1 layout: valid and deadlock-free, I and W in ascending micro-batch order, at most
// min(2p - 1 - s, m) micro-batches between F and W, and the bubble of F = I = W = 1:
// (p - 1)/(3m + p - 1), a third of 1F1B's 3(p - 1) idle units for the same work.
TEST(PipelineSchedule, ZeroBubbleEveryLayout) {
  for (int p = 2; p <= 4; ++p)
    for (int m = 1; m <= 8; ++m) {
      SCOPED_TRACE(fmt::format("p {} m {}", p, m));
      const ScheduleSpec spec{.stages = p, .micro_batches = m};
      auto lists = make_schedules(PipelineSchedule::zero_bubble, spec);
      ASSERT_EQ(check_schedule(lists, m), "");
      for (int s = 0; s < p; ++s) {
        int next_i = 0, next_w = 0;
        for (const PipeOp& op : lists[s]) {
          if (op.kind == K::backward_input) {
            EXPECT_EQ(op.micro_batch, next_i++);
          }
          if (op.kind == K::backward_weight) {
            EXPECT_EQ(op.micro_batch, next_w++);
          }
          EXPECT_NE(op.kind, K::backward);
        }
        EXPECT_LE(max_in_flight(lists[s]), std::min(2 * p - 1 - s, m)) << "stage " << s;
      }
      if (m >= p) {
        const Timeline tl = schedule_timeline(lists, m);
        EXPECT_DOUBLE_EQ(tl.bubble_fraction(), double(p - 1) / double(3 * m + p - 1));
      }
    }
}

TEST(PipelineSchedule, CheckerFindsBrokenLists) {
  const ScheduleSpec last{.stages = 2, .stage = 1, .micro_batches = 2};
  EXPECT_EQ(check_stage_schedule(parse_ops("recvA0 F0 B1 recvA1 F1 B0 sendG0 sendG1"), last),
            "stage 1: op 2 (B1): backward before its forward");
  EXPECT_EQ(check_stage_schedule(parse_ops("recvA0 F0 F1 B0 B1 sendG0 sendG1"), last),
            "stage 1: op 2 (F1): forward without a receive of its input before it");
  EXPECT_EQ(check_stage_schedule(parse_ops("recvA0 F0 B0 sendG0 recvA1 F1 B1"), last),
            "stage 1: micro-batch 1 chunk 0 is never sent back (gradient)");
  EXPECT_EQ(check_stage_schedule(parse_ops("recvA0 F0 B0 sendG0 recvA1 F1 B1 sendG1 F1"), last),
            "stage 1: op 8 (F1): forwarded twice");
  EXPECT_EQ(check_stage_schedule(parse_ops("recvA0 F0 B0 sendG0 recvA2 F2 B2 sendG2"), last),
            "stage 1: op 4 (recvA2): micro-batch outside [0, 2)");
  EXPECT_EQ(check_stage_schedule(parse_ops("recvA0 F0 sendA0 B0 sendG0"), {.stages = 2, .stage = 1}),
            "stage 1: op 2 (sendA0): the last stage has no next stage to send to");
  EXPECT_EQ(check_stage_schedule(parse_ops("recvA0 F0 B0"), {.stages = 2, .stage = 0}),
            "stage 0: op 0 (recvA0): the first stage has no previous stage to receive from");
  EXPECT_EQ(check_stage_schedule(parse_ops("F0 I0 W0"), {}), "");
  EXPECT_EQ(check_stage_schedule(parse_ops("F0 W0 I0"), {}),
            "stage 0: op 1 (W0): weight gradient before its input gradient");
  EXPECT_EQ(check_stage_schedule(parse_ops("F0 I0"), {}),
            "stage 0: micro-batch 0 chunk 0 is never given its weight gradient");
  EXPECT_EQ(check_stage_schedule(parse_ops("F0 B0 I0 W0"), {}), "stage 0: op 2 (I0): backwarded twice");
  EXPECT_EQ(check_stage_schedule(parse_ops("F0 B0"), {.micro_batches = 2}),
            "stage 0: micro-batch 1 chunk 0 is never forwarded");

  // Each list valid on its own, but stage 0 sends micro-batch 1 before 0 while stage 1 receives 0
  // first: the data would land in the wrong micro-batch.
  EXPECT_EQ(check_schedule({parse_ops("F0 F1 sendA1 sendA0 recvG0 B0 recvG1 B1"),
                            parse_ops("recvA0 recvA1 F0 F1 B0 sendG0 B1 sendG1")},
                           2),
            "stage 0 sends activations of micro-batches [1 0] to stage 1, which receives them as [0 1]");
  // Two chunks on two stages: stage 0 sends micro-batch 0's activations across boundaries 0 (chunk
  // 0) and 2 (chunk 1) on its one link to stage 1, which takes chunk 1's first. Each boundary alone
  // matches; the link does not (tags would have let them pass each other; a link has none).
  EXPECT_EQ(check_schedule({parse_ops("F0 sendA0 recvA0c1 F0c1 sendA0c1 recvG0c1 B0c1 sendG0c1 recvG0 B0"),
                            parse_ops("recvA0c1 recvA0 F0 sendA0 F0c1 B0c1 sendG0c1 recvG0 B0 sendG0")},
                           1, 2),
            "stage 0 sends activations of micro-batches [0@0 0@2] to stage 1, which receives them as [0@2 0@0] "
            "(micro-batch@boundary: every chunk's messages share the link between two stages)");

  // Valid and matching, but stage 0 waits for the gradient of micro-batch 0 before it sends the
  // activation of 1, which stage 1 needs to get there.
  EXPECT_EQ(check_schedule({parse_ops("F0 sendA0 recvG0 B0 F1 sendA1 recvG1 B1"),
                            parse_ops("recvA0 recvA1 F0 F1 B0 sendG0 B1 sendG1")},
                           2),
            "deadlock: stage 0 waits before B0 for recvG0; stage 1 waits before F1 for recvA1");
  // With both forwards before its first backward, stage 0 runs against the same stage 1.
  EXPECT_EQ(check_schedule({parse_ops("F0 sendA0 F1 sendA1 recvG0 B0 recvG1 B1"),
                            parse_ops("recvA0 recvA1 F0 F1 B0 sendG0 B1 sendG1")},
                           2),
            "");
}

TEST(PipelineSchedule, BadInputsAreRefused) {
  EXPECT_DEATH(make_schedule(PipelineSchedule::one_f_one_b, {.stages = 0}), "pipeline schedule for 0 stages");
  EXPECT_DEATH(make_schedule(PipelineSchedule::gpipe, {.stages = 2, .stage = 2}), "stage 2 of 2");
  EXPECT_DEATH(make_schedule(PipelineSchedule::gpipe, {.stages = 2, .stage = -1}), "stage -1 of 2");
  EXPECT_DEATH(make_schedule(PipelineSchedule::one_f_one_b, {.stages = 2, .micro_batches = 0}), "0 micro-batches");
  EXPECT_DEATH(one_stage_schedule(0), "0 micro-batches");
  EXPECT_DEATH(make_schedule(PipelineSchedule::one_f_one_b, {.stages = 2, .chunks = 2}), "one chunk per stage");
  EXPECT_DEATH(gpipe_schedule({.stages = 2, .chunks = 2}), "one chunk per stage");
  try {
    make_schedule(PipelineSchedule::interleaved, {.stages = 2, .micro_batches = 3, .chunks = 2});
    ADD_FAILURE() << "interleaved accepted 3 micro-batches over 2 stages";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "the interleaved schedule needs micro-batches per step (3) divisible by pp 2");
  }
  try {
    make_schedule(PipelineSchedule::zero_bubble, {.stages = 2, .micro_batches = 4, .chunks = 2});
    ADD_FAILURE() << "zero_bubble accepted two chunks";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "not supported yet: the zero_bubble pipeline schedule (2 stages, 2 virtual chunks each)");
  }
  // With one stage every kind is the one-stage list, zero_bubble included.
  EXPECT_EQ(make_schedule(PipelineSchedule::zero_bubble, {.micro_batches = 2}), one_stage_schedule(2));
  // A timeline of an invalid schedule is a bug of the caller.
  EXPECT_DEATH(schedule_timeline({parse_ops("B0 F0")}, 1), "backward before its forward");
}

// ---- The executor on one stage ----

// Records every call; its activations are fp32 [2, 3] (never sent on one stage).
class RecordingStage final : public PipelineStage {
 public:
  kernels::Shape activation_shape() const override { return {2, 3}; }
  kernels::DType activation_dtype() const override { return kernels::DType::fp32; }
  kernels::Device activation_device() const override { return kernels::Device::cpu; }
  void forward(int mb, int chunk, Tensor input) override {
    calls.push_back({K::forward, mb, chunk});
    undefined_inputs += !input.defined();
  }
  void backward(int mb, int chunk, Tensor grad_output) override {
    calls.push_back({K::backward, mb, chunk});
    undefined_inputs += !grad_output.defined();
  }
  Tensor output(int, int) override {
    ADD_FAILURE() << "output() on the only stage";
    return {};
  }
  Tensor input_grad(int, int) override {
    ADD_FAILURE() << "input_grad() on the only stage";
    return {};
  }

  std::vector<PipeOp> calls;
  int undefined_inputs = 0;
};

TEST(PipelineExecutor, OneStageCallsTheStageInListOrder) {
  PipeLinks pp;  // one stage: no links
  for (PipelineSchedule kind : kKinds)
    for (int m : {1, 3, 8}) {
      const auto ops = make_schedule(kind, {.stages = 1, .micro_batches = m});
      RecordingStage stage;
      PipelineExecutor ex(ops, stage, pp);
      EXPECT_EQ(ex.activation_buffers(), 0);
      EXPECT_EQ(ex.grad_buffers(), 0);
      for (int step = 0; step < 2; ++step) {
        stage.calls.clear();
        ex.run();
        EXPECT_EQ(stage.calls, ops);
      }
      EXPECT_EQ(stage.undefined_inputs, 2 * 2 * m) << "first and last stage: no input, no output gradient";
    }
  // GPipe's own list at one stage runs too: all forwards, then all backwards.
  const auto gpipe = gpipe_schedule({.micro_batches = 3});
  RecordingStage stage;
  PipelineExecutor ex(gpipe, stage, pp);
  ex.run();
  EXPECT_EQ(format_ops(stage.calls), "F0 F1 F2 B0 B1 B2");
}

TEST(PipelineExecutor, RefusesAListForAnotherLayout) {
  PipeLinks pp;
  RecordingStage stage;
  // Stage 0 of two sends activations on; a one-rank pp group has no next stage.
  EXPECT_DEATH(PipelineExecutor(one_f_one_b_schedule({.stages = 2, .micro_batches = 2}), stage, pp),
               "the last stage has no next stage to send to");
}

// ---- The executor on its links, stages as threads ----

// Virtual stage v adds 1 to what it receives (the first starts from 100 · micro-batch) and 1 to the
// gradient going back (the last starts from 1000 · micro-batch), and checks what arrives: a message
// that landed in another micro-batch or chunk shows as a wrong value.
class CountingStage final : public PipelineStage {
 public:
  CountingStage(int stages, int stage, int chunks, int micro_batches)
      : p_(stages), s_(stage), v_(chunks), out_(size_t(micro_batches * chunks), 0.0f) {}
  kernels::Shape activation_shape() const override { return {1}; }
  kernels::DType activation_dtype() const override { return kernels::DType::fp32; }
  kernels::Device activation_device() const override { return kernels::Device::cpu; }
  void forward(int mb, int c, Tensor input) override {
    const int v = c * p_ + s_;
    const float x = v == 0 ? 100.0f * mb : *static_cast<const float*>(input.data);
    EXPECT_EQ(x, 100.0f * mb + v) << "forward of micro-batch " << mb << " chunk " << c << " on stage " << s_;
    out_[size_t(mb * v_ + c)] = x + 1;
    ++forwards;
  }
  void backward(int mb, int c, Tensor grad_output) override {
    const int v = c * p_ + s_, last = p_ * v_ - 1;
    const float g = v == last ? 1000.0f * mb : *static_cast<const float*>(grad_output.data);
    EXPECT_EQ(g, 1000.0f * mb + (last - v)) << "backward of micro-batch " << mb << " chunk " << c << " on stage " << s_;
    input_grad_ = g + 1;
    ++backwards;
  }
  void backward_input(int mb, int c, Tensor grad_output) override { backward(mb, c, grad_output); }
  void backward_weight(int, int) override {}
  Tensor output(int mb, int c) override { return kernels::host_tensor(&out_[size_t(mb * v_ + c)], {1}); }
  Tensor input_grad(int, int) override { return kernels::host_tensor(&input_grad_, {1}); }

  int forwards = 0, backwards = 0;

 private:
  int p_, s_, v_;
  std::vector<float> out_;
  float input_grad_ = 0;
};

// Every schedule on 2–4 stages over the links of thread ranks, whose sends complete only once the
// receive took the data (as a large message under MPI or NCCL) and whose messages match in the
// order made (all on tag 0): the values arrive where they belong, and nothing deadlocks.
TEST(PipelineExecutor, EveryScheduleMovesItsMessagesOverLinks) {
  struct Case {
    PipelineSchedule kind;
    int chunks;
  };
  for (Case c : {Case{PipelineSchedule::gpipe, 1}, Case{PipelineSchedule::one_f_one_b, 1},
                 Case{PipelineSchedule::interleaved, 2}, Case{PipelineSchedule::zero_bubble, 1}})
    for (int p : {2, 3, 4})
      for (int m : {p, 2 * p}) {
        SCOPED_TRACE(fmt::format("{} on {} stages, {} micro-batches", to_string(c.kind), p, m));
        run_ranks_in_threads(
            p,
            [&](Comm& pp) {
              PipeLinks links = make_pipe_links(pp);
              const ScheduleSpec spec{.stages = p, .stage = pp.rank(), .micro_batches = m, .chunks = c.chunks};
              CountingStage stage(p, pp.rank(), c.chunks, m);
              PipelineExecutor ex(make_schedule(c.kind, spec), stage, links);
              for (int step = 0; step < 2; ++step) ex.run();
              EXPECT_EQ(stage.forwards, 2 * m * c.chunks);
              EXPECT_EQ(stage.backwards, 2 * m * c.chunks);
            },
            30.0);
      }
}

}  // namespace
}  // namespace llmtrain::parallel
