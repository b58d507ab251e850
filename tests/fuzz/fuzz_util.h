// Shared by the libFuzzer targets (tests/fuzz/fuzz_*.cpp, built only with LLMTRAIN_SANITIZE).
//
// A target feeds one input to one reader of untrusted files. llmtrain::Error (and the recipe's
// RecipeError) is the reader refusing the input — the wanted outcome; anything else that escapes
// (another exception type, an ASan or UBSan report, a signal, a hang past -timeout) is a finding.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/log.h"

namespace llmtrain::fuzz {

inline std::string_view bytes(const uint8_t* data, size_t size) { return {reinterpret_cast<const char*>(data), size}; }

// An in-memory regular file (memfd) holding `contents`, named by /proc/self/fd/N.
class MemFile {
 public:
  explicit MemFile(std::string_view contents) : fd_(::memfd_create("fuzz", 0)) {
    if (fd_ < 0) std::abort();
    size_t done = 0;
    while (done < contents.size()) {
      ssize_t n = ::write(fd_, contents.data() + done, contents.size() - done);
      if (n <= 0) std::abort();
      done += size_t(n);
    }
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// One directory per process for targets whose reader wants names of its own (an .idx beside its
// .bin): /dev/shm when there is one, so that the disk is never touched.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path base =
        std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    std::filesystem::path d = base / ("llmtrain-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), std::streamsize(contents.size()));
  if (!out) std::abort();
}

// Quiet logs: a reader's warnings would flood the fuzzer's output.
inline void quiet() {
  static const bool once = [] {
    log_set_level(LogLevel::error);
    return true;
  }();
  (void)once;
}

}  // namespace llmtrain::fuzz
