// PCRE2 (JIT) behind the pre-tokenizer regexes, and the Oniguruma -> PCRE2 pattern translation.
#include "trainer/data/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include "common/error.h"
#include "trainer/data/utf8.h"

namespace llmtrain::trainer {

namespace {

constexpr const char* kWhiteSpace = "\\p{White_Space}";
constexpr const char* kNotWhiteSpace = "\\P{White_Space}";
constexpr const char* kWordInClass = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
constexpr const char* kHexInClass = "0-9A-Fa-f";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state shared by every pattern: match data with room for the whole match, and
// a JIT stack larger than the default 32 KiB so long runs of one class cannot exhaust it.
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    data = pcre2_match_data_create(16, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    LT_CHECK(data && context && stack, "out of memory creating PCRE2 match state");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

bool is_unicode_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string translate_onig_pattern(std::string_view p, std::string_view where) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  auto refuse = [&](std::string_view what) {
    throw Error(fmt::format("{}: not supported yet: {} in pre-tokenizer regex {}", where, what, p),
                "only patterns PCRE2 can express are supported (GPT-2, LLaMA-3, GPT-4o, Qwen-style ones are)");
  };
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[++i];
      switch (e) {
        case 's':
          out += kWhiteSpace;
          break;
        case 'S':
          out += kNotWhiteSpace;
          break;
        case 'd':
          out += "\\p{Nd}";
          break;
        case 'D':
          out += "\\P{Nd}";
          break;
        case 'w':
          out += in_class ? std::string(kWordInClass) : fmt::format("[{}]", kWordInClass);
          break;
        case 'W':
          if (in_class) refuse("\\W inside a character class");
          out += fmt::format("[^{}]", kWordInClass);
          break;
        case 'h':
          out += in_class ? std::string(kHexInClass) : fmt::format("[{}]", kHexInClass);
          break;
        case 'H':
          if (in_class) refuse("\\H inside a character class");
          out += fmt::format("[^{}]", kHexInClass);
          break;
        case 'u': {
          size_t k = i + 1;
          while (k < p.size() && k < i + 5 && std::isxdigit(static_cast<unsigned char>(p[k]))) ++k;
          if (k != i + 5) refuse("\\u not followed by four hex digits");
          out += fmt::format("\\x{{{}}}", p.substr(i + 1, 4));
          i += 4;
          break;
        }
        default:
          out += '\\';
          out += e;
      }
      continue;
    }
    if (!in_class) {
      if (c == '[') {
        in_class = true;
        out += c;
        // A ']' right after '[' or '[^' is a literal.
        if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
        if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
        continue;
      }
      out += c;
      continue;
    }
    // Inside a class.
    if (c == '[') {
      if (i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:alpha:]
        size_t close = p.find(":]", i + 2);
        if (close == std::string_view::npos) refuse("unterminated POSIX class");
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
      refuse("nested character class");
    }
    if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') refuse("character class intersection &&");
    if (c == ']') in_class = false;
    out += c;
  }
  return out;
}

RegexSplitter::RegexSplitter(std::string_view pattern, std::string_view where)
    : pattern_(pattern), translated_(translate_onig_pattern(pattern, where)) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated_.data()), translated_.size(), PCRE2_UTF | PCRE2_UCP,
                        &err, &err_offset, nullptr);
  if (!code_)
    throw Error(fmt::format("{}: pre-tokenizer regex {} does not compile (as PCRE2 {} at offset {}): {}", where,
                            pattern_, translated_, err_offset, pcre2_message(err)),
                "check the pattern in the tokenizer file");
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(code_); }

int64_t RegexSplitter::match(std::string_view subject, size_t start, uint32_t options, size_t* match_begin) const {
  ThreadMatchState& st = thread_match_state();
  auto ptr = reinterpret_cast<PCRE2_SPTR>(subject.data());
  // pcre2_jit_match takes no PCRE2_ANCHORED at match time; anchored lookups use the interpreter.
  bool jit = jit_ && !(options & PCRE2_ANCHORED);
  int rc = jit ? pcre2_jit_match(code_, ptr, subject.size(), start, options, st.data, st.context)
               : pcre2_match(code_, ptr, subject.size(), start, options | PCRE2_NO_UTF_CHECK, st.data, st.context);
  if (rc == PCRE2_ERROR_NOMATCH) return -1;
  if (rc < 0)
    throw Error(fmt::format("pre-tokenizer regex {} failed on a text of {} bytes: {}", pattern_, subject.size(),
                            pcre2_message(rc)),
                "the text may contain an extremely long run of one character class; split the document");
  // rc == 0 means the ovector is too small for the captures; the whole match is still there.
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
  *match_begin = ov[0];
  return int64_t(ov[1] - ov[0]);
}

void RegexSplitter::split(std::string_view text, uint32_t begin, uint32_t end, std::vector<Piece>& out) const {
  // The subject is exactly text[begin, end), as Hugging Face matches each piece as its own string:
  // lookarounds and anchors never see the neighbouring pieces.
  std::string_view subject = text.substr(begin, end - begin);
  size_t pos = 0, gap_begin = 0;
  while (pos < subject.size()) {
    size_t mb = 0;
    int64_t len = match(subject, pos, 0, &mb);
    if (len < 0) break;
    if (len == 0) {  // empty match: not a piece; move on by one character
      pos = mb + utf8_sequence_length(static_cast<unsigned char>(subject[mb]));
      continue;
    }
    if (mb > gap_begin) out.push_back({uint32_t(begin + gap_begin), uint32_t(begin + mb)});
    out.push_back({uint32_t(begin + mb), uint32_t(begin + mb + len)});
    pos = gap_begin = mb + len;
  }
  if (gap_begin < subject.size()) out.push_back({uint32_t(begin + gap_begin), end});
}

int64_t RegexSplitter::match_prefix(std::string_view text) const {
  size_t mb = 0;
  return match(text, 0, PCRE2_ANCHORED, &mb);
}

}  // namespace llmtrain::trainer
