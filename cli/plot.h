// `llmtrain plot`'s pure half: reading runs' metrics.jsonl into series, choosing round tick values,
// and laying a chart out in pixels (panels, axes, legend, every series' points mapped to pixels).
// Nothing here draws; cli/plot_render.cpp strokes a laid-out Chart with cairo, so all of the
// arithmetic is unit-tested without an image (tests/cli/test_plot.cpp).
//
// Rules a reader could get wrong:
//  - metrics.jsonl is untrusted input. Every line must be a JSON object with a numeric `step`, and
//    a wanted metric must be a number or null; anything else is an Error naming the file and line.
//    The one line not refused is an unterminated last line that does not parse (a run killed, or
//    still writing, mid-line): it is left out and the run's `incomplete_line` says so.
//  - null is the trainer's spelling of NaN/Inf (docs/metrics.md), not a missing value: it breaks the
//    curve into segments and is never joined over.
//  - `X` and `val_X` (loss and val_loss) share one panel: the same quantity on the training and the
//    validation data. Every other metric has a panel of its own, stacked, all sharing the step axis.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace llmtrain::cli {

// Longest metrics.jsonl line accepted (the trainer writes about 250 bytes per record).
inline constexpr size_t kMaxMetricsLineBytes = 64 * 1024;

struct MetricPoint {
  double step = 0;
  double value = 0;  // NaN: the record held null (a non-finite value)
};

struct MetricSeries {
  std::vector<MetricPoint> points;  // in file order; steps never decrease
  int64_t nulls = 0;                // points whose value is null
};

struct RunMetrics {
  std::string name;                            // the legend's label (the run directory's name)
  std::string path;                            // the metrics.jsonl read
  std::map<std::string, MetricSeries> series;  // the wanted metrics present in some record
  std::set<std::string> numeric_fields;        // every numeric field any record holds
  int64_t records = 0;                         // lines read as records
  int64_t incomplete_line = 0;                 // > 0: this unterminated last line was left out
};

// The metrics.jsonl of RUN (a run directory, or the file itself); throws Error when there is none.
std::string metrics_file(const std::string& run);
// The legend labels of RUN arguments: each run directory's name; where two runs share a name, the
// paths as given (without a trailing /metrics.jsonl), so that no two labels are the same.
std::vector<std::string> run_labels(const std::vector<std::string>& runs);
// Reads metrics.jsonl records from `in` (`path` names it in errors), keeping the `wanted` fields.
RunMetrics metrics_parse(std::istream& in, const std::string& path, const std::vector<std::string>& wanted);
// metrics_file + metrics_parse; `name` becomes the result's name.
RunMetrics metrics_read(const std::string& run, const std::string& name, const std::vector<std::string>& wanted);

// One axis: a range of round values covering the data, its ticks and their labels.
struct Axis {
  double lo = 0, hi = 1;  // the range drawn (the data's range widened to round values)
  bool log = false;       // logarithmic (base 10)
  std::vector<double> ticks;
  std::vector<std::string> labels;  // one per tick
};

// A linear axis over [lo, hi] with at most `max_intervals` intervals between ticks, the tick step
// 1, 2 or 5 × 10^k and the range widened to multiples of it. lo == hi is widened around the value.
Axis axis_linear(double lo, double hi, int max_intervals);
// A logarithmic axis over [lo, hi] (both > 0): ticks at 1, 2, 5 × 10^k, or at decades when those
// are too many; within a factor of a few, round values of a linear step instead.
Axis axis_log(double lo, double hi, int max_intervals);
// A tick's label: as many decimals as `step` needs ("0.25", "2500", "17.00005"); scientific for
// steps of 1e5 and more, and for values below 0.01 on steps below 1e-4 ("1.5e6", "2e-5"); never "-0".
std::string tick_label(double value, double step);
// The pixel of `value` on `axis` when axis.lo is at pixel p0 and axis.hi at p1 (for a y axis p1 < p0:
// pixels grow downwards). Log axes map log10 of the value.
double axis_map(const Axis& axis, double value, double p0, double p1);

// "png" or "svg" from the output file's extension (any case); nullopt for anything else.
enum class ImageFormat { png, svg };
std::optional<ImageFormat> image_format_for(const std::string& path);

// Panels for the metrics in the order given: `X` and `val_X` together, every other metric alone.
std::vector<std::vector<std::string>> panel_metrics(const std::vector<std::string>& metrics);

struct Pixel {
  double x = 0, y = 0;
};
struct Rect {
  double x = 0, y = 0, w = 0, h = 0;
  double right() const { return x + w; }
  double bottom() const { return y + h; }
};

struct ChartSeries {
  int run = 0;  // index into Chart::runs: picks the colour
  std::string metric;
  bool markers = false;                      // evaluation metrics (val_*): markers joined by a dashed line
  std::vector<std::vector<Pixel>> segments;  // split where a value is null; a segment of one point is a marker
};

struct LegendEntry {
  std::string label;
  int run = -1;  // the run's colour; -1: grey (a metric's line style)
  bool markers = false;
};

struct Panel {
  std::vector<std::string> metrics;
  Rect plot;  // the plotting area
  Axis x, y;
  std::string y_label;
  bool x_label = false;  // "step" under this panel (the bottom one)
  std::vector<ChartSeries> series;
  std::vector<LegendEntry> legend;
  Pixel legend_at;  // the top-left corner of the legend (right of the plotting area)
};

struct Chart {
  int width = 0, height = 0;
  std::string title;
  std::vector<std::string> runs;  // legend names, in colour order
  std::vector<Panel> panels;
  std::vector<std::string> notes;  // for the user: what is missing or non-finite, and where
};

struct PlotOptions {
  std::vector<std::string> metrics = {"loss", "val_loss"};
  // The metrics are the default ones, not asked for: one that no run has (val_loss of a run without
  // data.valid) is left out with a note instead of being an error.
  bool default_metrics = false;
  bool log_y = false;
  std::string title;  // empty: the runs and the metrics
};

inline constexpr int kChartWidth = 1000;
inline constexpr int kPanelHeight = 600;

// Lays out the chart: one kChartWidth × kPanelHeight panel per group of metrics, stacked, sharing
// the x axis (step). Throws Error for a metric no run has (unless default_metrics), no finite data
// point at all, and --log-y over values <= 0.
Chart chart_layout(const std::vector<RunMetrics>& runs, const PlotOptions& options);

// An estimate of a label's width in pixels (layout only; the renderer measures the real text).
double text_width_estimate(const std::string& text, double font_px);

}  // namespace llmtrain::cli
