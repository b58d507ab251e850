#include "launcher/hostfile.h"

#include <fmt/format.h>

#include <sstream>

#include "common/error.h"
#include "common/file_io.h"
#include "common/strings.h"

namespace llmtrain::launcher {
namespace {

// [user@]host, where host is a DNS name, an IPv4 address or an IPv6 address, and user a login
// name: nothing that ssh could read as an option ("-oProxyCommand=...") or a shell as syntax.
bool is_host_name(std::string_view s) {
  static const std::string alnum = std::string(kLetters) + std::string(kDigits);
  if (const size_t at = s.find('@'); at != std::string_view::npos) {
    if (!is_word(s.substr(0, at), alnum + "_", alnum + "._-")) return false;
    s = s.substr(at + 1);
  }
  return s.size() <= 253 && is_word(s, alnum, alnum + ".-_:");
}

// The text with bytes outside printable ASCII as \xNN, for an error message.
std::string printable(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    out += u >= 0x20 && u < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", u);
  }
  return out;
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
    if (!is_host_name(e.host))
      throw Error(fmt::format("{}: '{}' is not a host name", where, printable(e.host)),
                  "a host is a name or an address (letters, digits, '.', '-', '_', ':'; not starting with '-'), "
                  "optionally user@host: ssh and mpirun would take anything else as an option or a command");
    int max_slots = 0;
    for (size_t i = 1; i < tokens.size(); ++i) {
      const std::string& t = tokens[i];
      auto eq = t.find('=');
      std::string key = eq == std::string::npos ? t : t.substr(0, eq);
      std::string value = eq == std::string::npos ? "" : t.substr(eq + 1);
      int* target = key == "slots" ? &e.slots : (key == "max_slots" || key == "max-slots") ? &max_slots : nullptr;
      if (!target) throw Error(fmt::format("{}: unknown field '{}' for host {}", where, t, e.host), kHint);
      const std::optional<int> n = parse_small_count(value);
      if (!n || *n <= 0)
        throw Error(fmt::format("{}: {} must be a positive integer, found '{}'", where, key, value), kHint);
      *target = *n;
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
  std::string text;
  try {
    text = read_file(path, 1 << 20);
  } catch (const Error& e) {
    throw Error(fmt::format("launch.hostfile: {}", e.what()),
                "check the path (relative paths are relative to the current directory) and its permissions");
  }
  return hostfile_parse(text, path);
}

}  // namespace llmtrain::launcher
