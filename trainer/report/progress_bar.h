// A progress display for long commands: on a terminal, one line redrawn in place (a bar, the
// caller's status text, elapsed time and ETA) at most every 100 ms; elsewhere (logs, CI, pipes) a
// plain line every `interval_s` seconds, so logs stay readable and short.
//
// Rule a reader could get wrong: update() is cheap to call often (it returns at once between
// redraws), but it must be called from one thread only.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace llmtrain::trainer {

class ProgressBar {
 public:
  // terminal: redraw in place; otherwise print a line every interval_s seconds (0 = never).
  ProgressBar(std::FILE* out, bool terminal, double interval_s, std::string label);
  // fraction in [0, 1] (negative: unknown); status: what to show after the bar.
  void update(double fraction, const std::string& status);
  // Ends the display: the terminal line is completed with a newline.
  void finish();
  double elapsed_s() const;

 private:
  std::FILE* out_;
  bool terminal_;
  double interval_s_;
  std::string label_;
  std::chrono::steady_clock::time_point start_, last_;
  bool drawn_ = false;
};

}  // namespace llmtrain::trainer
