// The layout of a checkpoint directory, as far as anyone outside the trainer needs it: how step
// directories are named, which of them are complete, and which is newest. The launcher restarts
// a job from the newest complete one; `generate` and resume list them. What is inside a step
// directory (shards and manifest) is the trainer's format (trainer/checkpoint/checkpoint_format.h,
// docs/checkpoint-format.md).
//
// Rules a reader could get wrong:
//  - A step directory is complete once it holds manifest.json (it is renamed from
//    `step_<N>.partial/` only after everything in it was written and synced).
//  - `latest` is the truth: it names the checkpoint the run last committed, which is not always
//    the highest step. After a rollback (`checkpoint.resume: <older step>`) the run's new
//    checkpoints have lower steps than the abandoned ones beside them, and a restart must continue
//    the new line. Directories are scanned by step only when `latest` is missing or names nothing
//    complete (a crash between the rename and `latest`'s replacement then costs that one save).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace llmtrain {

inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kLatestFile = "latest";  // a text file naming the newest step directory
inline constexpr const char* kPartialSuffix = ".partial";
inline constexpr const char* kLockFile = "lock";  // JSON: the job that writes this directory

// "step_00000100"
std::string checkpoint_step_dir(int64_t step);
// The step of a directory name, or -1 when the name is not a step directory.
int64_t checkpoint_parse_step_dir(const std::string& name);

// The step directory `latest` names in `dir` (its path) when that directory is complete; else "".
std::string checkpoint_latest(const std::string& dir);

// The step directories to resume from, in the order to try them (complete or not; `.partial`
// never counts): what `latest` names, then the older ones newest first; when `latest` names
// nothing complete, every step directory newest first. Empty when `dir` does not exist.
std::vector<std::string> checkpoint_candidates(const std::string& dir);

// The first complete checkpoint of checkpoint_candidates (its path), "" when there is none: what a
// restart resumes from.
std::string checkpoint_to_resume(const std::string& dir);

// One job writes a checkpoint directory at a time. The lock is `<dir>/lock`, created exclusively
// (a temporary file hard-linked into place) and naming its holder: host, pid, job and when it was
// last renewed. Taking a held lock:
//  - the same job (a restart by the launcher, a Slurm requeue on another host): taken over;
//  - a holder on this host whose pid is gone: taken over with a warning;
//  - a holder not renewed for `lease_s` (a dead job on another host): taken over with a warning;
//  - a live holder on this host is waited for, up to `grace_s` (saying so): a job whose launcher
//    returned after one rank failed can still be ending its other ranks, which release the lock
//    as they exit, so that an immediate rerun is not refused;
//  - otherwise refused, naming the holder.
// The holder renews the lock while it runs (renew(), at most every few seconds is plenty) and
// removes it when it ends; a crash leaves it for the rules above.
struct CheckpointLockHolder {
  std::string host;
  int64_t pid = 0;
  std::string job;           // SLURM_JOB_ID, the launcher's LLMTRAIN_JOB, or "" (one process)
  int64_t renewed_unix = 0;  // seconds since the epoch
  std::string nonce;         // tells two takers apart
};

class CheckpointDirLock {
 public:
  static constexpr double kDefaultLease = 300;
  static constexpr double kDefaultGrace = 10;
  // Throws llmtrain::Error (user kind) naming the holder when the directory is held.
  static std::unique_ptr<CheckpointDirLock> acquire(const std::string& dir, const std::string& job,
                                                    double lease_s = kDefaultLease, double grace_s = kDefaultGrace);
  // The holder recorded in `dir`'s lock (host empty when the file is unreadable); nullopt when
  // there is no lock. Reads only: for a tool that must refuse a directory in use.
  static std::optional<CheckpointLockHolder> recorded(const std::string& dir);
  ~CheckpointDirLock();  // removes the lock when it is still ours
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

  // Rewrites the renewal time; throws when another job has taken the lock over meanwhile.
  void renew();
  const CheckpointLockHolder& holder() const { return me_; }

 private:
  CheckpointDirLock(std::string path, CheckpointLockHolder me) : path_(std::move(path)), me_(std::move(me)) {}
  std::string path_;
  CheckpointLockHolder me_;
};

// This process's job: SLURM_JOB_ID, else LLMTRAIN_JOB (set by `llmtrain run`'s supervisor for its
// ranks), else "".
std::string checkpoint_job_id();

}  // namespace llmtrain
