// Our BPE against Hugging Face `tokenizers` (the reference implementation): a byte-level BPE and a
// SentencePiece-style (LLaMA-2: byte fallback, Metaspace or Prepend + Replace) BPE trained by
// `tokenizers` on real text (Debian's English, Chinese and Russian fortunes), loaded in every layout
// we accept, must give the library's ids on > 1 MB of varied documents (Unicode, emoji, CJK,
// characters the SentencePiece-style vocabulary lacks, whitespace runs, numbers, contractions,
// special and added tokens), and decode back to the bytes (byte-level) or to the text the library's
// decode gives (SentencePiece-style). tests/trainer/data/tokenizer_parity.py produces the files and
// the reference ids and texts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/error.h"
#include "trainer/data/tokenizer.h"
#include "trainer/data/tokenizer_load.h"

using namespace llmtrain;
using namespace llmtrain;
using namespace llmtrain::trainer;
namespace fs = std::filesystem;

namespace {

fs::path g_dir;
std::vector<std::string> g_docs;

uint32_t read_u32(std::ifstream& in) {
  uint32_t v = 0;
  in.read(reinterpret_cast<char*>(&v), 4);
  return v;
}

// u32 length + bytes, n times.
std::vector<std::string> read_texts(std::ifstream& in, size_t n) {
  std::vector<std::string> out(n);
  for (auto& d : out) {
    d.resize(read_u32(in));
    in.read(d.data(), std::streamsize(d.size()));
  }
  return out;
}

std::vector<std::vector<int32_t>> read_ids(const fs::path& p, size_t n) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in) << p;
  std::vector<std::vector<int32_t>> out(n);
  for (auto& ids : out) {
    ids.resize(read_u32(in));
    in.read(reinterpret_cast<char*>(ids.data()), std::streamsize(ids.size() * 4));
  }
  EXPECT_TRUE(in) << "truncated " << p;
  return out;
}

std::string show(const Tokenizer& t, const std::vector<int32_t>& ids, size_t at) {
  std::string s;
  for (size_t i = at > 3 ? at - 3 : 0; i < std::min(ids.size(), at + 4); ++i) {
    std::string piece;
    try {
      piece = t.decode(std::span(&ids[i], 1));
    } catch (const Error&) {
      piece = "?";
    }
    s += fmt::format("{}{}={:?} ", i == at ? "*" : "", ids[i], piece);
  }
  return s;
}

// The reference files are made once per build tree (ctest runs every test in its own process) and
// remade when the script (or its helper) changes; a lock keeps parallel test processes from racing.
void load_reference() {
  if (!g_docs.empty()) return;
  fs::path script = fs::path(LLMTRAIN_SOURCE_DIR) / "tests/trainer/data/tokenizer_parity.py";
  g_dir = fs::path(LLMTRAIN_BINARY_DIR) / "testdata/tokenizer_parity";
  fs::create_directories(g_dir.parent_path());
  int lock = ::open((g_dir.string() + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(lock, 0);
  ::flock(lock, LOCK_EX);
  fs::path done = g_dir / "done";
  const fs::path helper = script.parent_path() / "sentencepiece_style.py";
  if (!fs::exists(done) || fs::last_write_time(script) > fs::last_write_time(done) ||
      fs::last_write_time(helper) > fs::last_write_time(done)) {
    fs::remove_all(g_dir);
    fs::create_directories(g_dir);
    std::string python = std::string(LLMTRAIN_SOURCE_DIR) + "/.venv/bin/python";
    ASSERT_TRUE(fs::exists(python)) << python << " is missing: run scripts/setup.sh (it installs `tokenizers`)";
    std::string cmd = python + " " + script.string() + " " + g_dir.string();
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ofstream(done) << "ok\n";
  }
  ::flock(lock, LOCK_UN);
  ::close(lock);
  std::ifstream in(g_dir / "texts.bin", std::ios::binary);
  g_docs = read_texts(in, read_u32(in));
  ASSERT_TRUE(in);
}

class TokenizerParity : public ::testing::TestWithParam<std::pair<const char*, const char*>> {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(load_reference()); }
};

class TokenizerParityExtra : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(load_reference()); }
};

TEST_P(TokenizerParity, IdsMatchHuggingFaceAndDecodeToTheBytes) {
  auto [file, ids_name] = GetParam();
  bool round_trip =
      std::string(ids_name) == "gpt2" || std::string(ids_name) == "llama3" || std::string(ids_name) == "gpt4o";
  // SentencePiece-style: decode must give what Hugging Face's decode gives.
  const bool sentencepiece = std::string(ids_name).starts_with("sp_");
  ASSERT_FALSE(g_docs.empty());
  auto tok = load_tokenizer((g_dir / file).string());
  auto expected = read_ids(g_dir / (std::string(ids_name) + ".ids"), g_docs.size());
  std::vector<std::string> hf_text;
  if (sentencepiece) {
    std::ifstream in(g_dir / (std::string(ids_name) + ".text"), std::ios::binary);
    hf_text = read_texts(in, g_docs.size());
    ASSERT_TRUE(in) << ids_name << ".text";
  }
  size_t bytes = 0, mismatches = 0, not_round_trip = 0;
  for (size_t d = 0; d < g_docs.size(); ++d) {
    bytes += g_docs[d].size();
    std::vector<int32_t> got = tok->encode(g_docs[d]);
    if (got != expected[d]) {
      size_t at = 0;
      while (at < got.size() && at < expected[d].size() && got[at] == expected[d][at]) ++at;
      if (++mismatches <= 5)
        ADD_FAILURE() << file << ": document " << d << " differs at token " << at
                      << "\n  text:     " << fmt::format("{:?}", g_docs[d].substr(0, 300))
                      << "\n  expected: " << show(*tok, expected[d], at) << "\n  got:      " << show(*tok, got, at);
    }
    // Stripping added tokens (rstrip/lstrip) and an added prefix space change the text by design;
    // every other layout must give the bytes back.
    if (round_trip && tok->decode(got) != g_docs[d] && ++not_round_trip <= 5)
      ADD_FAILURE() << file << ": document " << d
                    << " does not decode to its bytes: " << fmt::format("{:?}", g_docs[d].substr(0, 200));
    if (sentencepiece) {
      const std::string text = tok->decode(expected[d]);
      if (text != hf_text[d] && ++not_round_trip <= 5)
        ADD_FAILURE() << file << ": document " << d << " decodes to\n  " << fmt::format("{:?}", text.substr(0, 200))
                      << "\nHugging Face:\n  " << fmt::format("{:?}", hf_text[d].substr(0, 200));
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << g_docs.size() << " documents";
  EXPECT_EQ(not_round_trip, 0u) << "of " << g_docs.size() << " documents";
  EXPECT_GE(bytes, 1000000u) << "the comparison must cover at least 1 MB";
}

INSTANTIATE_TEST_SUITE_P(Layouts, TokenizerParity,
                         ::testing::Values(std::pair{"bpe.json", "bpe"}, std::pair{"bpe_legacy.json", "bpe_legacy"},
                                           std::pair{"gpt2/vocab.json", "gpt2"}, std::pair{"llama3.json", "llama3"},
                                           std::pair{"gpt4o.json", "gpt4o"}, std::pair{"prefix.json", "prefix"},
                                           std::pair{"sp_legacy.json", "sp_legacy"},
                                           std::pair{"sp_first.json", "sp_first"},
                                           std::pair{"sp_split.json", "sp_split"},
                                           std::pair{"sp_never.json", "sp_never"}, std::pair{"sp_unk.json", "sp_unk"}),
                         [](const auto& info) {
                           std::string n = info.param.second;
                           return n;
                         });

// Many threads encoding at once get the ids one thread gets (per-thread caches, shared tables).
TEST_F(TokenizerParityExtra, ConcurrentEncodingIsDeterministic) {
  auto tok = load_tokenizer((g_dir / "llama3.json").string());
  auto expected = read_ids(g_dir / "llama3.ids", g_docs.size());
  std::vector<size_t> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (size_t d = t; d < g_docs.size(); d += 2)
        if (tok->encode(g_docs[d]) != expected[d]) ++wrong[t];
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(wrong[t], 0u) << "thread " << t;
}

// The SentencePiece-style references exercise what they are meant to: characters the vocabulary
// lacks fall back to their bytes' tokens (ids 3..258), or become <unk> (id 0) without byte_fallback.
TEST_F(TokenizerParityExtra, ReferencesFallBackToBytesAndUnknown) {
  size_t byte_tokens = 0, unknown = 0;
  for (const auto& ids : read_ids(g_dir / "sp_first.ids", g_docs.size()))
    byte_tokens += size_t(std::count_if(ids.begin(), ids.end(), [](int32_t id) { return id >= 3 && id < 259; }));
  for (const auto& ids : read_ids(g_dir / "sp_unk.ids", g_docs.size()))
    unknown += size_t(std::count(ids.begin(), ids.end(), 0));
  EXPECT_GE(byte_tokens, 10000u);
  EXPECT_GE(unknown, 1000u);
  // "▁" (the prepended space, as its own token: no merge joins it to an emoji), then the 4 bytes.
  auto tok = load_tokenizer((g_dir / "sp_first.json").string());
  const std::string emoji = "\xf0\x9f\xa6\x80";  // U+1F980, in no fortune
  auto ids = tok->encode(emoji);
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(tok->decode(std::span(ids.data(), 1)), "");  // the decoder strips the leading space
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()),
            (std::vector<int32_t>{3 + 0xf0, 3 + 0x9f, 3 + 0xa6, 3 + 0x80}));
  EXPECT_EQ(tok->decode(ids), emoji);
}

// A checkpoint keeps the tokenizer as bytes; rebuilt from them it encodes the same.
TEST_F(TokenizerParityExtra, RebuiltFromSourceBytesEncodesTheSame) {
  for (const char* file : {"bpe.json", "gpt2/vocab.json", "sp_legacy.json"}) {
    auto tok = load_tokenizer((g_dir / file).string());
    TokenizerSource src = tok->source();
    auto again = load_tokenizer_from_bytes(src.kind, src.bytes, "checkpoint");
    EXPECT_EQ(again->vocab_size(), tok->vocab_size());
    EXPECT_EQ(again->eod_id(), tok->eod_id());
    for (size_t d = 0; d < g_docs.size(); d += 7) ASSERT_EQ(again->encode(g_docs[d]), tok->encode(g_docs[d])) << file;
  }
}

}  // namespace
