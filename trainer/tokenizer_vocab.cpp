#include "trainer/tokenizer_vocab.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace llmtrain::trainer {

int tokenizer_vocab_size(const std::string& tokenizer) {
  if (tokenizer == "byte") return kByteVocabSize;
  std::ifstream in(tokenizer);
  if (!in)
    throw Error(fmt::format("cannot read tokenizer file {}", tokenizer),
                "data.tokenizer takes \"byte\" or the path of a tokenizer.json / vocab.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{} is not valid JSON: {}", tokenizer, e.what()),
                "data.tokenizer must be a Hugging Face tokenizer.json or a GPT-2 vocab.json");
  }
  int64_t max_id = -1;
  auto scan_vocab = [&](const nlohmann::json& vocab) {
    for (auto it = vocab.begin(); it != vocab.end(); ++it)
      if (it.value().is_number_integer()) max_id = std::max<int64_t>(max_id, it.value().get<int64_t>());
  };
  if (j.is_object() && j.contains("model") && j["model"].is_object() && j["model"].contains("vocab")) {
    const auto& vocab = j["model"]["vocab"];
    if (vocab.is_object())
      scan_vocab(vocab);
    else if (vocab.is_array())
      max_id = static_cast<int64_t>(vocab.size()) - 1;  // Unigram: [[piece, score]...]
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
      for (const auto& t : j["added_tokens"])
        if (t.contains("id") && t["id"].is_number_integer()) max_id = std::max<int64_t>(max_id, t["id"].get<int64_t>());
  } else if (j.is_object()) {
    scan_vocab(j);  // GPT-2 vocab.json: {"token": id, ...}
  }
  if (max_id < 0)
    throw Error(fmt::format("{}: found no vocabulary (expected model.vocab in a tokenizer.json, or a "
                            "vocab.json mapping tokens to ids)",
                            tokenizer),
                "point data.tokenizer at the tokenizer.json shipped with the model");
  return static_cast<int>(max_id + 1);
}

}  // namespace llmtrain::trainer
