// Loading a tokenizer of any kind (trainer/data/tokenizer.h lists them): from what data.tokenizer
// or --tokenizer says, or from the kind and bytes a checkpoint kept (TokenizerSource). The one place
// that knows every kind of tokenizer; the interface, tokenizer.h, knows none of them.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "trainer/data/tokenizer.h"

namespace llmtrain::trainer {

// "byte"; a Hugging Face tokenizer.json; a GPT-2 vocab.json (merges.txt beside it) or merges.txt
// (vocab.json beside it); or a directory holding tokenizer.json or vocab.json + merges.txt.
// Throws llmtrain::Error naming the file for anything unreadable, malformed or not supported.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec_or_path);

// Rebuilds a tokenizer from TokenizerSource::kind and ::bytes (e.g. as stored in a checkpoint).
// For kTokenizerKindGpt2Files the bytes are a JSON object {"vocab.json": TEXT, "merges.txt": TEXT}.
// `origin` names the bytes in error messages ("checkpoint runs/x/ckpt/step_00000100").
std::unique_ptr<Tokenizer> load_tokenizer_from_bytes(std::string_view kind, std::string_view bytes,
                                                     std::string_view origin);

}  // namespace llmtrain::trainer
