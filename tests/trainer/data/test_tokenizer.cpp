// Tokenizers without the Python oracle: the byte tokenizer, a hand-made BPE whose ids are worked
// out by hand from GPT-2's algorithm, the ways to point at tokenizer files, and the refusals
// (unsupported kinds, broken files, invalid UTF-8, unknown ids) with messages naming the file.
// tests/trainer/data/test_tokenizer_parity.cpp checks real BPEs against Hugging Face.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "trainer/data/bpe_tokenizer.h"
#include "trainer/data/regex_splitter.h"
#include "trainer/data/tokenizer.h"
#include "trainer/data/tokenizer_vocab.h"
#include "trainer/data/utf8.h"

using namespace llmtrain;
using namespace llmtrain;
using namespace llmtrain::trainer;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The 256 byte symbols in GPT-2's alphabet, then "Ġt" "he" "Ġthe", merges in that order, and
// <|endoftext|> as a special added token.
json tiny_bpe() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, byte_to_unicode()[b]);
    vocab[s] = b;
  }
  vocab["\xc4\xa0t"] = 256;  // "Ġt"
  vocab["he"] = 257;
  vocab["\xc4\xa0the"] = 258;
  vocab["<|endoftext|>"] = 259;
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::array({{{"id", 259},
                                    {"content", "<|endoftext|>"},
                                    {"single_word", false},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"normalized", false},
                                    {"special", true}}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", json::array({"\xc4\xa0 t", "h e", "\xc4\xa0t he"})}};
  return j;
}

class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("llmtrain_tok_{}_{}", getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  fs::path dir_;
};

TEST_F(TokenizerTest, ByteTokenizerIsBytesPlusEndOfDocument) {
  auto t = load_tokenizer("byte");
  EXPECT_EQ(t->vocab_size(), 257);
  EXPECT_EQ(t->eod_id(), 256);
  EXPECT_EQ(t->spec(), "byte");
  std::string text = "h\xc3\xa9\xff<|endoftext|>";  // invalid UTF-8 and a special token's text: just bytes
  auto ids = t->encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[0], 'h');
  EXPECT_EQ(ids[1], 0xc3);
  EXPECT_EQ(ids[3], 0xff);
  EXPECT_EQ(t->decode(ids), text);
  EXPECT_EQ(t->decode(std::vector<int32_t>{104, 256}), "h<|endoftext|>");
  EXPECT_TRUE(t->is_special(256));
  EXPECT_NE(error_of([&] { t->decode(std::vector<int32_t>{257}); }).find("cannot decode token id 257"),
            std::string::npos);
  EXPECT_EQ(tokenizer_vocab_size("byte"), 257);
  auto again = load_tokenizer_from_bytes(t->source().kind, t->source().bytes, "checkpoint");
  EXPECT_EQ(again->encode(text), ids);
}

TEST_F(TokenizerTest, DeeplyNestedJsonIsAnErrorNotACrash) {
  // A million '[' would overflow the stack inside the JSON parser (SIGSEGV) before any error.
  const std::string deep = "{\"model\": " + std::string(1000000, '[') + std::string(1000000, ']') + "}";
  std::string path = write("tokenizer.json", deep);
  EXPECT_NE(error_of([&] { load_tokenizer(path); }).find("JSON nested deeper than 64 levels"), std::string::npos);
  EXPECT_NE(error_of([&] {
              load_tokenizer_from_bytes(kTokenizerKindHfJson, deep, "checkpoint");
            }).find("JSON nested deeper than 64 levels"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              load_tokenizer_from_bytes(kTokenizerKindGpt2Files, deep, "checkpoint");
            }).find("JSON nested deeper than 64 levels"),
            std::string::npos);
}

TEST_F(TokenizerTest, AHugeTokenIdIsAnErrorNotGigabytes) {
  // Found by fuzz_tokenizer: one id of 2^30 in a small vocabulary sized every id-indexed array to
  // 2^30 entries (an out-of-memory abort under ASan, gigabytes without it).
  json j = tiny_bpe();
  j["model"]["vocab"]["huge"] = 1 << 30;
  std::string path = write("tokenizer.json", j.dump());
  EXPECT_NE(error_of([&] { load_tokenizer(path); }).find("token id 1073741824 is far beyond the vocabulary's"),
            std::string::npos);
}

TEST_F(TokenizerTest, HandMadeBpeMergesByRank) {
  std::string path = write("tokenizer.json", tiny_bpe().dump());
  auto t = load_tokenizer(path);
  EXPECT_EQ(t->vocab_size(), 260);
  EXPECT_EQ(t->eod_id(), 259);
  // "the the": words "the" and " the". "the": t h e -> (h,e) merges -> [t, he].
  // " the": Ġ t h e -> (Ġ,t) rank 0 -> Ġt h e -> (h,e) -> Ġt he -> (Ġt,he) -> Ġthe.
  EXPECT_EQ(t->encode("the the"), (std::vector<int32_t>{'t', 257, 258}));
  // Special token text becomes its id; "!" is byte 33; a space is Ġ (byte 32 -> id 32).
  EXPECT_EQ(t->encode("<|endoftext|> the!"), (std::vector<int32_t>{259, 258, '!'}));
  EXPECT_EQ(t->decode(t->encode("the the<|endoftext|>")), "the the<|endoftext|>");
  EXPECT_EQ(tokenizer_vocab_size(path), 260);
  EXPECT_NE(t->describe().find("end of document <|endoftext|>=259"), std::string::npos) << t->describe();
}

TEST_F(TokenizerTest, InvalidUtf8IsRefusedWithItsOffset) {
  auto t = load_tokenizer(write("tokenizer.json", tiny_bpe().dump()));
  for (const auto& c :
       {std::pair{std::string("ab\xff"), 2}, std::pair{std::string("ok \xc3"), 3},
        std::pair{std::string("\xed\xa0\x80 surrogate"), 0}, std::pair{std::string("\xc0\xaf overlong"), 0}}) {
    const std::string& text = c.first;
    const int offset = c.second;
    std::string msg = error_of([&] { t->encode(text); });
    EXPECT_NE(msg.find(fmt::format("invalid UTF-8 at byte {}", offset)), std::string::npos) << msg;
  }
}

TEST_F(TokenizerTest, FindsFilesByDirectoryVocabOrMerges) {
  json j = tiny_bpe();
  write("hf/tokenizer.json", j.dump());
  EXPECT_EQ(load_tokenizer((dir_ / "hf").string())->vocab_size(), 260);
  // GPT-2 layout: vocab.json + merges.txt.
  write("gpt2/vocab.json", j["model"]["vocab"].dump());
  write("gpt2/merges.txt", "#version: 0.2\n\xc4\xa0 t\nh e\n\xc4\xa0t he\n");
  for (std::string p : {"gpt2", "gpt2/vocab.json", "gpt2/merges.txt"}) {
    auto t = load_tokenizer((dir_ / p).string());
    EXPECT_EQ(t->encode("the the"), (std::vector<int32_t>{'t', 257, 258})) << p;
    EXPECT_EQ(t->eod_id(), 259) << p;
  }
  write("lonely/vocab.json", j["model"]["vocab"].dump());
  EXPECT_NE(error_of([&] { load_tokenizer((dir_ / "lonely/vocab.json").string()); }).find("merges.txt"),
            std::string::npos);
}

TEST_F(TokenizerTest, OtherKindsAreRefusedAsNotSupportedYet) {
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    const char* says;
  };
  std::vector<Case> cases = {
      {"wordpiece", [](json& j) { j["model"]["type"] = "WordPiece"; }, "not supported yet: WordPiece tokenizer model"},
      {"unigram",
       [](json& j) {
         j["model"] = {{"type", "Unigram"}, {"vocab", json::array()}};
       },
       "not supported yet: Unigram tokenizer model"},
      {"metaspace",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xe2\x96\x81"}};
       },
       "not supported yet: the Metaspace pre-tokenizer"},
      {"normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "NFC"}};
       },
       "not supported yet: the NFC normalizer"},
      {"byte_fallback", [](json& j) { j["model"]["byte_fallback"] = true; },
       "not supported yet: BPE with byte_fallback"},
      {"no_byte_level", [](json& j) { j["pre_tokenizer"] = nullptr; },
       "not supported yet: a BPE tokenizer without a ByteLevel"},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, "not supported yet: BPE dropout"},
      {"split_removed",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers",
                                {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}},
                                 {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
       },
       "not supported yet: Split pre-tokenizer with behavior Removed"},
      {"bad_merge", [](json& j) { j["model"]["merges"].push_back("x zz"); }, "token \"zz\" is not in the vocabulary"},
      {"decoder",
       [](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "not supported yet: the WordPiece decoder"},
  };
  for (const auto& c : cases) {
    json j = tiny_bpe();
    c.edit(j);
    std::string path = write(std::string(c.name) + ".json", j.dump());
    std::string msg = error_of([&] { load_tokenizer(path); });
    EXPECT_NE(msg.find(c.says), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << c.name << " must name the file: " << msg;
  }
  std::string sp = write("sp/tokenizer.model", "\x0a\x0b binary");
  EXPECT_NE(error_of([&] { load_tokenizer(sp); }).find("not supported yet: SentencePiece"), std::string::npos);
  EXPECT_NE(error_of([&] { load_tokenizer((dir_ / "sp").string()); }).find("not supported yet: SentencePiece"),
            std::string::npos);
  std::string bad = write("broken.json", "{\"model\": {");
  EXPECT_NE(error_of([&] { load_tokenizer(bad); }).find("is not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([&] { load_tokenizer((dir_ / "nothing.json").string()); }).find("cannot read tokenizer file"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_tokenizer_from_bytes("sentencepiece", "", "ckpt"); }).find("unknown tokenizer kind"),
            std::string::npos);
}

TEST_F(TokenizerTest, DecodeRefusesIdsWithoutToken) {
  json j = tiny_bpe();
  j["added_tokens"][0]["id"] = 300;  // ids 260..299 have no token
  auto t = load_tokenizer(write("t.json", j.dump()));
  EXPECT_EQ(t->vocab_size(), 301);
  EXPECT_NE(error_of([&] { t->decode(std::vector<int32_t>{270}); }).find("no token has this id"), std::string::npos);
  EXPECT_NE(error_of([&] { t->decode(std::vector<int32_t>{-1}); }).find("outside [0, 301)"), std::string::npos);
}

TEST(RegexTranslation, OnigurumaClassesBecomeUnicodeProperties) {
  EXPECT_EQ(translate_onig_pattern(R"(\s+(?!\S)|[^\s\p{L}]|\d|\u00e9)", "t"),
            R"(\p{White_Space}+(?!\P{White_Space})|[^\p{White_Space}\p{L}]|\p{Nd}|\x{00e9})");
  EXPECT_NE(error_of([] { translate_onig_pattern("[a-z&&[^aeiou]]", "t.json"); }).find("not supported yet"),
            std::string::npos);
  // Oniguruma's \s (White_Space) takes U+0085 but not U+180E; PCRE2's own \s differs on both.
  RegexSplitter ws(R"(\s)", "t");
  EXPECT_EQ(ws.match_prefix("\xc2\x85"), 2);
  EXPECT_EQ(ws.match_prefix("\xe1\xa0\x8e"), -1);
}

}  // namespace
