// Atomic writes under injected faults: whichever operation fails, the previous contents survive
// and no temporary file is left behind. Reads: only regular files, of bounded size.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

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

std::string read_error(const std::string& path, int64_t max_bytes = kReadFileLimit) {
  try {
    read_file(path, max_bytes);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(FileIo, ReadsOnlyRegularFilesOfBoundedSize) {
  fs::path d = temp_dir();
  // A FIFO with no writer would block the open, /dev/zero never end: both refused at once.
  const fs::path fifo = d / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(read_error(fifo.string()).find("not a regular file"), std::string::npos);
  EXPECT_NE(read_error("/dev/zero").find("not a regular file"), std::string::npos);
  EXPECT_NE(read_error(d.string()).find("not a regular file"), std::string::npos);
  std::ofstream(d / "big") << std::string(1000, 'x');
  EXPECT_NE(read_error((d / "big").string(), 999).find("1000 bytes, more than the 999"), std::string::npos);
  EXPECT_EQ(read_file((d / "big").string(), 1000), std::string(1000, 'x'));
  EXPECT_EQ(read_file((d / "big").string()).size(), 1000u);
  fs::remove_all(d);
}

// Issue 33: temporaries had predictable names (`<path>.tmp.<pid>`) and were opened with O_TRUNC and
// without O_NOFOLLOW, so a link planted at that name made the write land in another file.
TEST(FileIo, AtomicWriteNeverWritesThroughALinkAtATemporaryName) {
  fs::path d = temp_dir();
  const fs::path victim = d / "victim", path = d / "out.txt";
  std::ofstream(victim) << "precious";
  // Links at the names an attacker could predict: the old scheme's, and a few pids around ours.
  for (int pid = ::getpid() - 2; pid <= ::getpid() + 2; ++pid)
    fs::create_symlink(victim, d / ("out.txt.tmp." + std::to_string(pid)));
  write_file_atomic(default_file_system(), path.string(), "new contents");
  EXPECT_EQ(read_file(victim.string()), "precious");
  EXPECT_EQ(read_file(path.string()), "new contents");
  EXPECT_FALSE(fs::is_symlink(path));
  // The planted links are left alone (not ours to delete), and no temporary of ours stays.
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator{}), 2 + 5);
  fs::remove_all(d);
}

TEST(FileIo, CreateIsExclusiveAndNeverFollowsALink) {
  fs::path d = temp_dir();
  const fs::path victim = d / "victim";
  std::ofstream(victim) << "precious";
  fs::create_symlink(victim, d / "link");
  EXPECT_THROW(default_file_system().create((d / "link").string()), Error);
  EXPECT_THROW(default_file_system().create(victim.string()), Error);  // an existing file: not truncated
  EXPECT_EQ(read_file(victim.string()), "precious");
  // A link at a log's name is not appended through either.
  EXPECT_EQ(open_append((d / "link").string()), nullptr);
  EXPECT_EQ(read_file(victim.string()), "precious");
  std::FILE* log = open_append((d / "log").string());
  ASSERT_NE(log, nullptr);
  std::fclose(log);
  fs::remove_all(d);
}

TEST(FileIo, TemporariesAreNewFilesOfUnpredictableNames) {
  fs::path d = temp_dir();
  std::string a, b;
  const int fa = create_temp_file((d / "x").string(), &a), fb = create_temp_file((d / "x").string(), &b);
  ::close(fa), ::close(fb);
  EXPECT_NE(a, b);
  const std::string prefix = (d / "x.tmp.").string();
  ASSERT_EQ(a.rfind(prefix, 0), 0u) << a;
  EXPECT_EQ(a.substr(prefix.size()).find(std::to_string(::getpid())), std::string::npos) << a;
  EXPECT_EQ(random_name_suffix().size(), 16u);
  EXPECT_NE(random_name_suffix(), random_name_suffix());
  const std::string dir = make_temp_dir((d / "out.partial").string());
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_NE(dir, make_temp_dir((d / "out.partial").string()));
  fs::remove_all(d);
}

}  // namespace
