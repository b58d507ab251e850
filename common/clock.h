// The monotonic clock in seconds, for durations (step times, timeouts, communication stats). Not a
// wall-clock time: only differences of two readings mean anything.
#pragma once

#include <chrono>

namespace llmtrain {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace llmtrain
