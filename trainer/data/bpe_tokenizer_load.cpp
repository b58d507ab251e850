// Reading tokenizer files into a BpeSpec: Hugging Face tokenizer.json (byte-level and
// SentencePiece-style BPE) and GPT-2's vocab.json + merges.txt.
//
// Rule a reader could get wrong: every part of a tokenizer.json that changes the ids is either
// implemented or refused with "not supported yet" — never skipped. What is deliberately not
// applied is documented in docs/data.md: the post-processor (BOS/EOS templates; prep
// appends the end-of-document token itself), truncation and padding (batch settings, not part
// of the tokenization), the byte-level decoder (decode() returns the exact bytes).
//
// Everything read here is bounded before use (bpe_normalizer.h): at most kMaxTextStages steps in
// each of normalizer, pre-tokenizer and decoder, literals of at most kMaxTextStageLiteral bytes.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_depth.h"
#include "common/json_integer.h"
#include "common/strings.h"
#include "trainer/data/bpe_tokenizer.h"
#include "trainer/data/utf8.h"

namespace llmtrain::trainer {

namespace {

using nlohmann::json;

constexpr const char* kSupportedKinds =
    "llmtrain supports BPE tokenizers, byte-level (GPT-2, LLaMA-3, Qwen, GPT-4o style) and SentencePiece-style "
    "(LLaMA-2, Mistral, Mixtral); other kinds are planned";

[[noreturn]] void not_supported(std::string_view origin, const std::string& what) {
  throw Error(fmt::format("{}: not supported yet: {}", origin, what), kSupportedKinds);
}

// A JSON value for a message: hostile files may hold megabytes where a word is expected.
std::string brief(const json& j) {
  std::string s = j.dump();
  return s.size() <= 80 ? s : s.substr(0, 77) + "...";
}

// The steps of a Sequence under `key` ("normalizers", "pretokenizers", "decoders") of the `list`.
const json& sequence_steps(const json& j, const char* key, std::string_view origin, const char* list) {
  if (!j.contains(key) || !j[key].is_array())
    throw Error(fmt::format("{}: {} Sequence without a \"{}\" list", origin, list, key));
  return j[key];
}

// One more step in a normalizer, pre-tokenizer or decoder list, within kMaxTextStages.
void count_stage(size_t& count, std::string_view origin, const char* list) {
  if (++count > kMaxTextStages)
    throw Error(fmt::format("{}: the {} has more than {} steps", origin, list, kMaxTextStages),
                "real tokenizers have a handful; the file is damaged or hostile");
}

// A string field of a step, at most kMaxTextStageLiteral bytes; `fallback` when absent or null.
std::string text_field(const json& j, const char* key, std::string_view origin, std::string_view step,
                       std::optional<std::string> fallback = std::nullopt) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback) return *fallback;
    throw Error(fmt::format("{}: {} without a string \"{}\"", origin, step, key));
  }
  if (!j[key].is_string())
    throw Error(fmt::format("{}: {}: \"{}\" must be a string, found {}", origin, step, key, brief(j[key])));
  std::string s = j[key].get<std::string>();
  if (s.size() > kMaxTextStageLiteral)
    throw Error(fmt::format("{}: {}: \"{}\" is {} bytes, at most {} are accepted", origin, step, key, s.size(),
                            kMaxTextStageLiteral));
  return s;
}

// A field Hugging Face reads as one `char`: exactly one Unicode character.
std::string char_field(const json& j, const char* key, std::string_view origin, std::string_view step,
                       std::optional<std::string> fallback = std::nullopt) {
  std::string s = text_field(j, key, origin, step, std::move(fallback));
  size_t i = 0;
  if (!s.empty() && utf8_invalid_offset(s) == std::string::npos) utf8_next(s, i);
  if (s.empty() || i != s.size())
    throw Error(fmt::format("{}: {}: \"{}\" must be one character, found {:?}", origin, step, key, s));
  return s;
}

// A Replace step's pattern: {"String": literal}. Regex patterns are not implemented.
std::string replace_pattern(const json& j, std::string_view origin, std::string_view step) {
  const json& p = j.contains("pattern") ? j["pattern"] : json();
  if (p.is_object() && p.contains("String")) return text_field(p, "String", origin, step);
  if (p.is_object() && p.contains("Regex")) not_supported(origin, fmt::format("{} with a Regex pattern", step));
  throw Error(fmt::format("{}: {} without a pattern {{\"String\": ...}}, found {}", origin, step, brief(p)));
}

// Metaspace's prepend_scheme, or the older add_prefix_space (true: always, false: never); both must agree.
BpePreTokenizerStage::Prepend metaspace_prepend(const json& j, std::string_view origin, std::string_view step) {
  using Prepend = BpePreTokenizerStage::Prepend;
  std::optional<Prepend> scheme;
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    std::string s = text_field(j, "prepend_scheme", origin, step);
    if (s == "always")
      scheme = Prepend::always;
    else if (s == "first")
      scheme = Prepend::first;
    else if (s == "never")
      scheme = Prepend::never;
    else
      throw Error(fmt::format("{}: {}: prepend_scheme {:?} is not always, first or never", origin, step, s));
  }
  if (j.contains("add_prefix_space") && !j["add_prefix_space"].is_null()) {
    if (!j["add_prefix_space"].is_boolean())
      throw Error(fmt::format("{}: {}: \"add_prefix_space\" must be true or false, found {}", origin, step,
                              brief(j["add_prefix_space"])));
    const bool add = j["add_prefix_space"].get<bool>();
    if (!scheme) return add ? Prepend::always : Prepend::never;
    if (add != (*scheme != Prepend::never))
      throw Error(fmt::format("{}: {}: add_prefix_space {} contradicts prepend_scheme", origin, step, add),
                  "newer files have prepend_scheme only: remove add_prefix_space");
  }
  return scheme.value_or(Prepend::always);
}

std::string type_of(const json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) return j["type"].get<std::string>();
  return "";
}

bool flag(const json& j, const char* key, bool fallback, std::string_view origin) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean())
    throw Error(fmt::format("{}: \"{}\" must be true or false, found {}", origin, key, j[key].dump()));
  return j[key].get<bool>();
}

void parse_pre_tokenizer(const json& j, std::string_view origin, std::vector<BpePreTokenizerStage>& out,
                         size_t& count) {
  count_stage(count, origin, "pre_tokenizer");
  std::string type = type_of(j);
  if (type == "Sequence") {
    for (const auto& p : sequence_steps(j, "pretokenizers", origin, "pre_tokenizer"))
      parse_pre_tokenizer(p, origin, out, count);
    return;
  }
  if (type == "Metaspace") {
    BpePreTokenizerStage s;
    s.kind = BpePreTokenizerStage::Kind::metaspace;
    s.replacement = char_field(j, "replacement", origin, "the Metaspace pre-tokenizer", "\xe2\x96\x81");
    s.prepend = metaspace_prepend(j, origin, "the Metaspace pre-tokenizer");
    s.split = flag(j, "split", true, origin);
    out.push_back(s);
    return;
  }
  if (type == "ByteLevel") {
    BpePreTokenizerStage s;
    s.kind = BpePreTokenizerStage::Kind::byte_level;
    s.add_prefix_space = flag(j, "add_prefix_space", true, origin);
    s.use_regex = flag(j, "use_regex", true, origin);
    out.push_back(s);
    return;
  }
  if (type == "Split") {
    BpePreTokenizerStage s;
    s.kind = BpePreTokenizerStage::Kind::split;
    const json& pat = j.contains("pattern") ? j["pattern"] : json();
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      s.pattern = pat["Regex"].get<std::string>();
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      // A literal: escape every character that means something in a regex.
      for (char c : pat["String"].get<std::string>()) {
        if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) s.pattern += '\\';
        s.pattern += c;
      }
    } else {
      throw Error(
          fmt::format("{}: Split pre-tokenizer without a pattern {{\"Regex\": ...}} or {{\"String\": ...}}", origin));
    }
    std::string behavior = j.value("behavior", std::string("Isolated"));
    if (behavior != "Isolated")
      not_supported(origin, fmt::format("Split pre-tokenizer with behavior {} (only Isolated)", behavior));
    if (flag(j, "invert", false, origin)) not_supported(origin, "Split pre-tokenizer with invert: true");
    out.push_back(s);
    return;
  }
  not_supported(origin, fmt::format("the {} pre-tokenizer", type.empty() ? j.dump() : type));
}

// Byte-level BPE decodes to the bytes its tokens stand for: ByteLevel (or no decoder) is all it takes.
void check_byte_level_decoder(const json& j, std::string_view origin, size_t& count) {
  if (j.is_null()) return;
  count_stage(count, origin, "decoder");
  std::string type = type_of(j);
  if (type == "ByteLevel") return;
  if (type == "Sequence" && j.contains("decoders") && j["decoders"].is_array()) {
    for (const auto& d : j["decoders"]) check_byte_level_decoder(d, origin, count);
    return;
  }
  not_supported(origin,
                fmt::format("the {} decoder (byte-level BPE decodes with ByteLevel)", type.empty() ? brief(j) : type));
}

uint64_t count_field(const json& j, const char* key, std::string_view origin, std::string_view step) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 0)
    throw Error(fmt::format("{}: {}: \"{}\" must be a count (0, 1, ...), found {}", origin, step, key,
                            j.contains(key) ? brief(j[key]) : std::string("nothing")));
  return j[key].get<uint64_t>();
}

// The decoder chain of a SentencePiece-style tokenizer.
void parse_decoder(const json& j, std::string_view origin, std::vector<BpeDecoderStage>& out, size_t& count) {
  count_stage(count, origin, "decoder");
  using Kind = BpeDecoderStage::Kind;
  std::string type = type_of(j);
  BpeDecoderStage s;
  if (type == "Sequence") {
    for (const auto& d : sequence_steps(j, "decoders", origin, "decoder")) parse_decoder(d, origin, out, count);
    return;
  }
  if (type == "Replace") {
    s.kind = Kind::replace;
    s.pattern = replace_pattern(j, origin, "the Replace decoder");
    s.content = text_field(j, "content", origin, "the Replace decoder");
  } else if (type == "ByteFallback") {
    s.kind = Kind::byte_fallback;
  } else if (type == "Fuse") {
    s.kind = Kind::fuse;
  } else if (type == "Strip") {
    s.kind = Kind::strip;
    s.content = char_field(j, "content", origin, "the Strip decoder");
    s.start = count_field(j, "start", origin, "the Strip decoder");
    s.stop = count_field(j, "stop", origin, "the Strip decoder");
  } else if (type == "Metaspace") {
    s.kind = Kind::metaspace;
    s.content = char_field(j, "replacement", origin, "the Metaspace decoder", "\xe2\x96\x81");
    s.strip_first = metaspace_prepend(j, origin, "the Metaspace decoder") != BpePreTokenizerStage::Prepend::never;
  } else if (type == "ByteLevel") {
    not_supported(origin, "the ByteLevel decoder in a BPE without the ByteLevel pre-tokenizer");
  } else {
    not_supported(origin, fmt::format("the {} decoder", type.empty() ? brief(j) : type));
  }
  out.push_back(std::move(s));
}

void parse_normalizer(const json& j, std::string_view origin, std::vector<BpeNormalizerStage>& out, size_t& count) {
  count_stage(count, origin, "normalizer");
  std::string type = type_of(j);
  BpeNormalizerStage s;
  if (type == "Sequence") {
    for (const auto& n : sequence_steps(j, "normalizers", origin, "normalizer"))
      parse_normalizer(n, origin, out, count);
    return;
  }
  if (type == "Prepend") {
    s.kind = BpeNormalizerStage::Kind::prepend;
    s.content = text_field(j, "prepend", origin, "the Prepend normalizer");
  } else if (type == "Replace") {
    s.kind = BpeNormalizerStage::Kind::replace;
    s.pattern = replace_pattern(j, origin, "the Replace normalizer");
    s.content = text_field(j, "content", origin, "the Replace normalizer");
  } else {
    not_supported(origin, fmt::format("the {} normalizer", type.empty() ? brief(j) : type));
  }
  out.push_back(std::move(s));
}

BpeAddedToken parse_added_token(const json& t, std::string_view origin) {
  if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
      !t["content"].is_string())
    throw Error(
        fmt::format("{}: added_tokens entry {} needs an integer \"id\" and a string \"content\"", origin, t.dump()));
  BpeAddedToken a;
  // Checked in the type it arrives in: 2^32 + 339 is refused, not cut to 339.
  a.id = int32_t(json_integer(t["id"], fmt::format("{}: added token {}'s id", origin, brief(t["content"])),
                              "token ids are 0 to 2^31 - 1, as in Hugging Face's tokenizers", 0, INT32_MAX));
  a.content = t["content"].get<std::string>();
  if (a.content.size() > kMaxAddedTokenBytes)  // the matcher's cost per byte of text (added_tokens.h)
    throw Error(fmt::format("{}: added token {} is {} bytes, more than the {} llmtrain accepts", origin, a.id,
                            a.content.size(), kMaxAddedTokenBytes),
                "real added tokens are tens of bytes: this tokenizer.json is not one a model ships");
  a.special = flag(t, "special", false, origin);
  a.normalized = flag(t, "normalized", !a.special, origin);
  a.lstrip = flag(t, "lstrip", false, origin);
  a.rstrip = flag(t, "rstrip", false, origin);
  a.single_word = flag(t, "single_word", false, origin);
  return a;
}

json parse_json(std::string_view text, std::string_view origin, const char* what) {
  require_json_depth(text, origin);
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw Error(fmt::format("{} is not valid JSON: {}", origin, e.what()), fmt::format("expected {}", what));
  }
}

void read_vocab_object(const json& v, std::string_view origin, BpeSpec& spec) {
  spec.vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number_integer())
      throw Error(fmt::format("{}: vocabulary entry {:?} maps to {}, expected an integer id", origin, it.key(),
                              it.value().dump()));
    spec.vocab.emplace_back(
        it.key(), int32_t(json_integer(it.value(), fmt::format("{}: vocabulary entry {:?}'s id", origin, it.key()),
                                       "token ids are 0 to 2^31 - 1, as in Hugging Face's tokenizers", 0, INT32_MAX)));
  }
}

}  // namespace

BpeSpec parse_hf_tokenizer_json(std::string_view text, std::string_view origin) {
  json j = parse_json(text, origin, "a Hugging Face tokenizer.json");
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw Error(fmt::format("{}: no \"model\" object: not a Hugging Face tokenizer.json", origin),
                "point data.tokenizer / --tokenizer at the tokenizer.json shipped with the model");
  BpeSpec spec;
  spec.format = "tokenizer.json";
  try {
    const json& model = j["model"];
    std::string mtype = type_of(model);
    if (mtype.empty() && model.contains("merges")) mtype = "BPE";
    if (mtype != "BPE") not_supported(origin, fmt::format("{} tokenizer model", mtype.empty() ? "an unknown" : mtype));
    if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0)
      not_supported(origin, "BPE dropout (it makes tokenization random)");
    spec.byte_fallback = flag(model, "byte_fallback", false, origin);
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
        not_supported(origin, fmt::format("BPE with {} {:?}", key, model[key].get<std::string>()));
    spec.ignore_merges = flag(model, "ignore_merges", false, origin);
    spec.fuse_unk = flag(model, "fuse_unk", false, origin);
    if (model.contains("unk_token") && model["unk_token"].is_string())
      spec.unk_token = model["unk_token"].get<std::string>();

    if (!model.contains("vocab") || !model["vocab"].is_object())
      throw Error(fmt::format("{}: model.vocab must be an object mapping tokens to ids", origin));
    read_vocab_object(model["vocab"], origin, spec);
    if (!model.contains("merges") || !model["merges"].is_array())
      throw Error(fmt::format("{}: model.merges must be a list", origin));
    const json& merges = model["merges"];
    spec.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      if (m.is_string()) {  // "a b" (tokenizers < 0.20)
        const std::string& s = m.get_ref<const std::string&>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          throw Error(fmt::format("{}: merge {} {:?} is not two tokens separated by one space", origin, i, s));
        spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["a", "b"]
        spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        throw Error(fmt::format("{}: merge {} is {}, expected \"a b\" or [\"a\", \"b\"]", origin, i, m.dump()));
      }
    }

    size_t steps = 0;
    if (j.contains("normalizer") && !j["normalizer"].is_null())
      parse_normalizer(j["normalizer"], origin, spec.normalizer, steps);
    steps = 0;
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
      parse_pre_tokenizer(j["pre_tokenizer"], origin, spec.pre_tokenizer, steps);
    using Kind = BpePreTokenizerStage::Kind;
    auto kind_at = [&](size_t i) { return spec.pre_tokenizer[i].kind; };
    bool byte_level = false, metaspace = false;
    for (size_t i = 0; i < spec.pre_tokenizer.size(); ++i) {
      byte_level = byte_level || kind_at(i) == Kind::byte_level;
      metaspace = metaspace || kind_at(i) == Kind::metaspace;
      if (kind_at(i) == Kind::byte_level && i + 1 < spec.pre_tokenizer.size())
        not_supported(origin, "a pre-tokenizer after ByteLevel");
    }
    if (byte_level && metaspace) not_supported(origin, "Metaspace and ByteLevel pre-tokenizers together");
    steps = 0;
    if (byte_level) {
      if (j.contains("decoder")) check_byte_level_decoder(j["decoder"], origin, steps);
    } else if (j.contains("decoder") && !j["decoder"].is_null()) {
      spec.has_decoder = true;
      parse_decoder(j["decoder"], origin, spec.decoder, steps);
    }

    if (j.contains("added_tokens") && j["added_tokens"].is_array())
      for (const auto& t : j["added_tokens"]) spec.added.push_back(parse_added_token(t, origin));
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: unexpected tokenizer.json layout: {}", origin, e.what()),
                "expected a Hugging Face tokenizer.json as `tokenizers` writes it");
  }
  return spec;
}

BpeSpec parse_gpt2_files(std::string_view vocab_json, std::string_view merges_txt, std::string_view origin) {
  json v = parse_json(vocab_json, origin, "GPT-2's vocab.json: an object mapping tokens to ids");
  if (!v.is_object() || v.contains("model"))
    throw Error(fmt::format("{}: vocab.json must be an object mapping tokens to ids", origin));
  BpeSpec spec;
  spec.format = "vocab.json + merges.txt";
  read_vocab_object(v, origin, spec);
  size_t line_no = 0, pos = 0;
  while (pos < merges_txt.size()) {
    size_t nl = merges_txt.find('\n', pos);
    std::string_view line = merges_txt.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? merges_txt.size() : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && starts_with(line, "#version"))) continue;
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
      throw Error(fmt::format("{}: merges.txt line {}: {:?} is not two tokens separated by one space", origin, line_no,
                              std::string(line)),
                  "merges.txt holds one merge per line: \"left right\"");
    spec.merges.emplace_back(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
  }
  spec.pre_tokenizer.push_back(BpePreTokenizerStage::byte_level_stage(false, true));
  for (const auto& [s, id] : spec.vocab)
    if (s == "<|endoftext|>") spec.added.push_back({id, s, true, false, false, false, false});
  return spec;
}

}  // namespace llmtrain::trainer
