#include "parallel/wait_poll.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace llmtrain::parallel {

double wait_poll(const std::function<bool()>& done, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  constexpr int kYieldPolls = 100;
  constexpr auto kFirstNap = std::chrono::microseconds(20);
  constexpr auto kLongestNap = std::chrono::microseconds(1000);
  const auto start = Clock::now();
  const auto limit = std::chrono::duration<double>(timeout_s);
  auto nap = kFirstNap;
  for (int polls = 0;; ++polls) {
    if (done()) return std::chrono::duration<double>(Clock::now() - start).count();
    if (Clock::now() - start >= limit) return -1.0;
    if (polls < kYieldPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, kLongestNap);
    }
  }
}

}  // namespace llmtrain::parallel
