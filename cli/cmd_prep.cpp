// `llmtrain prep`: the command-line face of trainer/data/data_prep.h. Parses nothing itself (main.cpp
// registers the flags with CLI11); decides the progress display and turns SIGINT/SIGTERM into a
// clean stop that leaves no partial output.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>

#include "cli/commands.h"
#include "common/error.h"
#include "trainer/data/data_prep.h"

namespace llmtrain::cli {

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop.store(true); }

}  // namespace

int cmd_prep(const PrepArgs& args) {
  trainer::PrepOptions o = args.options;
  if (args.separator_given) o.separator = args.separator;
  o.append_eod = !args.no_append_eod;
  if (args.progress == "auto") {
    o.progress_terminal = ::isatty(STDERR_FILENO);
  } else if (args.progress == "bar") {
    o.progress_terminal = true;
  } else if (args.progress == "lines") {
    o.progress_terminal = false;
  } else if (args.progress == "none") {
    o.progress_terminal = false;
    o.progress_interval_s = 0;
  } else {
    throw Error("--progress " + args.progress + ": expected auto, bar, lines or none");
  }
  auto old_int = std::signal(SIGINT, on_signal);
  auto old_term = std::signal(SIGTERM, on_signal);
  trainer::PrepSummary s;
  try {
    s = trainer::prep_run(o, &g_stop);
  } catch (...) {
    std::signal(SIGINT, old_int);
    std::signal(SIGTERM, old_term);
    if (g_stop.load()) {
      std::fprintf(stderr, "prep: interrupted; nothing was written\n");
      return 130;
    }
    throw;
  }
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  std::fputs(trainer::prep_summary_text(s).c_str(), stdout);
  return 0;
}

}  // namespace llmtrain::cli
