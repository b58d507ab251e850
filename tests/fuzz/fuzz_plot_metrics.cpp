// A run's metrics.jsonl as `llmtrain plot` reads it: every line (bounded), the records' steps and
// values, then the chart's layout over them, linear and logarithmic. The property checked beyond "an
// llmtrain::Error or nothing": a chart that lays out has a handful of ticks and only finite pixels
// (a non-finite one is what cairo would refuse; an endless tick loop is a timeout).
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "cli/plot.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void require_finite(const llmtrain::cli::Chart& c) {
  for (const auto& p : c.panels) {
    for (const auto* axis : {&p.x, &p.y}) {
      if (!std::isfinite(axis->lo) || !std::isfinite(axis->hi) || axis->ticks.size() > 1000) std::abort();
      for (double t : axis->ticks)
        if (!std::isfinite(t)) std::abort();
    }
    for (const auto& s : p.series)
      for (const auto& seg : s.segments)
        for (const auto& px : seg)
          if (!std::isfinite(px.x) || !std::isfinite(px.y)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmtrain;
  fuzz::quiet();
  std::istringstream in(std::string(fuzz::bytes(data, size)));
  try {
    cli::RunMetrics run = cli::metrics_parse(in, "metrics.jsonl", {"loss", "val_loss", "lr", "grad_norm"});
    run.name = "run";
    for (bool log_y : {false, true}) {
      cli::PlotOptions o;
      o.metrics = {"loss", "val_loss", "lr", "grad_norm"};
      o.default_metrics = true;
      o.log_y = log_y;
      try {
        require_finite(cli::chart_layout({run}, o));
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
