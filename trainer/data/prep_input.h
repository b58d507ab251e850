// Input side of `llmtrain prep`: which files, in which format, cut into documents.
//
//  - text: one document per file; or, with a separator, documents end at every line that is
//    exactly the separator (fortune files use "%"; "" makes blank lines separate documents). The
//    separator line belongs to no document; every other line keeps its newline.
//  - JSONL: one JSON object per line, the document is the string under the key (--jsonl-key);
//    blank lines are skipped. Parsing happens in the workers (prep_tokenize.cpp): here a JSONL
//    document is its raw line.
//  - Either may be gzip-compressed (.gz, or any file that starts with gzip's magic): zlib reads
//    both transparently.
//
// Rule a reader could get wrong: memory stays bounded whatever the input. Lines and documents are
// read through a fixed buffer; a document larger than max_document_bytes is not held: its bytes
// are dropped and the record carries an error (skipped under --skip-bad, fatal otherwise).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

typedef struct gzFile_s* gzFile;

namespace llmtrain::trainer {

enum class InputFormat { text, jsonl };

struct InputFile {
  std::string path;
  InputFormat format = InputFormat::text;
  int64_t disk_bytes = 0;
};

// Checks every path (exists, is a readable regular file) and decides its format: `format` is
// "auto" (by name: .jsonl, .json, .ndjson, optionally + .gz, are JSONL), "text" or "jsonl".
// Throws llmtrain::Error naming the first path that cannot be read.
std::vector<InputFile> prep_resolve_inputs(const std::vector<std::string>& paths, const std::string& format);

// One document as read.
struct Record {
  std::string text;   // the document (text), or the raw line (JSONL)
  uint32_t file = 0;  // index into the inputs
  int64_t line = 0;   // first line of the document, 1-based; 0 = the whole file
  std::string error;  // set when the record is unusable (too large)
};

// Reads one file's documents in order.
class DocumentReader {
 public:
  // Throws llmtrain::Error when the file cannot be opened.
  DocumentReader(const InputFile& file, uint32_t index, const std::optional<std::string>& separator,
                 int64_t max_document_bytes);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // The next document, or false at the end of the file. Throws llmtrain::Error for read and
  // decompression errors, naming the file.
  bool next(Record& out);
  // Bytes of the file on disk consumed so far (compressed bytes for gzip).
  int64_t disk_offset() const;

 private:
  bool fill();                     // refills buf_ from the file; false at the end
  bool read_line(std::string& s);  // appends one line (with its '\n') to s; false at the end

  const InputFile& file_;
  uint32_t index_;
  std::optional<std::string> separator_;
  int64_t max_bytes_;
  gzFile gz_ = nullptr;
  std::vector<char> buf_;
  size_t pos_ = 0, end_ = 0;
  bool eof_ = false;
  int64_t line_ = 0;
  bool line_too_long_ = false;
};

}  // namespace llmtrain::trainer
