// Hostile recipes: what a malicious or broken file (or --set value) must not do — run a command
// through a generated script, break a later JSON write, expand without bound, nest without bound,
// block on a pipe or read forever. Each is refused with a diagnostic at validation, before any rank.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "cli/recipe_emit.h"
#include "cli/recipe_load.h"
#include "cli/recipe_parse.h"
#include "common/error.h"
#include "common/strings.h"

using namespace llmtrain;
namespace fs = std::filesystem;

namespace {

const std::string kRecipe = R"(name: t
model: {family: gpt2, layers: 2, hidden: 64, heads: 4, seq_len: 32}
data: {train: data/x}
train: {steps: 10, micro_batch: 2}
)";

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("llmtrain_hostile_" + std::to_string(getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path file(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return path_ / name;
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// The diagnostics of loading `text` with `sets` (empty when it loads).
std::vector<cli::Diagnostic> errors_of(const fs::path& file, const std::vector<std::string>& sets = {}) {
  try {
    cli::recipe_load(file.string(), sets);
  } catch (const cli::RecipeError& e) {
    return e.diagnostics();
  }
  return {};
}

std::string all_messages(const std::vector<cli::Diagnostic>& diags) {
  std::string out;
  for (const auto& d : diags) out += d.key + ": " + d.message + "\n";
  return out;
}

TEST(RecipeHostile, ControlCharactersInValuesAreRefused) {
  TempDir dir;
  // A line break in a value would end an #SBATCH comment line of the generated script, and the
  // next line would run on the compute node.
  auto d = errors_of(dir.file("a.yaml", kRecipe + "launch: {slurm: {partition: \"gpu\\nrm -rf ~\"}}\n"));
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d[0].key, "launch.slurm.partition");
  EXPECT_NE(d[0].message.find("U+000A (a line break)"), std::string::npos) << all_messages(d);
  EXPECT_NE(d[0].where.find("a.yaml:5:"), std::string::npos) << d[0].where;

  d = errors_of(dir.file("b.yaml", kRecipe), {"log.dir=\"runs/x\\r\\n#SBATCH --wrap=id\""});
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d[0].key, "log.dir");
  EXPECT_NE(d[0].message.find("U+000D"), std::string::npos) << all_messages(d);

  d = errors_of(dir.file("c.yaml", kRecipe + "checkpoint: {dir: \"ck\\tpt\"}\n"));
  ASSERT_FALSE(d.empty());
  EXPECT_NE(d[0].message.find("(a tab)"), std::string::npos) << all_messages(d);

  // In keys too.
  d = errors_of(dir.file("d.yaml", kRecipe + "\"log\\u0007\": {every: 1}\n"));
  ASSERT_FALSE(d.empty());
  EXPECT_NE(d[0].message.find("a key holds the control character U+0007"), std::string::npos) << all_messages(d);
}

TEST(RecipeHostile, BytesThatAreNotUtf8AreRefused) {
  TempDir dir;
  // Would make every checkpoint save fail once training had started (the manifest is JSON).
  auto d = errors_of(dir.file("a.yaml", kRecipe + "log: {dir: \"runs/\xff\xfe\"}\n"));
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d[0].key, "log.dir");
  EXPECT_NE(d[0].message.find("not UTF-8 (0xff) at byte 5"), std::string::npos) << all_messages(d);
  // An overlong encoding of '/' and a lone surrogate: not UTF-8 either.
  EXPECT_FALSE(errors_of(dir.file("b.yaml", kRecipe + "log: {dir: \"a\xc0\xaf\"}\n")).empty());
  EXPECT_FALSE(errors_of(dir.file("c.yaml", kRecipe + "log: {dir: \"a\xed\xa0\x80\"}\n")).empty());
  // Real UTF-8 is fine.
  EXPECT_TRUE(errors_of(dir.file("d.yaml", kRecipe + "log: {dir: \"runs/größe-λ-🙂\"}\n")).empty());
}

// Issue 33: `llmtrain import` wrote the model directory's path raw into a comment of the recipe it
// derives: a line break in it added keys. Every string is escaped now, and the text parses back to
// exactly the values written (or, for a control character, is refused like any recipe holding one).
TEST(RecipeHostile, TheDerivedRecipeHoldsEveryStringExactlyAndGainsNoKey) {
  ModelConfig m;
  m.family = ModelFamily::llama, m.layers = 2, m.hidden = 64, m.heads = 4, m.kv_heads = 2, m.ffn_hidden = 128;
  m.vocab = 300, m.seq_len = 32, m.max_positions = 32;
  for (std::string hostile :
       {"/m/a\nparallel: {tp: 3}", "/m/\"x\": y", "/m/\xc2\x85tp: 2", "/m/\xe2\x80\xa8tp: 2", "/m/# c", "/m/{a: [b",
        "/m/'q'", "/m/back\\slash", "/m/größe 🙂", "/m/\r\nname: evil"}) {
    const std::string text =
        cli::recipe_derived_yaml(m, "run", hostile + "/tok.json", hostile, hostile + "/config.json");
    cli::ParsedRecipe p = cli::recipe_parse_text(text, "derived", {});
    EXPECT_EQ(p.recipe.parallel.tp, 1) << text;  // no key was added
    EXPECT_EQ(p.recipe.name, "run") << text;
    if (!text_problem(hostile).empty()) {
      EXPECT_FALSE(p.diags.empty()) << text;  // refused as a value, never read as syntax
      continue;
    }
    EXPECT_TRUE(p.diags.empty()) << text << (p.diags.empty() ? "" : p.diags[0].message);
    EXPECT_EQ(p.recipe.checkpoint.resume_path, hostile) << text;
    EXPECT_EQ(p.recipe.data.tokenizer, hostile + "/tok.json") << text;
    EXPECT_EQ(p.recipe.model.ffn_hidden, 128);
  }
  EXPECT_THROW(cli::recipe_derived_yaml(m, "run", "byte", "/m/\xff", "/m/config.json"), Error);  // not UTF-8
}

TEST(RecipeHostile, AliasExpansionIsBounded) {
  TempDir dir;
  // Nine levels of ten aliases each: 10^9 values once expanded ("billion laughs").
  std::string bomb = kRecipe + "extra:\n  l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; ++i) {
    bomb += "  l" + std::to_string(i) + ": &l" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) bomb += (k ? ", *l" : "*l") + std::to_string(i - 1);
    bomb += "]\n";
  }
  auto d = errors_of(dir.file("bomb.yaml", bomb));
  ASSERT_FALSE(d.empty());
  EXPECT_NE(all_messages(d).find("expands to more than 100000 values"), std::string::npos) << all_messages(d);
}

TEST(RecipeHostile, NestingIsBounded) {
  TempDir dir;
  const int depth = 200;
  auto d =
      errors_of(dir.file("deep.yaml", kRecipe + "extra: " + std::string(depth, '[') + std::string(depth, ']') + "\n"));
  ASSERT_FALSE(d.empty());
  EXPECT_NE(all_messages(d).find("nests deeper than"), std::string::npos) << all_messages(d);
}

TEST(RecipeHostile, PipesDirectoriesAndHugeFilesAreRefusedWithoutReadingThem) {
  TempDir dir;
  const fs::path fifo = dir.path() / "fifo.yaml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto d = errors_of(fifo);  // opening a FIFO with no writer would block forever
  ASSERT_FALSE(d.empty());
  EXPECT_NE(d[0].message.find("not a regular file"), std::string::npos) << all_messages(d);

  d = errors_of(dir.path());
  ASSERT_FALSE(d.empty());
  EXPECT_NE(d[0].message.find("not a regular file"), std::string::npos) << all_messages(d);

  d = errors_of(dir.file("huge.yaml", kRecipe + "# " + std::string(5 << 20, 'x') + "\n"));
  ASSERT_FALSE(d.empty());
  EXPECT_NE(d[0].message.find("larger than 4 MiB"), std::string::npos) << all_messages(d);
}

TEST(RecipeHostile, CountsAreBoundedSoTheirProductsCannotWrap) {
  TempDir dir;
  const fs::path file = dir.file("r.yaml", kRecipe);
  // 2^16 × 2^16 wrapped a 32-bit product to 0, and `layers % 0` killed the process (SIGFPE).
  for (auto sets : std::vector<std::vector<std::string>>{
           {"parallel.pp=65536", "parallel.virtual_stages=65536", "parallel.pp_schedule=interleaved"},
           {"parallel.tp=65536", "parallel.pp=65536", "parallel.dp=65536"},
           {"parallel.tp=65536", "parallel.pp=65536"},
           {"train.micro_batch=1048576", "parallel.dp=65536", "train.global_batch=1073741824"},
       }) {
    EXPECT_FALSE(errors_of(file, sets).empty()) << sets[0];  // an error (the world is one rank), not a signal
  }
  for (const char* over : {"parallel.tp=65537", "parallel.dp=4294967296", "model.hidden=1048577",
                           "train.micro_batch=2147483647", "model.vocab=4294967296", "launch.procs_per_node=5000"}) {
    auto d = errors_of(file, {over});
    ASSERT_FALSE(d.empty()) << over;
    EXPECT_TRUE(d[0].message.find("expected an integer in 1..") != std::string::npos ||
                d[0].message.find("(at most 2147483647)") != std::string::npos)
        << over << ": " << all_messages(d);
  }
}

}  // namespace
