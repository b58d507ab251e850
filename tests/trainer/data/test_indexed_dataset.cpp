// The indexed dataset format against an independent implementation of Megatron-LM's writer and
// reader written from the spec (tests/trainer/data/indexed_dataset_ref.py, numpy): our files must be the
// same bytes, each side must read the other's, and damaged files must be refused naming the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/error.h"
#include "trainer/data/indexed_dataset.h"

using namespace llmtrain;
using namespace llmtrain;
using namespace llmtrain::trainer;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string run(const std::string& cmd) {
  std::string out;
  std::FILE* f = ::popen(cmd.c_str(), "r");
  EXPECT_NE(f, nullptr) << cmd;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  EXPECT_EQ(::pclose(f), 0) << cmd;
  return out;
}

std::string ref_script() {
  return std::string("/usr/bin/python3 ") + LLMTRAIN_SOURCE_DIR + "/tests/trainer/data/indexed_dataset_ref.py";
}

using Docs = std::vector<std::vector<std::vector<int32_t>>>;  // documents of sequences of tokens

// Varied documents: empty ones, several sequences, long ones, the largest ids of the dtype.
Docs make_docs(int32_t max_id, unsigned seed) {
  std::mt19937 rng(seed);
  Docs docs;
  for (int d = 0; d < 300; ++d) {
    std::vector<std::vector<int32_t>> doc;
    int seqs = d % 17 == 0 ? 0 : 1 + int(rng() % 3);
    for (int s = 0; s < seqs; ++s) {
      std::vector<int32_t> seq(rng() % (d % 50 == 1 ? 5000 : 40));
      for (auto& t : seq) t = int32_t(rng() % uint32_t(max_id + 1));
      if (!seq.empty() && d % 7 == 0) seq.back() = max_id;
      doc.push_back(std::move(seq));
    }
    docs.push_back(std::move(doc));
  }
  return docs;
}

class IndexedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("llmtrain_idx_{}_{}", getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string prefix(const std::string& name) const { return (dir_ / name).string(); }

  void write_ours(const std::string& p, TokenDtype dtype, const Docs& docs) {
    IndexedDatasetWriter w(p, dtype);
    for (const auto& doc : docs) {
      for (const auto& seq : doc) w.add_sequence(seq);
      w.end_document();
    }
    w.close();
    w.commit();
  }
  void write_reference(const std::string& p, const char* dtype, const Docs& docs) {
    fs::path json = dir_ / "docs.json";
    std::ofstream(json) << nlohmann::json(docs).dump();
    run(ref_script() + " write " + p + " " + dtype + " < " + json.string());
  }
  fs::path dir_;
};

TEST_F(IndexedDatasetTest, SameBytesAsMegatronLayoutForBothDtypes) {
  for (auto [dtype, name, max_id] :
       {std::tuple{TokenDtype::uint16, "uint16", 65499}, std::tuple{TokenDtype::int32, "int32", 200000}}) {
    Docs docs = make_docs(max_id, 7);
    write_ours(prefix(std::string("ours_") + name), dtype, docs);
    write_reference(prefix(std::string("ref_") + name), name, docs);
    for (const char* ext : {".bin", ".idx"})
      EXPECT_EQ(slurp(prefix(std::string("ours_") + name) + ext), slurp(prefix(std::string("ref_") + name) + ext))
          << name << ext << " differs from the reference writer's";
  }
}

TEST_F(IndexedDatasetTest, ReaderReadsReferenceFilesAndReferenceReadsOurs) {
  Docs docs = make_docs(65499, 11);
  write_reference(prefix("ref"), "uint16", docs);
  IndexedDataset ds(prefix("ref"));
  ASSERT_EQ(ds.num_documents(), int64_t(docs.size()));
  EXPECT_EQ(ds.dtype(), TokenDtype::uint16);
  int64_t seq = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<int32_t> flat;
    for (const auto& s : docs[d]) {
      EXPECT_EQ(ds.sequence(seq++), s);
      flat.insert(flat.end(), s.begin(), s.end());
    }
    ASSERT_EQ(ds.document(int64_t(d)), flat) << "document " << d;
  }
  EXPECT_EQ(seq, ds.num_sequences());

  write_ours(prefix("ours"), TokenDtype::int32, docs);
  auto dump = nlohmann::json::parse(run(ref_script() + " read " + prefix("ours")));
  EXPECT_EQ(dump["dtype_code"], 4);
  EXPECT_EQ(dump["document_count"], docs.size() + 1);
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<int32_t> flat;
    for (const auto& s : docs[d]) flat.insert(flat.end(), s.begin(), s.end());
    ASSERT_EQ(dump["documents"][d].get<std::vector<int32_t>>(), flat) << "document " << d;
  }
}

TEST_F(IndexedDatasetTest, DtypeFollowsMegatronThreshold) {
  EXPECT_EQ(token_dtype_for_vocab(257), TokenDtype::uint16);
  EXPECT_EQ(token_dtype_for_vocab(50257), TokenDtype::uint16);
  EXPECT_EQ(token_dtype_for_vocab(65499), TokenDtype::uint16);
  EXPECT_EQ(token_dtype_for_vocab(65500), TokenDtype::int32);  // Megatron: cardinality < 65500
  EXPECT_EQ(token_dtype_for_vocab(128256), TokenDtype::int32);
}

TEST_F(IndexedDatasetTest, EmptyDatasetRoundTrips) {
  write_ours(prefix("empty"), TokenDtype::uint16, {});
  IndexedDataset ds(prefix("empty"));
  EXPECT_EQ(ds.num_documents(), 0);
  EXPECT_EQ(ds.num_tokens(), 0);
}

// Each damage is refused with a message that names the damaged file.
TEST_F(IndexedDatasetTest, DamagedFilesAreRefusedNamingTheFile) {
  Docs docs = make_docs(1000, 3);
  std::string good = prefix("good");
  write_ours(good, TokenDtype::uint16, docs);
  std::string idx = slurp(good + ".idx"), bin = slurp(good + ".bin");

  struct Case {
    const char* name;
    std::string idx, bin;
    const char* file;
    const char* says;
  };
  std::string bad_version = idx;
  bad_version[9] = 2;
  std::string bad_dtype = idx;
  bad_dtype[17] = 7;  // float32
  std::string bad_docs = idx;
  bad_docs[bad_docs.size() - 8] = 5;  // last document index != sequence count
  std::vector<Case> cases = {
      {"truncated_idx", idx.substr(0, idx.size() - 3), bin, ".idx", "truncated or corrupt"},
      {"tiny_idx", idx.substr(0, 20), bin, ".idx", "shorter than the 34-byte header"},
      {"truncated_bin", idx, bin.substr(0, bin.size() - 2), ".bin", "the .bin is truncated"},
      {"longer_bin", idx, bin + "xx", ".bin", "do not belong together"},
      {"foreign_idx", std::string("PK\x03\x04 this is a zip file, not an index, padded....."), bin, ".idx",
       "not a Megatron-LM indexed dataset index"},
      {"version", bad_version, bin, ".idx", "version 2, expected 1"},
      {"dtype", bad_dtype, bin, ".idx", "is not an integer token type"},
      {"doc_indices", bad_docs, bin, ".idx", "document indices must run from 0"},
  };
  for (const auto& c : cases) {
    std::string p = prefix(c.name);
    std::ofstream(p + ".idx", std::ios::binary) << c.idx;
    std::ofstream(p + ".bin", std::ios::binary) << c.bin;
    try {
      IndexedDataset ds(p);
      ADD_FAILURE() << c.name << ": opened a damaged dataset";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(p + c.file), std::string::npos) << c.name << ": " << msg;
      EXPECT_NE(msg.find(c.says), std::string::npos) << c.name << ": " << msg;
    }
  }
  fs::remove(prefix("missing") + ".bin");
  std::ofstream(prefix("missing") + ".idx", std::ios::binary) << idx;
  try {
    IndexedDataset ds(prefix("missing"));
    ADD_FAILURE() << "opened a dataset without its .bin";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(prefix("missing") + ".bin"), std::string::npos) << e.what();
  }
}

TEST_F(IndexedDatasetTest, AbandonedWriterLeavesNothing) {
  {
    IndexedDatasetWriter w(prefix("partial"), TokenDtype::uint16);
    w.add_document(std::vector<int32_t>{1, 2, 3});
    w.close();  // complete, but never committed
  }
  {
    IndexedDatasetWriter w(prefix("partial2"), TokenDtype::uint16);
    w.add_document(std::vector<int32_t>{1, 2, 3});
  }
  EXPECT_TRUE(fs::is_empty(dir_)) << "temporaries left in " << dir_;
}

// Issue 33: the writer's temporaries were `PREFIX.bin.tmp-<pid>` and friends, opened with fopen("wb"):
// a link planted at such a name made prep write the tokens into another file.
TEST_F(IndexedDatasetTest, WriterNeverWritesThroughALinkAtATemporaryName) {
  std::ofstream(dir_ / "victim") << "precious";
  for (const char* name : {"d.bin.tmp-", "d.idx.tmp-", "d.idx.lengths.tmp-", "d.idx.docs.tmp-"})
    fs::create_symlink(dir_ / "victim", dir_ / (name + std::to_string(::getpid())));
  write_ours(prefix("d"), TokenDtype::uint16, {{{1, 2, 3}}});
  std::ifstream in(dir_ / "victim");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "precious");
  EXPECT_EQ(IndexedDataset(prefix("d")).num_tokens(), 3);
}

TEST_F(IndexedDatasetTest, WriterRefusesIdsTheDtypeCannotHold) {
  IndexedDatasetWriter w(prefix("small"), TokenDtype::uint16);
  EXPECT_THROW(w.add_document(std::vector<int32_t>{70000}), Error);
}

}  // namespace
