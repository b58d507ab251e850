// The op profile's report (log.profile: ops; docs/metrics.md "Per-op timing"): the table a run logs
// at its end and the same figures as JSON (`<log.dir>/op_profile.json`), from the totals the loop's
// profiler collected (trainer/loop/op_profiler.h).
//
// The rule a reader could get wrong: rows overlap. A row inside another (a library call inside its
// op, an op called inside another op) is part of that row's time, and a side-stream row (a
// communication stream's) runs beside the compute stream's work: neither is added to the total, which
// is the top-level compute-stream rows' only. The share of a row is of the profiled steps' own time
// (their device time on cuda, the host clock on the CPU), so the total's share says how much of the
// step the ops cover, and "outside ops" is the rest (host work, waits, an idle stream).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace llmtrain::trainer {

struct OpProfileRow {
  std::string name;
  std::string inside;  // the row this one ran inside; "": none (top level)
  bool side_stream = false;
  int64_t calls = 0;
  double seconds = 0;
};

struct OpProfileSummary {
  std::string device;  // "cpu" or "cuda"
  int rank = 0;
  int64_t first_step = 0;  // the profiled steps: first_step .. first_step + steps - 1 (as the progress line counts)
  int64_t steps = 0;
  double step_seconds = 0;  // the profiled steps' time, summed
  int64_t dropped = 0;      // scopes not timed (the pool was full)
  std::vector<OpProfileRow> rows;
};

// The rows in the table's order: the top-level compute rows by total time (largest first), each
// followed by the rows inside it (the same order, one level deeper), then the top-level side-stream
// rows likewise. `depth` is a row's nesting under the rows before it.
struct OrderedRow {
  const OpProfileRow* row;
  int depth;
};
std::vector<OrderedRow> op_profile_order(const OpProfileSummary& s);

// The top-level compute-stream rows' time: what the total line counts.
double op_profile_in_ops_seconds(const OpProfileSummary& s);

// The table, one string per line: a heading, the column names, the rows, the total and the step.
std::vector<std::string> op_profile_table(const OpProfileSummary& s);

// {"rank", "device", "first_step", "steps", "step_ms", "step_ms_per_step", "in_ops_ms", "outside_ops_ms",
//  "dropped_scopes", "ops": [{"name", "inside" (null at top level), "depth", "side_stream", "calls",
//  "total_ms", "ms_per_step", "share"}, ...]}: the rows in the table's order, share a fraction of step_ms.
nlohmann::json op_profile_json(const OpProfileSummary& s);

}  // namespace llmtrain::trainer
