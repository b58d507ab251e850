// Small string helpers shared by every part: suggestions for misspelt names, joining, and the
// parsing of durations and byte sizes that recipes and flags use.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace llmtrain {

// Levenshtein distance between two ASCII strings.
int edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word`, if it is close enough to be a plausible typo.
std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates);

std::string join(const std::vector<std::string>& parts, std::string_view sep);
std::vector<std::string> split(std::string_view s, char sep);
std::string trim(std::string_view s);
bool starts_with(std::string_view s, std::string_view prefix);

// Character-class checks for the small grammars of recipes, flags and environment variables
// (hand-written rather than std::regex, whose recursion a long hostile string can overflow).
// One or more ASCII digits, nothing else.
bool is_digits(std::string_view s);
// A C identifier: a letter or '_', then letters, digits or '_'.
bool is_identifier(std::string_view s);
// A non-empty string whose first character is in `first` and every other in `rest` (ASCII sets).
bool is_word(std::string_view s, std::string_view first, std::string_view rest);
// What is wrong with `s` as a line of text for a recipe, a hostfile or a script: "" when nothing;
// else e.g. "the control character U+000A (a line break) at byte 12" or "a byte that is not
// UTF-8 (0xff) at byte 3". Control characters (C0, DEL, C1) and the Unicode line and paragraph
// separators could end a line of a generated script (an sbatch header) or of a YAML file, or drive
// a terminal; bytes that are not UTF-8 could not be written into JSON (a checkpoint manifest).
std::string text_problem(std::string_view s);
// Text from a file we did not write, made safe to print on a terminal or in a log: printable
// UTF-8 is kept; control characters (C0, DEL, C1), the Unicode line and paragraph separators, and
// bytes that are not UTF-8 become escapes (\n, \t, \r, \xNN, \uNNNN), so an ESC from a tensor name
// cannot drive the terminal and a line break cannot fake a line of output. With `keep_newlines`,
// '\n' stays (multi-line messages of ours that quote such text).
std::string printable(std::string_view s, bool keep_newlines = false);
// `s` as a double-quoted YAML scalar that reads back as exactly `s`: '"' and '\' escaped, and every
// control character, DEL, C1 control, U+2028/U+2029 and U+FEFF written as an escape, so no value
// can end its line or add a key. Throws llmtrain::Error naming `what` when `s` is not UTF-8 (YAML
// cannot hold such bytes).
std::string yaml_quoted(std::string_view s, std::string_view what);
// `s` with every byte that is not part of valid UTF-8, every control character (C0, DEL, C1) and
// U+FFFE/U+FFFF replaced by '?': text for cairo (which refuses invalid UTF-8) and for XML.
std::string utf8_sanitize(std::string_view s);
// `s` for XML character data or an attribute value: utf8_sanitize'd, then & < > " ' as entities.
std::string xml_escaped(std::string_view s);
// A name for a file inside a directory we own (a checkpoint's shard or tokenizer copy): no '/',
// not "." or "..", not empty, no control characters or bytes that are not UTF-8. Paths read from a
// file we did not write must be confined with it, never joined as they come.
bool is_plain_file_name(std::string_view s);
// ASCII character sets for is_word.
inline constexpr std::string_view kLetters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
inline constexpr std::string_view kDigits = "0123456789";

// A count written as 1 to 9 ASCII digits, nothing else ("0042" is 42); nullopt otherwise. Nine
// digits always fit an int, so no input overflows.
std::optional<int> parse_small_count(std::string_view s);

// A decimal integer ("42", "-7", "+3"; nothing else, not even spaces): nullopt when malformed or
// outside int64_t. Numbers from flags, environment variables and files go through this, never
// through atoi/strtol (whose overflow is undefined or silent).
std::optional<int64_t> parse_int64(std::string_view s);
// "300s", "5m", "1.5h", "250ms", or a bare number of seconds. nullopt when malformed.
std::optional<double> parse_duration_seconds(std::string_view s);
// "5GB", "500MB", "2GiB", "1000000" (bytes; KB/MB/GB/TB are powers of 1000 as transformers'
// max_shard_size, KiB/MiB/GiB of 1024). nullopt when malformed or beyond 2^64.
std::optional<uint64_t> parse_byte_size(std::string_view s);
// Formats seconds as "1h02m03s" / "4m05s" / "12.3s".
std::string format_duration(double seconds);
// Formats a long span for a person: "158 days", "4.3 days", "7.5 hours"; under two hours as
// format_duration.
std::string format_span(double seconds);
// Formats a count with a suffix: 124.44M, 8.03B, 1.20T; beyond 1e15 in scientific notation.
std::string format_count(double n);
// Formats bytes with binary suffix: 1.5 GiB.
std::string format_bytes(double bytes);

}  // namespace llmtrain
