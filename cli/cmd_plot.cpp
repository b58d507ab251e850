// `llmtrain plot RUN...`: reads each run's metrics.jsonl, lays the curves out (cli/plot.h), draws them
// with cairo (cli/plot_render.h) and writes the PNG or SVG atomically, so a reader (an image viewer
// refreshing it during training) sees the old picture or the new one, never half a file.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/plot.h"
#include "cli/plot_render.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/log.h"
#include "common/strings.h"

namespace llmtrain::cli {
namespace fs = std::filesystem;

namespace {

// The metric names of --metric, each once, in the order given; an empty name is an error.
std::vector<std::string> metric_names(const std::vector<std::string>& given) {
  std::vector<std::string> names;
  for (const auto& m : given) {
    std::string name = trim(m);
    if (name.empty())
      throw Error("--metric: an empty metric name", "give field names separated by commas: --metric loss,val_loss,lr");
    if (name == "step") throw Error("--metric step: step is the x axis", "plot another field against it");
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

// <first run>/loss.png: the run directory, or the directory of a metrics.jsonl given directly.
std::string default_output(const std::string& first_run) {
  fs::path p(first_run);
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) p = p.parent_path();
  return (p / "loss.png").string();
}

}  // namespace

int cmd_plot(const PlotArgs& args) {
  PlotOptions options;  // its metrics default to loss and val_loss
  if (!args.metrics.empty()) options.metrics = metric_names(args.metrics);
  options.default_metrics = args.metrics.empty();
  options.log_y = args.log_y;
  options.title = args.title;

  // The output is checked before any run is read: a typo there should not wait on a large file.
  std::string output = args.output.empty() ? default_output(args.runs.at(0)) : args.output;
  auto format = image_format_for(output);
  if (!format)
    throw Error(fmt::format("{}: unknown image type \"{}\"", output, fs::path(output).extension().string()),
                "end the output file name in .png or .svg");
  fs::path dir = fs::path(output).parent_path();
  std::error_code ec;
  if (!dir.empty() && !fs::is_directory(dir, ec))
    throw Error(fmt::format("{}: the directory {} does not exist", output, dir.string()),
                "create it, or write the image elsewhere with -o");

  std::vector<std::string> labels = run_labels(args.runs);
  std::vector<RunMetrics> runs;
  for (size_t i = 0; i < args.runs.size(); ++i) runs.push_back(metrics_read(args.runs[i], labels[i], options.metrics));

  Chart chart = chart_layout(runs, options);
  for (const auto& note : chart.notes) log_warn("{}", note);
  write_file_atomic(default_file_system(), output, chart_render(chart, *format));
  std::vector<std::string> drawn;
  for (const auto& panel : chart.panels) drawn.insert(drawn.end(), panel.metrics.begin(), panel.metrics.end());
  std::printf("plot: wrote %s (%d×%d px, %zu run%s: %s)\n", output.c_str(), chart.width, chart.height, runs.size(),
              runs.size() == 1 ? "" : "s", join(drawn, ", ").c_str());
  return 0;
}

}  // namespace llmtrain::cli
