// Terminal bar or plain periodic lines; see progress_bar.h.
#include "trainer/report/progress_bar.h"

#include <fmt/format.h>

#include "common/log.h"
#include "common/strings.h"

namespace llmtrain::trainer {

ProgressBar::ProgressBar(std::FILE* out, bool terminal, double interval_s, std::string label)
    : out_(out), terminal_(terminal), interval_s_(interval_s), label_(std::move(label)) {
  start_ = last_ = std::chrono::steady_clock::now();
}

double ProgressBar::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ProgressBar::update(double fraction, const std::string& status) {
  auto now = std::chrono::steady_clock::now();
  double since = std::chrono::duration<double>(now - last_).count();
  if (terminal_ ? since < 0.1 : (interval_s_ <= 0 || since < interval_s_)) return;
  last_ = now;
  double elapsed = elapsed_s();
  std::string eta = fraction > 0.001 && fraction < 1 ? format_duration(elapsed * (1 - fraction) / fraction) : "?";
  if (terminal_) {
    constexpr int kWidth = 24;
    int filled = fraction < 0 ? 0 : int(fraction * kWidth + 0.5);
    std::string bar = std::string(size_t(filled), '#') + std::string(size_t(kWidth - filled), '.');
    std::fprintf(out_, "\r\033[K%s [%s] %3.0f%%  %s  %s, ETA %s", label_.c_str(), bar.c_str(),
                 fraction < 0 ? 0.0 : fraction * 100, status.c_str(), format_duration(elapsed).c_str(), eta.c_str());
    drawn_ = true;
    if (out_ == stderr) log_inplace_line(true);  // the next logged line clears it first
  } else {
    std::fprintf(out_, "%s: %.0f%%  %s  %s, ETA %s\n", label_.c_str(), fraction < 0 ? 0.0 : fraction * 100,
                 status.c_str(), format_duration(elapsed).c_str(), eta.c_str());
  }
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (terminal_ && drawn_) std::fprintf(out_, "\r\033[K");
  std::fflush(out_);
  if (drawn_ && out_ == stderr) log_inplace_line(false);
  drawn_ = false;
}

}  // namespace llmtrain::trainer
