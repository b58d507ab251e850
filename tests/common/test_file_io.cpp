// Atomic writes under injected faults: whichever operation fails, the previous contents survive
// and no temporary file is left behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "common/error.h"
#include "common/file_io.h"

using namespace llmtrain;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("llmtrain_fileio_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(FileIo, AtomicWriteReplacesContents) {
  fs::path d = temp_dir();
  std::string path = (d / "a.txt").string();
  write_file_atomic(default_file_system(), path, "first");
  EXPECT_EQ(read_file(path), "first");
  write_file_atomic(default_file_system(), path, "second");
  EXPECT_EQ(read_file(path), "second");
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator{}), 1);
  fs::remove_all(d);
}

TEST(FileIo, EveryFailurePointKeepsOldContents) {
  fs::path d = temp_dir();
  std::string path = (d / "a.txt").string();
  write_file_atomic(default_file_system(), path, "old");
  // Count the operations of one atomic write, then fail each in turn.
  FaultyFileSystem counter(default_file_system());
  write_file_atomic(counter, path, "old");
  long ops = counter.operations();
  ASSERT_GE(ops, 4);  // create, append, sync, rename (+ sync_dir)
  for (long i = 1; i <= ops; ++i) {
    FaultyFileSystem faulty(default_file_system());
    faulty.fail_at(i, ENOSPC);
    try {
      write_file_atomic(faulty, path, "new");
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("disk is full"), std::string::npos);
    }
    ASSERT_TRUE(faulty.failed()) << "operation " << i;
    std::string now = read_file(path);
    // Failing before the rename keeps the old file; failing the directory fsync after it has the new one.
    EXPECT_TRUE(now == "old" || (now == "new" && i == ops)) << "operation " << i << " left: " << now;
    EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator{}), 1) << "temporary left behind";
    write_file_atomic(default_file_system(), path, "old");
  }
  fs::remove_all(d);
}

TEST(FileIo, ErrorsNameThePath) {
  try {
    write_file_atomic(default_file_system(), "/nonexistent-dir/x/y.txt", "x");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x/y.txt"), std::string::npos) << e.what();
  }
  try {
    read_file("/nonexistent-dir/z");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read /nonexistent-dir/z"), std::string::npos) << e.what();
  }
}

}  // namespace
