#include "common/recipe/recipe_changes.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <utility>

#include "common/error.h"
#include "common/strings.h"

namespace llmtrain {
namespace {

// Keys (or sections, ending in '.') whose changes a resume takes without being told: how the run
// is laid out, carried out and reported, not what it computes.
constexpr std::array<const char*, 12> kHarmless = {
    "name",
    "parallel.",
    "launch.",
    "log.",
    "eval.",
    "checkpoint.",
    "train.device",
    "train.threads",
    "train.micro_batch",
    "train.activation_checkpointing",
    "train.on_nonfinite",
    "train.max_skipped_steps",
};
// Files the checkpoint identifies by their contents (the data's documents and tokens), not by path.
constexpr std::array<const char*, 2> kByContents = {"data.train", "data.valid"};

// Keys whose auto value is another key's: {derived, source}.
constexpr std::array<std::pair<const char*, const char*>, 4> kFollows = {{
    {"optimizer.decay_steps", "train.steps"},
    {"model.max_positions", "model.seq_len"},
    {"optimizer.muon.adamw_lr", "optimizer.lr"},
    {"optimizer.muon.adamw_weight_decay", "optimizer.weight_decay"},
}};

bool covers(const std::string& pattern, const std::string& key) {
  if (pattern.ends_with('.')) return key.starts_with(pattern);
  return key == pattern;
}

}  // namespace

std::map<std::string, std::string> recipe_yaml_values(const std::string& yaml) {
  std::map<std::string, std::string> values;
  std::vector<std::string> path;  // the sections open at each depth
  std::string list_key;           // the key whose value may continue below it as "- item" lines
  for (const std::string& line : split(yaml, '\n')) {
    const size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos || line[indent] == '#') continue;
    if (line.compare(indent, 2, "- ") == 0) {  // an item of the list above ("    - {path: ..., weight: 1}")
      if (!list_key.empty()) values[list_key] += (values[list_key].empty() ? "" : "; ") + trim(line.substr(indent + 2));
      continue;
    }
    list_key.clear();
    const size_t colon = line.find(':', indent);
    if (colon == std::string::npos) continue;
    path.resize(std::min(path.size(), indent / 2));
    std::string dotted;
    for (const std::string& p : path) dotted += p + ".";
    dotted += line.substr(indent, colon - indent);
    const std::string value = trim(line.substr(colon + 1));
    if (value.empty()) {  // a section, or a key whose value is the list below it
      path.push_back(line.substr(indent, colon - indent));
      list_key = dotted;
      continue;
    }
    values[dotted] = value;
  }
  return values;
}

std::string RecipeChange::text() const { return fmt::format("{} {} → {}{}", key, saved, now, text_suffix); }

std::vector<RecipeChange> recipe_changes(const std::string& saved_yaml, const std::string& this_yaml) {
  const auto saved = recipe_yaml_values(saved_yaml), now = recipe_yaml_values(this_yaml);
  std::vector<RecipeChange> out;
  for (const auto& [key, value] : now) {
    auto it = saved.find(key);
    if (it != saved.end() && it->second != value) out.push_back({key, printable(it->second), printable(value), ""});
  }
  return out;
}

ChangeKind change_kind(const std::string& key) {
  for (const char* p : kByContents)
    if (covers(p, key)) return ChangeKind::by_contents;
  for (const char* p : kHarmless)
    if (covers(p, key)) return ChangeKind::harmless;
  return ChangeKind::meaning;
}

bool change_allowed(const std::string& key, const std::vector<std::string>& allowed) {
  return std::any_of(allowed.begin(), allowed.end(), [&](const std::string& a) {
    return a == "all" || a == key || (key.starts_with(a) && key.size() > a.size() && key[a.size()] == '.');
  });
}

constexpr const char* kOptimizerNameKey = "optimizer.name";

ResumeChanges classify_resume_changes(const std::string& saved_yaml, const std::string& this_yaml,
                                      const std::vector<std::string>& allowed) {
  ResumeChanges out;
  std::vector<RecipeChange> changes = recipe_changes(saved_yaml, this_yaml);
  // A checkpoint from before optimizer.name existed is AdamW's.
  if (const auto now = recipe_yaml_values(this_yaml); now.contains(kOptimizerNameKey) &&
                                                      !recipe_yaml_values(saved_yaml).contains(kOptimizerNameKey) &&
                                                      now.at(kOptimizerNameKey) != "adamw")
    changes.push_back({kOptimizerNameKey, "adamw", now.at(kOptimizerNameKey), ""});
  // A resolved auto value that follows another key in both recipes is not a change of its own: the
  // other key's change carries it.
  for (const auto& [derived, source] : kFollows) {
    auto find = [&](const char* key) {
      return std::find_if(changes.begin(), changes.end(), [&](const RecipeChange& c) { return c.key == key; });
    };
    auto from = find(source), with = find(derived);
    if (from == changes.end() || with == changes.end() || from->saved != with->saved || from->now != with->now)
      continue;
    from->text_suffix += fmt::format(" ({}, auto, with it)", derived);
    changes.erase(with);
  }
  for (RecipeChange& c : changes) {
    const ChangeKind kind = change_kind(c.key);
    if (c.key == kOptimizerNameKey)  // the state is another optimizer's: no --allow-change takes it
      out.refused.push_back(std::move(c));
    else if (kind == ChangeKind::harmless)
      out.harmless.push_back(std::move(c));
    else if (change_allowed(c.key, allowed))
      out.allowed.push_back(std::move(c));
    else if (kind == ChangeKind::meaning)
      out.refused.push_back(std::move(c));
    // by contents and not allowed: the checkpoint's data identity decides (same data elsewhere resumes)
  }
  return out;
}

void require_resume_changes_allowed(const ResumeChanges& changes, const std::string& checkpoint) {
  if (changes.refused.empty()) return;
  for (const RecipeChange& c : changes.refused)
    if (c.key == kOptimizerNameKey)
      throw Error(fmt::format("resuming {}: optimizer.name is {} there and {} in this recipe: the checkpoint's "
                              "optimizer state is {}'s, which {} cannot continue",
                              checkpoint, c.saved, c.now, c.saved, c.now),
                  fmt::format("resume it with optimizer.name: {}, or set checkpoint.load_weights_only: true to start "
                              "{} from its weights (a new run: step, optimizer state and data position start fresh)",
                              c.saved, c.now));
  std::vector<std::string> texts, keys;
  for (const RecipeChange& c : changes.refused) {
    texts.push_back(c.text());
    keys.push_back(c.key);
  }
  throw Error(
      fmt::format("resuming {}: this recipe changes what the run computes since that checkpoint was written: {}",
                  checkpoint, join(texts, ", ")),
      fmt::format("resume with the checkpoint's values (its manifest.json holds its recipe), or accept the change{} "
                  "with --allow-change {} (a changed train.steps or optimizer.decay_steps continues the schedule from "
                  "the current learning rate to min_lr at the new end, without a jump; any other schedule change "
                  "applies as written from this step); checkpoint.load_weights_only: true starts a new run from its "
                  "weights instead",
                  changes.refused.size() == 1 ? "" : "s", join(keys, ",")));
}

}  // namespace llmtrain
