// What changed between the recipe a checkpoint was written with and the recipe that resumes it,
// and which of those changes a resume takes without being told.
//
// Both recipes are compared as recipe_to_yaml writes them (cli/recipe_emit.h: every key resolved,
// one `key: value` line each, sections by indentation), so the comparison needs no parser and
// reads a manifest's recipe as safely as any other text. A change is one of:
//  - meaning: it changes what the run computes (the model, the data's tokenizer... the schedule,
//    the learning rate, the batch, the seed, the precision): refused unless the user allows it by
//    key (`--allow-change train.steps`), by section (`--allow-change optimizer`) or all of them
//    (`--allow-change all`);
//  - harmless: how the run is carried out or reported (the layout, threads, micro-batch, logging,
//    evaluation and checkpoint cadence, the launch): taken, with one line saying so;
//  - by contents: data.train and data.valid name files whose contents the checkpoint identifies
//    (trainer/checkpoint/checkpointer.h): the same data at another path resumes, other data is
//    refused there, unless `--allow-change data.train`.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace llmtrain {

// A recipe's values by dotted key ("optimizer.lr" → "0.001"), from recipe_to_yaml's text. A value
// that continues on the lines below its key (data.train's list) is those lines joined by "; ".
std::map<std::string, std::string> recipe_yaml_values(const std::string& yaml);

struct RecipeChange {
  std::string key;           // "train.steps"
  std::string saved;         // the checkpoint's value
  std::string now;           // this recipe's
  std::string text_suffix;   // what else it carries (" (optimizer.decay_steps, auto, with it)")
  std::string text() const;  // "train.steps 200 → 400"
};

// The keys whose values differ, in key order. A key only one of them has (a key added to the schema
// since the checkpoint was written) is not a change.
std::vector<RecipeChange> recipe_changes(const std::string& saved_yaml, const std::string& this_yaml);

enum class ChangeKind { meaning, harmless, by_contents };
ChangeKind change_kind(const std::string& key);

// Whether `allowed` (the --allow-change values: keys, sections, "all") covers `key`.
bool change_allowed(const std::string& key, const std::vector<std::string>& allowed);

struct ResumeChanges {
  std::vector<RecipeChange> refused;   // meaning, not allowed
  std::vector<RecipeChange> allowed;   // meaning or by contents, allowed by the user
  std::vector<RecipeChange> harmless;  // taken without being told
};
// A resolved auto value that follows another key in both recipes (optimizer.decay_steps =
// train.steps, model.max_positions = model.seq_len) is not a change of its own: the other key's
// change carries it.
ResumeChanges classify_resume_changes(const std::string& saved_yaml, const std::string& this_yaml,
                                      const std::vector<std::string>& allowed);

// Throws llmtrain::Error (user kind) when `changes.refused` is not empty: each change with both
// values, and the --allow-change that takes them. `checkpoint` names the step directory.
void require_resume_changes_allowed(const ResumeChanges& changes, const std::string& checkpoint);

}  // namespace llmtrain
