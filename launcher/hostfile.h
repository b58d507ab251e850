// Open MPI hostfiles (`launch.hostfile`): one host per line, `host [slots=N] [max_slots=N]`,
// `#` starts a comment. The launcher reads it before any rank starts so that a typo is an error
// naming the file and line, not a message from mpirun halfway through start-up.
//
// Rule a reader could get wrong: with a hostfile the world is hosts × launch.procs_per_node
// (mpirun maps `ppr:<procs_per_node>:node`), not the sum of the slots; slots only bound how many
// ranks a host may take, so a host with fewer slots than launch.procs_per_node is an error.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace llmtrain::launcher {

struct HostfileEntry {
  std::string host;
  int slots = 0;  // 0 = not given (the host takes launch.procs_per_node ranks)
  int line = 0;   // 1-based line in the file
};

struct Hostfile {
  std::string path;
  std::vector<HostfileEntry> hosts;  // in file order; each host once
};

// Parses hostfile text; `path` names it in errors ("hosts.txt:3: ..."). Throws llmtrain::Error.
Hostfile hostfile_parse(std::string_view text, const std::string& path);
// Reads and parses a hostfile. Throws llmtrain::Error when it is unreadable, empty or malformed.
Hostfile hostfile_read(const std::string& path);

}  // namespace llmtrain::launcher
