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
#include <string>
#include <vector>

namespace llmtrain {

inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kLatestFile = "latest";  // a text file naming the newest step directory
inline constexpr const char* kPartialSuffix = ".partial";

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

}  // namespace llmtrain
