// Tokenizers without the Python oracle: the byte tokenizer, hand-made BPEs (byte-level and
// SentencePiece-style) whose ids are worked out by hand from the algorithms, the decoder steps on
// the examples Hugging Face's give, the ways to point at tokenizer files, and the refusals
// (unsupported kinds, broken or hostile files, invalid UTF-8, unknown ids) with messages naming the
// file.
// tests/trainer/data/test_tokenizer_parity.cpp checks real BPEs against Hugging Face.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "trainer/data/added_tokens.h"
#include "trainer/data/bpe_decoder.h"
#include "trainer/data/bpe_normalizer.h"
#include "trainer/data/bpe_tokenizer.h"
#include "trainer/data/regex_splitter.h"
#include "trainer/data/tokenizer.h"
#include "trainer/data/tokenizer_load.h"
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

// LLaMA-2's layout in miniature: <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF> (ids 3..258),
// then "▁" 259, "a" 260, "b" 261, "▁a" 262, "ab" 263, "▁ab" 264; merges (▁ a), (a b), (▁a b);
// byte_fallback, fuse_unk, </s> special; pre-tokenizer Metaspace (first, no split) and LLaMA-2's
// decoder.
const std::string kSpace = "\xe2\x96\x81";  // ▁
json tiny_sp() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  int id = 259;
  for (const std::string& t :
       {kSpace, std::string("a"), std::string("b"), kSpace + "a", std::string("ab"), kSpace + "ab"})
    vocab[t] = id++;
  json j;
  j["added_tokens"] = json::array();
  for (int i = 0; i < 3; ++i)
    j["added_tokens"].push_back({{"id", i},
                                 {"content", std::vector<std::string>{"<unk>", "<s>", "</s>"}[size_t(i)]},
                                 {"normalized", false},
                                 {"special", true}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", "first"}, {"split", false}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  j["model"] = {
      {"type", "BPE"},
      {"unk_token", "<unk>"},
      {"fuse_unk", true},
      {"byte_fallback", true},
      {"vocab", vocab},
      {"merges", json::array({json::array({kSpace, "a"}), json::array({"a", "b"}), json::array({kSpace + "a", "b"})})}};
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
  // Each case edits `base`; loading the result must fail with an error that says `says` and names the file.
  struct RefusalCase {
    const char* name;
    std::function<void(json&)> edit;
    const char* says;
  };
  void expect_refused(const json& base, const std::vector<RefusalCase>& cases) {
    for (const auto& c : cases) {
      json j = base;
      c.edit(j);
      std::string path = write(std::string(c.name) + ".json", j.dump());
      std::string msg = error_of([&] { load_tokenizer(path); });
      EXPECT_NE(msg.find(c.says), std::string::npos) << c.name << ": " << msg;
      EXPECT_NE(msg.find(path), std::string::npos) << c.name << " must name the file: " << msg;
    }
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

// The added-token matcher's cost is linear in the text whatever the number of tokens (issue 65:
// 200,000 added tokens on 150,000 '<' compared every token at every position and never finished):
// its trie steps, counted (no timing), double with the text and stay within the text's length ×
// the longest token; the matches are still leftmost-longest.
TEST(AddedTokens, MatchingCostIsLinearInTheText) {
  const RegexSplitter word_char(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}])", "the test");
  auto split = [&](const AddedMatcher& m, const std::string& text, uint64_t& steps) {
    std::vector<Segment> out;
    steps = 0;
    m.split(text, 0, uint32_t(text.size()), word_char, out, &steps);
    return out;
  };
  uint64_t a = 0, b = 0;
  AddedMatcher many;
  for (int i = 0; i < 200000; ++i) many.add({.id = 1000 + i, .content = "<t" + std::to_string(i) + ">"});
  many.finish();
  split(many, std::string(150000, '<'), a);
  split(many, std::string(300000, '<'), b);
  EXPECT_EQ(a, 2u * 150000 - 1);  // each '<' one step in, one step out (the last: the text's end)
  EXPECT_EQ(b, 2u * 300000 - 1);
  const std::vector<Segment> found = split(many, "a<t7><t123456>x<t", a);
  ASSERT_EQ(found.size(), 4u);
  EXPECT_EQ(found[0].id, -1);
  EXPECT_EQ(found[1].id, 1007);
  EXPECT_EQ(found[2].id, 124456);
  EXPECT_EQ(found[3].id, -1);
  // Tokens nested in one another ('<', '<<', ... 64 of them): the longest wins, at most 65 steps a byte.
  AddedMatcher nested;
  for (int k = 1; k <= 64; ++k) nested.add({.id = k, .content = std::string(size_t(k), '<')});
  nested.finish();
  const std::vector<Segment> runs = split(nested, std::string(64 * 2000, '<'), a);
  EXPECT_EQ(runs.size(), 2000u);
  EXPECT_EQ(runs[0].id, 64);
  split(nested, std::string(64 * 4000, '<'), b);
  EXPECT_EQ(a, 65u * 2000 - 1);  // 64 steps along each match and one out of it
  EXPECT_EQ(b, 65u * 4000 - 1);
}

// Ids are checked in the type they arrive in (Hugging Face refuses both): 2^32 + 339 is not 339,
// and an added token's 2^32 is not 0.
TEST_F(TokenizerTest, IdsThatWouldWrapAreRefused) {
  expect_refused(
      tiny_bpe(),
      {
          {"vocab_id_wraps", [](json& j) { j["model"]["vocab"]["h"] = (int64_t(1) << 32) + 339; },
           "vocabulary entry \"h\"'s id 4294967635 is outside [0, 2147483647]"},
          {"vocab_id_float", [](json& j) { j["model"]["vocab"]["h"] = 104.5; }, "expected an integer id"},
          {"added_id_wraps",
           [](json& j) {
             j["added_tokens"] = json::array({{{"id", int64_t(1) << 32}, {"content", "<x>"}, {"special", true}}});
           },
           "added token \"<x>\"'s id 4294967296 is outside [0, 2147483647]"},
          {"added_id_unsigned_max",
           [](json& j) {
             j["added_tokens"] = json::array({{{"id", uint64_t(-1)}, {"content", "<x>"}}});
           },
           "not an integer"},
          {"added_token_too_long",
           [](json& j) {
             j["added_tokens"] = json::array({{{"id", 300}, {"content", std::string(kMaxAddedTokenBytes + 1, '<')}}});
           },
           "added token 300 is 4097 bytes, more than the 4096 llmtrain accepts"},
      });
}

TEST_F(TokenizerTest, OtherKindsAreRefusedAsNotSupportedYet) {
  expect_refused(
      tiny_bpe(),
      {
          {"wordpiece", [](json& j) { j["model"]["type"] = "WordPiece"; },
           "not supported yet: WordPiece tokenizer model"},
          {"unigram",
           [](json& j) {
             j["model"] = {{"type", "Unigram"}, {"vocab", json::array()}};
           },
           "not supported yet: Unigram tokenizer model"},
          {"normalizer",
           [](json& j) {
             j["normalizer"] = {{"type", "NFC"}};
           },
           "not supported yet: the NFC normalizer"},
          {"byte_fallback",
           [](json& j) {
             j["model"]["vocab"].erase("\xc4\xa0");
             j["model"]["byte_fallback"] = true;
           },
           "not supported yet: byte_fallback in a byte-level BPE whose vocabulary lacks 1 of the 256 byte symbols"},
          {"no_byte_level", [](json& j) { j["pre_tokenizer"] = nullptr; },
           "not supported yet: the ByteLevel decoder in a BPE without the ByteLevel pre-tokenizer"},
          {"metaspace_and_byte_level",
           [](json& j) {
             j["pre_tokenizer"] = {{"type", "Sequence"},
                                   {"pretokenizers", {{{"type", "Metaspace"}}, j["pre_tokenizer"]}}};
           },
           "not supported yet: Metaspace and ByteLevel pre-tokenizers together"},
          {"replace_regex",
           [](json& j) {
             j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}};
           },
           "not supported yet: the Replace normalizer with a Regex pattern"},
          {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, "not supported yet: BPE dropout"},
          {"split_removed",
           [](json& j) {
             j["pre_tokenizer"] = {{"type", "Sequence"},
                                   {"pretokenizers",
                                    {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}},
                                     {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
           },
           "not supported yet: Split pre-tokenizer with behavior Removed"},
          {"bad_merge", [](json& j) { j["model"]["merges"].push_back("x zz"); },
           "token \"zz\" is not in the vocabulary"},
          {"decoder",
           [](json& j) {
             j["decoder"] = {{"type", "WordPiece"}};
           },
           "not supported yet: the WordPiece decoder"},
      });
  // SentencePiece's tokenizer.model: not read; the error points at the tokenizer.json beside it, or
  // says how to make one.
  std::string sp = write("sp/tokenizer.model", "\x0a\x0b binary");
  auto message_and_hint = [&] {
    try {
      load_tokenizer(sp);
    } catch (const Error& e) {
      return std::string(e.what()) + "\nhint: " + e.hint();
    }
    return std::string("(no error)");
  };
  std::string msg = message_and_hint();
  EXPECT_NE(msg.find("SentencePiece .model files are not read, and there is no tokenizer.json beside it"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("AutoTokenizer.from_pretrained('" + (dir_ / "sp").string() + "').save_pretrained("),
            std::string::npos)
      << msg;
  EXPECT_NE(error_of([&] { load_tokenizer((dir_ / "sp").string()); }).find("SentencePiece .model files are not read"),
            std::string::npos);
  write("sp/tokenizer.json", tiny_sp().dump());
  msg = message_and_hint();
  EXPECT_NE(msg.find("use " + (dir_ / "sp/tokenizer.json").string()), std::string::npos) << msg;
  EXPECT_EQ(load_tokenizer((dir_ / "sp").string())->vocab_size(), 265) << "a directory prefers its tokenizer.json";
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

// The ids of tiny_sp(), by hand. "ab ab" is "▁ab▁ab" (Metaspace: ' ' -> ▁, ▁ in front of the text):
// symbols ▁ a b ▁ a b; (▁ a) has rank 0, leftmost first: ▁a b ▁ a b, then ▁a b ▁a b; (a b) no
// longer occurs; (▁a b) twice: ▁ab ▁ab = 264 264.
TEST_F(TokenizerTest, HandMadeSentencePieceBpe) {
  std::string path = write("tokenizer.json", tiny_sp().dump());
  auto t = load_tokenizer(path);
  EXPECT_EQ(t->vocab_size(), 265);
  EXPECT_EQ(t->eod_id(), 2);
  EXPECT_EQ(t->encode("ab ab"), (std::vector<int32_t>{264, 264}));
  EXPECT_EQ(t->decode(std::vector<int32_t>{264, 264}), "ab ab");  // "▁ab▁ab" -> " ab ab", first space stripped
  // "é" is not in the vocabulary: its UTF-8 bytes C3 A9 as <0xC3> <0xA9> (3 + byte), after the ▁.
  EXPECT_EQ(t->encode("\xc3\xa9"), (std::vector<int32_t>{259, 3 + 0xc3, 3 + 0xa9}));
  EXPECT_EQ(t->decode(t->encode("\xc3\xa9")), "\xc3\xa9");
  // prepend_scheme first: only the text's first stretch gets ▁; after </s>, "ab" is a b -> ab (263).
  EXPECT_EQ(t->encode("ab</s>ab"), (std::vector<int32_t>{264, 2, 263}));
  EXPECT_EQ(t->decode(std::vector<int32_t>{264, 2, 263}), "ab</s>ab");
  // "a  b" -> ▁a▁▁b: (▁ a) -> ▁a, then no pair has a merge.
  EXPECT_EQ(t->encode("a  b"), (std::vector<int32_t>{262, 259, 259, 261}));
  EXPECT_EQ(t->encode(""), std::vector<int32_t>{});
  EXPECT_NE(t->describe().find("SentencePiece-style BPE"), std::string::npos) << t->describe();
  EXPECT_NE(t->describe().find("byte fallback (256 of 256 <0xNN> tokens)"), std::string::npos) << t->describe();

  // Always: every stretch between added tokens gets ▁. Split: a word starts at every ▁ (same ids here).
  json j = tiny_sp();
  j["pre_tokenizer"]["prepend_scheme"] = "always";
  j["pre_tokenizer"]["split"] = true;
  auto always = load_tokenizer(write("always.json", j.dump()));
  EXPECT_EQ(always->encode("ab</s>ab"), (std::vector<int32_t>{264, 2, 264}));
  EXPECT_EQ(always->encode("a  b"), (std::vector<int32_t>{262, 259, 259, 261}));
  // LLaMA-2's older file: no pre-tokenizer, the normalizer puts ▁ in front of each stretch and
  // replaces spaces: the same ids as "always".
  j = tiny_sp();
  j["pre_tokenizer"] = nullptr;
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Prepend"}, {"prepend", kSpace}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}}}}};
  auto legacy = load_tokenizer(write("legacy.json", j.dump()));
  EXPECT_EQ(legacy->encode("ab</s>ab"), (std::vector<int32_t>{264, 2, 264}));
  EXPECT_EQ(legacy->encode("ab ab"), (std::vector<int32_t>{264, 264}));
  EXPECT_EQ(legacy->decode(std::vector<int32_t>{264, 2, 264}), "ab</s> ab");  // as Hugging Face decodes it

  // Without byte_fallback, a character without a token is <unk> (0): fused into one for a run, or not.
  j = tiny_sp();
  j["model"]["byte_fallback"] = false;
  EXPECT_EQ(load_tokenizer(write("unk.json", j.dump()))->encode("\xc3\xa9\xc3\xa9"), (std::vector<int32_t>{259, 0}));
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(load_tokenizer(write("unk2.json", j.dump()))->encode("\xc3\xa9\xc3\xa9"),
            (std::vector<int32_t>{259, 0, 0}));
  // A character whose bytes are not all tokens is <unk>; Hugging Face writes it after the byte tokens
  // of the characters that follow it, until a character with a token of its own ("a") comes.
  j = tiny_sp();
  j["model"]["vocab"].erase("<0xA9>");
  EXPECT_EQ(load_tokenizer(write("quirk.json", j.dump()))
                ->encode("\xc3\xa9\xc3\xbc"
                         "a"),
            (std::vector<int32_t>{259, 3 + 0xc3, 3 + 0xbc, 0, 260}));
}

// Long SentencePiece-style words are encoded in parts cut before each "▁" that follows another
// character, when no merge can join across such a place: the ids must be those of the whole word.
// Merging "▁" "▁" (runs of spaces) still allows it; a merge ("<0x41>", "▁") does not, and makes the
// reference (it never applies to a text without 'A').
TEST_F(TokenizerTest, SentencePieceWordsInPartsGiveTheWholeWordsIds) {
  json j = tiny_sp();
  j["model"]["vocab"][kSpace + kSpace] = 265;
  j["model"]["merges"].push_back(json::array({kSpace, kSpace}));
  auto cut = load_tokenizer(write("cut.json", j.dump()));
  j["model"]["vocab"]["<0x41>" + kSpace] = 266;
  j["model"]["merges"].push_back(json::array({"<0x41>", kSpace}));
  auto whole = load_tokenizer(write("whole.json", j.dump()));
  // "a   b": ▁a ▁▁ ▁ b either way.
  EXPECT_EQ(cut->encode("a   b"), (std::vector<int32_t>{262, 265, 259, 261}));
  std::string text;
  for (int i = 0; i < 40; ++i)
    text += std::string(size_t(i % 4), ' ') + (i % 3 ? "ab"
                                                     : "b\xc3\xa9"
                                                       "a");
  text += "</s>" + text;
  EXPECT_EQ(cut->encode(text), whole->encode(text));
  EXPECT_GT(cut->encode(text).size(), 100u);
}

// A stop (prep's SIGTERM) ends the tokenization of one huge text between words, not after it.
TEST_F(TokenizerTest, AnInterruptStopsEncodingBetweenWords) {
  auto t = load_tokenizer(write("tokenizer.json", tiny_bpe().dump()));
  std::string text;
  for (int i = 0; i < 5000; ++i) text += " the he";
  std::atomic<bool> stop{true};
  t->set_interrupt(&stop);
  EXPECT_NE(error_of([&] { t->encode(text); }).find("interrupted while tokenizing"), std::string::npos);
  stop = false;
  EXPECT_EQ(t->encode(text), load_tokenizer(write("plain.json", tiny_bpe().dump()))->encode(text));
}

// Streaming generation: decode([id]) of "▁ab" after other tokens would lose its space (the decoder
// strips the text's first one); the stream gives what the whole text gains.
TEST_F(TokenizerTest, DecodeStreamGivesWhatTheTextGains) {
  auto t = load_tokenizer(write("tokenizer.json", tiny_sp().dump()));
  EXPECT_EQ(t->decode(std::vector<int32_t>{264}), "ab");
  DecodeStream stream(*t, {264});
  std::string text = "ab";
  for (int32_t id : {264, 3 + 0xc3, 3 + 0xa9, 2, 263}) text += stream.next(id);
  EXPECT_EQ(text, "ab ab\xc3\xa9</s>ab");
  // A character in byte-fallback tokens: nothing until its last byte (the text would end in U+FFFD),
  // then the character; one that never completes comes out as U+FFFD at the end.
  DecodeStream chars(*t, {264});
  EXPECT_EQ(chars.next(3 + 0xc3), "");
  EXPECT_EQ(chars.next(3 + 0xa9), "\xc3\xa9");
  EXPECT_EQ(chars.next(3 + 0xc3), "");
  EXPECT_EQ(chars.finish(), "\xef\xbf\xbd");
  DecodeStream broken(*t, {264});  // a character cut short by another token: U+FFFD, then the token
  EXPECT_EQ(broken.next(3 + 0xc3), "");
  EXPECT_EQ(broken.next(263),
            "\xef\xbf\xbd"
            "ab");
  EXPECT_EQ(text, t->decode(std::vector<int32_t>{264, 264, 3 + 0xc3, 3 + 0xa9, 2, 263}));
  // Byte-level: the same as decoding each token.
  auto b = load_tokenizer("byte");
  DecodeStream bytes(*b, {'h'});
  EXPECT_EQ(bytes.next('i'), "i");
}

// The steps on the examples Hugging Face's own give (tokenizers 0.23).
TEST(TokenizerSteps, NormalizersAndDecodersAsHuggingFace) {
  auto replace = [](std::string_view in, std::string_view pattern, std::string_view content) {
    std::string out;
    replace_all(in, pattern, content, 1000, "test", out);
    return out;
  };
  EXPECT_EQ(replace("aaaaa", "aa", "x"), "xxa");
  EXPECT_EQ(replace("abc", "", "x"), "xaxbxcx");  // an empty pattern matches at every character boundary
  std::string out, scratch;
  const std::vector<BpeNormalizerStage> llama2 = {{BpeNormalizerStage::Kind::prepend, "", kSpace},
                                                  {BpeNormalizerStage::Kind::replace, " ", kSpace}};
  normalize_text(llama2, "a b", out, scratch);
  EXPECT_EQ(out, kSpace + "a" + kSpace + "b");

  using Kind = BpeDecoderStage::Kind;
  auto stage = [](Kind kind, const std::string& content, uint64_t start) {
    BpeDecoderStage s;
    s.kind = kind;
    s.content = content;
    s.start = start;
    return s;
  };
  BpeDecoderStage fallback = stage(Kind::byte_fallback, "", 0), strip = stage(Kind::strip, " ", 1),
                  meta = stage(Kind::metaspace, kSpace, 0);
  // A run of byte tokens becomes one piece before Strip looks at each piece: "  " loses one space.
  EXPECT_EQ(decode_token_strings({fallback, strip}, true, {"<0x20>", "<0x20>", "b", " c"}), " bc");
  EXPECT_EQ(decode_token_strings({strip}, true, {"  a ", " b"}), " a b");
  // Metaspace: the first token loses every ▁, the others turn them into spaces.
  EXPECT_EQ(decode_token_strings({meta}, true, {"a" + kSpace + "b" + kSpace, kSpace + "c"}), "ab c");
  meta.strip_first = false;  // prepend_scheme never
  EXPECT_EQ(decode_token_strings({meta}, true, {kSpace + kSpace + "a"}), "  a");
  // A run that is not UTF-8 is one U+FFFD per byte token, as Hugging Face writes it (never raw bytes).
  EXPECT_EQ(decode_token_strings({fallback}, true, {"<0x41>", "<0xE4>", "<0xB8>", "<0xAD>", "x", "<0xE4>"}),
            "A\xe4\xb8\xadx\xef\xbf\xbd");
  EXPECT_EQ(decode_token_strings({fallback}, true, {"<0xE4>", "<0xB8>", "y"}), "\xef\xbf\xbd\xef\xbf\xbdy");
  EXPECT_EQ(decode_token_strings({}, false, {"a", "b"}), "a b");  // no decoder: joined by spaces
  EXPECT_EQ(byte_fallback_value("<0x4a>"), 0x4a);
  EXPECT_EQ(byte_fallback_value("<0x+F>"), 15);  // Rust's from_str_radix takes a '+'
  EXPECT_EQ(byte_fallback_value("<0xG1>"), -1);
  EXPECT_EQ(byte_fallback_value("<0x411>"), -1);
}

// What a hostile tokenizer.json can ask is bounded: steps, literal sizes, how much a text grows.
TEST_F(TokenizerTest, HostileSentencePieceFilesAreBounded) {
  expect_refused(tiny_sp(), {
                                {"many_steps",
                                 [](json& j) {
                                   j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};
                                   for (int i = 0; i < 65; ++i)
                                     j["normalizer"]["normalizers"].push_back({{"type", "Prepend"}, {"prepend", "x"}});
                                 },
                                 "the normalizer has more than 64 steps"},
                                {"long_literal",
                                 [](json& j) {
                                   j["normalizer"] = {{"type", "Prepend"}, {"prepend", std::string(257, 'x')}};
                                 },
                                 "\"prepend\" is 257 bytes, at most 256 are accepted"},
                                {"two_char_replacement", [](json& j) { j["pre_tokenizer"]["replacement"] = "ab"; },
                                 "\"replacement\" must be one character, found \"ab\""},
                                {"scheme", [](json& j) { j["pre_tokenizer"]["prepend_scheme"] = "sometimes"; },
                                 "prepend_scheme \"sometimes\" is not always, first or never"},
                                {"contradiction", [](json& j) { j["pre_tokenizer"]["add_prefix_space"] = false; },
                                 "add_prefix_space false contradicts prepend_scheme"},
                                {"negative_strip", [](json& j) { j["decoder"]["decoders"][3]["start"] = -1; },
                                 "\"start\" must be a count (0, 1, ...), found -1"},
                                {"ctc",
                                 [](json& j) {
                                   j["decoder"] = {{"type", "CTC"}};
                                 },
                                 "not supported yet: the CTC decoder"},
                                {"nfkc",
                                 [](json& j) {
                                   j["normalizer"] = {{"type", "NFKC"}};
                                 },
                                 "not supported yet: the NFKC normalizer"},
                                {"missing_merge_token",
                                 [](json& j) {
                                   j["model"]["merges"].push_back(json::array({"b", "zz"}));
                                 },
                                 "token \"zz\" is not in the vocabulary"},
                            });
  json replace_by_long = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", std::string(200, 'x')}};
  // Each Replace turns a space into 200 bytes, and the next multiplies that: refused before it is
  // built, whatever the number of steps.
  json j = tiny_sp();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};
  for (int i = 0; i < 8; ++i) {
    j["normalizer"]["normalizers"].push_back(replace_by_long);
    j["normalizer"]["normalizers"].push_back({{"type", "Replace"}, {"pattern", {{"String", "x"}}}, {"content", "  "}});
  }
  auto t = load_tokenizer(write("grow.json", j.dump()));
  EXPECT_EQ(t->encode("ab"), std::vector<int32_t>{264});  // no space: nothing grows
  EXPECT_NE(error_of([&] { t->encode(std::string(4000, ' ')); }).find("Replace normalizer would turn"),
            std::string::npos);
  // A Strip of 10^18 characters takes what there is.
  j = tiny_sp();
  j["decoder"]["decoders"][3]["start"] = uint64_t(1e18);
  EXPECT_EQ(load_tokenizer(write("strip.json", j.dump()))->decode(std::vector<int32_t>{259, 259, 264}), "ab");
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
