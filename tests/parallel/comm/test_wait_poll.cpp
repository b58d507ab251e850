// The bounded polling loop: it returns when the poll says done, gives up (-1) once the timeout
// has passed, never earlier, and lets a poll's exception through.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>

#include "parallel/comm/wait_poll.h"

namespace llmtrain::parallel {
namespace {

TEST(WaitPoll, ReturnsWhenDone) {
  int polls = 0;
  double waited = wait_poll([&] { return ++polls == 3 ? Poll::done : Poll::pending; }, 10.0);
  EXPECT_GE(waited, 0.0);
  EXPECT_EQ(polls, 3);
}

TEST(WaitPoll, GivesUpAfterTheTimeoutAndNotBefore) {
  const auto start = std::chrono::steady_clock::now();
  int polls = 0;
  double waited = wait_poll(
      [&] {
        ++polls;
        return polls % 7 == 0 ? Poll::progressed : Poll::pending;
      },
      0.05);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(waited, -1.0);
  EXPECT_GE(elapsed, 0.05);
  EXPECT_GT(polls, 1);
}

TEST(WaitPoll, ExceptionsFromThePollPropagate) {
  EXPECT_THROW(wait_poll([]() -> Poll { throw std::runtime_error("MPI failed"); }, 1.0), std::runtime_error);
}

}  // namespace
}  // namespace llmtrain::parallel
