// BPE encoding and decoding, byte-level and SentencePiece-style (see bpe_tokenizer.h for the order
// of the steps).
//
// Speed comes from three things: the pre-tokenizer regex is JIT-compiled PCRE2; each thread keeps
// a cache from word bytes to ids (most words of a text repeat), so merges run once per distinct
// word; and merges are looked up in an open-addressing table keyed by the pair of ids.
#include "trainer/data/bpe_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <queue>
#include <unordered_map>

#include "common/error.h"
#include "trainer/data/utf8.h"

namespace llmtrain::trainer {

namespace {

constexpr uint32_t kNoRank = UINT32_MAX;
constexpr size_t kMaxCachedWord = 255;

uint64_t mix64(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return x;
}

uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xff51afd7ed558ccdull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = mix64(h ^ w);
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = mix64(h ^ w ^ 0x5bd1e995);
  }
  return h | 1;  // 0 marks an empty slot
}

size_t table_capacity(size_t n) {
  size_t c = 16;
  while (c < 2 * n + 2) c <<= 1;
  return c;
}

// Immutable map from byte strings to ids (open addressing, linear probing).
class StringIdMap {
 public:
  void build(const std::vector<std::pair<std::string, int32_t>>& entries) {
    slots_.assign(table_capacity(entries.size()), Slot{});
    mask_ = slots_.size() - 1;
    for (const auto& [key, id] : entries) {
      uint64_t h = hash_bytes(key);
      size_t i = h & mask_;
      while (slots_[i].hash != 0) {
        if (slots_[i].hash == h && view(slots_[i]) == key) break;
        i = (i + 1) & mask_;
      }
      if (slots_[i].hash == 0) {
        slots_[i] = Slot{h, uint32_t(arena_.size()), uint32_t(key.size()), id};
        arena_ += key;
      }
    }
  }
  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.hash == 0) return -1;
      if (s.hash == h && view(s) == key) return s.id;
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t off = 0, len = 0;
    int32_t id = -1;
  };
  std::string_view view(const Slot& s) const { return std::string_view(arena_).substr(s.off, s.len); }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t mask_ = 0;
};

// (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  struct Entry {
    uint32_t rank = kNoRank;
    int32_t id = -1;
  };
  void build(const std::vector<std::pair<uint64_t, Entry>>& entries) {
    slots_.assign(table_capacity(entries.size()), Slot{});
    mask_ = slots_.size() - 1;
    for (const auto& [key, e] : entries) {
      size_t i = mix64(key) & mask_;
      while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
      slots_[i] = Slot{key, e};  // a repeated pair takes its later rank, as Hugging Face's HashMap does
    }
  }
  Entry find(int32_t left, int32_t right) const {
    uint64_t key = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
    for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.entry;
      if (s.key == kEmpty) return Entry{};
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    Entry entry;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Per-thread cache from word bytes to ids. Cleared when full, and when the thread moves to another
// tokenizer (instances are numbered, never reusing a number).
class WordCache {
 public:
  static constexpr size_t kSlots = 1 << 16;
  bool lookup(std::string_view word, uint64_t h, std::vector<int32_t>& out) const {
    if (slots_.empty()) return false;
    for (size_t i = h & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      const Slot& s = slots_[i];
      if (s.hash == 0) return false;
      if (s.hash == h && s.key_len == word.size() &&
          std::memcmp(keys_.data() + s.key_off, word.data(), word.size()) == 0) {
        out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.ids_len);
        return true;
      }
    }
  }
  void insert(std::string_view word, uint64_t h, const int32_t* ids, size_t n) {
    if (slots_.empty()) slots_.assign(kSlots, Slot{});
    if (used_ * 2 > kSlots || keys_.size() > (8u << 20) || ids_.size() > (4u << 20) || n > 65535) {
      if (n > 65535) return;
      clear();
      slots_.assign(kSlots, Slot{});
    }
    size_t i = h & (kSlots - 1);
    while (slots_[i].hash != 0) i = (i + 1) & (kSlots - 1);
    slots_[i] = Slot{h, uint32_t(keys_.size()), uint32_t(ids_.size()), uint16_t(word.size()), uint16_t(n)};
    keys_.append(word);
    ids_.insert(ids_.end(), ids, ids + n);
    ++used_;
  }
  void clear() {
    slots_.clear();
    keys_.clear();
    ids_.clear();
    used_ = 0;
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_off = 0, ids_off = 0;
    uint16_t key_len = 0, ids_len = 0;
  };
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t used_ = 0;
};

struct ThreadState {
  uint64_t owner = 0;
  WordCache cache;
  std::vector<Segment> segments, segments2;
  std::vector<Piece> pieces, next;
  std::string buffer, buffer2;      // pre-tokenizer stages that rewrite the text, alternately
  std::string normalized, scratch;  // the normalizer's output and working space
  std::vector<int32_t> symbols;
  std::vector<uint32_t> ranks;
  std::vector<int32_t> merged;
};

ThreadState& thread_state(uint64_t owner) {
  thread_local ThreadState ts;
  if (ts.owner != owner) {
    ts.cache.clear();
    ts.owner = owner;
  }
  return ts;
}

std::atomic<uint64_t> next_instance{1};

}  // namespace

const std::array<uint32_t, 256>& byte_to_unicode() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? uint32_t(b) : 256 + n++;
    }
    return t;
  }();
  return table;
}

// Speed for SentencePiece-style words, which are whole texts when the pre-tokenizer does not split
// (LLaMA-2, Mistral): no merge can join across a position where the space character c ("▁")
// follows another character, if c has a token of its own (the symbol there starts with c) and every
// merge whose right part starts with c has a left part made only of c (so only runs of spaces join
// across). Merges on either side of such a position then never interact, and BPE on the parts gives
// the ids BPE on the whole gives (the lowest-rank pair of the whole is the lowest of its part), so
// the word is cut there and each part goes through the word cache. The unknown and byte-fallback
// symbols agree too: c, having a token, ends any run of unknown characters. ignore_merges looks up
// whole words, so it keeps them whole. Returns c, or "" when the vocabulary does not allow this.
std::string word_boundary(const BpeSpec& spec, const std::unordered_map<std::string, int32_t>& by_string) {
  if (spec.ignore_merges) return "";
  std::string c = "\xe2\x96\x81";  // ▁, or the replacement the file uses for spaces
  for (const auto& st : spec.pre_tokenizer)
    if (st.kind == BpePreTokenizerStage::Kind::metaspace) c = st.replacement;
  for (const auto& n : spec.normalizer)
    if (n.kind == BpeNormalizerStage::Kind::replace && n.pattern == " " && !n.content.empty()) c = n.content;
  if (!by_string.count(c)) return "";
  for (const auto& [left, right] : spec.merges) {
    if (right.compare(0, c.size(), c) != 0) continue;
    for (size_t i = 0; i < left.size(); i += c.size())
      if (left.compare(i, c.size(), c) != 0) return "";
  }
  return c;
}

struct BpeTokenizer::Impl {
  uint64_t instance = next_instance++;
  bool byte_level = true;  // else SentencePiece-style: symbols are characters
  // Byte-level: the symbol of each byte. SentencePiece-style: the token of each ASCII character
  // (other characters are looked up in `vocab`).
  std::array<int32_t, 256> byte_id{};
  std::array<int32_t, 256> byte_token_id{};  // SentencePiece-style: "<0xNN>" (-1: none, or no byte_fallback)
  MergeTable merges;
  StringIdMap vocab;  // raw bytes -> id: ignore_merges, and SentencePiece-style characters
  std::vector<std::string> id_bytes;
  std::vector<uint8_t> defined, special;
  bool ignore_merges = false;
  bool byte_fallback = false;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  AddedMatcher raw_added, normalized_added;
  struct Stage {
    std::unique_ptr<RegexSplitter> splitter;  // null: no split in this stage
    bool add_prefix_space = false;
    bool metaspace = false;  // ' ' -> replacement, prepended as `prepend` says, split before each if `split`
    std::string replacement;
    BpePreTokenizerStage::Prepend prepend = BpePreTokenizerStage::Prepend::always;
    bool split = false;
  };
  std::vector<Stage> stages;
  std::vector<BpeNormalizerStage> normalizer;
  std::vector<BpeDecoderStage> decoder;
  bool has_decoder = false;
  std::unique_ptr<RegexSplitter> word_char;  // single_word checks: \w as Rust's regex crate has it
  // SentencePiece-style: a word may be encoded in parts cut before each `boundary` character that
  // follows another character (see word_boundary()); empty: never.
  std::string boundary;
  std::string summary;

  void encode_segment(const BpeTokenizer& self, std::string_view text, uint32_t b, uint32_t e, bool at_origin,
                      std::vector<int32_t>& ids, ThreadState& ts) const;
  void metaspace_stage(const Stage& st, bool at_origin, std::string_view& cur, ThreadState& ts) const;
  void encode_word(std::string_view w, std::vector<int32_t>& ids, ThreadState& ts) const;
  void char_symbols(std::string_view w, std::vector<int32_t>& sym) const;
  void encode_word_whole(std::string_view w, std::vector<int32_t>& ids, ThreadState& ts) const;
  void merge_small(ThreadState& ts) const;
  void merge_large(ThreadState& ts) const;
};

BpeTokenizer::BpeTokenizer(const BpeSpec& spec, TokenizerSource source)
    : Tokenizer(std::move(source)), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const std::string& origin = this->source().origin;
  m.byte_level = std::any_of(spec.pre_tokenizer.begin(), spec.pre_tokenizer.end(),
                             [](const auto& st) { return st.kind == BpePreTokenizerStage::Kind::byte_level; });
  const auto& b2u = byte_to_unicode();
  std::unordered_map<uint32_t, uint8_t> u2b;
  for (int b = 0; b < 256; ++b) u2b[b2u[b]] = uint8_t(b);

  // Vocabulary: string -> id (for merges), id -> bytes (for decoding), bytes -> id (for lookups).
  std::unordered_map<std::string, int32_t> by_string;
  by_string.reserve(spec.vocab.size() * 2);
  int32_t max_id = -1;
  for (const auto& [s, id] : spec.vocab) {
    if (id < 0) throw Error(fmt::format("{}: token {:?} has negative id {}", origin, s, id));
    by_string[s] = id;
    max_id = std::max(max_id, id);
  }
  for (const auto& t : spec.added) max_id = std::max(max_id, t.id);
  if (max_id < 0) throw Error(fmt::format("{}: the vocabulary is empty", origin), "point at the tokenizer's own file");
  // Ids index arrays of max_id + 1 entries: a hostile id (2^31 - 1 in a file of ten tokens) must not
  // make them gigabytes. Real vocabularies are dense (gaps of a few reserved ids at most).
  const int64_t entries = int64_t(spec.vocab.size() + spec.added.size());
  if (int64_t(max_id) >= entries + 65536 || max_id >= (1 << 24))
    throw Error(fmt::format("{}: token id {} is far beyond the vocabulary's {} entries", origin, max_id, entries),
                "ids run from 0 to about the number of tokens; the file is damaged or not a tokenizer");
  vocab_size_ = max_id + 1;
  m.id_bytes.assign(vocab_size_, {});
  m.defined.assign(vocab_size_, 0);
  m.special.assign(vocab_size_, 0);
  std::vector<std::pair<std::string, int32_t>> raw_entries;
  raw_entries.reserve(spec.vocab.size());
  for (const auto& [s, id] : spec.vocab) {
    if (m.defined[id])
      throw Error(fmt::format("{}: id {} is given to two tokens ({:?} and another)", origin, id, s),
                  "the vocabulary must map each id to one token");
    if (!m.byte_level) {  // SentencePiece-style: the token is its text
      raw_entries.emplace_back(s, id);
      m.id_bytes[id] = s;
      m.defined[id] = 1;
      continue;
    }
    std::string raw;
    bool byte_level = true;
    for (size_t i = 0; i < s.size();) {
      uint32_t cp = utf8_next(s, i);
      auto it = u2b.find(cp);
      if (it == u2b.end()) {
        byte_level = false;
        break;
      }
      raw.push_back(char(it->second));
    }
    // A token outside the byte-level alphabet decodes to its own UTF-8 (Hugging Face's ByteLevel
    // decoder does the same) and can never be a word's bytes, so it stays out of `vocab`.
    if (byte_level) raw_entries.emplace_back(raw, id);
    m.id_bytes[id] = byte_level ? raw : s;
    m.defined[id] = 1;
  }
  m.vocab.build(raw_entries);
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    if (m.byte_level)
      utf8_append(ch, b2u[b]);
    else if (b < 0x80)
      ch.push_back(char(b));  // SentencePiece-style: ASCII characters; a byte >= 0x80 is never a character
    auto it = ch.empty() ? by_string.end() : by_string.find(ch);
    m.byte_id[b] = it == by_string.end() ? -1 : it->second;
    auto bt = spec.byte_fallback ? by_string.find(fmt::format("<0x{:02X}>", b)) : by_string.end();
    m.byte_token_id[b] = bt == by_string.end() ? -1 : bt->second;
  }
  const int missing_bytes = int(std::count(m.byte_id.begin(), m.byte_id.end(), -1));
  const int byte_tokens = int(256 - std::count(m.byte_token_id.begin(), m.byte_token_id.end(), -1));
  if (m.byte_level && spec.byte_fallback && missing_bytes > 0)
    throw Error(fmt::format("{}: not supported yet: byte_fallback in a byte-level BPE whose vocabulary lacks {} of "
                            "the 256 byte symbols",
                            origin, missing_bytes),
                "byte-level BPE has a symbol for every byte; byte_fallback belongs to SentencePiece-style files");
  m.byte_fallback = spec.byte_fallback;

  // Merges by rank.
  std::vector<std::pair<uint64_t, MergeTable::Entry>> merge_entries;
  merge_entries.reserve(spec.merges.size());
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const auto& [a, b] = spec.merges[r];
    auto ia = by_string.find(a), ib = by_string.find(b), im = by_string.find(a + b);
    for (auto [it, what] : {std::pair{ia, a}, std::pair{ib, b}, std::pair{im, a + b}})
      if (it == by_string.end())
        throw Error(fmt::format("{}: merge {} ({:?} {:?}): token {:?} is not in the vocabulary", origin, r, a, b, what),
                    "the merges and the vocabulary must come from the same tokenizer");
    uint64_t key = (uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second);
    merge_entries.push_back({key, MergeTable::Entry{uint32_t(r), im->second}});
  }
  m.merges.build(merge_entries);
  m.ignore_merges = spec.ignore_merges;
  m.boundary = word_boundary(spec, by_string);
  m.fuse_unk = spec.fuse_unk;
  if (spec.unk_token) {
    auto it = by_string.find(*spec.unk_token);
    if (it == by_string.end())
      throw Error(fmt::format("{}: unk_token {:?} is not in the vocabulary", origin, *spec.unk_token));
    m.unk_id = it->second;
  }

  // Added tokens: decoded as their text; special ones flagged. Those with normalized=true are
  // matched in normalized text, so their contents are normalized too (and decode so, as in HF).
  m.normalizer = spec.normalizer;
  for (const auto& t : spec.added) {
    if (t.content.empty()) continue;
    BpeAddedToken matched = t;
    if (t.normalized && !m.normalizer.empty()) {
      std::string scratch;
      normalize_text(m.normalizer, t.content, matched.content, scratch);
    }
    m.id_bytes[t.id] = matched.content;
    m.defined[t.id] = 1;
    if (t.special) m.special[t.id] = 1;
    (t.normalized ? m.normalized_added : m.raw_added).add(matched);
  }
  m.raw_added.finish();
  m.normalized_added.finish();
  m.word_char = std::make_unique<RegexSplitter>(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])", origin);

  // End of document: the first special token with one of these names.
  for (std::string_view name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>",
                                "<\xef\xbd\x9c"
                                "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"}) {
    for (const auto& t : spec.added)
      if (t.special && t.content == name) eod_id_ = t.id;
    if (eod_id_ >= 0) break;
  }
  if (eod_id_ >= 0) m.special[eod_id_] = 1;

  // Pre-tokenizer stages.
  std::string pre;
  for (const auto& st : spec.pre_tokenizer) {
    Impl::Stage s;
    if (!pre.empty()) pre += " + ";
    if (st.kind == BpePreTokenizerStage::Kind::split) {
      s.splitter = std::make_unique<RegexSplitter>(st.pattern, origin);
      pre += fmt::format("split /{}/", st.pattern);
    } else if (st.kind == BpePreTokenizerStage::Kind::metaspace) {
      s.metaspace = true;
      s.replacement = st.replacement;
      s.prepend = st.prepend;
      s.split = st.split;
      const char* when[] = {"always", "first", "never"};
      pre += fmt::format("metaspace {:?} (prepend {}{})", st.replacement, when[int(st.prepend)],
                         st.split ? ", split" : "");
    } else {
      s.add_prefix_space = st.add_prefix_space;
      if (st.use_regex) s.splitter = std::make_unique<RegexSplitter>(kGpt2Pattern, origin);
      pre += fmt::format("byte-level{}{}", st.use_regex ? " with GPT-2 regex" : "",
                         st.add_prefix_space ? " and prefix space" : "");
    }
    m.stages.push_back(std::move(s));
  }
  m.decoder = spec.decoder;
  m.has_decoder = spec.has_decoder;

  std::string norm;
  for (const auto& n : spec.normalizer)
    norm += fmt::format("{}{}", norm.empty() ? "" : " + ",
                        n.kind == BpeNormalizerStage::Kind::prepend
                            ? fmt::format("prepend {:?}", n.content)
                            : fmt::format("replace {:?} by {:?}", n.pattern, n.content));
  std::string extras;
  if (spec.ignore_merges) extras += ", whole-word vocabulary lookup first (ignore_merges)";
  if (m.byte_level && missing_bytes)
    extras += fmt::format(", {} byte values missing from the vocabulary ({})", missing_bytes,
                          m.unk_id >= 0 ? "encoded as unk" : "dropped, as Hugging Face does");
  if (!m.byte_level && m.byte_fallback) extras += fmt::format(", byte fallback ({} of 256 <0xNN> tokens)", byte_tokens);
  if (!m.byte_level && m.unk_id >= 0)
    extras += fmt::format(", unknown characters as {}{}", m.id_bytes[m.unk_id], m.fuse_unk ? " (fused)" : "");
  m.summary = fmt::format(
      "{} BPE from {} ({}): {} ids, {} merges, {} added tokens, end of document {}, {}pre-tokenizer: {}{}",
      m.byte_level ? "byte-level" : "SentencePiece-style", origin, spec.format, vocab_size_, spec.merges.size(),
      spec.added.size(), eod_id_ >= 0 ? fmt::format("{}={}", m.id_bytes[eod_id_], eod_id_) : std::string("none"),
      norm.empty() ? "" : "normalizer: " + norm + ", ", pre.empty() ? "none" : pre, extras);
}

BpeTokenizer::~BpeTokenizer() = default;

bool BpeTokenizer::is_special(int32_t id) const { return id >= 0 && id < vocab_size_ && impl_->special[id]; }

std::string BpeTokenizer::describe() const { return impl_->summary; }

void BpeTokenizer::encode_append(std::string_view text, std::vector<int32_t>& ids) const {
  if (text.size() >= (size_t(1) << 31))
    throw Error(fmt::format("a text of {} bytes is too long to encode at once (limit 2 GiB)", text.size()),
                "split the document");
  size_t bad = utf8_invalid_offset(text);
  if (bad != std::string_view::npos)
    throw Error(fmt::format("invalid UTF-8 at byte {} (0x{:02x})", bad, uint8_t(text[bad])),
                "BPE encodes UTF-8 text: fix the input, skip it (prep --skip-bad), or use the byte tokenizer");
  const Impl& m = *impl_;
  ThreadState& ts = thread_state(m.instance);
  auto& segs = ts.segments;
  auto& sub = ts.segments2;
  segs.clear();
  m.raw_added.split(text, 0, uint32_t(text.size()), *m.word_char, segs);
  for (const Segment& s : segs) {
    if (s.id >= 0) {
      ids.push_back(s.id);
      continue;
    }
    if (s.end == s.begin) continue;
    // Normalized (into ts.normalized when there is a normalizer), then its added tokens cut out.
    std::string_view part = text;
    uint32_t b = s.begin, e = s.end;
    if (!m.normalizer.empty()) {
      normalize_text(m.normalizer, text.substr(b, e - b), ts.normalized, ts.scratch);
      part = ts.normalized;
      b = 0;
      e = uint32_t(part.size());
    }
    sub.clear();
    m.normalized_added.split(part, b, e, *m.word_char, sub);
    for (const Segment& t : sub) {
      if (t.id >= 0)
        ids.push_back(t.id);
      else if (t.end > t.begin)  // at the text's first byte: what Metaspace's prepend_scheme "first" asks
        m.encode_segment(*this, part, t.begin, t.end, s.begin == 0 && t.begin == b, ids, ts);
    }
  }
}

// The buffer a stage that rewrites the text writes into: not the one `cur` is in.
static std::string& rewrite_buffer(std::string_view cur, ThreadState& ts) {
  std::string& out = cur.data() == ts.buffer.data() ? ts.buffer2 : ts.buffer;
  out.clear();
  return out;
}

void BpeTokenizer::Impl::encode_segment(const BpeTokenizer& self, std::string_view text, uint32_t b, uint32_t e,
                                        bool at_origin, std::vector<int32_t>& ids, ThreadState& ts) const {
  std::string_view cur = text;
  auto& pieces = ts.pieces;
  auto& next = ts.next;
  pieces.clear();
  pieces.push_back({b, e});
  for (const Stage& st : stages) {
    if (st.metaspace) metaspace_stage(st, at_origin, cur, ts);
    if (st.add_prefix_space) {
      // Each piece gets a leading space unless it has one; pieces move into the buffer.
      std::string& buf = rewrite_buffer(cur, ts);
      next.clear();
      for (const Piece& p : pieces) {
        if (p.end == p.begin) continue;
        uint32_t start = uint32_t(buf.size());
        if (cur[p.begin] != ' ') buf.push_back(' ');
        buf.append(cur.substr(p.begin, p.end - p.begin));
        next.push_back({start, uint32_t(buf.size())});
      }
      std::swap(pieces, next);
      cur = buf;
    }
    if (st.splitter) {
      next.clear();
      for (const Piece& p : pieces)
        if (p.end > p.begin) st.splitter->split(cur, p.begin, p.end, next);
      std::swap(pieces, next);
    }
  }
  // encode_word may not reuse ts.pieces: copy nothing, just walk them.
  for (size_t k = 0; k < pieces.size(); ++k) {
    if ((k & 1023) == 0) self.check_interrupt();  // a stop between words (set_interrupt)
    const Piece& p = pieces[k];
    if (p.end > p.begin) encode_word(cur.substr(p.begin, p.end - p.begin), ids, ts);
  }
}

// Metaspace: in each piece ' ' becomes the replacement, which is also put in front of the piece
// (always; only at the text's start for "first"; never) unless it starts with one; with `split`, a
// new piece starts at every replacement (Hugging Face's MergedWithNext).
void BpeTokenizer::Impl::metaspace_stage(const Stage& st, bool at_origin, std::string_view& cur,
                                         ThreadState& ts) const {
  using Prepend = BpePreTokenizerStage::Prepend;
  auto& pieces = ts.pieces;
  auto& next = ts.next;
  std::string& buf = rewrite_buffer(cur, ts);
  const std::string_view rep = st.replacement;
  next.clear();
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Piece& p = pieces[k];
    if (p.end == p.begin) continue;
    const std::string_view piece = cur.substr(p.begin, p.end - p.begin);
    const uint32_t start = uint32_t(buf.size());
    const bool starts_with_rep = piece[0] == ' ' || piece.substr(0, rep.size()) == rep;
    if (!starts_with_rep && (st.prepend == Prepend::always || (st.prepend == Prepend::first && k == 0 && at_origin)))
      buf += rep;
    replace_all(piece, " ", rep, kMaxTextBytes, "Metaspace pre-tokenizer", buf);
    const uint32_t end = uint32_t(buf.size());
    if (!st.split) {
      next.push_back({start, end});
      continue;
    }
    uint32_t from = start;
    const std::string_view all = buf;
    for (size_t at = all.find(rep, start); at != std::string_view::npos && at < end;
         at = all.find(rep, at + rep.size())) {
      if (at > from) next.push_back({from, uint32_t(at)});
      from = uint32_t(at);
    }
    if (end > from) next.push_back({from, end});
  }
  std::swap(pieces, next);
  cur = buf;
}

void BpeTokenizer::Impl::encode_word(std::string_view w, std::vector<int32_t>& ids, ThreadState& ts) const {
  if (boundary.empty() || w.size() <= kMaxCachedWord / 4) return encode_word_whole(w, ids, ts);
  // Parts cut before each boundary character that follows another character (see word_boundary).
  const std::string_view c = boundary;
  size_t from = 0;
  for (size_t at = w.find(c, 1); at != std::string_view::npos; at = w.find(c, at + c.size())) {
    if (at > from && (at < c.size() || w.compare(at - c.size(), c.size(), c) != 0)) {
      encode_word_whole(w.substr(from, at - from), ids, ts);
      from = at;
    }
  }
  encode_word_whole(w.substr(from), ids, ts);
}

void BpeTokenizer::Impl::encode_word_whole(std::string_view w, std::vector<int32_t>& ids, ThreadState& ts) const {
  if (w.size() == 1 && (byte_level || byte_id[uint8_t(w[0])] >= 0)) {
    int32_t id = byte_id[uint8_t(w[0])];
    if (id >= 0)
      ids.push_back(id);
    else if (unk_id >= 0)
      ids.push_back(unk_id);
    return;
  }
  if (ignore_merges) {
    int32_t id = vocab.find(w);
    if (id >= 0) {
      ids.push_back(id);
      return;
    }
  }
  uint64_t h = 0;
  if (w.size() <= kMaxCachedWord) {
    h = hash_bytes(w);
    if (ts.cache.lookup(w, h, ids)) return;
  }
  auto& sym = ts.symbols;
  sym.clear();
  if (!byte_level) {
    char_symbols(w, sym);
  } else {
    for (char c : w) {
      int32_t id = byte_id[uint8_t(c)];
      if (id >= 0) {
        sym.push_back(id);
      } else if (unk_id >= 0) {
        if (!(fuse_unk && !sym.empty() && sym.back() == unk_id)) sym.push_back(unk_id);
      }  // else: dropped, as Hugging Face does without an unk token
    }
  }
  if (sym.size() <= 64)
    merge_small(ts);
  else
    merge_large(ts);
  if (w.size() <= kMaxCachedWord) ts.cache.insert(w, h, sym.data(), sym.size());
  ids.insert(ids.end(), sym.begin(), sym.end());
}

// SentencePiece-style symbols, as Hugging Face's BPE::merge_word makes them: each character's token;
// else (byte_fallback) the "<0xNN>" tokens of all its bytes when every one exists; else the unknown
// token, which waits in `pending` until a character with a token comes (fuse_unk: one for a run). A
// pending unknown token is not written before byte tokens (Hugging Face writes them first too).
void BpeTokenizer::Impl::char_symbols(std::string_view w, std::vector<int32_t>& sym) const {
  bool pending = false;
  for (size_t i = 0; i < w.size();) {
    const size_t len = std::min<size_t>(utf8_sequence_length(uint8_t(w[i])), w.size() - i);
    const int32_t id = len == 1 ? byte_id[uint8_t(w[i])] : vocab.find(w.substr(i, len));
    if (id >= 0) {
      if (pending) sym.push_back(unk_id);
      pending = false;
      sym.push_back(id);
    } else if (byte_fallback && std::all_of(w.begin() + i, w.begin() + i + len,
                                            [&](char c) { return byte_token_id[uint8_t(c)] >= 0; })) {
      for (size_t k = i; k < i + len; ++k) sym.push_back(byte_token_id[uint8_t(w[k])]);
    } else if (unk_id >= 0) {
      if (pending && !fuse_unk) sym.push_back(unk_id);
      pending = true;
    }  // else: dropped, as Hugging Face does without an unk token
    i += len;
  }
  if (pending) sym.push_back(unk_id);
}

// Short words: rescan for the lowest-ranked pair (leftmost on ties), merge it, repeat.
void BpeTokenizer::Impl::merge_small(ThreadState& ts) const {
  auto& sym = ts.symbols;
  auto& rank = ts.ranks;
  auto& merged = ts.merged;
  size_t n = sym.size();
  if (n < 2) return;
  rank.resize(n - 1);
  merged.resize(n - 1);
  for (size_t i = 0; i + 1 < n; ++i) {
    auto e = merges.find(sym[i], sym[i + 1]);
    rank[i] = e.rank;
    merged[i] = e.id;
  }
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == kNoRank) break;
    sym[best] = merged[best];
    sym.erase(sym.begin() + best + 1);
    rank.erase(rank.begin() + best);
    merged.erase(merged.begin() + best);
    --n;
    if (best > 0) {
      auto e = merges.find(sym[best - 1], sym[best]);
      rank[best - 1] = e.rank;
      merged[best - 1] = e.id;
    }
    if (best + 1 < n) {
      auto e = merges.find(sym[best], sym[best + 1]);
      rank[best] = e.rank;
      merged[best] = e.id;
    }
  }
}

// Long words (long runs of letters or spaces): a heap of candidate merges over a linked list,
// O(n log n). Ordered by (rank, position), the same choice merge_small makes.
void BpeTokenizer::Impl::merge_large(ThreadState& ts) const {
  auto& sym = ts.symbols;
  int32_t n = int32_t(sym.size());
  std::vector<int32_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    uint32_t rank;
    int32_t pos;
    int32_t id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t i) {
    int32_t j = next[i];
    if (j < 0) return;
    auto e = merges.find(sym[i], sym[j]);
    if (e.rank != kNoRank) heap.push({e.rank, i, e.id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos]) continue;
    int32_t j = next[c.pos];
    if (j < 0) continue;
    auto e = merges.find(sym[c.pos], sym[j]);
    if (e.rank != c.rank || e.id != c.id) continue;  // stale: a neighbour changed since it was queued
    sym[c.pos] = c.id;
    alive[j] = 0;
    next[c.pos] = next[j];
    if (next[j] >= 0) prev[next[j]] = c.pos;
    if (prev[c.pos] >= 0) push(prev[c.pos]);
    push(c.pos);
  }
  int32_t k = 0;
  for (int32_t i = 0; i >= 0 && i < n; i = next[i]) sym[k++] = sym[i];
  sym.resize(k);
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  const Impl& m = *impl_;
  std::string out;
  std::vector<std::string> tokens;  // SentencePiece-style: the decoder chain works on the token strings
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_ || !m.defined[id])
      throw Error(fmt::format("cannot decode token id {}: {}", id,
                              id < 0 || id >= vocab_size_ ? fmt::format("outside [0, {})", vocab_size_)
                                                          : std::string("no token has this id")),
                  "ids must come from this tokenizer (" + source().origin + ")");
    if (m.byte_level)
      out += m.id_bytes[id];
    else
      tokens.push_back(m.id_bytes[id]);
  }
  return m.byte_level ? out : decode_token_strings(m.decoder, m.has_decoder, std::move(tokens));
}

}  // namespace llmtrain::trainer
