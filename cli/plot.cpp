// Reading metrics.jsonl, round ticks and the chart's layout for `llmtrain plot` (see plot.h for the
// rules). Pixels: x grows right, y grows down; a panel's y axis maps its lo to the plot's bottom.
#include "cli/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_depth.h"
#include "common/strings.h"

namespace llmtrain::cli {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Layout in pixels. Fonts: titles 18, axis labels 13, ticks and legend 12 (plot_render.cpp).
constexpr double kTitleBand = 56;    // above the first panel's plotting area
constexpr double kPanelTop = 28;     // above every other panel's
constexpr double kPanelBottom = 56;  // tick labels and the "step" label
constexpr double kTickFont = 12;
constexpr double kLegendGap = 16;     // between the plotting area and the legend
constexpr double kLegendSwatch = 32;  // the line sample and the space after it
constexpr double kMaxLegendWidth = 260;

// The start of a bad line for an error message: printable, at most 60 bytes, cut on a UTF-8 boundary.
std::string excerpt(const std::string& line) {
  size_t n = line.size();
  if (n > 60) {
    n = 60;
    while (n > 0 && (static_cast<unsigned char>(line[n]) & 0xC0) == 0x80) --n;
  }
  std::string s = utf8_sanitize(line.substr(0, n));
  return n < line.size() ? s + "..." : s;
}

const char* json_kind(const json& j) {
  switch (j.type()) {
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
}

enum class LineRead { line, end, too_long };

// One line without its '\n', reading at most kMaxMetricsLineBytes of it: a hostile file cannot make
// us hold more than that. `terminated` is false for a last line that ends without '\n'.
LineRead read_line(std::streambuf& in, std::string& line, bool& terminated) {
  line.clear();
  terminated = false;
  for (;;) {
    int c = in.sbumpc();
    if (c == std::char_traits<char>::eof()) return line.empty() ? LineRead::end : LineRead::line;
    if (c == '\n') {
      terminated = true;
      return LineRead::line;
    }
    if (line.size() == kMaxMetricsLineBytes) return LineRead::too_long;
    line.push_back(static_cast<char>(c));
  }
}

bool blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

// The directory a RUN argument names: itself, or the directory of a metrics.jsonl given directly.
fs::path run_dir(const std::string& run) {
  fs::path p(run);
  std::error_code ec;
  if (fs::is_regular_file(p, ec) || p.filename() == "metrics.jsonl") p = p.parent_path();
  if (p.empty()) p = ".";
  return p;
}

// A path for display without a trailing separator.
std::string display_path(fs::path p) {
  p = p.lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) { lo = std::min(lo, v), hi = std::max(hi, v); }
  bool empty() const { return lo > hi; }
};

// Candidates of a log axis, m × 10^k for m in {1, 2, 5}, in increasing order.
struct LogTick {
  int k = 0;
  int m = 0;  // index into {1, 2, 5}
  double value() const {
    static constexpr double kMantissa[] = {1, 2, 5};
    return kMantissa[m] * std::pow(10.0, k);
  }
  void next() {
    if (++m == 3) m = 0, ++k;
  }
  void prev() {
    if (--m < 0) m = 2, --k;
  }
};

// The largest candidate <= v, and the smallest >= v (with a relative tolerance: 0.3 counts as 0.3).
LogTick log_tick_below(double v) {
  LogTick t{static_cast<int>(std::floor(std::log10(v))) + 1, 0};
  while (t.value() > v * (1 + 1e-9)) t.prev();
  return t;
}
LogTick log_tick_above(double v) {
  LogTick t{static_cast<int>(std::floor(std::log10(v))) - 1, 0};
  while (t.value() < v * (1 - 1e-9)) t.next();
  return t;
}

// "no run has the metric", with the numeric fields the runs do have and a likely typo's correction.
Error missing_metric_error(const std::string& metric, const std::vector<RunMetrics>& runs,
                           const std::vector<std::string>& paths) {
  std::set<std::string> fields;
  int64_t records = 0;
  for (const auto& r : runs) fields.insert(r.numeric_fields.begin(), r.numeric_fields.end()), records += r.records;
  fields.erase("step");
  std::vector<std::string> names(fields.begin(), fields.end());
  std::string hint = records == 0    ? std::string("no records yet: a run writes one every log.every steps")
                     : names.empty() ? std::string("their records hold no numeric field but step")
                                     : "numeric fields of these runs: " + join(names, ", ");
  if (auto guess = closest_match(metric, names)) hint = fmt::format("did you mean {}? {}", *guess, hint);
  return Error(fmt::format("no run has the metric \"{}\" ({})", utf8_sanitize(metric), join(paths, ", ")), hint);
}

// What the chart leaves out or breaks of one run, for the user.
void add_run_notes(const RunMetrics& r, const std::vector<std::string>& metrics, std::vector<std::string>& notes) {
  if (r.incomplete_line > 0)
    notes.push_back(fmt::format("{}:{}: the last line is incomplete (a run killed or still writing); left out", r.path,
                                r.incomplete_line));
  for (const auto& m : metrics) {
    auto it = r.series.find(m);
    if (it == r.series.end())
      notes.push_back(fmt::format("{} has no {} ({})", r.name, m, r.path));
    else if (it->second.nulls > 0)
      notes.push_back(fmt::format("{}: {} of {} values of {} are null (non-finite), drawn as gaps", r.name,
                                  it->second.nulls, it->second.points.size(), m));
  }
}

// One run's metric in the pixels of panel `p` (axes and plotting area set), split at null values.
ChartSeries chart_series(int run, const std::string& metric, const MetricSeries& series, const Panel& p) {
  ChartSeries s;
  s.run = run;
  s.metric = utf8_sanitize(metric);
  s.markers = starts_with(metric, "val_");
  std::vector<Pixel> segment;
  for (const auto& pt : series.points) {
    if (std::isnan(pt.value)) {
      if (!segment.empty()) s.segments.push_back(std::move(segment));
      segment.clear();
      continue;
    }
    segment.push_back(
        {axis_map(p.x, pt.step, p.plot.x, p.plot.right()), axis_map(p.y, pt.value, p.plot.bottom(), p.plot.y)});
  }
  if (!segment.empty()) s.segments.push_back(std::move(segment));
  return s;
}

}  // namespace

double text_width_estimate(const std::string& text, double font_px) {
  size_t code_points = 0;
  for (char c : text) code_points += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return 0.62 * font_px * static_cast<double>(code_points);
}

std::string metrics_file(const std::string& run) {
  const char* hint = "give a run directory (the recipe's log.dir, e.g. runs/tiny) or its metrics.jsonl";
  fs::path p(run);
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    fs::path f = p / "metrics.jsonl";
    if (fs::is_regular_file(f, ec)) return f.string();
    throw Error(fmt::format("{}: no metrics.jsonl in this directory", run),
                std::string(hint) + "; a run writes it from its first logged step");
  }
  if (fs::is_regular_file(p, ec)) return run;
  if (!fs::exists(p, ec)) throw Error(fmt::format("{}: no such run directory or file", run), hint);
  throw Error(fmt::format("{}: neither a run directory nor a file", run), hint);
}

std::vector<std::string> run_labels(const std::vector<std::string>& runs) {
  std::vector<std::string> names;
  for (const auto& run : runs) {
    fs::path dir = fs::absolute(run_dir(run)).lexically_normal();
    if (!dir.has_filename() && dir.has_parent_path() && dir != dir.root_path()) dir = dir.parent_path();
    std::string name = dir.filename().string();
    names.push_back(name.empty() ? display_path(dir) : name);
  }
  // Runs that share a directory name (a/tiny, b/tiny) are named by their paths instead.
  std::vector<std::string> labels = names;
  for (size_t i = 0; i < runs.size(); ++i)
    if (std::count(names.begin(), names.end(), names[i]) > 1) labels[i] = display_path(run_dir(runs[i]));
  // The same run given twice: numbered.
  std::vector<std::string> unique = labels;
  for (size_t i = 0; i < labels.size(); ++i) {
    auto same = std::count(labels.begin(), labels.begin() + static_cast<std::ptrdiff_t>(i), labels[i]);
    if (same > 0) unique[i] += fmt::format(" ({})", same + 1);
  }
  return unique;
}

RunMetrics metrics_parse(std::istream& in, const std::string& path, const std::vector<std::string>& wanted) {
  const char* hint = "metrics.jsonl holds one JSON object per line, each with a numeric \"step\" (docs/metrics.md)";
  RunMetrics r;
  r.path = path;
  std::string line;
  bool terminated = false;
  int64_t line_no = 0;
  double last_step = -1;
  int64_t last_step_line = 0;
  for (;;) {
    LineRead got = read_line(*in.rdbuf(), line, terminated);
    if (got == LineRead::end) break;
    ++line_no;
    if (got == LineRead::too_long)
      throw Error(fmt::format("{}:{}: a line longer than {} KiB: not a metrics record", path, line_no,
                              kMaxMetricsLineBytes / 1024),
                  hint);
    if (blank(line)) continue;
    if (json_nesting_depth(line) > kMaxJsonDepth)
      throw Error(
          fmt::format("{}:{}: JSON nested deeper than {} levels: not a metrics record", path, line_no, kMaxJsonDepth),
          hint);
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      // A run killed mid-write (or still writing) leaves a last line without its '\n'.
      if (!terminated) {
        r.incomplete_line = line_no;
        break;
      }
      throw Error(fmt::format("{}:{}: not JSON: {}", path, line_no, excerpt(line)), hint);
    }
    if (!j.is_object())
      throw Error(fmt::format("{}:{}: {} where a record (a JSON object) belongs", path, line_no, json_kind(j)), hint);
    auto step_it = j.find("step");
    if (step_it == j.end() || !step_it->is_number())
      throw Error(fmt::format("{}:{}: the record has no numeric \"step\": {}", path, line_no, excerpt(line)), hint);
    double step = step_it->get<double>();
    if (!std::isfinite(step) || step < 0)
      throw Error(fmt::format("{}:{}: step {} is not a step number", path, line_no, excerpt(step_it->dump())), hint);
    if (step < last_step)
      throw Error(fmt::format("{}:{}: step {} after step {} on line {}: steps go backwards", path, line_no, step,
                              last_step, last_step_line),
                  "a run's metrics.jsonl goes forward in steps; was another run's file appended to it?");
    last_step = step, last_step_line = line_no;
    for (const auto& [key, value] : j.items())
      if (value.is_number()) r.numeric_fields.insert(key);
    for (const auto& name : wanted) {
      auto it = j.find(name);
      if (it == j.end()) continue;
      MetricSeries& s = r.series[name];
      if (it->is_number() && std::isfinite(it->get<double>())) {
        s.points.push_back({step, it->get<double>()});
      } else if (it->is_null() || it->is_number()) {  // null (or a number too large for a double)
        s.points.push_back({step, kNaN});
        ++s.nulls;
      } else {
        throw Error(
            fmt::format("{}:{}: \"{}\" is {}, not a number", path, line_no, utf8_sanitize(name), json_kind(*it)),
            "plot numeric fields only; docs/metrics.md lists them");
      }
    }
    ++r.records;
  }
  return r;
}

RunMetrics metrics_read(const std::string& run, const std::string& name, const std::vector<std::string>& wanted) {
  std::string path = metrics_file(run);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open for reading", path), "check the file's permissions");
  RunMetrics r = metrics_parse(in, path, wanted);
  if (in.bad()) throw Error(fmt::format("{}: read error", path), "check the file and the disk");
  r.name = name;
  return r;
}

std::string tick_label(double value, double step) {
  step = std::abs(step);
  if (!std::isfinite(value) || !std::isfinite(step) || step == 0) return fmt::format("{}", value);  // (no axis has one)
  if (std::abs(value) < step * 1e-9 || value == 0) return "0";
  if (step >= 1e5 || (step < 1e-4 && std::abs(value) < 1e-2)) {
    // Scientific: as many mantissa digits as the step resolves, trailing zeros and '+' dropped.
    int digits = std::max(
        0, static_cast<int>(std::floor(std::log10(std::abs(value)) + 1e-9) - std::floor(std::log10(step) + 1e-9)));
    std::string s = fmt::format("{:.{}e}", value, digits);
    size_t e = s.find('e');
    std::string mantissa = s.substr(0, e);
    if (mantissa.find('.') != std::string::npos) {
      while (mantissa.back() == '0') mantissa.pop_back();
      if (mantissa.back() == '.') mantissa.pop_back();
    }
    int exponent = 0;
    if (e == std::string::npos) return s;
    const char* first = s.data() + e + 1;
    if (*first == '+') ++first;
    std::from_chars(first, s.data() + s.size(), exponent);
    return fmt::format("{}e{}", mantissa, exponent);
  }
  int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", value, decimals);
}

Axis axis_linear(double lo, double hi, int max_intervals) {
  LT_CHECK(lo <= hi && max_intervals >= 1, "axis_linear({}, {}, {})", lo, hi, max_intervals);
  const auto too_large = [&] {
    return Error(fmt::format("cannot draw an axis from {} to {}: the values are too large", lo, hi),
                 "plot a metric with finite values");
  };
  if (!std::isfinite(hi - lo)) throw too_large();
  // One value, or values so close that no step between them is a normal number (subnormal values,
  // 1e-320): widened around them, by at least kMinSpan, so that the tick step stays a normal number.
  constexpr double kMinSpan = 1e-290;
  if (hi - lo <= std::max(std::abs(lo), std::abs(hi)) * 1e-12 || hi - lo < kMinSpan) {
    double d = lo == 0 ? 1 : std::max(std::abs(lo) * 0.1, kMinSpan);
    lo -= d, hi += d;
    if (!std::isfinite(hi - lo)) throw too_large();
  }
  double magnitude = std::pow(10.0, std::floor(std::log10((hi - lo) / max_intervals)));
  if (!std::isnormal(magnitude)) throw too_large();
  Axis a;
  for (double m : {1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0}) {
    double step = m * magnitude;
    double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
    if (last - first > max_intervals && m < 100) continue;
    // Every data-derived loop is bounded: a handful of ticks, each index exactly representable.
    if (!(last - first <= 10.0 * max_intervals) || std::abs(first) > 1e15 || std::abs(last) > 1e15 ||
        !std::isfinite(first * step) || !std::isfinite(last * step))
      throw too_large();
    a.lo = first * step, a.hi = last * step;
    for (double i = first; i <= last; ++i) {
      double v = i * step;
      if (std::abs(v) < step * 1e-9) v = 0;
      a.ticks.push_back(v);
      a.labels.push_back(tick_label(v, step));
    }
    break;
  }
  return a;
}

Axis axis_log(double lo, double hi, int max_intervals) {
  LT_CHECK(lo > 0 && lo <= hi && std::isfinite(hi) && max_intervals >= 1, "axis_log({}, {}, {})", lo, hi,
           max_intervals);
  // Decades whose powers of ten are normal numbers, widened by the candidates around them.
  if (lo < 1e-300 || hi > 1e300)
    throw Error(fmt::format("--log-y: values from {} to {}: a log axis draws values in [1e-300, 1e300]", lo, hi),
                "drop --log-y for this metric");
  if (hi / lo < 1 + 1e-9) lo /= 1.25, hi *= 1.25;  // one value: widen around it
  Axis a;
  a.log = true;
  LogTick first = log_tick_below(lo), last = log_tick_above(hi);
  std::vector<double> candidates;
  for (LogTick t = first; t.k < last.k || (t.k == last.k && t.m <= last.m); t.next()) candidates.push_back(t.value());
  if (candidates.size() >= 4 && static_cast<int>(candidates.size()) - 1 <= max_intervals) {
    a.lo = candidates.front(), a.hi = candidates.back();
    for (double v : candidates) a.ticks.push_back(v), a.labels.push_back(tick_label(v, v));
    return a;
  }
  if (candidates.size() >= 4) {
    // Many decades: ticks at every `stride`-th power of ten.
    int k0 = static_cast<int>(std::floor(std::log10(lo) + 1e-9));
    int k1 = static_cast<int>(std::ceil(std::log10(hi) - 1e-9));
    int stride = std::max(1, (k1 - k0 + max_intervals - 1) / max_intervals);
    k1 = k0 + (k1 - k0 + stride - 1) / stride * stride;
    a.lo = std::pow(10.0, k0), a.hi = std::pow(10.0, k1);
    for (int k = k0; k <= k1; k += stride) {
      double v = std::pow(10.0, k);
      a.ticks.push_back(v), a.labels.push_back(tick_label(v, v));
    }
    return a;
  }
  // Within a factor of a few: round values of a linear step, on the log scale.
  Axis lin = axis_linear(lo, hi, max_intervals);
  a.lo = lin.lo > 0 ? lin.lo : lo;
  a.hi = lin.hi;
  for (size_t i = 0; i < lin.ticks.size(); ++i)
    if (lin.ticks[i] >= a.lo * (1 - 1e-9)) a.ticks.push_back(lin.ticks[i]), a.labels.push_back(lin.labels[i]);
  return a;
}

double axis_map(const Axis& axis, double value, double p0, double p1) {
  double t = axis.log ? (std::log10(value) - std::log10(axis.lo)) / (std::log10(axis.hi) - std::log10(axis.lo))
                      : (value - axis.lo) / (axis.hi - axis.lo);
  return p0 + t * (p1 - p0);
}

std::optional<ImageFormat> image_format_for(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  if (ext == ".png") return ImageFormat::png;
  if (ext == ".svg") return ImageFormat::svg;
  return std::nullopt;
}

std::vector<std::vector<std::string>> panel_metrics(const std::vector<std::string>& metrics) {
  std::vector<std::vector<std::string>> panels;
  std::vector<bool> placed(metrics.size(), false);
  for (size_t i = 0; i < metrics.size(); ++i) {
    if (placed[i]) continue;
    placed[i] = true;
    const std::string& m = metrics[i];
    bool is_val = starts_with(m, "val_");
    std::string partner = is_val ? m.substr(4) : "val_" + m;
    std::vector<std::string> group = {m};
    for (size_t j = i + 1; j < metrics.size(); ++j) {
      if (placed[j] || metrics[j] != partner) continue;
      placed[j] = true;
      group.insert(is_val ? group.begin() : group.end(), partner);  // the training metric first
    }
    panels.push_back(group);
  }
  return panels;
}

Chart chart_layout(const std::vector<RunMetrics>& runs, const PlotOptions& options) {
  LT_CHECK(!runs.empty() && !options.metrics.empty());
  Chart c;
  c.width = kChartWidth;
  for (const auto& r : runs) c.runs.push_back(utf8_sanitize(r.name));
  std::vector<std::string> paths;
  for (const auto& r : runs) paths.push_back(r.path);

  // Every metric asked for must be in some run; a run without it is only a note.
  std::vector<std::string> metrics;
  for (const auto& m : options.metrics) {
    bool any = std::any_of(runs.begin(), runs.end(), [&](const RunMetrics& r) { return r.series.count(m) > 0; });
    if (any) {
      metrics.push_back(m);
    } else if (options.default_metrics) {
      c.notes.push_back(fmt::format("no run has {}: left out", m));
    } else {
      throw missing_metric_error(m, runs, paths);
    }
  }
  if (metrics.empty()) throw missing_metric_error(options.metrics[0], runs, paths);
  for (const auto& r : runs) add_run_notes(r, metrics, c.notes);

  // Data ranges: x over every finite point of every metric, y per panel.
  auto groups = panel_metrics(metrics);
  Range x_range;
  std::vector<Range> y_ranges(groups.size());
  for (size_t g = 0; g < groups.size(); ++g)
    for (const auto& m : groups[g])
      for (const auto& r : runs) {
        auto it = r.series.find(m);
        if (it == r.series.end()) continue;
        for (const auto& p : it->second.points) {
          if (std::isnan(p.value)) continue;
          if (options.log_y && p.value <= 0)
            throw Error(fmt::format("--log-y: {} of {} is {} at step {} ({}); a log axis needs values > 0", m, r.name,
                                    p.value, p.step, r.path),
                        "drop --log-y for this metric");
          x_range.add(p.step);
          y_ranges[g].add(p.value);
        }
      }
  if (x_range.empty())
    throw Error(fmt::format("no data points: no finite value of {} in {}", join(metrics, ", "), join(paths, ", ")),
                "plot a run that has logged steps, or another --metric");

  c.title = utf8_sanitize(options.title.empty() ? join(metrics, ", ") + " — " + join(c.runs, ", ") : options.title);
  c.height = static_cast<int>(groups.size()) * kPanelHeight;

  // The y axes first: their labels' width sets the left margin, the same for every panel so
  // that the step axes line up.
  double left = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    Panel p;
    for (const auto& m : groups[g]) p.metrics.push_back(utf8_sanitize(m));
    double top = g == 0 ? kTitleBand : kPanelTop;
    p.plot.y = static_cast<double>(g) * kPanelHeight + top;
    p.plot.h = kPanelHeight - top - kPanelBottom;
    int y_intervals = std::max(2, static_cast<int>(p.plot.h / 55));
    if (y_ranges[g].empty()) {
      c.notes.push_back(fmt::format("no finite value of {} in any run: its panel is empty", join(p.metrics, ", ")));
      y_ranges[g].add(options.log_y ? 1 : 0);
    }
    p.y = options.log_y ? axis_log(y_ranges[g].lo, y_ranges[g].hi, y_intervals)
                        : axis_linear(y_ranges[g].lo, y_ranges[g].hi, y_intervals);
    double widest = 0;
    for (const auto& l : p.y.labels) widest = std::max(widest, text_width_estimate(l, kTickFont));
    left = std::max(left, 44 + widest);  // the rotated metric name, the labels, the tick marks
    p.y_label = join(p.metrics, ", ");
    p.x_label = g + 1 == groups.size();
    // Legend: every run by colour; and the line styles when the panel holds a metric and its val_.
    for (size_t r = 0; r < runs.size(); ++r) p.legend.push_back({c.runs[r], static_cast<int>(r), false});
    if (p.metrics.size() > 1)
      for (const auto& m : p.metrics) p.legend.push_back({m, -1, starts_with(m, "val_")});
    c.panels.push_back(std::move(p));
  }
  double legend_w = 0;
  for (const auto& p : c.panels)
    for (const auto& e : p.legend) legend_w = std::max(legend_w, kLegendSwatch + text_width_estimate(e.label, 12));
  legend_w = std::min(legend_w, kMaxLegendWidth);
  double plot_w = kChartWidth - left - kLegendGap - legend_w - 12;
  int x_intervals = std::max(2, static_cast<int>(plot_w / 90));
  Axis x = axis_linear(x_range.lo, x_range.hi, x_intervals);

  for (size_t g = 0; g < c.panels.size(); ++g) {
    Panel& p = c.panels[g];
    p.x = x;
    p.plot.x = left;
    p.plot.w = plot_w;
    p.legend_at = {p.plot.right() + kLegendGap, p.plot.y};
    for (const auto& m : groups[g])
      for (size_t r = 0; r < runs.size(); ++r) {
        auto it = runs[r].series.find(m);
        if (it == runs[r].series.end()) continue;
        p.series.push_back(chart_series(static_cast<int>(r), m, it->second, p));
      }
  }
  if (runs.size() > 10) c.notes.push_back("more than 10 runs: colours repeat");
  return c;
}

}  // namespace llmtrain::cli
