// Reading tokenizer files into a BpeSpec: Hugging Face tokenizer.json and GPT-2's vocab.json +
// merges.txt.
//
// Rule a reader could get wrong: every part of a tokenizer.json that changes the ids is either
// implemented or refused with "not supported yet" — never skipped. What is deliberately not
// applied is documented in docs/data.md: the post-processor (BOS/EOS templates; prep
// appends the end-of-document token itself), truncation and padding (batch settings, not part
// of the tokenization), the decoder beyond byte-level (decode() returns the exact bytes).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_depth.h"
#include "common/strings.h"
#include "trainer/data/bpe_tokenizer.h"

namespace llmtrain::trainer {

namespace {

using nlohmann::json;

constexpr const char* kOnlyByteLevel =
    "llmtrain supports byte-level BPE tokenizers (GPT-2, LLaMA-3, Qwen, GPT-4o style); other kinds are "
    "planned";

[[noreturn]] void not_supported(std::string_view origin, const std::string& what) {
  throw Error(fmt::format("{}: not supported yet: {}", origin, what), kOnlyByteLevel);
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

void parse_pre_tokenizer(const json& j, std::string_view origin, std::vector<BpePreTokenizerStage>& out) {
  std::string type = type_of(j);
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      throw Error(fmt::format("{}: pre_tokenizer Sequence without a \"pretokenizers\" list", origin));
    for (const auto& p : j["pretokenizers"]) parse_pre_tokenizer(p, origin, out);
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
  if (type == "Metaspace")
    not_supported(origin, "the Metaspace pre-tokenizer (SentencePiece-style tokenizers such as LLaMA-2, Mistral, T5)");
  not_supported(origin, fmt::format("the {} pre-tokenizer", type.empty() ? j.dump() : type));
}

void check_decoder(const json& j, std::string_view origin) {
  if (j.is_null()) return;
  std::string type = type_of(j);
  if (type == "ByteLevel") return;
  if (type == "Sequence" && j.contains("decoders") && j["decoders"].is_array()) {
    for (const auto& d : j["decoders"]) check_decoder(d, origin);
    return;
  }
  not_supported(origin, fmt::format("the {} decoder (byte-level BPE decodes with ByteLevel)", type));
}

BpeAddedToken parse_added_token(const json& t, std::string_view origin) {
  if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
      !t["content"].is_string())
    throw Error(
        fmt::format("{}: added_tokens entry {} needs an integer \"id\" and a string \"content\"", origin, t.dump()));
  BpeAddedToken a;
  a.id = t["id"].get<int32_t>();
  a.content = t["content"].get<std::string>();
  a.special = flag(t, "special", false, origin);
  a.normalized = flag(t, "normalized", !a.special, origin);
  a.lstrip = flag(t, "lstrip", false, origin);
  a.rstrip = flag(t, "rstrip", false, origin);
  a.single_word = flag(t, "single_word", false, origin);
  if (a.id < 0) throw Error(fmt::format("{}: added token {} has negative id {}", origin, a.content, a.id));
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
    spec.vocab.emplace_back(it.key(), it.value().get<int32_t>());
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
    if (flag(model, "byte_fallback", false, origin))
      not_supported(origin, "BPE with byte_fallback (SentencePiece-style, e.g. LLaMA-2, Mistral)");
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

    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      const json& n = j["normalizer"];
      bool empty_sequence = type_of(n) == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() &&
                            n["normalizers"].empty();
      if (!empty_sequence) not_supported(origin, fmt::format("the {} normalizer", type_of(n)));
    }
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
      parse_pre_tokenizer(j["pre_tokenizer"], origin, spec.pre_tokenizer);
    bool byte_level_last =
        !spec.pre_tokenizer.empty() && spec.pre_tokenizer.back().kind == BpePreTokenizerStage::Kind::byte_level;
    for (size_t i = 0; i + 1 < spec.pre_tokenizer.size(); ++i)
      if (spec.pre_tokenizer[i].kind == BpePreTokenizerStage::Kind::byte_level)
        not_supported(origin, "a pre-tokenizer after ByteLevel");
    if (!byte_level_last)
      not_supported(origin, "a BPE tokenizer without a ByteLevel pre-tokenizer (SentencePiece-style BPE)");
    if (j.contains("decoder")) check_decoder(j["decoder"], origin);

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
  spec.pre_tokenizer.push_back({BpePreTokenizerStage::Kind::byte_level, "", false, true});
  for (const auto& [s, id] : spec.vocab)
    if (s == "<|endoftext|>") spec.added.push_back({id, s, true, false, false, false, false});
  return spec;
}

}  // namespace llmtrain::trainer
