#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "common/strings.h"

using namespace llmtrain;
using ::testing::HasSubstr;

TEST(Strings, EditDistance) {
  EXPECT_EQ(edit_distance("layers", "layers"), 0);
  EXPECT_EQ(edit_distance("layer", "layers"), 1);
  EXPECT_EQ(edit_distance("hiden", "hidden"), 1);
  EXPECT_EQ(edit_distance("", "abc"), 3);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
  EXPECT_EQ(edit_distance("gtp2", "gpt2"), 1);  // adjacent transposition is one edit
}

TEST(Strings, ClosestMatchOnlyForPlausibleTypos) {
  std::vector<std::string> keys{"layers", "hidden", "heads", "kv_heads"};
  EXPECT_EQ(closest_match("layrs", keys).value_or(""), "layers");
  EXPECT_EQ(closest_match("kvheads", keys).value_or(""), "kv_heads");
  EXPECT_FALSE(closest_match("optimizer", keys).has_value());
}

TEST(Strings, ByteSizes) {
  EXPECT_EQ(parse_byte_size("5GB"), 5'000'000'000ull);
  EXPECT_EQ(parse_byte_size("100KB"), 100'000ull);
  EXPECT_EQ(parse_byte_size("2GiB"), 2ull << 30);
  EXPECT_EQ(parse_byte_size(" 1000000 "), 1'000'000ull);
  EXPECT_EQ(parse_byte_size("1.5MB"), 1'500'000ull);
  for (const char* bad : {"", "GB", "-1GB", "5 apples", "1e30TB", "nan"}) EXPECT_FALSE(parse_byte_size(bad)) << bad;
}

TEST(Strings, Durations) {
  EXPECT_DOUBLE_EQ(*parse_duration_seconds("300s"), 300);
  EXPECT_DOUBLE_EQ(*parse_duration_seconds("5m"), 300);
  EXPECT_DOUBLE_EQ(*parse_duration_seconds("1.5h"), 5400);
  EXPECT_DOUBLE_EQ(*parse_duration_seconds("250ms"), 0.25);
  EXPECT_DOUBLE_EQ(*parse_duration_seconds("42"), 42);
  EXPECT_FALSE(parse_duration_seconds("5 minutes").has_value());
  EXPECT_FALSE(parse_duration_seconds("-3s").has_value());
  EXPECT_FALSE(parse_duration_seconds("").has_value());
  EXPECT_EQ(format_duration(3723), "1h02m03s");
  EXPECT_EQ(format_duration(65), "1m05s");
  EXPECT_EQ(format_span(65), "1m05s");
  EXPECT_EQ(format_span(7.5 * 3600), "7.5 hours");
  EXPECT_EQ(format_span(4.3 * 86400), "4.3 days");
  EXPECT_EQ(format_span(100000 * 136.7), "158 days");
}

TEST(Strings, Counts) {
  EXPECT_EQ(format_count(124439808), "124.44M");
  EXPECT_EQ(format_count(999), "999");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
}

TEST(Strings, CharacterClasses) {
  EXPECT_TRUE(is_digits("0123"));
  EXPECT_FALSE(is_digits(""));
  EXPECT_FALSE(is_digits("12a"));
  EXPECT_FALSE(is_digits("-1"));
  EXPECT_TRUE(is_identifier("kv_heads"));
  EXPECT_TRUE(is_identifier("_x9"));
  EXPECT_FALSE(is_identifier("9x"));
  EXPECT_FALSE(is_identifier(""));
  EXPECT_FALSE(is_identifier("a-b"));
  EXPECT_TRUE(is_word("gpt2-124m.v1", "g", "abcdefghijklmnopqrstuvwxyz0123456789-."));
  EXPECT_FALSE(is_word("Gpt2", "g", "pt2"));
  // A string far longer than any recipe value: checked in one pass, without recursion.
  EXPECT_TRUE(is_digits(std::string(1 << 20, '7')));
  EXPECT_TRUE(is_identifier("a" + std::string(1 << 20, '_')));
}

TEST(Strings, TextProblems) {
  EXPECT_EQ(text_problem("runs/größe 🙂"), "");
  EXPECT_EQ(text_problem("a\nb"), "the control character U+000A (a line break) at byte 1");
  EXPECT_EQ(text_problem("\x7f"), "the control character U+007F at byte 0");
  EXPECT_EQ(text_problem("ab\xff"), "a byte that is not UTF-8 (0xff) at byte 2");
  EXPECT_NE(text_problem("\xc3"), "");              // truncated sequence
  EXPECT_NE(text_problem("\xc0\xaf"), "");          // overlong '/'
  EXPECT_NE(text_problem("\xe0\x80\xaf"), "");      // overlong, 3 bytes
  EXPECT_NE(text_problem("\xed\xa0\x80"), "");      // a UTF-16 surrogate
  EXPECT_NE(text_problem("\xf4\x90\x80\x80"), "");  // past U+10FFFF
  EXPECT_EQ(text_problem("\xf4\x8f\xbf\xbf"), "");  // U+10FFFF itself
}

TEST(Strings, Utf8SanitizeReplacesInvalidBytesAndControls) {
  EXPECT_EQ(utf8_sanitize("run-α ✓"), "run-α ✓");
  EXPECT_EQ(utf8_sanitize("a\xff"
                          "b"),
            "a?b");
  EXPECT_EQ(utf8_sanitize("a\tb\x7f"), "a?b?");
  EXPECT_EQ(utf8_sanitize("\xc0\xaf"), "??");             // overlong '/'
  EXPECT_EQ(utf8_sanitize("\xed\xa0\x80"), "???");        // a surrogate
  EXPECT_EQ(utf8_sanitize("x\xe2\x82"), "x??");           // cut short
  EXPECT_EQ(utf8_sanitize("a\xc2\x9b[31mb"), "a?[31mb");  // C1 CSI
}

TEST(Strings, TextProblemsIncludeC1ControlsAndLineSeparators) {
  EXPECT_EQ(text_problem("a\xc2\x85"), "the control character U+0085 at byte 1");
  EXPECT_EQ(text_problem("a\xe2\x80\xa8"), "the line separator U+2028 at byte 1");
  EXPECT_EQ(text_problem("\xc2\xa0"), "");  // a no-break space is text
}

TEST(Strings, PrintableEscapesWhatCouldDriveATerminal) {
  EXPECT_EQ(printable("runs/größe 🙂"), "runs/größe 🙂");
  EXPECT_EQ(printable("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(printable("a\nb\tc\rd"), "a\\nb\\tc\\rd");
  EXPECT_EQ(printable("a\nb", /*keep_newlines=*/true), "a\nb");
  EXPECT_EQ(printable("\xc2\x9b"
                      "31m"),
            "\\u009b31m");
  EXPECT_EQ(printable("x\xe2\x80\xa8y"), "x\\u2028y");
  EXPECT_EQ(printable("\xff\xc3"), "\\xff\\xc3");
  EXPECT_EQ(printable("\x7f"), "\\x7f");
}

TEST(Strings, YamlQuotedEscapesEverythingThatCouldEndALine) {
  EXPECT_EQ(yaml_quoted("plain", "x"), "\"plain\"");
  EXPECT_EQ(yaml_quoted("a\"b\\c", "x"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(yaml_quoted("a\nkey: 1", "x"), "\"a\\x0akey: 1\"");
  EXPECT_EQ(yaml_quoted("\xc2\x85\xe2\x80\xa8\xef\xbb\xbf", "x"), "\"\\u0085\\u2028\\ufeff\"");
  EXPECT_EQ(yaml_quoted("größe", "x"), "\"größe\"");
  try {
    yaml_quoted("a\xff", "the model directory");
    FAIL() << "not UTF-8 must be refused";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("the model directory holds a byte that is not UTF-8 (0xff)"));
  }
}

TEST(Strings, XmlEscaped) { EXPECT_EQ(xml_escaped("a<b>&\"c'\x01"), "a&lt;b&gt;&amp;&quot;c&apos;?"); }

TEST(Strings, ParseInt64IsStrictAndRangeChecked) {
  EXPECT_EQ(parse_int64("42"), 42);
  EXPECT_EQ(parse_int64("-7"), -7);
  EXPECT_EQ(parse_int64("+3"), 3);
  EXPECT_EQ(parse_int64("9223372036854775807"), INT64_MAX);
  for (const char* bad : {"", "-", "+", " 1", "1 ", "1,2", "0x10", "1e3", "9223372036854775808", "--1"})
    EXPECT_FALSE(parse_int64(bad).has_value()) << bad;
}
