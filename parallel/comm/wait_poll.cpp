#include "parallel/comm/wait_poll.h"

#include <algorithm>
#include <thread>

namespace llmtrain::parallel {

double wait_poll(const std::function<Poll()>& poll, double timeout_s, double eager_s) {
  using Clock = std::chrono::steady_clock;
  using Seconds = std::chrono::duration<double>;
  const auto start = Clock::now();
  auto last_progress = start;
  double eager = std::max(eager_s, kMinEagerSeconds);
  for (;;) {
    const Poll p = poll();
    const auto now = Clock::now();
    if (p == Poll::done) return Seconds(now - start).count();
    if (Seconds(now - start).count() >= timeout_s) return -1.0;
    if (p == Poll::progressed) {
      last_progress = now;
      eager = kMinEagerSeconds;
    }
    const Seconds idle = now - last_progress;
    if (idle.count() < eager) {
      std::this_thread::yield();
    } else {
      auto nap = std::chrono::duration_cast<std::chrono::microseconds>(idle / kNapDivisor);
      std::this_thread::sleep_for(
          std::clamp(nap, std::chrono::microseconds(kShortestNap), std::chrono::microseconds(kLongestNap)));
    }
  }
}

}  // namespace llmtrain::parallel
