#include "common/host.h"

#include <fmt/format.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/strings.h"

namespace llmtrain {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int runnable_threads() {
  // "0.52 0.58 0.59 3/412 12345": the fourth field is runnable/total scheduling entities, now. The
  // least of a few readings 10 ms apart: a thread that ran for a moment (a shell, a pipe's reader)
  // is not load.
  int least = -1;
  for (int i = 0; i < 5; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::ifstream in("/proc/loadavg");
    std::string a, b, c, run;
    if (!(in >> a >> b >> c >> run)) return -1;
    const size_t slash = run.find('/');
    const std::optional<int> n = slash == std::string::npos ? std::nullopt : parse_small_count(run.substr(0, slash));
    if (!n) return -1;
    least = least < 0 ? *n : std::min(least, *n);
  }
  return least;
}

static int64_t meminfo_kib(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (starts_with(line, key + ":")) {
      std::istringstream ss(line.substr(key.size() + 1));
      int64_t v = 0;
      ss >> v;
      return v;
    }
  }
  return 0;
}

std::string executable_path() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("llmtrain") : p.string();
}

HostInfo host_info() {
  HostInfo h;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0) h.hostname = name;
  utsname u{};
  if (uname(&u) == 0) h.os = std::string(u.sysname) + " " + u.release + " " + u.machine;
  std::ifstream cpu("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpu, line)) {
    if (starts_with(line, "model name")) {
      auto colon = line.find(':');
      if (colon != std::string::npos) h.cpu_model = trim(line.substr(colon + 1));
      break;
    }
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  h.cores_online = online > 0 ? static_cast<int>(online) : 1;
  h.cores_usable = usable_cores();
  h.memory_total = meminfo_kib("MemTotal") * 1024;
  h.memory_available = meminfo_kib("MemAvailable") * 1024;
  return h;
}

void require_host_memory(int64_t bytes, const std::string& what) {
  int64_t limit = meminfo_kib("MemAvailable") * 1024;
  const char* which = "available memory";
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY && (limit <= 0 || int64_t(as.rlim_cur) < limit))
    limit = int64_t(as.rlim_cur), which = "address-space limit (ulimit -v)";
  if (limit <= 0 || bytes <= limit) return;  // (no /proc/meminfo: nothing to check against)
  throw environment_error(fmt::format("{} needs {} of memory, more than this host's {} of {}", what,
                                      format_bytes(double(bytes)), which, format_bytes(double(limit))),
                          "run it on a machine with more memory; if the size is unexpected, the file stating it is "
                          "damaged or was not written for this");
}

}  // namespace llmtrain
