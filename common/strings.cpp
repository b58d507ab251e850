#include "common/strings.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "common/error.h"

namespace llmtrain {

int edit_distance(std::string_view a, std::string_view b) {
  // Optimal string alignment: insertions, deletions, substitutions and adjacent transpositions
  // ("gtp2" is one edit from "gpt2"), each costing one.
  std::vector<int> prev2(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      int sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  int best_d = 1 << 30;
  for (const auto& c : candidates) {
    int d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  // A typo: at most a third of the word wrong (and at least one edit allowed).
  int limit = std::max<int>(1, static_cast<int>(word.size()) / 3);
  if (best && best_d <= limit) return best;
  return std::nullopt;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.emplace_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

bool is_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool is_word(std::string_view s, std::string_view first, std::string_view rest) {
  if (s.empty() || first.find(s[0]) == std::string_view::npos) return false;
  return std::all_of(s.begin() + 1, s.end(), [&](char c) { return rest.find(c) != std::string_view::npos; });
}

bool is_identifier(std::string_view s) {
  static const std::string first = std::string(kLetters) + "_";
  static const std::string rest = first + std::string(kDigits);
  return is_word(s, first, rest);
}

namespace {

// The code point at s[i] and its length in bytes; 0 when the bytes there are not UTF-8: a bad lead
// or continuation byte, a sequence cut short, an overlong form, a surrogate, beyond U+10FFFF.
size_t utf8_at(std::string_view s, size_t i, uint32_t* cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80                   ? 1
                   : (c >= 0xc2 && c <= 0xdf) ? 2
                   : (c >= 0xe0 && c <= 0xef) ? 3
                   : (c >= 0xf0 && c <= 0xf4) ? 4
                                              : 0;
  if (n == 0 || i + n > s.size()) return 0;
  uint32_t v = n == 1 ? c : n == 2 ? c & 0x1fu : n == 3 ? c & 0x0fu : c & 0x07u;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xc0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3fu);
  }
  static constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMinForLength[n] || (v >= 0xd800 && v <= 0xdfff) || v > 0x10ffff) return 0;
  *cp = v;
  return n;
}

// C0, DEL and C1 controls.
bool is_control(uint32_t cp) { return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f); }
// What a reader may take for the end of a line besides the controls: U+2028, U+2029.
bool is_separator(uint32_t cp) { return cp == 0x2028 || cp == 0x2029; }

// Appends the escape of a character that must not appear as it is — a control, a line separator,
// the byte order mark — as \xNN (ASCII) or \uNNNN, which both C-style readers and YAML read back;
// false for any other character.
bool append_escape(std::string& out, uint32_t cp) {
  if (cp < 0x80 && is_control(cp))
    out += fmt::format("\\x{:02x}", cp);
  else if (is_control(cp) || is_separator(cp) || cp == 0xfeff)
    out += fmt::format("\\u{:04x}", cp);
  else
    return false;
  return true;
}

}  // namespace

std::string text_problem(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_at(s, i, &cp);
    if (n == 0)
      return fmt::format("a byte that is not UTF-8 (0x{:02x}) at byte {}", static_cast<unsigned char>(s[i]), i);
    if (is_control(cp)) {
      const char* name = cp == '\n'   ? " (a line break)"
                         : cp == '\r' ? " (a carriage return)"
                         : cp == '\t' ? " (a tab)"
                                      : "";
      return fmt::format("the control character U+{:04X}{} at byte {}", cp, name, i);
    }
    if (is_separator(cp)) return fmt::format("the line separator U+{:04X} at byte {}", cp, i);
    i += n;
  }
  return "";
}

std::string printable(std::string_view s, bool keep_newlines) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_at(s, i, &cp);
    if (n == 0) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(s[i]));
      ++i;
      continue;
    }
    if (cp == '\n' && keep_newlines)
      out += '\n';
    else if (cp == '\n')
      out += "\\n";
    else if (cp == '\t')
      out += "\\t";
    else if (cp == '\r')
      out += "\\r";
    else if (!append_escape(out, cp))
      out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string yaml_quoted(std::string_view s, std::string_view what) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_at(s, i, &cp);
    if (n == 0)
      throw Error(fmt::format("{} holds a byte that is not UTF-8 (0x{:02x}) at byte {}: it cannot be written into YAML",
                              what, static_cast<unsigned char>(s[i]), i),
                  "use a name or path that is UTF-8 text");
    if (cp == '"' || cp == '\\')
      out += '\\', out += char(cp);
    else if (!append_escape(out, cp))
      out.append(s.substr(i, n));
    i += n;
  }
  return out + "\"";
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_at(s, i, &cp);
    if (n == 0 || is_control(cp) || cp == 0xfffe || cp == 0xffff) {
      out += '?';
      i += std::max<size_t>(n, 1);
      continue;
    }
    out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string xml_escaped(std::string_view s) {
  std::string out;
  for (char c : utf8_sanitize(s)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

bool is_plain_file_name(std::string_view s) {
  return !s.empty() && s.size() <= 255 && s != "." && s != ".." && s.find('/') == std::string_view::npos &&
         text_problem(s).empty();
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

std::optional<int64_t> parse_int64(std::string_view s) {
  const std::string_view digits = s.substr(!s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0);
  if (!is_digits(digits)) return std::nullopt;
  int64_t out = 0;
  const char* first = s[0] == '+' ? s.data() + 1 : s.data();
  auto [p, ec] = std::from_chars(first, s.data() + s.size(), out);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return out;
}

std::optional<int> parse_small_count(std::string_view s) {
  if (s.size() > 9 || !is_digits(s)) return std::nullopt;
  return static_cast<int>(*parse_int64(s));
}

std::optional<double> parse_duration_seconds(std::string_view s) {
  std::string t = trim(s);
  if (t.empty()) return std::nullopt;
  double scale = 1.0;
  std::string_view num = t;
  auto ends = [&](std::string_view suf) {
    return num.size() > suf.size() && num.substr(num.size() - suf.size()) == suf;
  };
  if (ends("ms"))
    scale = 1e-3, num.remove_suffix(2);
  else if (ends("s"))
    num.remove_suffix(1);
  else if (ends("m"))
    scale = 60, num.remove_suffix(1);
  else if (ends("h"))
    scale = 3600, num.remove_suffix(1);
  double v = 0;
  auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  if (ec != std::errc() || p != num.data() + num.size() || !std::isfinite(v) || v < 0) return std::nullopt;
  return v * scale;
}

std::optional<uint64_t> parse_byte_size(std::string_view s) {
  std::string t = trim(s);
  static const std::pair<std::string_view, double> units[] = {
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"KB", 1e3},
      {"MB", 1e6},     {"GB", 1e9},        {"TB", 1e12},          {"B", 1.0}};
  double scale = 1.0;
  std::string_view num = t;
  for (const auto& [suffix, factor] : units) {
    if (num.size() > suffix.size() && num.substr(num.size() - suffix.size()) == suffix) {
      scale = factor;
      num.remove_suffix(suffix.size());
      break;
    }
  }
  double v = 0;
  auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  if (num.empty() || ec != std::errc() || p != num.data() + num.size() || !std::isfinite(v) || v < 0 ||
      v * scale >= 1.8e19)
    return std::nullopt;
  return static_cast<uint64_t>(v * scale);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  if (seconds < 60) return fmt::format("{:.1f}s", seconds);
  long s = std::lround(seconds);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m{:02}s", s / 3600, (s % 3600) / 60, s % 60);
}

std::string format_span(double seconds) {
  constexpr double kHour = 3600, kDay = 24 * kHour;
  if (!std::isfinite(seconds) || seconds < 2 * kHour) return format_duration(seconds);
  if (seconds < 2 * kDay) return fmt::format("{:.1f} hours", seconds / kHour);
  if (seconds < 10 * kDay) return fmt::format("{:.1f} days", seconds / kDay);
  return fmt::format("{:.0f} days", seconds / kDay);
}

std::string format_count(double n) {
  const char* suffix[] = {"", "K", "M", "B", "T"};
  if (std::fabs(n) >= 1e15) return fmt::format("{:.3g}", n);
  int i = 0;
  while (std::fabs(n) >= 1000 && i < 4) n /= 1000, ++i;
  return i == 0 ? fmt::format("{:.0f}", n) : fmt::format("{:.2f}{}", n, suffix[i]);
}

std::string format_bytes(double bytes) {
  const char* suffix[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (std::fabs(bytes) >= 1024 && i < 4) bytes /= 1024, ++i;
  return i == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, suffix[i]);
}

}  // namespace llmtrain
