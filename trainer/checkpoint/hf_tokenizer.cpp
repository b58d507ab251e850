// The tokenizer half of the Hugging Face bridge (hf_bridge.h): tokenizer.json and
// tokenizer_config.json as transformers' PreTrainedTokenizerFast reads them (the format of
// Hugging Face `tokenizers`' Tokenizer::save: model BPE, pre-tokenizer ByteLevel, decoder ByteLevel).
#include <fmt/format.h>

#include "common/error.h"
#include "common/json_depth.h"
#include "trainer/checkpoint/hf_bridge.h"
#include "trainer/data/bpe_tokenizer.h"
#include "trainer/data/byte_tokenizer.h"

namespace llmtrain::trainer {
using nlohmann::json;

namespace {

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// The byte tokenizer as a byte-level BPE: one token per byte (its id is the byte), no merges, and
// <|endoftext|> as a special added token.
BpeSpec byte_spec() {
  BpeSpec spec;
  const auto& b2u = byte_to_unicode();
  for (int b = 0; b < 256; ++b) spec.vocab.emplace_back(utf8(b2u[size_t(b)]), b);
  spec.added.push_back({kByteEodId, "<|endoftext|>", true, false, false, false, false});
  spec.pre_tokenizer.push_back(BpePreTokenizerStage::byte_level_stage(false, false));
  return spec;
}

json added_token(const BpeAddedToken& t) {
  return json{{"id", t.id},         {"content", t.content},       {"single_word", t.single_word}, {"lstrip", t.lstrip},
              {"rstrip", t.rstrip}, {"normalized", t.normalized}, {"special", t.special}};
}

std::string tokenizer_json(const BpeSpec& spec) {
  json vocab = json::object();
  for (const auto& [token, id] : spec.vocab) vocab[token] = id;
  json merges = json::array();
  for (const auto& [a, b] : spec.merges) merges.push_back(a + " " + b);
  json added = json::array();
  for (const auto& t : spec.added) added.push_back(added_token(t));
  LT_CHECK(spec.pre_tokenizer.size() == 1 && spec.pre_tokenizer[0].kind == BpePreTokenizerStage::Kind::byte_level,
           "hf export: only a single ByteLevel pre-tokenizer is written");
  const auto& bl = spec.pre_tokenizer[0];
  json j{{"version", "1.0"},
         {"truncation", nullptr},
         {"padding", nullptr},
         {"added_tokens", added},
         {"normalizer", nullptr},
         {"pre_tokenizer",
          {{"type", "ByteLevel"},
           {"add_prefix_space", bl.add_prefix_space},
           {"trim_offsets", true},
           {"use_regex", bl.use_regex}}},
         {"post_processor", nullptr},
         {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
         {"model",
          {{"type", "BPE"},
           {"dropout", nullptr},
           {"unk_token", nullptr},
           {"continuing_subword_prefix", nullptr},
           {"end_of_word_suffix", nullptr},
           {"fuse_unk", false},
           {"byte_fallback", false},
           {"vocab", vocab},
           {"merges", merges}}}};
  return j.dump(2);
}

}  // namespace

std::string hf_byte_tokenizer_json() { return tokenizer_json(byte_spec()); }

std::map<std::string, std::string> hf_tokenizer_files(const Tokenizer& tok, int64_t model_max_length) {
  const TokenizerSource& src = tok.source();
  std::string file;
  if (src.kind == kTokenizerKindByte) {
    file = hf_byte_tokenizer_json();
  } else if (src.kind == kTokenizerKindGpt2Files) {
    require_json_depth(src.bytes, src.origin);
    json both = json::parse(src.bytes, nullptr, false);
    if (!both.is_object() || !both.contains("vocab.json") || !both.contains("merges.txt") ||
        !both["vocab.json"].is_string() || !both["merges.txt"].is_string())
      throw Error(fmt::format("{}: the stored GPT-2 tokenizer files are damaged", src.origin),
                  "the checkpoint is damaged");
    file = tokenizer_json(
        parse_gpt2_files(both["vocab.json"].get<std::string>(), both["merges.txt"].get<std::string>(), src.origin));
  } else if (src.kind == kTokenizerKindHfJson) {
    file = src.bytes;
  } else {
    throw Error(fmt::format("{}: tokenizer kind {} cannot be exported", src.origin, src.kind),
                "not supported yet: exporting this tokenizer");
  }
  // The end-of-document token as transformers' eos (and bos: GPT-2's convention of one
  // <|endoftext|> for both).
  json config{{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"model_max_length", model_max_length},
              {"clean_up_tokenization_spaces", false}};
  if (tok.eod_id() >= 0) {
    const int32_t eod = tok.eod_id();
    const std::string text = tok.decode(std::span<const int32_t>(&eod, 1));
    config["eos_token"] = text;
    config["bos_token"] = text;
  }
  return {{"tokenizer.json", file}, {"tokenizer_config.json", config.dump(2)}};
}

}  // namespace llmtrain::trainer
