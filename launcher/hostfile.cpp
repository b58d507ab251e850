#include "launcher/hostfile.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/strings.h"

namespace llmtrain::launcher {
namespace {

bool parse_positive(std::string_view s, int& out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v <= 0) return false;
  out = v;
  return true;
}

}  // namespace

Hostfile hostfile_parse(std::string_view text, const std::string& path) {
  Hostfile hf;
  hf.path = path;
  const char* kHint = "each line is `host [slots=N] [max_slots=N]` (Open MPI's hostfile format); `#` starts a comment";
  int line_no = 0;
  for (const std::string& raw : split(text, '\n')) {
    ++line_no;
    std::string line = raw;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::vector<std::string> tokens;
    std::istringstream in(line);
    for (std::string t; in >> t;) tokens.push_back(t);
    if (tokens.empty()) continue;
    auto where = fmt::format("{}:{}", path, line_no);
    HostfileEntry e;
    e.host = tokens[0];
    e.line = line_no;
    if (e.host.find('=') != std::string::npos)
      throw Error(fmt::format("{}: expected a host name first, found '{}'", where, e.host), kHint);
    int max_slots = 0;
    for (size_t i = 1; i < tokens.size(); ++i) {
      const std::string& t = tokens[i];
      auto eq = t.find('=');
      std::string key = eq == std::string::npos ? t : t.substr(0, eq);
      std::string value = eq == std::string::npos ? "" : t.substr(eq + 1);
      int* target = key == "slots" ? &e.slots : (key == "max_slots" || key == "max-slots") ? &max_slots : nullptr;
      if (!target) throw Error(fmt::format("{}: unknown field '{}' for host {}", where, t, e.host), kHint);
      if (!parse_positive(value, *target))
        throw Error(fmt::format("{}: {} must be a positive integer, found '{}'", where, key, value), kHint);
    }
    if (max_slots > 0 && e.slots > max_slots)
      throw Error(fmt::format("{}: host {} has slots={} above max_slots={}", where, e.host, e.slots, max_slots), kHint);
    if (e.slots == 0 && max_slots > 0) e.slots = max_slots;
    for (const auto& prev : hf.hosts)
      if (prev.host == e.host)
        throw Error(fmt::format("{}: host {} is listed twice (lines {} and {})", where, e.host, prev.line, line_no),
                    "list each host once and give its rank count with slots=N");
    hf.hosts.push_back(std::move(e));
  }
  if (hf.hosts.empty())
    throw Error(fmt::format("{}: the hostfile lists no hosts", path), std::string("add one line per host: ") + kHint);
  return hf;
}

Hostfile hostfile_read(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw Error(fmt::format("{}: cannot read launch.hostfile: {}", path, std::strerror(errno)),
                "check the path (relative paths are relative to the current directory) and its permissions");
  std::stringstream ss;
  ss << in.rdbuf();
  return hostfile_parse(ss.str(), path);
}

}  // namespace llmtrain::launcher
