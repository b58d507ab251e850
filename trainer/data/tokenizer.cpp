#include "trainer/data/tokenizer.h"

#include <algorithm>

#include "trainer/data/bpe_decoder.h"

namespace llmtrain::trainer {

DecodeStream::DecodeStream(const Tokenizer& tokenizer, std::vector<int32_t> context)
    : tokenizer_(tokenizer), prefix_(std::move(context)), prefix_text_(tokenizer_.decode(prefix_)) {}

std::string DecodeStream::gained() const {
  std::vector<int32_t> window = prefix_;
  window.insert(window.end(), pending_.begin(), pending_.end());
  const std::string text = tokenizer_.decode(window);
  if (text.compare(0, prefix_text_.size(), prefix_text_) == 0) return text.substr(prefix_text_.size());
  // The prefix's text changed with what followed (its byte-fallback run, valid alone, is not with
  // the next byte): the pending ids' own text.
  return tokenizer_.decode(pending_);
}

std::string DecodeStream::next(int32_t id) {
  pending_.push_back(id);
  std::string added = gained();
  const bool incomplete =
      added.size() >= kReplacementCharacter.size() &&
      std::string_view(added).substr(added.size() - kReplacementCharacter.size()) == kReplacementCharacter;
  if (incomplete || added.empty()) return "";
  prefix_ = std::move(pending_);
  pending_.clear();
  prefix_text_ = tokenizer_.decode(prefix_);
  return added;
}

std::string DecodeStream::finish() {
  if (pending_.empty()) return "";
  std::string added = gained();
  pending_.clear();
  return added;
}

}  // namespace llmtrain::trainer
