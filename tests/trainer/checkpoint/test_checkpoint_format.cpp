// The checkpoint manifest and the slice arithmetic behind resharding. slice_overlap is checked
// against brute force: every element of the global tensor, located in both slices by definition.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "common/error.h"
#include "trainer/checkpoint/checkpoint_format.h"

using namespace llmtrain;
using namespace llmtrain;
using namespace llmtrain::trainer;

namespace {

// For every global element, its position in the slice's data, or -1.
int64_t position_in(const SliceSpec& s, const std::vector<int64_t>& idx) {
  int64_t flat = 0;
  for (size_t d = 0; d < idx.size(); ++d) {
    if (idx[d] < s.offset[d] || idx[d] >= s.offset[d] + s.shape[d]) return -1;
    flat = flat * s.shape[d] + (idx[d] - s.offset[d]);
  }
  return flat >= s.begin && flat < s.end ? flat - s.begin : -1;
}

SliceSpec random_slice(std::mt19937& rng, const std::vector<int64_t>& shape) {
  SliceSpec s;
  for (int64_t n : shape) {
    int64_t a = std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
    int64_t b = std::uniform_int_distribution<int64_t>(a + 1, n)(rng);
    if (rng() % 3 == 0) a = 0, b = n;  // often whole dimensions, as tensor parallelism cuts one
    s.offset.push_back(a);
    s.shape.push_back(b - a);
  }
  int64_t numel = s.block_numel();
  s.begin = 0, s.end = numel;
  if (rng() % 2) {  // a flat (ZeRO) range inside the block
    s.begin = std::uniform_int_distribution<int64_t>(0, numel - 1)(rng);
    s.end = std::uniform_int_distribution<int64_t>(s.begin + 1, numel)(rng);
  }
  return s;
}

TEST(SliceOverlap, MatchesBruteForce) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 3000; ++trial) {
    int rank = 1 + trial % 3;
    std::vector<int64_t> shape;
    for (int d = 0; d < rank; ++d) shape.push_back(1 + rng() % 7);
    SliceSpec want = random_slice(rng, shape), have = random_slice(rng, shape);

    std::map<int64_t, int64_t> expected;  // want position -> have position
    std::vector<int64_t> idx(rank, 0);
    while (true) {
      int64_t w = position_in(want, idx), h = position_in(have, idx);
      if (w >= 0 && h >= 0) expected[w] = h;
      int d = rank - 1;
      while (d >= 0 && ++idx[d] == shape[d]) idx[d--] = 0;
      if (d < 0) break;
    }
    std::map<int64_t, int64_t> got;
    int64_t last_want_end = -1;
    for (const CopyRun& r : slice_overlap(want, have)) {
      ASSERT_GT(r.count, 0);
      ASSERT_GT(r.want_at, last_want_end - 1) << "runs not in increasing order";
      last_want_end = r.want_at + r.count;
      for (int64_t k = 0; k < r.count; ++k) got[r.want_at + k] = r.have_at + k;
    }
    ASSERT_EQ(got, expected) << "trial " << trial;
  }
}

TEST(SliceOverlap, SameSliceIsOneRun) {
  SliceSpec s = SliceSpec::block({8, 6}, 1, 3, 3);
  auto runs = slice_overlap(s, s);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].count, 24);
  SliceSpec whole = SliceSpec::whole({8, 6});
  // A column block of a whole tensor: one run per row.
  EXPECT_EQ(slice_overlap(s, whole).size(), 8u);
  // A row block: one run.
  EXPECT_EQ(slice_overlap(SliceSpec::block({8, 6}, 0, 2, 4), whole).size(), 1u);
}

TEST(Manifest, JsonRoundTrip) {
  Manifest m;
  m.step = 120;
  m.consumed_samples = 3840;
  m.rng = {{"seed", 1234}};
  m.recipe_yaml = "name: t\n";
  m.mesh = {2, 1, 4, 1};
  m.tokenizer_kind = "byte";
  m.tokenizer = "byte";
  SavedTensor t{"transformer.h.0.attn.c_proj.weight", TensorRole::adam_m, {8, 6}, "F32", {}};
  t.slices.push_back({SliceSpec::block({8, 6}, 1, 0, 3), "rank_00000.safetensors", "adam_m/x", 7, {7}});
  m.tensors.push_back(t);
  Manifest back = manifest_from_json(manifest_to_json(m), "m.json");
  EXPECT_EQ(manifest_to_json(back), manifest_to_json(m));
  ASSERT_NE(back.find("transformer.h.0.attn.c_proj.weight", TensorRole::adam_m), nullptr);
  EXPECT_EQ(back.find("transformer.h.0.attn.c_proj.weight", TensorRole::param), nullptr);
}

TEST(Manifest, NewerVersionIsRefusedByName) {
  nlohmann::json j = manifest_to_json(Manifest{});
  j["version"] = kCheckpointFormatVersion + 1;
  try {
    manifest_from_json(j, "/ckpt/step_00000010/manifest.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/ckpt/step_00000010/manifest.json has checkpoint format version"),
              std::string::npos)
        << e.what();
  }
}

TEST(Manifest, DamagedIsRefused) {
  nlohmann::json j = manifest_to_json(Manifest{});
  j.erase("step");
  EXPECT_THROW(manifest_from_json(j, "m.json"), Error);
  EXPECT_THROW(manifest_from_json(nlohmann::json::array(), "m.json"), Error);
}

TEST(Manifest, FilesOutsideTheCheckpointAreRefused) {
  // A crafted manifest must not make the loader read (or block on) anything but its own directory.
  Manifest m;
  m.tokenizer_kind = "hf-json";
  m.tokenizer = "tokenizer.json";
  SavedTensor t{"w", TensorRole::param, {4}, "F32", {}};
  t.slices.push_back({SliceSpec::block({4}, 0, 0, 1), "rank_00000.safetensors", "param/w", 0, {0}});
  m.tensors.push_back(t);
  EXPECT_NO_THROW(manifest_from_json(manifest_to_json(m), "m.json"));
  for (const char* bad : {"../../x.safetensors", "/etc/passwd", "..", ".", "", "a/b", "a\nb"}) {
    nlohmann::json j = manifest_to_json(m);
    j["tensors"][0]["slices"][0]["file"] = bad;
    try {
      manifest_from_json(j, "m.json");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is not a file name inside the checkpoint"), std::string::npos) << e.what();
    }
    j = manifest_to_json(m);
    j["tokenizer"]["file"] = bad;
    EXPECT_THROW(manifest_from_json(j, "m.json"), Error) << bad;
  }
}

std::string manifest_error(const nlohmann::json& j) {
  try {
    manifest_from_json(j, "m.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// Issue 33: sizes of a manifest are multiplied and added without wrapping, and an entry listed many
// times (each listing read and counted again) is refused.
TEST(Manifest, WrappingSizesAndRepeatedEntriesAreRefused) {
  Manifest m;
  m.tokenizer_kind = "byte";
  m.tokenizer = "byte";
  SavedTensor t{"w", TensorRole::param, {4, 4}, "F32", {}};
  t.slices.push_back({SliceSpec::whole({4, 4}), "rank_00000.safetensors", "param/w", 0, {0}});
  m.tensors.push_back(t);
  const nlohmann::json ok = manifest_to_json(m);
  EXPECT_EQ(manifest_error(ok), "no error");

  nlohmann::json j = ok;  // a tensor of 2^32 × 2^32 elements
  j["tensors"][0]["shape"] = {int64_t(1) << 32, int64_t(1) << 32};
  EXPECT_NE(manifest_error(j).find("more elements than 64 bits can count"), std::string::npos) << manifest_error(j);

  j = ok;  // offset + extent past 2^63: wraps negative, and "inside" the tensor
  j["tensors"][0]["slices"][0]["offset"] = {INT64_MAX, 0};
  j["tensors"][0]["slices"][0]["shape"] = {2, 4};
  j["tensors"][0]["slices"][0]["end"] = 8;
  EXPECT_NE(manifest_error(j).find("lies outside the tensor's shape"), std::string::npos) << manifest_error(j);

  j = ok;
  j["tensors"][0]["slices"].push_back(j["tensors"][0]["slices"][0]);
  EXPECT_NE(manifest_error(j).find("entry param/w of rank_00000.safetensors is listed twice"), std::string::npos)
      << manifest_error(j);
}

TEST(StepDirs, ShardFileNames) { EXPECT_EQ(checkpoint_shard_file(3), "rank_00003.safetensors"); }

}  // namespace
