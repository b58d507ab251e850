#include "trainer/data/tokenizer.h"

#include <algorithm>

namespace llmtrain::trainer {

DecodeStream::DecodeStream(const Tokenizer& tokenizer, std::vector<int32_t> context)
    : tokenizer_(tokenizer), ids_(std::move(context)), done_(tokenizer_.decode(ids_).size()) {}

std::string DecodeStream::next(int32_t id) {
  ids_.push_back(id);
  std::string text = tokenizer_.decode(ids_);
  // Every decoder chain we implement only appends to the text of a sequence it extends; should one
  // not, nothing is taken back (what was printed stays printed).
  std::string added = text.size() > done_ ? text.substr(done_) : std::string();
  done_ = std::max(done_, text.size());
  return added;
}

}  // namespace llmtrain::trainer
