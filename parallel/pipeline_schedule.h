// Pipeline schedules as data (docs/architecture.md §3 "Pipeline parallelism"; Megatron's
// get_forward_backward_func, torch.distributed.pipelining's schedules): a schedule is a pure
// function of (stages, this stage, micro-batches, virtual chunks) that returns the list of
// instructions one stage executes in one optimizer step — forward, backward, and the sends and
// receives of activations and their gradients. One executor (parallel/pipeline_executor.h) runs any
// list; a new schedule is a new generator here and nothing else.
//
// Rules a reader could get wrong:
//  - A receive precedes the forward/backward that consumes it and a send directly follows the
//    forward/backward that produces it. The executor posts receives when it reaches them and waits
//    for them just before use, so the generators place each receive one piece of work early (its
//    transfer can run during that work); placing it earlier would only hold more buffers.
//  - Sends and receives between two stages match in list order, with no tags: activations from
//    stage s to s + 1 travel on one link and gradients from s to s - 1 on another
//    (parallel/pipe_links.h), every chunk's on the same one, so the k-th activation send of stage s
//    is the k-th activation receive of stage s + 1 (likewise for gradients). check_schedule()
//    checks that they are the same micro-batch across the same boundary.
//  - Micro-batches are backwarded in ascending order on every stage by every generator, so the
//    parameter gradients are summed in the same order as in the one-stage loop.
//  - With one stage (and one chunk) every schedule kind is the one-stage list F0 B0 F1 B1 ...,
//    exactly the order the training loop ran before pipelines existed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/recipe/recipe.h"

namespace llmtrain::parallel {

enum class PipeOpKind : uint8_t {
  forward,          // "F3": run the forward of micro-batch 3 on this stage's layers
  backward,         // "B3": its full backward (input and weight gradients)
  send_activation,  // "sendA3": the forward's output to the next stage
  recv_activation,  // "recvA3": the forward's input from the previous stage
  send_grad,        // "sendG3": the backward's input gradient to the previous stage
  recv_grad,        // "recvG3": the backward's output gradient from the next stage
  // Zero-bubble schedules (ZB-H1): backward split into the input gradient (sent on at once) and
  // the weight gradient (deferred into bubbles). A micro-batch has either B or I then W.
  backward_input,   // "I3": the gradient of the stage's input (and what W needs of it)
  backward_weight,  // "W3": the weight gradients of the micro-batch
};

struct PipeOp {
  PipeOpKind kind = PipeOpKind::forward;
  int micro_batch = 0;
  int chunk = 0;  // virtual chunk of this stage (interleaved schedules); 0 otherwise

  bool operator==(const PipeOp&) const = default;
};

// "F3", "B3", "sendA3", "recvG3", "I3", "W3"; a chunk other than 0 is appended: "F3c1".
std::string to_string(const PipeOp& op);
// The ops separated by single spaces: "recvA0 F0 sendA0 ..." (schedules are printable: the tests
// compare whole lists by it; messages name single ops with to_string).
std::string format_ops(const std::vector<PipeOp>& ops);

bool is_compute(PipeOpKind kind);  // forward, backward, backward_input, backward_weight

// Which boundary between virtual stages a send or receive crosses. Virtual stage v = chunk ·
// stages + stage runs layers block v; boundary k lies between virtual stages k and k + 1, so an
// activation sent by virtual stage v and the gradient it receives cross boundary v, and the
// activation it receives and the gradient it sends cross boundary v - 1. With several chunks, two
// stages exchange data across several boundaries over one link; the checker matches each send with
// its receive by (micro-batch, boundary).
int pipe_boundary(const PipeOp& op, int stages, int stage);

struct ScheduleSpec {
  int stages = 1;         // pipeline stages (parallel.pp)
  int stage = 0;          // this stage: its rank in the pp group
  int micro_batches = 1;  // per optimizer step on this data-parallel rank
  int chunks = 1;         // virtual chunks per stage (parallel.virtual_stages)
};

// Generators. Bad inputs (stages < 1, stage outside [0, stages), micro_batches < 1, chunks != 1
// for all but the interleaved one) are bugs of the caller: the recipe check refuses every layout that could produce
// them.
std::vector<PipeOp> one_stage_schedule(int micro_batches);           // F0 B0 F1 B1 ...
std::vector<PipeOp> gpipe_schedule(const ScheduleSpec& spec);        // all forwards, then all backwards
std::vector<PipeOp> one_f_one_b_schedule(const ScheduleSpec& spec);  // Megatron's non-interleaved 1F1B
// Megatron's interleaved 1F1B over spec.chunks virtual chunks per stage (virtual stage c · stages +
// s on stage s); micro_batches must be divisible by stages (as Megatron requires).
std::vector<PipeOp> interleaved_schedule(const ScheduleSpec& spec);
// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B's order of forwards and input
// gradients (I; at most stages - stage micro-batches between F and I, as 1F1B between F and B),
// and the weight gradients (W) deferred into the slots where the stage would wait, by up to
// stages - 1 - stage micro-batches; W in ascending micro-batch order. With F, I and W of equal
// time the bubble is (p - 1)/(3m + p - 1) of the stage-time, a third of 1F1B's 3(p - 1) idle units.
std::vector<PipeOp> zero_bubble_schedule(const ScheduleSpec& spec);

// A list's forwards and the transfers of their activations, in the list's order: what evaluation
// runs (forward only, through the same executor). Every stage's forward-only list of one schedule
// kind keeps the order its training list gives the forwards, so they match as the training lists do.
std::vector<PipeOp> forward_only_schedule(const std::vector<PipeOp>& ops);
// Whether a list has no backward work (a forward-only list).
bool is_forward_only(const std::vector<PipeOp>& ops);

// The recipe's schedule for one stage. With one stage and one chunk every kind gives the one-stage
// list; `interleaved` throws llmtrain::Error when micro_batches is not a multiple of stages, and
// `zero_bubble` with chunks > 1 throws one ("not supported yet").
std::vector<PipeOp> make_schedule(PipelineSchedule kind, const ScheduleSpec& spec);
// Every stage's list (spec.stage is ignored): what the checker and the timeline take.
std::vector<std::vector<PipeOp>> make_schedules(PipelineSchedule kind, const ScheduleSpec& spec);

// The most (micro-batch, chunk) pairs forwarded and not yet backwarded (B, or W after I) at any
// point of the list:
// how many micro-batches' activations the stage keeps at once (1F1B: min(stages - stage,
// micro_batches); GPipe: micro_batches).
int max_in_flight(const std::vector<PipeOp>& ops);
// The same counted per chunk, the most of any chunk: how many activation slots each chunk of the
// stage needs (equal to max_in_flight with one chunk).
int max_in_flight_per_chunk(const std::vector<PipeOp>& ops);

// Checkers: "" when valid, otherwise the first problem found, naming the stage and the op.
// One stage's list: every (micro-batch, chunk) forwarded exactly once and backwarded exactly once
// after it (a forward-only list: never backwarded); exactly one receive before each forward/backward that needs data
// from another stage and one send after each that produces data for one; no communication where there is no peer;
// micro-batches and chunks in range; a split backward's W after its I.
std::string check_stage_schedule(const std::vector<PipeOp>& ops, const ScheduleSpec& spec);
// Every stage's list (lists[s] for stage s): each as above, sends of stage s matching the receives
// of its peer in the same order, and no deadlock when run as the executor runs them (receives and
// sends posted non-blocking, each receive waited just before its data is used, each send waited
// before the stage may overwrite its buffer — the timeline's model below, with a send completing
// only once its receive is posted).
std::string check_schedule(const std::vector<std::vector<PipeOp>>& lists, int micro_batches, int chunks = 1);

// Where the work of every stage falls in time when forward and backward (or each of I and W)
// take one unit and communication takes none: rows[s][t] is the op stage s computes in slot t, or nothing (idle).
// Slot 0 is the first slot in which any stage works; the last slot is the last in which any does.
struct Timeline {
  std::vector<std::vector<std::optional<PipeOp>>> rows;

  int stages() const { return static_cast<int>(rows.size()); }
  int slots() const { return rows.empty() ? 0 : static_cast<int>(rows[0].size()); }
  int64_t idle_slots() const;
  // The step's bubble: idle stage-slots / (stages × slots), i.e. the fraction of the step's
  // stage-time spent idle. For GPipe and 1F1B this is (stages - 1) / (micro_batches + stages - 1).
  double bubble_fraction() const;
};

// The lists must be valid (check_schedule() == "", checked).
Timeline schedule_timeline(const std::vector<std::vector<PipeOp>>& lists, int micro_batches, int chunks = 1);
// How long a compute op takes on a stage (any unit; e.g. the mean measured seconds of its kind and chunk).
using OpDuration = std::function<double(int stage, const PipeOp& op)>;
// One step of the lists when each compute op takes `duration(stage, op)` and communication takes
// none (the timeline's model): per stage, the time it computed and when its last op ended (the
// stages start at 0). The step ends when the last stage's last op does; each stage idles for the
// part of that span it does not compute, and their mean as a fraction of the span is the bubble:
// with unit durations Timeline::bubble_fraction(); unequal stages, or unequal forward,
// input-gradient and weight-gradient times, give what the closed-form bubbles (which assume equal
// ones) do not. The lists must be valid (not checked here: check_schedule once).
struct SimulatedStep {
  std::vector<double> busy, end;
  double span() const;  // the last stage's end
};
SimulatedStep simulate_step(const std::vector<std::vector<PipeOp>>& lists, const OpDuration& duration);
// One row per stage, one column per slot, idle slots as ".", then the bubble:
//   stage 0 | F0 F1 .  B0 F2 B1 .  B2
//   stage 1 | .  F0 B0 F1 B1 F2 B2 .
//   bubble 25.0% (4 of 16 stage-slots idle)
std::string format_timeline(const Timeline& timeline);

}  // namespace llmtrain::parallel
