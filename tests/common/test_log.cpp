// Progress messages come from one rank: with ranks as threads of one process (ranks_in_process),
// each thread's own setting decides, and a thread that set none follows the process's.
#include <gtest/gtest.h>

#include <thread>

#include "common/log.h"

using llmtrain::log_progress_enabled;
using llmtrain::log_set_progress;

TEST(LogProgress, EachThreadKeepsItsOwnSetting) {
  bool root_sees = false, other_sees = true;
  std::thread root([&] {
    log_set_progress(true);
    std::thread other([&] {
      log_set_progress(false);  // set after the root's: a process-wide flag would silence the root
      other_sees = log_progress_enabled();
    });
    other.join();
    root_sees = log_progress_enabled();
  });
  root.join();
  EXPECT_TRUE(root_sees);
  EXPECT_FALSE(other_sees);
}

TEST(LogProgress, AThreadThatSetNoneFollowsTheProcess) {
  bool seen = true;
  log_set_progress(false);  // as a non-root rank's main thread does
  std::thread writer([&] { seen = log_progress_enabled(); });
  writer.join();
  EXPECT_FALSE(seen);
  log_set_progress(true);
}
