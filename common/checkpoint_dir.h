// The layout of a checkpoint directory, as far as anyone outside the trainer needs it: how step
// directories are named, which of them are complete, and which is newest. The launcher restarts
// a job from the newest complete one; `generate` and resume list them. What is inside a step
// directory (shards and manifest) is the trainer's format (trainer/checkpoint/checkpoint_format.h,
// docs/checkpoint-format.md).
//
// Rule a reader could get wrong: a step directory is complete once it holds manifest.json (it is
// renamed from `step_<N>.partial/` only after everything in it was written and synced), and
// `latest` is replaced after that rename — so after a crash between the two, the newest complete
// directory is newer than the one `latest` names. Listing by step finds it either way.
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

// The step directories in `dir`, newest first (complete or not; `.partial` never counts). Empty
// when `dir` does not exist.
std::vector<std::string> checkpoint_candidates(const std::string& dir);

// The newest complete checkpoint in `dir` (its path): the step directory with the highest step
// that holds a manifest.json. "" when there is none.
std::string checkpoint_newest_complete(const std::string& dir);

}  // namespace llmtrain
