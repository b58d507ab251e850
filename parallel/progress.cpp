#include "parallel/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/enum_names.h"
#include "common/signals.h"
#include "common/strings.h"
#include "parallel/comm/flight_recorder.h"

namespace llmtrain::parallel {
namespace {

std::atomic<int64_t> g_step{0};
std::atomic<int> g_phase{int(Phase::start)};
std::atomic<bool> g_dump_requested{false};
std::atomic<int64_t> g_beat{0};

void on_dump_request(int) { g_dump_requested.store(true); }

class Reporter {
 public:
  explicit Reporter(double interval_s) : interval_s_(interval_s) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Reporter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void loop() {
    // The wait is cut into short slices so that a dump request (a flag set by the signal handler,
    // which cannot notify) is served within a tenth of a second.
    auto next = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (g_dump_requested.exchange(false)) {
        lock.unlock();
        const std::string path = flight_recorder().dump();
        report(path);
        lock.lock();
      } else if (std::chrono::steady_clock::now() >= next) {
        lock.unlock();
        report("");
        lock.lock();
        next = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                      std::chrono::duration<double>(interval_s_));
      }
      cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
  }

  // One line, written with one write(2) so that it is never split by the rank's other output
  // (which goes through stdio's buffer: at worst this line lands inside one of those lines, and the
  // supervisor finds the marker anywhere in a line).
  void report(const std::string& flight_path) {
    std::string line = fmt::format("{}step={} phase={} beat={}", kProgressMarker, g_step.load(),
                                   to_string(Phase(g_phase.load())), g_beat.load());
    const std::string op = flight_recorder().in_flight();
    if (!op.empty()) line += " op=" + op;
    if (!flight_path.empty()) line += " flight=" + flight_path;
    line += "\n";
    size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(STDOUT_FILENO, line.data() + done, line.size() - done);
      if (n <= 0) return;  // stdout gone: the supervisor will see silence
      done += size_t(n);
    }
  }

  double interval_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

std::mutex g_reporter_mu;
Reporter* g_reporter = nullptr;

}  // namespace

const char* to_string(Phase phase) {
  static constexpr EnumName<Phase> kNames[] = {{"start", Phase::start}, {"train", Phase::train}, {"eval", Phase::eval},
                                               {"save", Phase::save},   {"load", Phase::load},   {"done", Phase::done}};
  return enum_name(kNames, phase);
}

void set_progress(int64_t step, Phase phase) {
  g_step.store(step, std::memory_order_relaxed);
  g_phase.store(int(phase), std::memory_order_relaxed);
}

void beat_progress() { g_beat.fetch_add(1, std::memory_order_relaxed); }

void start_progress_reporter(int rank) {
  const char* flight_dir = std::getenv(kFlightDirEnv);
  if (flight_dir && *flight_dir) flight_recorder().set_dump_dir(flight_dir, rank);
  const char* env = std::getenv(kProgressEnv);
  if (!env || !*env) return;
  const std::optional<double> interval = parse_duration_seconds(env);
  if (!interval || *interval <= 0) return;  // set by our supervisor: a bad value is not the user's
  std::lock_guard<std::mutex> lock(g_reporter_mu);
  if (g_reporter) return;
  install_signal_handler(SIGUSR2, on_dump_request);
  g_reporter = new Reporter(*interval);
}

void stop_progress_reporter() {
  std::lock_guard<std::mutex> lock(g_reporter_mu);
  delete g_reporter;
  g_reporter = nullptr;
}

}  // namespace llmtrain::parallel
