// Recipe parsing beyond errors: `--set` overrides, defaults and "auto" resolution, the resolved
// YAML round trip, every shipped recipe, and docs/recipe.md covering every schema key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/recipe_emit.h"
#include "cli/recipe_load.h"
#include "cli/recipe_parse.h"

using namespace llmtrain;
namespace fs = std::filesystem;

namespace {

const char* kRecipe = R"(name: t
model: {family: gpt2, layers: 2, hidden: 64, heads: 4, seq_len: 32}
data: {train: data/x}
train: {steps: 10, micro_batch: 2}
)";

class TempRecipe {
 public:
  explicit TempRecipe(const std::string& text) {
    static int n = 0;
    path_ = fs::temp_directory_path() /
            ("llmtrain_parse_" + std::to_string(getpid()) + "_" + std::to_string(n++) + ".yaml");
    std::ofstream(path_) << text;
  }
  ~TempRecipe() { fs::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

cli::LoadedRecipe load(const std::string& text, const std::vector<std::string>& sets = {}) {
  TempRecipe f(text);
  return cli::recipe_load(f.path(), sets);
}

std::vector<cli::Diagnostic> load_errors(const std::string& text, const std::vector<std::string>& sets) {
  try {
    load(text, sets);
  } catch (const cli::RecipeError& e) {
    return e.diagnostics();
  }
  return {};
}

TEST(RecipeParse, DefaultsAndAutoResolve) {
  auto r = load(kRecipe).recipe;
  EXPECT_EQ(r.model.kv_heads, 4);
  EXPECT_EQ(r.model.ffn_hidden, 256);      // gpt2: 4 × hidden
  EXPECT_EQ(r.model.vocab, 257);           // byte tokenizer
  EXPECT_EQ(r.model.padded_vocab(), 384);  // 257 rounded up to 128
  EXPECT_EQ(r.model.max_positions, 32);
  EXPECT_TRUE(r.model.tie_embeddings);
  EXPECT_EQ(r.parallel.dp, 1);
  EXPECT_EQ(r.train.global_batch, 2);
  EXPECT_EQ(r.optimizer.decay_steps, 10);
  EXPECT_EQ(r.log.dir, (fs::current_path() / "runs/t").string());
  EXPECT_EQ(r.checkpoint.dir, (fs::current_path() / "runs/t/ckpt").string());
  EXPECT_EQ(r.data.train.at(0).path, (fs::current_path() / "data/x").string());
}

TEST(RecipeParse, LlamaDefaults) {
  auto r = load(R"(name: l
model: {family: llama, layers: 2, hidden: 4096, heads: 32, kv_heads: 8, seq_len: 16, vocab: 1000}
data: {train: d}
train: {steps: 1, micro_batch: 1}
)")
               .recipe;
  EXPECT_FALSE(r.model.tie_embeddings);
  EXPECT_EQ(r.model.ffn_hidden, 11008);  // LLaMA-7B's width: 8/3 · 4096 rounded up to 256
}

TEST(RecipeParse, SetOverridesFileValues) {
  auto r = load(kRecipe, {"train.steps=30", "optimizer.lr=3e-4", "model.layers=4", "name=other"}).recipe;
  EXPECT_EQ(r.train.steps, 30);
  EXPECT_DOUBLE_EQ(r.optimizer.lr, 3e-4);
  EXPECT_EQ(r.model.layers, 4);
  EXPECT_EQ(r.name, "other");
}

TEST(RecipeParse, SetCreatesMissingSectionsAndTakesYamlValues) {
  auto r = load(kRecipe, {"optimizer.betas=[0.8, 0.9]", "launch.slurm.partition=gpu", "parallel.timeout=2m",
                          "data.train=[{path: a, weight: 2}, {path: b, weight: 1}]"})
               .recipe;
  EXPECT_DOUBLE_EQ(r.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(r.optimizer.beta2, 0.9);
  EXPECT_EQ(r.launch.slurm.partition, "gpu");
  EXPECT_DOUBLE_EQ(r.parallel.timeout_s, 120.0);
  ASSERT_EQ(r.data.train.size(), 2u);
  EXPECT_DOUBLE_EQ(r.data.train[0].weight, 2.0);
}

TEST(RecipeParse, LaterSetWins) {
  auto r = load(kRecipe, {"train.steps=5", "train.steps=7"}).recipe;
  EXPECT_EQ(r.train.steps, 7);
}

TEST(RecipeParse, SetErrorsNameTheArgument) {
  auto d = load_errors(kRecipe, {"train.steps=abc"});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].where, "--set train.steps=abc");
  EXPECT_EQ(d[0].key, "train.steps");

  d = load_errors(kRecipe, {"train.stpes=3"});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].where, "--set train.stpes=3");
  EXPECT_NE(d[0].hint.find("did you mean train.steps"), std::string::npos);

  d = load_errors(kRecipe, {"train.steps"});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].message.find("expected key=value"), std::string::npos);

  d = load_errors(kRecipe, {"name.inner=3"});
  ASSERT_FALSE(d.empty());
  EXPECT_NE(d[0].message.find("cannot set a key inside"), std::string::npos);
}

TEST(RecipeParse, NumbersTimesAndNamesFollowTheirGrammars) {
  auto r = load(kRecipe, {"train.steps=+12", "optimizer.lr=.5e-3", "optimizer.weight_decay=1.", "optimizer.min_lr=2E-5",
                          "launch.slurm.time=2-04:30:00", "name=gpt2-124m.v1_b"})
               .recipe;
  EXPECT_EQ(r.train.steps, 12);
  EXPECT_DOUBLE_EQ(r.optimizer.lr, 5e-4);
  EXPECT_DOUBLE_EQ(r.optimizer.weight_decay, 1.0);
  EXPECT_DOUBLE_EQ(r.optimizer.min_lr, 2e-5);
  EXPECT_EQ(r.launch.slurm.time, "2-04:30:00");
  EXPECT_EQ(r.name, "gpt2-124m.v1_b");
  for (const char* time : {"90", "30:00", "04:00:00", "1-12"})
    EXPECT_NO_THROW(load(kRecipe, {std::string("launch.slurm.time=") + time})) << time;
  for (const char* bad :
       {"train.steps=1e3", "train.steps=0x10", "optimizer.lr=1e", "optimizer.lr=.", "optimizer.lr=inf",
        "optimizer.lr=nan", "optimizer.lr=1.2.3", "launch.slurm.time=1:2:3:4", "launch.slurm.time=1:234",
        "launch.slurm.time=-1", "launch.slurm.time=tomorrow", "name=-x", "name=a/b", "name=.hidden"})
    EXPECT_FALSE(load_errors(kRecipe, {bad}).empty()) << bad;
  // Keys: dotted identifiers only.
  for (const char* bad : {"train..steps=3", ".train=3", "train.=3", "train.9steps=3", "=3"})
    EXPECT_NE(load_errors(kRecipe, {bad}).at(0).message.find("expected key=value"), std::string::npos) << bad;
  // A hostile value far longer than any real one is refused (not a stack overflow in a matcher).
  EXPECT_FALSE(load_errors(kRecipe, {"train.steps=" + std::string(1 << 20, '9')}).empty());
  EXPECT_FALSE(load_errors(kRecipe, {"name=" + std::string(1 << 20, 'a') + "/"}).empty());
}

TEST(RecipeParse, ResolvedYamlRoundTrips) {
  auto first = load(kRecipe, {"parallel.timeout=90s", "launch.slurm.time=01:00:00"}).recipe;
  std::string yaml = cli::recipe_to_yaml(first);
  auto second = load(yaml).recipe;
  EXPECT_EQ(cli::recipe_to_yaml(second), yaml);
}

// fp16's loss scaling keys: Megatron's defaults, overridable, emitted and read back.
TEST(RecipeParse, LossScaleHasMegatronsDefaultsAndRoundTrips) {
  const LossScaleConfig d = load(kRecipe).recipe.train.loss_scale;
  EXPECT_EQ(d.initial, 4294967296.0);
  EXPECT_EQ(d.growth_interval, 1000);
  EXPECT_EQ(d.backoff, 0.5);
  EXPECT_EQ(d.hysteresis, 2);
  EXPECT_EQ(d.min, 1.0);
  auto set = load(kRecipe, {"train.loss_scale.initial=65536", "train.loss_scale.hysteresis=1"}).recipe;
  EXPECT_EQ(set.train.loss_scale.initial, 65536.0);
  EXPECT_EQ(set.train.loss_scale.hysteresis, 1);
  const std::string yaml = cli::recipe_to_yaml(set);
  EXPECT_NE(yaml.find("  loss_scale:\n    initial: 65536\n"), std::string::npos) << yaml;
  EXPECT_EQ(cli::recipe_to_yaml(load(yaml).recipe), yaml);
}

TEST(RecipeParse, TensorBoardIsOffByDefaultAndRoundTrips) {
  EXPECT_FALSE(load(kRecipe).recipe.log.tensorboard);
  EXPECT_NE(cli::recipe_to_yaml(load(kRecipe).recipe).find("  tensorboard: false\n"), std::string::npos);
  auto on = load(kRecipe, {"log.tensorboard=true"}).recipe;
  EXPECT_TRUE(on.log.tensorboard);
  std::string yaml = cli::recipe_to_yaml(on);
  EXPECT_NE(yaml.find("  tensorboard: true\n"), std::string::npos) << yaml;
  auto again = load(yaml).recipe;
  EXPECT_TRUE(again.log.tensorboard);
  EXPECT_EQ(cli::recipe_to_yaml(again), yaml);
  EXPECT_TRUE(load(std::string(kRecipe) + "log: {tensorboard: true}\n").recipe.log.tensorboard);
}

TEST(RecipeParse, TheOpProfileIsOffByDefaultAndRoundTrips) {
  const Recipe off = load(kRecipe).recipe;
  EXPECT_EQ(off.log.profile, ProfileMode::none);
  EXPECT_EQ(off.log.profile_steps, 3);
  EXPECT_NE(cli::recipe_to_yaml(off).find("  profile: none\n  profile_steps: 3\n"), std::string::npos);
  const Recipe on = load(kRecipe, {"log.profile=ops", "log.profile_steps=5"}).recipe;
  EXPECT_EQ(on.log.profile, ProfileMode::ops);
  EXPECT_EQ(on.log.profile_steps, 5);
  const std::string yaml = cli::recipe_to_yaml(on);
  EXPECT_NE(yaml.find("  profile: ops\n  profile_steps: 5\n"), std::string::npos) << yaml;
  EXPECT_EQ(cli::recipe_to_yaml(load(yaml).recipe), yaml);
}

TEST(RecipeParse, EveryShippedRecipeValidatesAndRoundTrips) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(LLMTRAIN_SOURCE_DIR) / "recipes")) {
    if (entry.path().extension() != ".yaml") continue;
    ++n;
    SCOPED_TRACE(entry.path().string());
    cli::LoadedRecipe loaded;
    try {
      loaded = cli::recipe_load(entry.path().string(), {});
    } catch (const cli::RecipeError& e) {
      FAIL() << e.format();
    }
    std::string yaml = cli::recipe_to_yaml(loaded.recipe);
    EXPECT_EQ(cli::recipe_to_yaml(load(yaml).recipe), yaml);
  }
  EXPECT_GE(n, 6);
}

// Every number key of the schema (not a list by hand): NaN, infinities, a subnormal and an
// overflow are refused by key, whatever the key's range — a range check alone passes NaN.
TEST(RecipeParse, EveryNumberKeyRefusesNanInfinitiesAndSubnormals) {
  int keys = 0;
  for (const cli::RecipeKey& k : cli::recipe_schema()) {
    if (k.section || k.type.rfind("number", 0) != 0 || k.key.find('[') != std::string::npos) continue;
    ++keys;
    for (const char* bad : {"nan", "-nan", "inf", "-inf", "1e-320", "-4e-310", "1e999", "0x1p3"}) {
      const std::vector<cli::Diagnostic> d = load_errors(kRecipe, {k.key + "=" + bad});
      ASSERT_FALSE(d.empty()) << k.key << "=" << bad << " was accepted";
      EXPECT_EQ(d[0].key, k.key) << k.key << "=" << bad << ": " << d[0].message;
    }
  }
  EXPECT_GE(keys, 20);  // the walk found the schema's number keys
}

TEST(RecipeParse, DocsDescribeEverySchemaKey) {
  std::ifstream in(fs::path(LLMTRAIN_SOURCE_DIR) / "docs/recipe.md");
  ASSERT_TRUE(in) << "docs/recipe.md is missing";
  std::stringstream ss;
  ss << in.rdbuf();
  std::string doc = ss.str();
  auto keys = cli::recipe_schema_keys();
  EXPECT_GT(keys.size(), 50u);
  for (const auto& key : keys) {
    if (key.find('[') != std::string::npos) continue;  // data.train[].path is described with data.train
    EXPECT_NE(doc.find("`" + key + "`"), std::string::npos) << "docs/recipe.md does not describe `" << key << "`";
  }
}

}  // namespace
