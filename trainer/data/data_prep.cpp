// `llmtrain prep`'s pipeline: reader thread -> tokenizer workers -> in-order writer on the calling
// thread. Every thread hands its failure to the writer through an exception_ptr (nothing crosses a
// thread boundary by unwinding), and every wait also watches the abort flag.
#include "trainer/data/data_prep.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "common/host.h"
#include "common/json_depth.h"
#include "common/strings.h"
#include "trainer/data/indexed_dataset.h"
#include "trainer/data/prep_input.h"
#include "trainer/data/tokenizer.h"
#include "trainer/data/tokenizer_load.h"
#include "trainer/report/progress_bar.h"

namespace llmtrain::trainer {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kChunkBytes = 1 << 20;
constexpr size_t kChunkDocs = 8192;
constexpr int64_t kMaxAheadBytes = 64 << 20;
constexpr double kStallSeconds = 600;
constexpr size_t kBadExamples = 10;

// A run of documents, read together and tokenized by one worker.
struct Chunk {
  int64_t seq = 0;
  std::vector<Record> records;
  int64_t text_bytes = 0, disk_bytes = 0;
  size_t count = 0;                 // records, once tokenized (records is then freed)
  std::vector<int32_t> tokens;      // every record's tokens, back to back
  std::vector<int64_t> ends;        // per record: end of its tokens
  std::vector<std::string> errors;  // per record: "" or why it is bad
  std::vector<uint8_t> empty;       // per record: no text
};

class Pipeline {
 public:
  Pipeline(const PrepOptions& o, const std::vector<InputFile>& inputs, const Tokenizer& tok, int workers,
           const std::atomic<bool>* stop)
      : o_(o), inputs_(inputs), tok_(tok), stop_(stop), max_chunks_(2 * workers + 2) {
    reader_ = std::thread([this] { guarded([this] { read_all(); }); });
    for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { guarded([this] { work(); }); });
  }
  ~Pipeline() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      abort_ = true;
    }
    cv_.notify_all();
    reader_.join();
    for (auto& w : workers_) w.join();
  }

  // The next chunk in input order, or null after the last. Rethrows a reader's or worker's failure.
  std::unique_ptr<Chunk> next() {
    std::unique_lock<std::mutex> lock(mu_);
    auto waited_since = std::chrono::steady_clock::now();
    for (;;) {
      if (failure_) std::rethrow_exception(failure_);
      if (stopping()) throw Error("prep: interrupted; nothing was written");
      auto it = done_.find(next_seq_);
      if (it != done_.end()) {
        auto c = std::move(it->second);
        done_.erase(it);
        ++next_seq_;
        return c;
      }
      if (reading_done_ && next_seq_ == total_chunks_) return nullptr;
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - waited_since).count();
      if (waited > kStallSeconds)
        throw environment_error(
            fmt::format("prep: no progress for {:.0f} s waiting for the tokenizer workers "
                        "(chunk {} of the input)",
                        waited, next_seq_));
    }
  }
  // The writer is done with a chunk: the reader may go further ahead.
  void release(const Chunk& c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --in_flight_;
      in_flight_bytes_ -= c.text_bytes;
    }
    cv_.notify_all();
  }

 private:
  template <typename F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {  // handed to the writing thread: nothing crosses the thread boundary
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!failure_) failure_ = std::current_exception();
        abort_ = true;
      }
      cv_.notify_all();
    }
  }

  bool stopping() const { return stop_ && stop_->load(); }

  void read_all() {
    auto chunk = std::make_unique<Chunk>();
    int64_t seq = 0;
    auto push = [&] {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return abort_ || in_flight_ == 0 || (in_flight_ < max_chunks_ && in_flight_bytes_ < kMaxAheadBytes);
      });
      if (abort_) return false;
      chunk->seq = seq++;
      ++in_flight_;
      in_flight_bytes_ += chunk->text_bytes;
      work_.push_back(std::move(chunk));
      chunk = std::make_unique<Chunk>();
      lock.unlock();
      cv_.notify_all();
      return true;
    };
    for (uint32_t i = 0; i < inputs_.size(); ++i) {
      DocumentReader reader(inputs_[i], i, o_.separator, o_.max_document_mib << 20);
      int64_t accounted = 0;
      Record rec;
      while (reader.next(rec)) {
        if (stopping()) throw Error("prep: interrupted; nothing was written");
        chunk->text_bytes += int64_t(rec.text.size());
        chunk->records.push_back(std::move(rec));
        rec = Record{};
        if (chunk->text_bytes >= kChunkBytes || chunk->records.size() >= kChunkDocs) {
          int64_t off = std::min(reader.disk_offset(), inputs_[i].disk_bytes);
          chunk->disk_bytes += off - accounted;
          accounted = off;
          if (!push()) return;
        }
      }
      chunk->disk_bytes += inputs_[i].disk_bytes - accounted;
    }
    if ((!chunk->records.empty() || chunk->disk_bytes > 0) && !push()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_done_ = true;
      total_chunks_ = seq;
    }
    cv_.notify_all();
  }

  void work() {
    for (;;) {
      std::unique_ptr<Chunk> c;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return abort_ || !work_.empty() || reading_done_; });
        if (abort_ || work_.empty()) return;
        c = std::move(work_.front());
        work_.pop_front();
      }
      tokenize(*c);
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_[c->seq] = std::move(c);
      }
      cv_.notify_all();
    }
  }

  void tokenize(Chunk& c) {
    c.count = c.records.size();
    c.ends.reserve(c.count);
    c.errors.resize(c.count);
    c.empty.resize(c.count, 0);
    c.tokens.reserve(size_t(c.text_bytes / (tok_.spec() == "byte" ? 1 : 3)) + c.count + 16);
    std::string value;
    for (size_t r = 0; r < c.count; ++r) {
      Record& rec = c.records[r];
      auto where = [&] {
        return rec.line ? fmt::format("{}:{}", inputs_[rec.file].path, rec.line) : inputs_[rec.file].path;
      };
      size_t before = c.tokens.size();
      if (!rec.error.empty()) {
        c.errors[r] = rec.error;
      } else {
        std::string_view text = rec.text;
        if (inputs_[rec.file].format == InputFormat::jsonl) text = json_text(rec, where, c.errors[r], value);
        if (!c.errors[r].empty()) {
        } else if (text.empty()) {
          c.empty[r] = 1;
        } else {
          try {
            tok_.encode_append(text, c.tokens);
            if (o_.append_eod) c.tokens.push_back(tok_.eod_id());
          } catch (const Error& e) {
            c.tokens.resize(before);
            c.errors[r] = fmt::format("{}: {}", where(), e.what());
          }
        }
      }
      c.ends.push_back(int64_t(c.tokens.size()));
      rec.text = std::string();  // free the text as soon as it is tokenized
    }
    c.records.clear();
    c.records.shrink_to_fit();
  }

  template <typename Where>
  std::string_view json_text(const Record& rec, Where&& where, std::string& error, std::string& value) {
    nlohmann::json j;
    if (json_nesting_depth(rec.text) > kMaxJsonDepth) {
      error = fmt::format("{}: malformed JSON: nested deeper than {} levels", where(), kMaxJsonDepth);
      return {};
    }
    try {
      j = nlohmann::json::parse(rec.text);
    } catch (const nlohmann::json::exception& e) {
      std::string msg = e.what();
      auto colon = msg.find("]");
      error = fmt::format("{}: malformed JSON: {}", where(),
                          trim(colon == std::string::npos ? msg : msg.substr(colon + 1)));
      return {};
    }
    if (!j.is_object()) {
      error = fmt::format("{}: expected a JSON object, found {}", where(), j.type_name());
      return {};
    }
    auto it = j.find(o_.jsonl_key);
    if (it == j.end()) {
      std::vector<std::string> keys;
      for (auto k = j.begin(); k != j.end() && keys.size() < 8; ++k) keys.push_back("\"" + k.key() + "\"");
      error = fmt::format("{}: no key \"{}\" (the object has {})", where(), o_.jsonl_key,
                          keys.empty() ? std::string("no keys") : join(keys, ", "));
      return {};
    }
    if (!it->is_string()) {
      error = fmt::format("{}: key \"{}\" holds {} {}, expected a string", where(), o_.jsonl_key,
                          it->is_array() || it->is_object() ? "an" : "a", it->type_name());
      return {};
    }
    value = it->get<std::string>();
    return value;
  }

  const PrepOptions& o_;
  const std::vector<InputFile>& inputs_;
  const Tokenizer& tok_;
  const std::atomic<bool>* stop_;
  const int max_chunks_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Chunk>> work_;
  std::map<int64_t, std::unique_ptr<Chunk>> done_;
  int64_t next_seq_ = 0, total_chunks_ = -1;
  int in_flight_ = 0;
  int64_t in_flight_bytes_ = 0;
  bool reading_done_ = false, abort_ = false;
  std::exception_ptr failure_;
  std::thread reader_;
  std::vector<std::thread> workers_;
};

// Directories prep creates for its outputs, removed again when it fails.
struct CreatedDirs {
  std::vector<fs::path> dirs;  // deepest last
  bool keep = false;
  void create(const fs::path& dir) {
    std::vector<fs::path> missing;
    for (fs::path p = dir; !p.empty() && !fs::exists(p); p = p.parent_path()) missing.push_back(p);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
      throw Error(fmt::format("cannot create output directory {}: {}", dir.string(), ec.message()),
                  "check the --output path");
    dirs.insert(dirs.end(), missing.rbegin(), missing.rend());
  }
  ~CreatedDirs() {
    if (keep) return;
    std::error_code ec;
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) fs::remove(*it, ec);  // only if empty
  }
};

}  // namespace

PrepSummary prep_run(const PrepOptions& o, const std::atomic<bool>* stop) {
  if (o.output.empty()) throw Error("no output given", "pass --output PREFIX (or DIR/)");
  if (!(o.valid_fraction >= 0 && o.valid_fraction < 1))
    throw Error(fmt::format("--valid-fraction {}: expected a number in [0, 1)", o.valid_fraction));
  // Bounded above too: a thread per worker, and MiB shifted into bytes.
  if (o.workers < 0 || o.workers > 1024)
    throw Error(
        fmt::format("--workers {}: expected a number of threads in [1, 1024] (0: the usable cores)", o.workers));
  if (o.max_document_mib < 1 || o.max_document_mib > (int64_t(1) << 20))
    throw Error(fmt::format("--max-doc-mib {}: expected a size in MiB in [1, 1048576]", o.max_document_mib));
  if (!(o.progress_interval_s >= 0 && o.progress_interval_s <= 86400))
    throw Error(fmt::format("--progress-interval {}: expected seconds in [0, 86400] (0: none)", o.progress_interval_s));
  if (o.jsonl_key.empty()) throw Error("--jsonl-key is empty");
  std::vector<InputFile> inputs = prep_resolve_inputs(o.inputs, o.format);
  auto tok = load_tokenizer(o.tokenizer);
  tok->set_interrupt(stop);  // a stop (SIGTERM) ends a huge document's tokenization too, between words
  if (o.append_eod && tok->eod_id() < 0)
    throw Error(fmt::format("tokenizer {} has no end-of-document token to append", o.tokenizer),
                "pass --no-append-eod, or use a tokenizer with <|endoftext|>, <|end_of_text|>, </s> or <eos>");

  PrepSummary s;
  s.tokenizer = tok->describe();
  s.workers = o.workers > 0 ? o.workers : std::max(1, usable_cores());
  TokenDtype dtype = token_dtype_for_vocab(tok->vocab_size());
  s.dtype = std::string(token_dtype_name(uint8_t(dtype)));

  // Outputs: PREFIX, or PREFIX-train + PREFIX-valid; DIR/ gives DIR/train (+ DIR/valid).
  bool dir_mode = o.output.back() == '/';
  bool split = o.valid_fraction > 0;
  std::string train_prefix = dir_mode ? o.output + "train" : split ? o.output + "-train" : o.output;
  std::string valid_prefix = dir_mode ? o.output + "valid" : o.output + "-valid";
  CreatedDirs created;
  fs::path parent = fs::path(train_prefix).parent_path();
  if (!parent.empty()) created.create(parent);
  // Opening the writers first makes an unwritable output fail before any work.
  IndexedDatasetWriter train(train_prefix, dtype);
  std::unique_ptr<IndexedDatasetWriter> valid;
  if (split) valid = std::make_unique<IndexedDatasetWriter>(valid_prefix, dtype);

  int64_t total_disk = 0, disk_done = 0;
  for (const auto& f : inputs) total_disk += f.disk_bytes;
  ProgressBar progress(stderr, o.progress_terminal, o.progress_interval_s, "prep");
  auto status = [&] {
    double secs = std::max(progress.elapsed_s(), 1e-9);
    return fmt::format("{:.1f}/{:.1f} MiB  {} docs  {} tokens  {:.1f} MB/s", disk_done / 1048576.0,
                       total_disk / 1048576.0, format_count(double(s.documents)), format_count(double(s.tokens)),
                       double(s.text_bytes) / 1e6 / secs);
  };
  {
    Pipeline pipe(o, inputs, *tok, s.workers, stop);
    while (auto c = pipe.next()) {
      if (stop && stop->load()) throw Error("prep: interrupted; nothing was written");
      int64_t begin = 0;
      for (size_t r = 0; r < c->count; ++r) {
        int64_t end = c->ends[r];
        if (!c->errors[r].empty()) {
          if (!o.skip_bad)
            throw Error(c->errors[r], "fix the input, or pass --skip-bad to skip bad documents and count them");
          ++s.bad_skipped;
          if (s.bad_examples.size() < kBadExamples) s.bad_examples.push_back(c->errors[r]);
        } else if (c->empty[r]) {
          ++s.empty_skipped;
        } else {
          std::span<const int32_t> doc(c->tokens.data() + begin, size_t(end - begin));
          int64_t i = s.documents++;
          bool to_valid = split && int64_t(double(i + 1) * o.valid_fraction) > int64_t(double(i) * o.valid_fraction);
          (to_valid ? *valid : train).add_document(doc);
          (to_valid ? s.valid_documents : s.train_documents)++;
          (to_valid ? s.valid_tokens : s.train_tokens) += int64_t(doc.size());
          s.tokens += int64_t(doc.size());
        }
        begin = end;
      }
      s.text_bytes += c->text_bytes;
      disk_done += c->disk_bytes;
      pipe.release(*c);
      progress.update(total_disk > 0 ? double(disk_done) / double(total_disk) : -1, status());
    }
  }
  progress.finish();

  if (s.documents == 0)
    throw Error(
        fmt::format("no documents in the input ({} file{}: {} empty document{}, {} bad)", inputs.size(),
                    inputs.size() == 1 ? "" : "s", s.empty_skipped, s.empty_skipped == 1 ? "" : "s", s.bad_skipped),
        "check the --input files (and --jsonl-key / --format for JSONL)");
  if (split && s.valid_documents == 0)
    throw Error(fmt::format("--valid-fraction {} gave no validation document: {} documents × {} < 1", o.valid_fraction,
                            s.documents, o.valid_fraction),
                "use more documents or a larger fraction");
  train.close();
  if (valid) valid->close();
  train.commit();
  if (valid) valid->commit();
  created.keep = true;
  s.outputs.push_back(train_prefix);
  if (valid) s.outputs.push_back(valid_prefix);
  s.seconds = progress.elapsed_s();
  return s;
}

std::string prep_summary_text(const PrepSummary& s) {
  std::string out = fmt::format("tokenizer: {}\n", s.tokenizer);
  out += fmt::format("documents: {} ({} tokens, {})", s.documents, s.tokens, s.dtype);
  if (s.outputs.size() > 1)
    out += fmt::format(": train {} ({} tokens), valid {} ({} tokens)", s.train_documents, s.train_tokens,
                       s.valid_documents, s.valid_tokens);
  out += "\n";
  out += fmt::format("skipped: {} empty, {} bad\n", s.empty_skipped, s.bad_skipped);
  for (const auto& b : s.bad_examples) out += fmt::format("  bad: {}\n", b);
  if (s.bad_skipped > int64_t(s.bad_examples.size()))
    out += fmt::format("  ... and {} more\n", s.bad_skipped - int64_t(s.bad_examples.size()));
  out += fmt::format("read: {} in {:.2f} s ({:.1f} MB/s, {} workers)\n", format_bytes(double(s.text_bytes)), s.seconds,
                     double(s.text_bytes) / 1e6 / std::max(s.seconds, 1e-9), s.workers);
  for (const auto& p : s.outputs) out += fmt::format("wrote: {}.bin, {}.idx\n", p, p);
  return out;
}

}  // namespace llmtrain::trainer
