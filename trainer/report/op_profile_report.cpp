#include "trainer/report/op_profile_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

namespace llmtrain::trainer {

namespace {

bool top_level(const OpProfileRow& r) { return r.inside.empty() && !r.side_stream; }

double share_of(double seconds, double step) { return step > 0 ? seconds / step : 0.0; }

}  // namespace

std::vector<OrderedRow> op_profile_order(const OpProfileSummary& s) {
  std::vector<const OpProfileRow*> by_time;
  for (const OpProfileRow& r : s.rows) by_time.push_back(&r);
  std::stable_sort(by_time.begin(), by_time.end(),
                   [](const OpProfileRow* a, const OpProfileRow* b) { return a->seconds > b->seconds; });
  std::vector<OrderedRow> out;
  std::vector<bool> placed(by_time.size(), false);
  // The rows inside `parent`, each followed by its own (a row inside itself is not followed twice).
  std::function<void(const std::string&, int)> children = [&](const std::string& parent, int depth) {
    for (size_t i = 0; i < by_time.size(); ++i)
      if (!placed[i] && by_time[i]->inside == parent) {
        placed[i] = true;
        out.push_back({by_time[i], depth});
        children(by_time[i]->name, depth + 1);
      }
  };
  for (const bool side : {false, true})
    for (size_t i = 0; i < by_time.size(); ++i)
      if (!placed[i] && by_time[i]->inside.empty() && by_time[i]->side_stream == side) {
        placed[i] = true;
        out.push_back({by_time[i], 0});
        children(by_time[i]->name, 1);
      }
  for (size_t i = 0; i < by_time.size(); ++i)  // inside a row that never ran at the top level
    if (!placed[i]) out.push_back({by_time[i], 1});
  return out;
}

double op_profile_in_ops_seconds(const OpProfileSummary& s) {
  double in_ops = 0;
  for (const OpProfileRow& r : s.rows)
    if (top_level(r)) in_ops += r.seconds;
  return in_ops;
}

std::vector<std::string> op_profile_table(const OpProfileSummary& s) {
  std::vector<std::string> lines;
  lines.push_back(fmt::format("op profile (log.profile: ops), rank {} on {}: {} step(s) from step {}, {:.3f} ms a step",
                              s.rank, s.device, s.steps, s.first_step,
                              s.steps > 0 ? 1e3 * s.step_seconds / double(s.steps) : 0.0));
  if (s.steps == 0) {
    lines.push_back("  no step profiled: the run took no step after its first (warm-up) one");
    return lines;
  }
  if (std::any_of(s.rows.begin(), s.rows.end(), [](const OpProfileRow& r) { return !top_level(r); }))
    lines.push_back(
        "  (an indented row is part of the row above it, a side-stream row runs beside the compute stream: "
        "neither is in the total)");
  const std::vector<OrderedRow> order = op_profile_order(s);
  size_t width = 24;
  for (const OrderedRow& o : order)
    width = std::max(width, 2 * size_t(o.depth) + o.row->name.size() + (o.row->side_stream ? 14 : 0));
  const double steps = double(s.steps);
  auto line = [&](const std::string& name, const std::string& calls, double seconds) {
    return fmt::format("  {:<{}} {:>8} {:>11.3f} {:>10.3f} {:>6.1f}%", name, width, calls, 1e3 * seconds,
                       1e3 * seconds / steps, 100.0 * share_of(seconds, s.step_seconds));
  };
  lines.push_back(
      fmt::format("  {:<{}} {:>8} {:>11} {:>10} {:>7}", "op", width, "calls", "total ms", "ms/step", "share"));
  bool side_heading = false;
  int64_t calls = 0;
  const double in_ops = op_profile_in_ops_seconds(s);
  for (const OrderedRow& o : order) {
    const OpProfileRow& r = *o.row;
    if (r.side_stream && o.depth == 0 && !side_heading) {
      lines.push_back(line("in ops (the total)", std::to_string(calls), in_ops));
      side_heading = true;
    }
    if (top_level(r)) calls += r.calls;
    const std::string name = std::string(2 * size_t(o.depth), ' ') + r.name + (r.side_stream ? " (side stream)" : "");
    lines.push_back(line(name, std::to_string(r.calls), r.seconds));
  }
  if (!side_heading) lines.push_back(line("in ops (the total)", std::to_string(calls), in_ops));
  lines.push_back(line("outside ops", "", std::max(0.0, s.step_seconds - in_ops)));
  lines.push_back(line("the steps", "", s.step_seconds));
  if (s.dropped > 0)
    lines.push_back(
        fmt::format("  {} scope(s) not timed: the steps opened more than the pool the first step sized", s.dropped));
  return lines;
}

nlohmann::json op_profile_json(const OpProfileSummary& s) {
  const double in_ops = op_profile_in_ops_seconds(s);
  const double steps = double(std::max<int64_t>(s.steps, 1));
  nlohmann::json ops = nlohmann::json::array();
  for (const OrderedRow& o : op_profile_order(s)) {
    const OpProfileRow& r = *o.row;
    ops.push_back({{"name", r.name},
                   {"inside", r.inside.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.inside)},
                   {"depth", o.depth},
                   {"side_stream", r.side_stream},
                   {"calls", r.calls},
                   {"total_ms", 1e3 * r.seconds},
                   {"ms_per_step", 1e3 * r.seconds / steps},
                   {"share", share_of(r.seconds, s.step_seconds)}});
  }
  return {{"rank", s.rank},
          {"device", s.device},
          {"first_step", s.first_step},
          {"steps", s.steps},
          {"step_ms", 1e3 * s.step_seconds},
          {"step_ms_per_step", 1e3 * s.step_seconds / steps},
          {"in_ops_ms", 1e3 * in_ops},
          {"outside_ops_ms", 1e3 * std::max(0.0, s.step_seconds - in_ops)},
          {"dropped_scopes", s.dropped},
          {"ops", ops}};
}

}  // namespace llmtrain::trainer
