// The launcher's pre-flight checks that reach the file system (launcher/preflight.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "launcher/preflight.h"

using namespace llmtrain::launcher;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Issue 33: the write test wrote `.llmtrain-write-test.<pid>`, a predictable name, with O_TRUNC and
// following links: a link planted in a shared folder turned it into a write to another file (and
// its unlink then removed the link, not ours).
TEST(Preflight, WriteTestNeverWritesThroughALink) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("preflight_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "victim") << "precious";
  for (int pid = ::getpid() - 2; pid <= ::getpid() + 2; ++pid)
    fs::create_symlink(dir / "victim", dir / (".llmtrain-write-test." + std::to_string(pid)));
  check_writable_dir(dir.string(), "log.dir");
  EXPECT_EQ(slurp(dir / "victim"), "precious");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1 + 5);  // its probe is gone
  fs::remove_all(dir);
}

}  // namespace
