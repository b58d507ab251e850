// `llmtrain prep`: text or JSONL (optionally gzipped) -> tokens -> Megatron indexed dataset(s).
//
// The pipeline: one reader thread cuts the inputs into documents (trainer/data/prep_input.h) and packs
// them into chunks of about 1 MiB; `workers` threads parse JSON and tokenize chunks; the calling
// thread writes the chunks' tokens in input order (a chunk that finishes early waits for those
// before it), splitting whole documents between train and validation, and draws the progress.
// The reader stays at most ~64 MiB and 2 × workers + 2 chunks ahead of the writer, so memory does
// not grow with the input.
//
// Rules a reader could get wrong:
//  - The output does not depend on the number of workers: same inputs, flags and tokenizer give
//    the same bytes (tests/e2e/prep.sh checks --workers 1 against --workers 2).
//  - Nothing is left half-written: outputs go to temporary names and are renamed only when every
//    input was read and every output closed; any error (bad input without --skip-bad, a full disk,
//    an interrupt) removes them.
//  - The validation split is deterministic: of the documents kept, number i (from 0) goes to
//    validation when floor((i + 1) × F) > floor(i × F) — exactly floor(N × F) of N, evenly spread.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace llmtrain::trainer {

struct PrepOptions {
  std::vector<std::string> inputs;
  std::string format = "auto";           // auto | text | jsonl
  std::string jsonl_key = "text";        // the JSONL key holding the document
  std::optional<std::string> separator;  // text: a line equal to this ends a document; none = one per file
  std::string tokenizer = "byte";        // "byte" or a path load_tokenizer() accepts
  std::string output;                    // PREFIX, or DIR/ (files DIR/train, DIR/valid)
  bool append_eod = true;
  int workers = 0;              // 0 = the usable cores
  double valid_fraction = 0.0;  // in [0, 1)
  bool skip_bad = false;        // count and report bad documents instead of stopping
  int64_t max_document_mib = 256;
  double progress_interval_s = 10;  // plain progress lines when not on a terminal (0 = none)
  bool progress_terminal = false;   // draw a progress bar (the caller decides: isatty)
};

struct PrepSummary {
  std::string tokenizer;             // describe()
  std::vector<std::string> outputs;  // prefixes written
  std::string dtype;
  int64_t documents = 0, train_documents = 0, valid_documents = 0;
  int64_t tokens = 0, train_tokens = 0, valid_tokens = 0;
  int64_t text_bytes = 0;  // uncompressed document bytes read (JSONL: the whole lines)
  int64_t empty_skipped = 0, bad_skipped = 0;
  std::vector<std::string> bad_examples;  // the first few bad documents' messages
  double seconds = 0;
  int workers = 0;
};

// Runs prep. Throws llmtrain::Error for every bad input (naming file:line), an unwritable output,
// or when `stop` becomes true (an interrupt); no output exists afterwards in those cases.
PrepSummary prep_run(const PrepOptions& options, const std::atomic<bool>* stop = nullptr);

// The lines prep prints at the end.
std::string prep_summary_text(const PrepSummary& s);

}  // namespace llmtrain::trainer
