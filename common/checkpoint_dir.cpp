#include "common/checkpoint_dir.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "common/error.h"
#include "common/file_io.h"
#include "common/host.h"
#include "common/json_depth.h"
#include "common/json_integer.h"
#include "common/log.h"
#include "common/strings.h"

namespace llmtrain {
namespace fs = std::filesystem;

std::string checkpoint_step_dir(int64_t step) { return fmt::format("step_{:08}", step); }

int64_t checkpoint_parse_step_dir(const std::string& name) {
  if (name.size() < 13 || name.size() > 5 + 18 || name.rfind("step_", 0) != 0) return -1;  // no int64 overflow
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

namespace {

bool is_complete(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(path) / kManifestFile, ec);
}

}  // namespace

std::string checkpoint_latest(const std::string& dir) {
  if (dir.empty()) return "";
  std::string name;
  try {
    name = trim(read_file((fs::path(dir) / kLatestFile).string(), 4096));
  } catch (const Error&) {
    return "";  // missing, unreadable or not a small regular file: scan instead
  }
  if (checkpoint_parse_step_dir(name) < 0) return "";
  const std::string path = (fs::path(dir) / name).string();
  return is_complete(path) ? path : "";
}

std::vector<std::string> checkpoint_candidates(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    int64_t step = checkpoint_parse_step_dir(e.path().filename().string());
    if (step >= 0 && e.is_directory(ec)) steps.emplace_back(step, e.path().string());
  }
  std::sort(steps.rbegin(), steps.rend());
  const std::string latest = checkpoint_latest(dir);
  const int64_t latest_step = latest.empty() ? -1 : checkpoint_parse_step_dir(fs::path(latest).filename().string());
  std::vector<std::string> out;
  if (!latest.empty()) out.push_back(latest);
  for (auto& [step, path] : steps)
    if (latest.empty() || step < latest_step) out.push_back(path);
  return out;
}

std::string checkpoint_to_resume(const std::string& dir) {
  if (dir.empty()) return "";
  for (const std::string& path : checkpoint_candidates(dir))
    if (is_complete(path)) return path;
  return "";
}

}  // namespace llmtrain

namespace llmtrain {
namespace {

std::string holder_json(const CheckpointLockHolder& h) {
  return nlohmann::json{
      {"host", h.host}, {"pid", h.pid}, {"job", h.job}, {"renewed_unix", h.renewed_unix}, {"nonce", h.nonce}}
      .dump();
}

// The holder recorded in `path`; nullopt when there is no lock file. A lock that cannot be parsed
// counts as held by nobody alive (a holder of ours never writes a partial file).
std::optional<CheckpointLockHolder> read_holder(const std::string& path) {
  std::string text;
  try {
    text = read_file(path, 4096);
  } catch (const Error&) {
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(path, ec))) return std::nullopt;
    return CheckpointLockHolder{};
  }
  CheckpointLockHolder h;
  try {
    if (json_nesting_depth(text) > kMaxJsonDepth) return CheckpointLockHolder{};  // damaged, like a parse error
    auto j = nlohmann::json::parse(text);
    h.host = j.at("host").get<std::string>();
    // Integers checked as the file gives them: a float (1e300) cast to int64_t would be undefined
    // behaviour, and an unsigned 2^64 − 1 read as −1 would make kill(pid, 0) ask about every process.
    h.pid = json_integer(j.at("pid"), "pid", "", 1, INT32_MAX);
    h.job = j.at("job").get<std::string>();
    h.renewed_unix = json_integer(j.at("renewed_unix"), "renewed_unix", "", 0, INT64_MAX);
    h.nonce = j.at("nonce").get<std::string>();
  } catch (const nlohmann::json::exception&) {
    return CheckpointLockHolder{};
  } catch (const Error&) {  // an integer out of its range: damaged, like a parse error
    return CheckpointLockHolder{};
  }
  return h;
}

int64_t now_unix() { return int64_t(::time(nullptr)); }

// Writes `h` to a temporary file beside `path` and returns its name.
std::string write_temp(const std::string& path, const CheckpointLockHolder& h) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, h.nonce);
  write_file_atomic(default_file_system(), tmp, holder_json(h));
  return tmp;
}

// Why `h` may be taken over ("" when it may not).
std::string takeover_reason(const CheckpointLockHolder& h, const CheckpointLockHolder& me, double lease_s) {
  if (h.host.empty()) return "the lock file is unreadable";
  if (!me.job.empty() && h.job == me.job) return "";  // the same job: silent
  if (h.host == me.host && h.pid > 0 && h.pid <= INT32_MAX && ::kill(pid_t(h.pid), 0) != 0 && errno == ESRCH)
    return fmt::format("its holder, pid {} on this host, is gone", h.pid);
  // In doubles: a lock file's time may be anything, and int64 subtraction could overflow.
  if (double(now_unix()) - double(h.renewed_unix) > lease_s)
    return fmt::format("its holder on {} has not renewed it for {} s (the lease is {} s)", h.host,
                       double(now_unix()) - double(h.renewed_unix), int64_t(lease_s));
  return "held";
}

}  // namespace

std::string checkpoint_job_id() {
  if (const char* s = std::getenv("SLURM_JOB_ID"); s && *s) return std::string("slurm:") + s;
  if (const char* s = std::getenv("LLMTRAIN_JOB"); s && *s) return s;
  return "";
}

std::unique_ptr<CheckpointDirLock> CheckpointDirLock::acquire(const std::string& dir, const std::string& job,
                                                              double lease_s, double grace_s) {
  default_file_system().make_dirs(dir);
  const std::string path = (fs::path(dir) / kLockFile).string();
  CheckpointLockHolder me;
  // (UTF-8 only: the lock is JSON; a job id comes from the environment.)
  me.host = utf8_sanitize(host_info().hostname);
  me.pid = int64_t(::getpid());
  me.job = utf8_sanitize(job);
  me.renewed_unix = now_unix();
  me.nonce = fmt::format("{}-{}-{}", me.pid, now_unix(), std::random_device{}());
  const std::string tmp = write_temp(path, me);
  struct Remove {
    const std::string& p;
    ~Remove() { ::unlink(p.c_str()); }
  } remove_tmp{tmp};
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(grace_s, 0.0));
  bool waiting = false;
  for (int attempt = 0; attempt < 3;) {
    if (::link(tmp.c_str(), path.c_str()) == 0)
      return std::unique_ptr<CheckpointDirLock>(new CheckpointDirLock(path, me));
    if (errno != EEXIST) throw environment_error(fmt::format("cannot create {}: {}", path, std::strerror(errno)));
    const auto held = read_holder(path);
    if (!held) {  // released meanwhile: try again
      ++attempt;
      continue;
    }
    const std::string why = takeover_reason(*held, me, lease_s);
    if (why == "held" && held->host == me.host && std::chrono::steady_clock::now() < give_up) {
      if (!waiting)
        log_info("checkpoint.dir {} is locked by pid {} on this host{}: waiting up to {} s for it to end", dir,
                 held->pid, held->job.empty() ? "" : ", job " + held->job, grace_s);
      waiting = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (why == "held")
      throw Error(fmt::format("checkpoint.dir {} is in use by another job: host {}, pid {}{}, lock renewed {} s ago{}",
                              dir, held->host, held->pid, held->job.empty() ? "" : ", job " + held->job,
                              double(now_unix()) - double(held->renewed_unix),
                              waiting ? fmt::format(" (waited {} s for it to end)", grace_s) : ""),
                  fmt::format("two jobs must not write one checkpoint directory: stop the other job or set another "
                              "checkpoint.dir; a lock whose holder died is taken over (at once on the same host, "
                              "after {} s elsewhere)",
                              int64_t(lease_s)));
    // Take it over: replace the lock, then check that ours is the one that stayed.
    if (::rename(write_temp(path, me).c_str(), path.c_str()) != 0)
      throw environment_error(fmt::format("cannot replace {}: {}", path, std::strerror(errno)));
    const auto now = read_holder(path);
    if (now && now->nonce == me.nonce) {
      if (!why.empty()) log_warn("checkpoint.dir {}: taking over its lock ({})", dir, why);
      return std::unique_ptr<CheckpointDirLock>(new CheckpointDirLock(path, me));
    }
    ++attempt;
  }
  throw Error(fmt::format("checkpoint.dir {}: another job took its lock at the same time", dir),
              "two jobs must not write one checkpoint directory: stop the other job or set another checkpoint.dir");
}

std::optional<CheckpointLockHolder> CheckpointDirLock::recorded(const std::string& dir) {
  return read_holder((fs::path(dir) / kLockFile).string());
}

void CheckpointDirLock::renew() {
  const auto now = read_holder(path_);
  if (!now || now->nonce != me_.nonce)
    throw Error(fmt::format("the lock {} was taken over by another job{}", path_,
                            now ? fmt::format(" (host {}, pid {})", now->host, now->pid) : std::string(" (removed)")),
                "two jobs must not write one checkpoint directory: this one stops; its checkpoints are intact");
  me_.renewed_unix = now_unix();
  const std::string tmp = write_temp(path_, me_);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw environment_error(fmt::format("cannot renew {}: {}", path_, std::strerror(errno)));
  }
}

CheckpointDirLock::~CheckpointDirLock() {
  const auto now = read_holder(path_);
  if (now && now->nonce == me_.nonce) ::unlink(path_.c_str());
}

}  // namespace llmtrain
