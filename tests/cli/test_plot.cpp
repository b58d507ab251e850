// `llmtrain plot`'s pure half (cli/plot.h): round tick values, reading metrics.jsonl (good files and
// each kind of bad one, with the file and line named), run labels, and the chart's layout (panels,
// shared step axis, every point inside its plotting area, nulls as gaps). The drawn images are
// checked by an independent reader in tests/e2e/plot.sh; here only that the bytes are a PNG/SVG.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "cli/plot.h"
#include "cli/plot_render.h"
#include "common/error.h"

using namespace llmtrain;
using namespace llmtrain::cli;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

RunMetrics parse(const std::string& text, const std::vector<std::string>& wanted = {"loss", "val_loss"}) {
  std::istringstream in(text);
  return metrics_parse(in, "m.jsonl", wanted);
}

// The message of the Error that `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The tick step of an axis with at least two ticks.
double step_of(const Axis& a) { return a.ticks[1] - a.ticks[0]; }

bool round_step(double step) {
  double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  for (double m : {1.0, 2.0, 5.0})
    if (std::abs(mantissa - m) < 1e-6) return true;
  return false;
}

const char* kTwoEvals =
    R"({"step":1,"loss":5.5,"lr":0.001,"grad_norm":1.5}
{"step":2,"loss":4.0,"lr":0.002,"grad_norm":1.2}
{"step":2,"val_loss":4.2,"val_ppl":66.7,"tokens":100}
{"step":3,"loss":null,"lr":0.003,"grad_norm":null}
{"step":4,"loss":3.0,"lr":0.003,"grad_norm":0.9}
{"step":4,"val_loss":3.4,"val_ppl":30.0,"tokens":200}
)";

}  // namespace

TEST(PlotTicks, LinearStepAxisIsRound) {
  Axis a = axis_linear(1, 2500, 10);
  EXPECT_EQ(a.lo, 0);
  EXPECT_EQ(a.hi, 2500);
  EXPECT_THAT(a.labels, ElementsAre("0", "500", "1000", "1500", "2000", "2500"));
}

TEST(PlotTicks, LinearLossAxisHasDecimalsOfItsStep) {
  Axis a = axis_linear(1.52, 4.87, 8);
  EXPECT_DOUBLE_EQ(a.lo, 1.5);
  EXPECT_DOUBLE_EQ(a.hi, 5.0);
  EXPECT_THAT(a.labels, ElementsAre("1.5", "2.0", "2.5", "3.0", "3.5", "4.0", "4.5", "5.0"));
}

TEST(PlotTicks, LinearAxesCoverTheDataWithFewRoundEvenTicks) {
  const double ranges[][2] = {{0, 1},        {1.52, 4.87},  {-3.7, -0.2}, {-0.4, 12.1}, {0.001, 0.0013},
                              {1e-5, 3e-4},  {17, 17.0001}, {1, 1e9},     {2, 3},       {0.59, 0.61},
                              {-1e6, 2.5e6}, {3e-7, 9e-7},  {99, 101},    {0, 2500},    {7.3, 7.3}};
  for (auto [lo, hi] : ranges)
    for (int max_intervals : {2, 5, 8, 12}) {
      SCOPED_TRACE(testing::Message() << "[" << lo << ", " << hi << "] max " << max_intervals);
      Axis a = axis_linear(lo, hi, max_intervals);
      ASSERT_GE(a.ticks.size(), 2u);
      EXPECT_LE(static_cast<int>(a.ticks.size()) - 1, max_intervals);
      EXPECT_LE(a.lo, lo);
      EXPECT_GE(a.hi, hi);
      EXPECT_EQ(a.ticks.front(), a.lo);
      EXPECT_EQ(a.ticks.back(), a.hi);
      double step = step_of(a);
      EXPECT_TRUE(round_step(step)) << step;
      for (size_t i = 1; i < a.ticks.size(); ++i) EXPECT_NEAR(a.ticks[i] - a.ticks[i - 1], step, step * 1e-6);
      // Ticks fit the data: no more than one step of slack on either side.
      EXPECT_LT(lo - a.lo, step * (1 + 1e-9) + (lo == hi ? std::abs(lo) : 0));
      EXPECT_LT(a.hi - hi, step * (1 + 1e-9) + (lo == hi ? std::abs(lo) : 0));
      std::set<std::string> distinct(a.labels.begin(), a.labels.end());
      EXPECT_EQ(distinct.size(), a.labels.size()) << ::testing::PrintToString(a.labels);
    }
}

TEST(PlotTicks, OneValueIsWidenedAroundIt) {
  Axis a = axis_linear(2.0, 2.0, 8);
  EXPECT_LT(a.lo, 2.0);
  EXPECT_GT(a.hi, 2.0);
  Axis z = axis_linear(0, 0, 8);
  EXPECT_LT(z.lo, 0);
  EXPECT_GT(z.hi, 0);
}

// Issue 33: a subnormal value made the tick step 0 and the tick loop endless (until memory ran out);
// a huge one made non-finite pixels that cairo refused. Every axis over hostile values is a handful
// of finite ticks or an Error.
TEST(PlotTicks, HostileValuesGiveAFewTicksOrAnErrorNeverAnEndlessLoop) {
  for (double v : {5e-324, 1e-310, 2.2250738585072014e-308, 1e-300, -5e-324}) {
    const Axis a = axis_linear(v, v, 8);
    EXPECT_TRUE(std::isfinite(a.lo) && std::isfinite(a.hi) && a.lo < a.hi) << v;
    EXPECT_LE(a.ticks.size(), 81u) << v;
    EXPECT_GE(a.ticks.size(), 2u) << v;
  }
  const Axis close = axis_linear(5e-324, 1e-323, 8);
  EXPECT_LE(close.ticks.size(), 81u);
  EXPECT_NE(error_of([] { axis_linear(1.7e308, 1.7e308, 8); }), "");
  EXPECT_NE(error_of([] { axis_linear(-1.7e308, 1.7e308, 8); }), "");
  EXPECT_NE(error_of([] { axis_log(5e-324, 1, 8); }), "");
  EXPECT_NE(error_of([] { axis_log(1, 1.7e308, 8); }), "");
  EXPECT_EQ(tick_label(5e-324, 0), "5e-324");  // no step: printed as it is, no exception
  EXPECT_EQ(tick_label(1e300, std::numeric_limits<double>::infinity()), "1e+300");
  EXPECT_EQ(tick_label(std::numeric_limits<double>::quiet_NaN(), 1), "nan");
}

TEST(PlotLayout, SubnormalValuesAreDrawnAndHugeOnesRefused) {
  PlotOptions loss;
  loss.metrics = {"loss"};
  RunMetrics tiny = parse("{\"step\":1,\"loss\":5e-324}\n{\"step\":2,\"loss\":4.9e-324}\n");
  tiny.name = "tiny";
  const Chart c = chart_layout({tiny}, loss);
  EXPECT_FALSE(chart_render(c, ImageFormat::png).empty());
  RunMetrics huge = parse("{\"step\":1,\"loss\":1.7e308}\n{\"step\":1e308,\"loss\":1.7e308}\n");
  huge.name = "huge";
  EXPECT_NE(error_of([&] { chart_layout({huge}, loss); }).find("too large"), std::string::npos);
}

TEST(PlotTicks, Labels) {
  EXPECT_EQ(tick_label(0.30000000000000004, 0.1), "0.3");
  EXPECT_EQ(tick_label(-1e-17, 0.1), "0");
  EXPECT_EQ(tick_label(-0.0, 1), "0");
  EXPECT_EQ(tick_label(0.25, 0.05), "0.25");
  EXPECT_EQ(tick_label(2500, 500), "2500");
  EXPECT_EQ(tick_label(-1.5, 0.5), "-1.5");
  EXPECT_EQ(tick_label(1.5e6, 5e5), "1.5e6");
  EXPECT_EQ(tick_label(2e6, 5e5), "2e6");
  EXPECT_EQ(tick_label(2e-5, 1e-5), "2e-5");
  EXPECT_EQ(tick_label(1.2e-4, 2e-5), "1.2e-4");
  EXPECT_EQ(tick_label(17.00005, 5e-5), "17.00005");  // a small step on a large value stays fixed
}

TEST(PlotTicks, LogAxisOverDecades) {
  Axis a = axis_log(0.001, 10, 10);  // 1, 2, 5 per decade would be 12 intervals: decades only
  EXPECT_TRUE(a.log);
  EXPECT_THAT(a.labels, ElementsAre("0.001", "0.01", "0.1", "1", "10"));
  Axis wide = axis_log(1e-8, 1e4, 5);  // 12 decades in at most 5 intervals: every third
  EXPECT_THAT(wide.labels, ElementsAre("1e-8", "1e-5", "0.01", "10", "10000"));
}

TEST(PlotTicks, LogAxisOneTwoFive) {
  Axis a = axis_log(3, 10.9, 8);
  EXPECT_THAT(a.labels, ElementsAre("2", "5", "10", "20"));
  EXPECT_EQ(a.lo, 2);
  EXPECT_EQ(a.hi, 20);
}

TEST(PlotTicks, LogAxisWithinAFactorOfAFewUsesLinearRoundValues) {
  Axis a = axis_log(1.4, 4.5, 8);
  EXPECT_TRUE(a.log);
  EXPECT_THAT(a.labels, ElementsAre("1.0", "1.5", "2.0", "2.5", "3.0", "3.5", "4.0", "4.5"));
  Axis near_zero = axis_log(0.05, 0.3, 8);  // the linear range would start at 0: it starts at the data
  EXPECT_GT(near_zero.lo, 0);
  EXPECT_LE(near_zero.lo, 0.05);
  for (double t : near_zero.ticks) EXPECT_GE(t, near_zero.lo);
}

TEST(PlotTicks, MapLinearAndLogAndDownwardY) {
  Axis x = axis_linear(0, 100, 10);
  EXPECT_DOUBLE_EQ(axis_map(x, 0, 50, 950), 50);
  EXPECT_DOUBLE_EQ(axis_map(x, 25, 50, 950), 275);
  EXPECT_DOUBLE_EQ(axis_map(x, 100, 50, 950), 950);
  Axis y = axis_log(0.001, 10, 10);
  EXPECT_NEAR(axis_map(y, 0.001, 500, 100), 500, 1e-9);  // lo at the bottom
  EXPECT_NEAR(axis_map(y, 0.1, 500, 100), 300, 1e-9);    // half-way in decades
  EXPECT_NEAR(axis_map(y, 10, 500, 100), 100, 1e-9);
}

TEST(PlotFormat, ByExtension) {
  EXPECT_EQ(image_format_for("runs/a/loss.png"), ImageFormat::png);
  EXPECT_EQ(image_format_for("LOSS.PNG"), ImageFormat::png);
  EXPECT_EQ(image_format_for("x.svg"), ImageFormat::svg);
  EXPECT_EQ(image_format_for("x.jpg"), std::nullopt);
  EXPECT_EQ(image_format_for("png"), std::nullopt);
  EXPECT_EQ(image_format_for("x.png.txt"), std::nullopt);
}

TEST(PlotPanels, MetricAndItsValidationShareAPanel) {
  using V = std::vector<std::vector<std::string>>;
  EXPECT_EQ(panel_metrics({"loss", "val_loss"}), (V{{"loss", "val_loss"}}));
  EXPECT_EQ(panel_metrics({"val_loss", "lr", "loss"}), (V{{"loss", "val_loss"}, {"lr"}}));
  EXPECT_EQ(panel_metrics({"lr", "grad_norm"}), (V{{"lr"}, {"grad_norm"}}));
  EXPECT_EQ(panel_metrics({"val_ppl", "loss"}), (V{{"val_ppl"}, {"loss"}}));
}

TEST(PlotRead, StepAndEvaluationRecords) {
  RunMetrics r = parse(kTwoEvals, {"loss", "val_loss", "grad_norm"});
  EXPECT_EQ(r.records, 6);
  EXPECT_EQ(r.incomplete_line, 0);
  ASSERT_EQ(r.series.count("loss"), 1u);
  const auto& loss = r.series.at("loss");
  ASSERT_EQ(loss.points.size(), 4u);
  EXPECT_EQ(loss.nulls, 1);
  EXPECT_EQ(loss.points[0].step, 1);
  EXPECT_EQ(loss.points[0].value, 5.5);
  EXPECT_TRUE(std::isnan(loss.points[2].value));  // null: a gap, not dropped
  EXPECT_EQ(loss.points[3].value, 3.0);
  const auto& val = r.series.at("val_loss");
  ASSERT_EQ(val.points.size(), 2u);
  EXPECT_EQ(val.points[1].step, 4);
  EXPECT_EQ(val.points[1].value, 3.4);
  EXPECT_EQ(r.series.count("lr"), 0u);  // not wanted
  EXPECT_EQ(r.numeric_fields,
            (std::set<std::string>{"step", "loss", "lr", "grad_norm", "val_loss", "val_ppl", "tokens"}));
}

TEST(PlotRead, BlankLinesAndUnterminatedCompleteLastLine) {
  RunMetrics r = parse("{\"step\":1,\"loss\":2}\n\n  \r\n{\"step\":2,\"loss\":1.5}");
  EXPECT_EQ(r.records, 2);
  EXPECT_EQ(r.series.at("loss").points.size(), 2u);
  EXPECT_EQ(r.incomplete_line, 0);
}

TEST(PlotRead, IncompleteLastLineIsLeftOutAndReported) {
  RunMetrics r = parse("{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1.5}\n{\"step\":3,\"lo");
  EXPECT_EQ(r.records, 2);
  EXPECT_EQ(r.incomplete_line, 3);
  EXPECT_EQ(r.series.at("loss").points.size(), 2u);
}

TEST(PlotRead, BadLinesNameFileAndLine) {
  EXPECT_THAT(error_of([] { parse("{\"step\":1,\"loss\":2}\n{\"step\":2,\"lo\n{\"step\":3,\"loss\":1}\n"); }),
              HasSubstr("m.jsonl:2: not JSON: {\"step\":2,\"lo"));
  EXPECT_THAT(error_of([] { parse("{\"step\":1}\n[1,2]\n"); }),
              HasSubstr("m.jsonl:2: an array where a record (a JSON object) belongs"));
  EXPECT_THAT(error_of([] { parse("17\n"); }), HasSubstr("m.jsonl:1: a number where a record"));
  EXPECT_THAT(error_of([] { parse("{\"loss\":2}\n"); }), HasSubstr("m.jsonl:1: the record has no numeric \"step\""));
  EXPECT_THAT(error_of([] { parse("{\"step\":\"7\"}\n"); }), HasSubstr("m.jsonl:1: the record has no numeric"));
  EXPECT_THAT(error_of([] { parse("{\"step\":-3}\n"); }), HasSubstr("m.jsonl:1: step -3 is not a step number"));
  EXPECT_THAT(error_of([] { parse("{\"step\":1,\"loss\":\"high\"}\n"); }),
              HasSubstr("m.jsonl:1: \"loss\" is a string, not a number"));
  EXPECT_THAT(error_of([] { parse("{\"step\":1,\"loss\":[2]}\n"); }), HasSubstr("\"loss\" is an array"));
  EXPECT_THAT(error_of([] { parse("{\"step\":5,\"loss\":2}\n{\"step\":6,\"loss\":2}\n{\"step\":1,\"loss\":3}\n"); }),
              HasSubstr("m.jsonl:3: step 1 after step 6 on line 2: steps go backwards"));
  // A field that is not wanted may hold anything.
  EXPECT_EQ(parse("{\"step\":1,\"loss\":2,\"note\":\"hi\"}\n").records, 1);
}

TEST(PlotRead, LineLengthIsBounded) {
  std::string huge = "{\"step\":1,\"loss\":2,\"pad\":\"" + std::string(kMaxMetricsLineBytes, 'x') + "\"}\n";
  EXPECT_THAT(error_of([&] { parse("{\"step\":0}\n" + huge); }),
              HasSubstr("m.jsonl:2: a line longer than 64 KiB: not a metrics record"));
  // Just under the bound is a record like any other.
  std::string big = "{\"step\":1,\"loss\":2,\"pad\":\"" + std::string(kMaxMetricsLineBytes - 40, 'x') + "\"}\n";
  EXPECT_EQ(parse(big).records, 1);
}

TEST(PlotRead, ControlBytesInAnErrorAreMadePrintable) {
  std::string msg = error_of([] { parse(std::string("{\"step\x01\xff\n")); });
  EXPECT_THAT(msg, HasSubstr("m.jsonl:1: not JSON: {\"step??"));
}

TEST(PlotRead, RunDirectoriesAndFiles) {
  fs::path d = fs::temp_directory_path() / ("llmtrain_plot_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "tiny");
  fs::create_directories(d / "empty");
  std::ofstream(d / "tiny" / "metrics.jsonl") << kTwoEvals;
  RunMetrics by_dir = metrics_read((d / "tiny").string(), "tiny", {"loss"});
  EXPECT_EQ(by_dir.path, (d / "tiny" / "metrics.jsonl").string());
  EXPECT_EQ(by_dir.name, "tiny");
  EXPECT_EQ(by_dir.records, 6);
  RunMetrics by_file = metrics_read((d / "tiny" / "metrics.jsonl").string(), "tiny", {"loss"});
  EXPECT_EQ(by_file.records, 6);
  EXPECT_THAT(error_of([&] { metrics_read((d / "empty").string(), "empty", {"loss"}); }),
              HasSubstr("empty: no metrics.jsonl in this directory"));
  EXPECT_THAT(error_of([&] { metrics_read((d / "nowhere").string(), "nowhere", {"loss"}); }),
              HasSubstr("nowhere: no such run directory or file"));
  fs::remove_all(d);
}

TEST(PlotRead, RunLabelsAreDirectoryNamesMadeUnique) {
  EXPECT_THAT(run_labels({"runs/tiny", "runs/big/", "other/x/metrics.jsonl"}), ElementsAre("tiny", "big", "x"));
  EXPECT_THAT(run_labels({"a/tiny", "b/tiny/", "c"}), ElementsAre("a/tiny", "b/tiny", "c"));
  EXPECT_THAT(run_labels({"runs/tiny", "runs/tiny"}), ElementsAre("runs/tiny", "runs/tiny (2)"));
  EXPECT_THAT(run_labels({"."}), ElementsAre(fs::current_path().filename().string()));
}

namespace {

std::vector<RunMetrics> two_runs() {
  RunMetrics a = parse(kTwoEvals, {"loss", "val_loss", "lr"});
  a.name = "base";
  RunMetrics b = parse("{\"step\":2,\"loss\":6,\"lr\":0.01}\n{\"step\":10,\"loss\":2.5,\"lr\":0.02}\n",
                       {"loss", "val_loss", "lr"});
  b.name = "wide";
  return {a, b};
}

void expect_inside(const Panel& p) {
  for (const auto& s : p.series)
    for (const auto& seg : s.segments)
      for (const auto& px : seg) {
        EXPECT_GE(px.x, p.plot.x - 1e-9);
        EXPECT_LE(px.x, p.plot.right() + 1e-9);
        EXPECT_GE(px.y, p.plot.y - 1e-9);
        EXPECT_LE(px.y, p.plot.bottom() + 1e-9);
      }
}

}  // namespace

TEST(PlotLayout, LossAndValidationInOnePanel) {
  Chart c = chart_layout(two_runs(), PlotOptions{});
  EXPECT_EQ(c.width, kChartWidth);
  EXPECT_EQ(c.height, kPanelHeight);
  EXPECT_THAT(c.runs, ElementsAre("base", "wide"));
  ASSERT_EQ(c.panels.size(), 1u);
  const Panel& p = c.panels[0];
  EXPECT_THAT(p.metrics, ElementsAre("loss", "val_loss"));
  EXPECT_TRUE(p.x_label);
  // x covers both runs' steps (1..10), y every finite value (2.5..6).
  EXPECT_LE(p.x.lo, 1);
  EXPECT_GE(p.x.hi, 10);
  EXPECT_LE(p.y.lo, 2.5);
  EXPECT_GE(p.y.hi, 6);
  EXPECT_GT(p.plot.x, 0);
  EXPECT_LT(p.legend_at.x, c.width);
  EXPECT_GE(p.legend_at.x, p.plot.right());
  expect_inside(p);
  // base's loss: a gap at step 3's null, so two segments; its val_loss: markers.
  ASSERT_EQ(p.series.size(), 3u);  // base loss, wide loss, base val_loss (wide has none)
  EXPECT_EQ(p.series[0].run, 0);
  EXPECT_EQ(p.series[0].segments.size(), 2u);
  EXPECT_FALSE(p.series[0].markers);
  EXPECT_EQ(p.series[1].run, 1);
  EXPECT_EQ(p.series[2].metric, "val_loss");
  EXPECT_TRUE(p.series[2].markers);
  // The first point of base's loss (step 1, 5.5) lands where the axes put it.
  const Pixel& first = p.series[0].segments[0][0];
  EXPECT_DOUBLE_EQ(first.x, axis_map(p.x, 1, p.plot.x, p.plot.right()));
  EXPECT_DOUBLE_EQ(first.y, axis_map(p.y, 5.5, p.plot.bottom(), p.plot.y));
  // Legend: the runs in their colours, then the two metrics' line styles.
  ASSERT_EQ(p.legend.size(), 4u);
  EXPECT_EQ(p.legend[0].label, "base");
  EXPECT_EQ(p.legend[1].run, 1);
  EXPECT_EQ(p.legend[3].label, "val_loss");
  EXPECT_TRUE(p.legend[3].markers);
  // wide has no validation loss and base a null: both said.
  EXPECT_THAT(c.notes, testing::Contains(HasSubstr("wide has no val_loss")));
  EXPECT_THAT(c.notes, testing::Contains(HasSubstr("base: 1 of 4 values of loss are null")));
}

TEST(PlotLayout, PanelsStackAndShareTheStepAxis) {
  PlotOptions o;
  o.metrics = {"loss", "lr"};
  o.title = "sweep";
  Chart c = chart_layout(two_runs(), o);
  EXPECT_EQ(c.title, "sweep");
  ASSERT_EQ(c.panels.size(), 2u);
  EXPECT_EQ(c.height, 2 * kPanelHeight);
  const Panel& top = c.panels[0];
  const Panel& bottom = c.panels[1];
  EXPECT_FALSE(top.x_label);
  EXPECT_TRUE(bottom.x_label);
  EXPECT_EQ(top.x.ticks, bottom.x.ticks);
  EXPECT_EQ(top.plot.x, bottom.plot.x);
  EXPECT_EQ(top.plot.w, bottom.plot.w);
  EXPECT_LE(top.plot.bottom(), bottom.plot.y);
  EXPECT_LE(bottom.plot.bottom(), c.height);
  EXPECT_LE(bottom.y.hi, 0.05);      // lr's own y axis
  EXPECT_EQ(top.legend.size(), 2u);  // one metric per panel: no line-style entries
  expect_inside(top);
  expect_inside(bottom);
}

TEST(PlotLayout, Errors) {
  PlotOptions typo;
  typo.metrics = {"val_los"};
  std::string msg;
  try {
    chart_layout(two_runs(), typo);
  } catch (const Error& e) {
    msg = std::string(e.what()) + " | " + e.hint();
  }
  EXPECT_THAT(msg, HasSubstr("no run has the metric \"val_los\""));
  EXPECT_THAT(msg, HasSubstr("did you mean val_loss?"));

  RunMetrics nulls = parse("{\"step\":1,\"loss\":null}\n{\"step\":2,\"loss\":null}\n", {"loss"});
  nulls.name = "nan";
  PlotOptions loss;
  loss.metrics = {"loss"};
  EXPECT_THAT(error_of([&] { chart_layout({nulls}, loss); }), HasSubstr("no data points: no finite value of loss"));

  RunMetrics zero = parse("{\"step\":1,\"lr\":0}\n{\"step\":2,\"lr\":0.1}\n", {"lr"});
  zero.name = "warm";
  PlotOptions log_lr;
  log_lr.metrics = {"lr"};
  log_lr.log_y = true;
  EXPECT_THAT(error_of([&] { chart_layout({zero}, log_lr); }), HasSubstr("--log-y: lr of warm is 0 at step 1"));
}

TEST(PlotLayout, DefaultValidationLossMayBeMissing) {
  RunMetrics no_eval = parse("{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2}\n");
  no_eval.name = "noeval";
  PlotOptions defaults;
  defaults.default_metrics = true;  // `llmtrain plot RUN` without --metric
  Chart c = chart_layout({no_eval}, defaults);
  ASSERT_EQ(c.panels.size(), 1u);
  EXPECT_THAT(c.panels[0].metrics, ElementsAre("loss"));
  EXPECT_THAT(c.notes, testing::Contains(HasSubstr("no run has val_loss: left out")));
  // Asked for by name, it is an error.
  EXPECT_THAT(error_of([&] { chart_layout({no_eval}, PlotOptions{}); }),
              HasSubstr("no run has the metric \"val_loss\""));
  // With no records at all, even the defaults are.
  RunMetrics empty = parse("");
  empty.name = "empty";
  std::string msg;
  try {
    chart_layout({empty}, defaults);
  } catch (const Error& e) {
    msg = std::string(e.what()) + " | " + e.hint();
  }
  EXPECT_THAT(msg, HasSubstr("no run has the metric \"loss\" (m.jsonl) | no records yet"));
}

TEST(PlotLayout, LogYKeepsPointsInside) {
  PlotOptions o;
  o.log_y = true;
  Chart c = chart_layout(two_runs(), o);
  ASSERT_EQ(c.panels.size(), 1u);
  EXPECT_TRUE(c.panels[0].y.log);
  expect_inside(c.panels[0]);
}

// Issue 33: every cairo failure was reported as "is the disk or memory full?", though the image is
// drawn and encoded in memory (the file is written afterwards, with its own errors).
TEST(PlotRender, ADrawingFailureIsNotBlamedOnTheDisk) {
  Chart c = chart_layout(two_runs(), PlotOptions{});
  c.width = -1;  // an image cairo cannot make
  try {
    chart_render(c, ImageFormat::png);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cairo: creating the image failed"), std::string::npos) << e.what();
    EXPECT_EQ(e.hint().find("disk"), std::string::npos) << e.hint();
  }
}

TEST(PlotRender, PngAndSvgBytes) {
  Chart c = chart_layout(two_runs(), PlotOptions{});
  std::string png = chart_render(c, ImageFormat::png);
  ASSERT_GT(png.size(), 33u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  auto be32 = [&](size_t at) {
    return (static_cast<uint32_t>(static_cast<unsigned char>(png[at])) << 24) |
           (static_cast<uint32_t>(static_cast<unsigned char>(png[at + 1])) << 16) |
           (static_cast<uint32_t>(static_cast<unsigned char>(png[at + 2])) << 8) |
           static_cast<uint32_t>(static_cast<unsigned char>(png[at + 3]));
  };
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  EXPECT_EQ(be32(16), static_cast<uint32_t>(kChartWidth));
  EXPECT_EQ(be32(20), static_cast<uint32_t>(kPanelHeight));

  std::string svg = chart_render(c, ImageFormat::svg);
  EXPECT_THAT(svg, HasSubstr("<svg"));
  EXPECT_THAT(svg, HasSubstr("<title>loss, val_loss — base, wide</title>"));
  EXPECT_THAT(svg, HasSubstr("base (#1f77b4), wide (#ff7f0e)"));
  EXPECT_THAT(svg, HasSubstr("<path"));
  EXPECT_THAT(svg, HasSubstr("</svg>"));
}
