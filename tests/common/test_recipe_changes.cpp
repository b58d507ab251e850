// Which recipe changes a resume takes (common/recipe/recipe_changes.h), on text as recipe_to_yaml
// writes it.
#include <gtest/gtest.h>

#include "common/error.h"
#include "common/recipe/recipe_changes.h"

namespace llmtrain {
namespace {

std::string recipe(const std::string& steps, const std::string& lr, const std::string& every,
                   const std::string& train = "data/a") {
  return "name: r\n"
         "model:\n  family: gpt2\n  layers: 2\n  moe:\n    experts: 0\n"
         "data:\n  tokenizer: byte\n  train:\n    - {path: " +
         train +
         ", weight: 1}\n  valid: null\n"
         "train:\n  steps: " +
         steps + "\n  micro_batch: 2\n  loss_scale:\n    initial: 65536\n" + "optimizer:\n  lr: " + lr +
         "\n  decay_steps: " + steps + "\nlog:\n  every: " + every + "\n";
}

TEST(RecipeChanges, ValuesByDottedKeyWithListsJoined) {
  const auto v = recipe_yaml_values(recipe("200", "0.001", "10", "data/a") + "x:\n  list:\n    - a\n    - b\n");
  EXPECT_EQ(v.at("model.layers"), "2");
  EXPECT_EQ(v.at("model.moe.experts"), "0");
  EXPECT_EQ(v.at("train.loss_scale.initial"), "65536");
  EXPECT_EQ(v.at("optimizer.lr"), "0.001");
  EXPECT_EQ(v.at("data.train"), "{path: data/a, weight: 1}");
  EXPECT_EQ(v.at("data.valid"), "null");
  EXPECT_EQ(v.at("x.list"), "a; b");
  EXPECT_EQ(v.count("model"), 0u);
}

TEST(RecipeChanges, MeaningRefusedHarmlessTakenDataByContents) {
  const std::string saved = recipe("200", "0.001", "10", "data/a");
  const std::string now = recipe("400", "1", "5", "moved/a");
  ResumeChanges c = classify_resume_changes(saved, now, {});
  // optimizer.lr, train.steps (optimizer.decay_steps follows it: auto in both)
  ASSERT_EQ(c.refused.size(), 2u);
  EXPECT_EQ(c.refused[0].text(), "optimizer.lr 0.001 → 1");
  EXPECT_EQ(c.refused[1].text(), "train.steps 200 → 400 (optimizer.decay_steps, auto, with it)");
  ASSERT_EQ(c.harmless.size(), 1u);
  EXPECT_EQ(c.harmless[0].text(), "log.every 10 → 5");
  EXPECT_TRUE(c.allowed.empty());  // data.train: the checkpoint's data identity decides
  try {
    require_resume_changes_allowed(c, "ck/step_00000100");
    ADD_FAILURE() << "refused changes were accepted";
  } catch (const Error& e) {
    const std::string what = e.what(), hint = e.hint();
    EXPECT_NE(what.find("resuming ck/step_00000100"), std::string::npos) << what;
    EXPECT_NE(what.find("train.steps 200 → 400"), std::string::npos) << what;
    EXPECT_NE(what.find("optimizer.lr 0.001 → 1"), std::string::npos) << what;
    EXPECT_NE(hint.find("--allow-change optimizer.lr,train.steps"), std::string::npos) << hint;
  }
  // By key, by section, all.
  c = classify_resume_changes(saved, now, {"train.steps", "optimizer"});
  EXPECT_TRUE(c.refused.empty());
  EXPECT_EQ(c.allowed.size(), 2u);
  c = classify_resume_changes(saved, now, {"all"});
  EXPECT_EQ(c.allowed.size(), 3u);  // data.train too
  EXPECT_NO_THROW(require_resume_changes_allowed(c, "ck"));
  c = classify_resume_changes(saved, now, {"train.step", "optim"});  // prefixes of a name are not sections
  EXPECT_EQ(c.refused.size(), 2u);
  // A decay_steps set on its own is a change of its own.
  c = classify_resume_changes(
      saved,
      recipe("400", "0.001", "10")
          .replace(recipe("400", "0.001", "10").find("decay_steps: 400"), 16, "decay_steps: 300"),
      {});
  ASSERT_EQ(c.refused.size(), 2u);
  EXPECT_EQ(c.refused[0].text(), "optimizer.decay_steps 200 → 300");
}

TEST(RecipeChanges, KindsOfKeys) {
  for (const char* k : {"parallel.tp", "launch.procs_per_node", "log.every", "eval.every", "checkpoint.every",
                        "train.threads", "train.micro_batch", "train.device", "name"})
    EXPECT_EQ(change_kind(k), ChangeKind::harmless) << k;
  for (const char* k : {"model.hidden", "optimizer.lr", "train.steps", "train.global_batch", "train.seed",
                        "train.precision", "data.tokenizer", "train.grad_clip", "names"})
    EXPECT_EQ(change_kind(k), ChangeKind::meaning) << k;
  EXPECT_EQ(change_kind("data.train"), ChangeKind::by_contents);
  // A key only one recipe has is not a change (added to the schema since).
  EXPECT_TRUE(recipe_changes("train:\n  steps: 2\n", "train:\n  steps: 2\n  new_key: 1\n").empty());
}

}  // namespace
}  // namespace llmtrain
