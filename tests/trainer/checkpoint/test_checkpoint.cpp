// Checkpoints: every tensor round-trips bitwise, a save that fails at any point leaves the
// previous checkpoint loadable, damage is named, and slices of another layout read just what
// they need.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/error.h"
#include "common/file_io.h"
#include "parallel/comm/comm.h"
#include "tests/trainer/checkpoint/checkpoint_fixture.h"
#include "trainer/checkpoint/async_checkpoint.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_inspect.h"
#include "trainer/model/model.h"
#include "trainer/optim/optimizer.h"

using namespace llmtrain;
using namespace llmtrain::trainer;
namespace fs = std::filesystem;

namespace {

using Fixture = CheckpointFixture;

fs::path temp_dir(const std::string& name) { return checkpoint_test_dir("llmtrain_ckpt", name); }

bool same_bits(kernels::Tensor a, kernels::Tensor b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data, b.data, a.bytes()) == 0;
}

// How a test saves: checkpoint_save itself, or the same protocol through the asynchronous writer
// (checkpoint.async: the snapshot, the write on a background thread, the commit), whose failure is
// thrown here as checkpoint_save's would be.
enum class SaveMode { sync, async };

std::string save(SaveMode mode, FileSystem& fsys, const fs::path& dir, const CheckpointMeta& meta,
                 const std::vector<CheckpointSlice>& slices, parallel::Comm& world, int keep) {
  if (mode == SaveMode::sync) return checkpoint_save(fsys, dir.string(), meta, slices, world, keep);
  AsyncCheckpointWriter writer(fsys, dir.string(), keep, world, 60);
  const AsyncSaveResult started = writer.start(meta, slices);
  if (!writer.in_flight()) throw Error(started.error);
  const AsyncSaveResult done = *writer.finish();
  if (!done.committed()) throw Error(done.error);
  return done.path;
}

class SaveModes : public ::testing::TestWithParam<SaveMode> {};
INSTANTIATE_TEST_SUITE_P(Saves, SaveModes, ::testing::Values(SaveMode::sync, SaveMode::async),
                         [](const ::testing::TestParamInfo<SaveMode>& i) {
                           return std::string(i.param == SaveMode::sync ? "sync" : "async");
                         });

TEST(Checkpoint, EveryTensorRoundTripsBitwise) {
  fs::path dir = temp_dir("roundtrip");
  Fixture a(1), b(2);
  checkpoint_save(default_file_system(), dir.string(), meta_at(10), a.slices(), *a.world, 3);
  EXPECT_FALSE(same_bits(a.model.params(), b.model.params()));
  auto loaded = checkpoint_load((dir / "step_00000010").string(), b.slices(), *b.world);
  EXPECT_EQ(loaded.manifest.step, 10);
  EXPECT_EQ(loaded.manifest.consumed_samples, 40);
  EXPECT_TRUE(same_bits(a.model.params(), b.model.params()));
  EXPECT_TRUE(same_bits(a.opt.exp_avg(), b.opt.exp_avg()));
  EXPECT_TRUE(same_bits(a.opt.exp_avg_sq(), b.opt.exp_avg_sq()));
  // Every parameter and both moments of each are in the manifest.
  EXPECT_EQ(loaded.manifest.tensors.size(), 3 * a.model.parameters().size());
  EXPECT_EQ(fs::path(checkpoint_candidates(dir.string()).at(0)).filename(), "step_00000010");
  fs::remove_all(dir);
}

TEST(Checkpoint, KeepsTheNewestAndMovesLatest) {
  fs::path dir = temp_dir("keep");
  Fixture a(1);
  for (int64_t s : {10, 20, 30, 40})
    checkpoint_save(default_file_system(), dir.string(), meta_at(s), a.slices(), *a.world, 2);
  auto c = checkpoint_candidates(dir.string());
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(fs::path(c[0]).filename(), "step_00000040");
  EXPECT_EQ(fs::path(c[1]).filename(), "step_00000030");
  EXPECT_EQ(read_file((dir / "latest").string()), "step_00000040\n");
  fs::remove_all(dir);
}

// A save that fails at its n-th file operation, for every n, leaves step 10 loadable as the newest
// intact checkpoint, with its original contents.
TEST_P(SaveModes, InterruptedSaveAtEveryPointKeepsThePreviousOne) {
  const SaveMode mode = GetParam();
  fs::path dir = temp_dir(GetParam() == SaveMode::sync ? "interrupted" : "interrupted_async");
  Fixture a(1), b(2);
  checkpoint_save(default_file_system(), dir.string(), meta_at(10), a.slices(), *a.world, 3);
  FaultyFileSystem counter(default_file_system());
  save(mode, counter, dir / "count", meta_at(20), b.slices(), *b.world, 3);
  const long ops = counter.operations();
  ASSERT_GT(ops, 5);
  for (long n = 1; n <= ops; ++n) {
    for (int error : {EIO, ENOSPC}) {
      FaultyFileSystem faulty(default_file_system());
      faulty.fail_at(n, error);
      bool threw = false;
      try {
        save(mode, faulty, dir, meta_at(20), b.slices(), *b.world, 3);
      } catch (const Error& e) {
        threw = true;
        if (error == ENOSPC) {
          EXPECT_NE(std::string(e.what()).find("No space left"), std::string::npos) << e.what();
        }
      }
      // A failure after the commit (the rename) is only a warning: step 20 is complete then.
      if (!threw) {
        EXPECT_TRUE(fs::exists(dir / "step_00000020" / "manifest.json")) << "operation " << n;
      }
      Fixture c(3);
      auto loaded = checkpoint_resume(dir.string(), false, c.slices(), *c.world);
      ASSERT_TRUE(loaded.has_value()) << "operation " << n;
      // Failing after step 20's directory was renamed into place leaves step 20 complete: either
      // is a correct outcome; what must never happen is neither being loadable.
      if (loaded->manifest.step == 10) {
        EXPECT_TRUE(same_bits(c.model.params(), a.model.params())) << "operation " << n;
      } else {
        EXPECT_EQ(loaded->manifest.step, 20) << "operation " << n;
        EXPECT_TRUE(same_bits(c.model.params(), b.model.params())) << "operation " << n;
      }
      fs::remove_all(dir / "step_00000020");
      fs::remove_all(dir / "step_00000020.partial");
      write_file_atomic(default_file_system(), (dir / "latest").string(), "step_00000010\n");
    }
  }
  fs::remove_all(dir);
}

// Power loss: the process dies at the n-th file operation of a save (nothing after it reaches the
// disk), then everything not yet on stable storage is lost — data written after a file's last
// fsync, directory entries after their directory's last fsync (PowerLossFileSystem). With keep 1
// the save also removes step 10 (retention), so crashes inside retention are covered. At every n,
// a checkpoint must load, with the contents of step 10 or step 20; and after a save that completed
// (n past the last operation), step 20 must survive.
TEST_P(SaveModes, PowerLossAtEveryPointLeavesACheckpoint) {
  const SaveMode mode = GetParam();
  fs::path dir = temp_dir(GetParam() == SaveMode::sync ? "power_loss" : "power_loss_async");
  Fixture a(1), b(2);
  FaultyFileSystem counter(default_file_system());
  save(mode, counter, dir / "count", meta_at(20), b.slices(), *b.world, 1);
  const long ops = counter.operations();
  fs::remove_all(dir / "count");
  ASSERT_GT(ops, 5);
  for (long n = 1; n <= ops + 1; ++n) {
    checkpoint_save(default_file_system(), dir.string(), meta_at(10), a.slices(), *a.world, 1);
    {
      PowerLossFileSystem disk(default_file_system(), dir.string());
      FaultyFileSystem crash(disk);
      crash.crash_at(n);
      try {
        save(mode, crash, dir, meta_at(20), b.slices(), *b.world, 1);
      } catch (const Error&) {
      }
      disk.power_loss();
    }
    Fixture c(3);
    std::optional<LoadedCheckpoint> loaded;
    try {
      loaded = checkpoint_resume(dir.string(), false, c.slices(), *c.world);
    } catch (const Error& e) {
      ADD_FAILURE() << "power loss at operation " << n << " of " << ops << ": " << e.what();
    }
    ASSERT_TRUE(loaded.has_value()) << "power loss at operation " << n << " of " << ops;
    if (n > ops) {
      EXPECT_EQ(loaded->manifest.step, 20) << "a completed save was lost";
    }
    if (loaded->manifest.step == 10) {
      EXPECT_TRUE(same_bits(c.model.params(), a.model.params())) << "operation " << n;
    } else {
      EXPECT_EQ(loaded->manifest.step, 20) << "operation " << n;
      EXPECT_TRUE(same_bits(c.model.params(), b.model.params())) << "operation " << n;
    }
    fs::remove_all(dir);
  }
}

// A rolled-back run (checkpoint.resume: step 20 while 30 and 40 exist) saves 30 again and goes on:
// retention keeps its own line (`latest` and the steps below it), never deletes the checkpoint
// just written nor the abandoned 40, and a restart resumes the new 30, not the higher 40.
TEST(Checkpoint, RetentionAndResumeFollowTheLineage) {
  fs::path dir = temp_dir("lineage");
  Fixture a(1), b(2);
  for (int64_t s : {10, 20, 30, 40})
    checkpoint_save(default_file_system(), dir.string(), meta_at(s), a.slices(), *a.world, 2);
  // keep 2: 30 and 40 remain.
  ASSERT_FALSE(fs::exists(dir / "step_00000020"));
  // The rollback: resume 30 explicitly, save step 30 again with other contents (b), then 35.
  checkpoint_save(default_file_system(), dir.string(), meta_at(30), b.slices(), *b.world, 2);
  EXPECT_EQ(read_file((dir / "latest").string()), "step_00000030\n");
  checkpoint_save(default_file_system(), dir.string(), meta_at(35), b.slices(), *b.world, 2);
  EXPECT_TRUE(fs::exists(dir / "step_00000035"));
  EXPECT_TRUE(fs::exists(dir / "step_00000030"));
  EXPECT_TRUE(fs::exists(dir / "step_00000040"));  // another line: left alone
  Fixture c(3);
  auto loaded = checkpoint_resume(dir.string(), false, c.slices(), *c.world);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->manifest.step, 35);
  EXPECT_TRUE(same_bits(c.model.params(), b.model.params()));
  // Another job's save in progress beside ours is not ours to delete.
  fs::create_directories(dir / "step_00000050.partial");
  checkpoint_save(default_file_system(), dir.string(), meta_at(36), b.slices(), *b.world, 2);
  EXPECT_TRUE(fs::exists(dir / "step_00000050.partial"));
  EXPECT_FALSE(fs::exists(dir / "step_00000030"));  // beyond keep 2 on this line (36, 35)
  fs::remove_all(dir);
}

// Saving a step that exists (a resumed run re-saving it) swaps the directories: at every failure
// point, step 20 exists complete with either its old or its new contents.
TEST_P(SaveModes, SavingAStepAgainIsAtomic) {
  const SaveMode mode = GetParam();
  fs::path dir = temp_dir(GetParam() == SaveMode::sync ? "resave" : "resave_async");
  Fixture a(1), b(2);
  FaultyFileSystem counter(default_file_system());
  checkpoint_save(default_file_system(), dir.string(), meta_at(20), a.slices(), *a.world, 3);
  save(mode, counter, dir, meta_at(20), a.slices(), *a.world, 3);
  const long ops = counter.operations();
  for (long n = 1; n <= ops; ++n) {
    FaultyFileSystem faulty(default_file_system());
    faulty.fail_at(n, EIO);
    try {
      save(mode, faulty, dir, meta_at(20), b.slices(), *b.world, 3);
    } catch (const Error&) {
    }
    Fixture c(3);
    auto loaded = checkpoint_load((dir / "step_00000020").string(), c.slices(), *c.world);
    EXPECT_EQ(loaded.manifest.step, 20) << "operation " << n;
    EXPECT_TRUE(same_bits(c.model.params(), a.model.params()) || same_bits(c.model.params(), b.model.params()))
        << "operation " << n;
    // Back to a's contents for the next round.
    checkpoint_save(default_file_system(), dir.string(), meta_at(20), a.slices(), *a.world, 3);
  }
  fs::remove_all(dir);
}

class Damage : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir("damage");
    checkpoint_save(default_file_system(), dir_.string(), meta_at(10), a_.slices(), *a_.world, 3);
    checkpoint_save(default_file_system(), dir_.string(), meta_at(20), a_.slices(), *a_.world, 3);
    step20_ = dir_ / "step_00000020";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Loading step 20 explicitly fails naming `what`; resume: auto falls back to step 10.
  void expect_damage(const std::string& what) {
    Fixture b(2);
    try {
      checkpoint_resume(step20_.string(), true, b.slices(), *b.world);
      FAIL() << "damaged checkpoint loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    auto loaded = checkpoint_resume(dir_.string(), false, b.slices(), *b.world);
    ASSERT_TRUE(loaded.has_value());
    EXPECT_EQ(loaded->manifest.step, 10);
  }

  Fixture a_{1};
  fs::path dir_, step20_;
};

TEST_F(Damage, MissingShardFile) {
  fs::remove(step20_ / "rank_00000.safetensors");
  expect_damage("rank_00000.safetensors is missing");
}

TEST_F(Damage, TruncatedShard) {
  fs::path f = step20_ / "rank_00000.safetensors";
  fs::resize_file(f, fs::file_size(f) - 100);
  expect_damage("rank_00000.safetensors");
}

TEST_F(Damage, FlippedByteIsAChecksumMismatch) {
  fs::path f = step20_ / "rank_00000.safetensors";
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(-8, std::ios::end);
  char c;
  io.read(&c, 1);
  c ^= 0x40;
  io.seekp(-8, std::ios::end);
  io.write(&c, 1);
  io.close();
  expect_damage("checksum mismatch");
}

TEST_F(Damage, MissingManifest) {
  fs::remove(step20_ / "manifest.json");
  Fixture b(2);
  auto loaded = checkpoint_resume(dir_.string(), false, b.slices(), *b.world);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->manifest.step, 10);
  EXPECT_THROW(checkpoint_load(step20_.string(), b.slices(), *b.world), Error);
}

TEST_F(Damage, NewerFormatVersion) {
  std::string text = read_file((step20_ / "manifest.json").string());
  auto j = nlohmann::json::parse(text);
  j["version"] = kCheckpointFormatVersion + 1;
  write_file_atomic(default_file_system(), (step20_ / "manifest.json").string(), j.dump());
  expect_damage("newer than this build reads");
}

TEST_F(Damage, DeeplyNestedManifestIsAnErrorNotACrash) {
  std::string text = read_file((step20_ / "manifest.json").string());
  auto j = nlohmann::json::parse(text);
  // Valid JSON, but nested a million deep: parsing it would overflow the stack.
  std::string deep = j.dump();
  deep.insert(deep.size() - 1, ", \"x\": " + std::string(1000000, '[') + std::string(1000000, ']'));
  write_file_atomic(default_file_system(), (step20_ / "manifest.json").string(), deep);
  expect_damage("JSON nested deeper than 64 levels");
}

TEST_F(Damage, FloatWhereAnIntegerBelongsIsAnError) {
  // Found by fuzz_manifest: nlohmann casts a float to an integer type, undefined behaviour for
  // 1.5e32 (UBSan); every integer field of a manifest must be a JSON integer in range.
  std::string text = read_file((step20_ / "manifest.json").string());
  auto j = nlohmann::json::parse(text);
  j["tensors"][0]["slices"][0]["chunk_crc32c"][0] = 1.5e32;
  write_file_atomic(default_file_system(), (step20_ / "manifest.json").string(), j.dump());
  expect_damage("is 1.5e+32, not an integer");
}

TEST_F(Damage, AllDamagedIsAnErrorNotAFreshStart) {
  fs::remove(step20_ / "rank_00000.safetensors");
  fs::remove(dir_ / "step_00000010" / "rank_00000.safetensors");
  Fixture b(2);
  try {
    checkpoint_resume(dir_.string(), false, b.slices(), *b.world);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no intact checkpoint among the 2"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, WeightsOnlySlicesNeedNoOptimizerState) {
  fs::path dir = temp_dir("weights");
  Fixture a(1), b(2);
  checkpoint_save(default_file_system(), dir.string(), meta_at(10), a.slices(false), *a.world, 3);
  // Without optimizer state in the checkpoint, a full resume is refused with the fix...
  try {
    checkpoint_load((dir / "step_00000010").string(), b.slices(), *b.world);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.hint().find("load_weights_only"), std::string::npos) << e.hint();
  }
  // ...and weights alone load.
  checkpoint_load((dir / "step_00000010").string(), b.slices(false), *b.world);
  EXPECT_TRUE(same_bits(a.model.params(), b.model.params()));
  fs::remove_all(dir);
}

TEST(Checkpoint, ModelOfAnotherShapeIsNamed) {
  fs::path dir = temp_dir("shape");
  Fixture a(1);
  checkpoint_save(default_file_system(), dir.string(), meta_at(10), a.slices(), *a.world, 3);
  auto world = parallel::make_local_comm();
  ModelConfig other = small_checkpoint_model();
  other.ffn_hidden = 96;
  Model m(other, {}, *world);
  try {
    checkpoint_load((dir / "step_00000010").string(), checkpoint_slices(m, nullptr, true, false), *world);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape [64, 32] in the checkpoint, the model expects [96, 32]"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// Issue 33: a checkpoint of another model shape was reported "damaged" and skipped. It is intact:
// resume says so, names the recipe key that differs, and does not fall back past it.
TEST(Checkpoint, ResumingAnotherModelsCheckpointSaysSoNamingTheKey) {
  fs::path dir = temp_dir("other_model");
  Fixture a(1);
  CheckpointMeta meta = meta_at(10);
  meta.recipe_yaml = "name: t\nmodel:\n  family: llama\n  ffn_hidden: 64\n  vocab: 100\ndata:\n  ffn_hidden: 1\n";
  checkpoint_save(default_file_system(), dir.string(), meta, a.slices(), *a.world, 3);
  meta.step = 20;
  checkpoint_save(default_file_system(), dir.string(), meta, a.slices(), *a.world, 3);
  auto world = parallel::make_local_comm();
  ModelConfig other = small_checkpoint_model();
  other.ffn_hidden = 96;
  Model m(other, {}, *world);
  const std::string ours = "name: t\nmodel:\n  family: llama\n  ffn_hidden: 96\n  vocab: 100\ndata:\n  ffn_hidden: 2\n";
  for (bool explicit_path : {false, true}) {
    try {
      checkpoint_resume(explicit_path ? (dir / "step_00000020").string() : dir.string(), explicit_path,
                        checkpoint_slices(m, nullptr, true, false), *world, ours);
      ADD_FAILURE() << "another model's checkpoint was loaded";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("step_00000020 is an intact checkpoint of another model, not damaged: model.ffn_hidden is 64 "
                          "there, 96 in this recipe; its "),
                std::string::npos)
          << what;
      EXPECT_EQ(what.find("vocab"), std::string::npos) << what;  // keys that agree are not named
      EXPECT_EQ(what.find("damaged checkpoint"), std::string::npos) << what;
      EXPECT_NE(e.hint().find("checkpoint.resume: none"), std::string::npos) << e.hint();
    }
  }
  fs::remove_all(dir);
}

// Issue 33: export allocated the whole model its manifest's recipe describes before comparing it with
// the files: a 200B-parameter claim beside a small file reached gigabytes before failing.
TEST(Checkpoint, AModelLargerThanItsFilesIsRefusedBeforeAllocating) {
  fs::path dir = temp_dir("claim");
  Fixture a(1);
  checkpoint_save(default_file_system(), dir.string(), meta_at(10), a.slices(false), *a.world, 3);
  const std::string step = (dir / "step_00000010").string();
  ModelConfig big = small_checkpoint_model();
  big.hidden = 1 << 16, big.ffn_hidden = 1 << 18, big.heads = 512, big.kv_heads = 512;  // ~130B parameters
  // The manifest claims these shapes for the same tensors (slices of the small ones stay inside).
  nlohmann::json j = nlohmann::json::parse(read_file(step + "/manifest.json"));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const ParamSpec& p : model_param_specs(big)) shapes[p.name] = p.shape;
  for (auto& t : j["tensors"]) t["shape"] = shapes.at(t["name"].get<std::string>());
  const Manifest claim = manifest_from_json(j, "m.json");
  try {
    checkpoint_check_model_fits(step, claim, big, 2.0, "exporting it");
    FAIL() << "a model far larger than its files passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("but the shard files holding them have"), std::string::npos) << e.what();
  }
  // The checkpoint's own model passes.
  checkpoint_check_model_fits(step, checkpoint_read_manifest(step), small_checkpoint_model(), 2.0, "exporting it");
  fs::remove_all(dir);
}

// Resharding: a checkpoint of whole tensors read as tensor-parallel blocks (split along rows or
// columns) and as ZeRO-style flat ranges gives exactly the corresponding elements. The tensor is
// larger than a checksum chunk, so partial reads check chunk checksums.
TEST(Checkpoint, ReadsBlocksAndRangesOfAnotherLayout) {
  fs::path dir = temp_dir("reshard");
  auto world = parallel::make_local_comm();
  const std::vector<int64_t> shape{700, 600};  // 1.6 MiB of fp32
  std::vector<float> whole(700 * 600);
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = float(i) * 0.5f;
  CheckpointSlice s{"w",
                    TensorRole::param,
                    shape,
                    SliceSpec::whole(shape),
                    kernels::Tensor(whole.data(), kernels::DType::fp32, {700, 600}),
                    true};
  checkpoint_save(default_file_system(), dir.string(), meta_at(1), {s}, *world, 1);

  auto check = [&](SliceSpec want_slice) {
    std::vector<float> got(static_cast<size_t>(want_slice.numel()), -1.0f);
    CheckpointSlice want{"w",
                         TensorRole::param,
                         shape,
                         want_slice,
                         kernels::Tensor(got.data(), kernels::DType::fp32, {want_slice.numel()}),
                         false};
    checkpoint_load((dir / "step_00000001").string(), {want}, *world);
    for (const CopyRun& r : slice_overlap(want_slice, SliceSpec::whole(shape)))
      for (int64_t k = 0; k < r.count; ++k) ASSERT_EQ(got[size_t(r.want_at + k)], whole[size_t(r.have_at + k)]);
  };
  check(SliceSpec::block(shape, 0, 350, 350));  // tp = 2, rows
  check(SliceSpec::block(shape, 1, 150, 150));  // tp = 4, columns
  SliceSpec range = SliceSpec::block(shape, 0, 0, 350);
  range.begin = 1000, range.end = 120000;  // a ZeRO shard inside a tp block
  check(range);
  fs::remove_all(dir);
}

}  // namespace
