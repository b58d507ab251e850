// Facts about this host that several parts need: usable cores, memory, names.
#pragma once

#include <cstdint>
#include <string>

namespace llmtrain {

struct HostInfo {
  std::string hostname;
  std::string os;         // "Linux 6.1.0 x86_64"
  std::string cpu_model;  // from /proc/cpuinfo
  int cores_online = 0;   // logical CPUs online
  int cores_usable = 0;   // CPUs in this process's affinity mask (what threads can use)
  int64_t memory_total = 0;
  int64_t memory_available = 0;
};

HostInfo host_info();
// Throws llmtrain::Error (environment kind) when `bytes` exceed what this host can give now: its
// available memory (MemAvailable), and the address-space limit (ulimit -v) when there is one.
// `what` says what needs them ("the model the manifest describes"). Sizes that a file states are
// checked against the file first, then here, before anything is allocated.
void require_host_memory(int64_t bytes, const std::string& what);
int usable_cores();
// Threads runnable on this host right now (/proc/loadavg's fourth field, the caller included; the
// least of 5 readings over 40 ms), or -1 when it cannot be read.
int runnable_threads();
// The absolute path of this program (/proc/self/exe), for re-running it as ranks; "llmtrain" when
// it cannot be read.
std::string executable_path();

}  // namespace llmtrain
