// How prep cuts input files into documents (docs/data.md "Inputs"): whole files, separator lines
// (with CRLF, repeated, leading, and blank-line separators), JSONL lines with blank lines skipped,
// gzip read transparently, and over-large documents dropped with an error rather than held.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "trainer/data/prep_input.h"

using namespace llmtrain;
using namespace llmtrain;
using namespace llmtrain::trainer;
namespace fs = std::filesystem;

namespace {

struct Doc {
  std::string text;
  int64_t line;
  bool operator==(const Doc&) const = default;
};
std::ostream& operator<<(std::ostream& o, const Doc& d) { return o << "{" << d.line << ": \"" << d.text << "\"}"; }

class PrepInput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("llmtrain_prep_input_{}_{}", getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text, bool gz = false) {
    std::string p = (dir_ / name).string();
    if (gz) {
      gzFile f = gzopen(p.c_str(), "wb");
      gzwrite(f, text.data(), unsigned(text.size()));
      gzclose(f);
    } else {
      std::ofstream(p, std::ios::binary) << text;
    }
    return p;
  }
  std::vector<Doc> read(const std::string& path, std::optional<std::string> sep, int64_t max = 1 << 20,
                        std::vector<std::string>* errors = nullptr) {
    auto inputs = prep_resolve_inputs({path}, "auto");
    DocumentReader r(inputs[0], 0, sep, max);
    std::vector<Doc> out;
    Record rec;
    while (r.next(rec)) {
      if (!rec.error.empty() && errors) errors->push_back(rec.error);
      out.push_back({rec.text, rec.line});
    }
    return out;
  }
  fs::path dir_;
};

TEST_F(PrepInput, WholeFileIsOneDocument) {
  EXPECT_EQ(read(write("a.txt", "line 1\n%\nline 2"), std::nullopt), (std::vector<Doc>{{"line 1\n%\nline 2", 0}}));
  EXPECT_TRUE(read(write("empty.txt", ""), std::nullopt).empty());
}

TEST_F(PrepInput, SeparatorLinesEndDocuments) {
  std::string text = "%\nfirst\nstill first\n%\r\nsecond\r\n%\n%\nthird, no newline";
  EXPECT_EQ(read(write("f.txt", text), "%"),
            (std::vector<Doc>{{"first\nstill first\n", 2}, {"second\r\n", 5}, {"third, no newline", 8}}));
  // '' = blank lines separate paragraphs; "%%" is not "%".
  EXPECT_EQ(read(write("p.txt", "a\nb\n\n\nc\n%%\n"), ""), (std::vector<Doc>{{"a\nb\n", 1}, {"c\n%%\n", 5}}));
}

TEST_F(PrepInput, JsonlLinesAndGzip) {
  std::string text = "{\"text\": \"a\"}\n\n  \n{\"text\": \"b\"}";
  std::vector<Doc> want = {{"{\"text\": \"a\"}\n", 1}, {"{\"text\": \"b\"}", 4}};
  EXPECT_EQ(read(write("d.jsonl", text), std::nullopt), want);
  EXPECT_EQ(read(write("d.jsonl.gz", text, true), std::nullopt), want);
  EXPECT_EQ(read(write("t.txt.gz", "x\n%\ny\n", true), "%"), (std::vector<Doc>{{"x\n", 1}, {"y\n", 3}}));
}

TEST_F(PrepInput, OversizedDocumentsAreDroppedWithAnError) {
  std::vector<std::string> errors;
  auto docs = read(write("big.txt", "ok\n%\n" + std::string(5000, 'x') + "\nmore\n%\nok again\n"), "%", 1000, &errors);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], (Doc{"ok\n", 1}));
  EXPECT_EQ(docs[1].text, "");  // not held in memory
  EXPECT_EQ(docs[2], (Doc{"ok again\n", 6}));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("big.txt:3: document larger than"), std::string::npos) << errors[0];
}

TEST_F(PrepInput, UnreadableInputsAreNamed) {
  try {
    prep_resolve_inputs({(dir_ / "missing.txt").string()}, "auto");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.txt"), std::string::npos);
  }
  EXPECT_THROW(prep_resolve_inputs({dir_.string()}, "auto"), Error);
  EXPECT_THROW(prep_resolve_inputs({write("x.txt", "x")}, "yaml"), Error);
  EXPECT_EQ(prep_resolve_inputs({write("x.txt", "x")}, "jsonl")[0].format, InputFormat::jsonl);
}

}  // namespace
