// TensorBoard event files (`log.tensorboard: true`), written without TensorFlow or a protobuf
// library. docs/metrics.md ("TensorBoard") lists the tags; this file owns the format and the tags.
//
// The format: `events.out.tfevents.<unix time>.<host>`, a sequence of TFRecord records
//   uint64 length | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// (little-endian; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), each record's data one serialized
// `tensorboard.Event` protobuf (TensorBoard's event.proto and summary.proto). The first event of a
// file carries file_version "brain.Event:2"; scalars are Event{wall_time, step, summary{value{tag,
// simple_value}}}.
//
// Rules a reader could get wrong:
//  - After the constructor nothing here throws: the training loop must not die for a chart. The first
//    failed write logs one warning and turns the writer off for the rest of the run.
//  - Scalars are queued and written by flush(), one write per batch: a killed run keeps every flushed
//    batch whole (a record cut short at the end of a file is ignored by TensorBoard's readers).
//  - Every run, resumed or not, writes a new file, never into an old one. The file's second event is a
//    SessionLog START at the first step the run will write: TensorBoard then drops the points of
//    earlier files at that step and after (steps a killed run logged past its last checkpoint), as
//    metrics.jsonl drops those records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/file_io.h"
#include "trainer/placement/memory.h"
#include "trainer/report/metrics.h"

namespace llmtrain::trainer {

class TensorBoardWriter {
 public:
  // Creates `dir` and a new events file in it, and writes the file's opening events. `first_step`:
  // the first step this run will write (a resumed run's start step + 1). Throws llmtrain::Error
  // (environment) naming the path when the directory or the file cannot be made.
  TensorBoardWriter(const std::string& dir, int64_t first_step, FileSystem& fs = default_file_system());
  ~TensorBoardWriter();  // flushes what is queued; never throws
  TensorBoardWriter(TensorBoardWriter&&) = default;
  TensorBoardWriter& operator=(TensorBoardWriter&&) = default;

  // Queues one scalar (`wall_time`: seconds since the Unix epoch); flush() writes it.
  void add_scalar(std::string_view tag, int64_t step, float value, double wall_time);
  // Writes what is queued in one write. A failure logs a warning (once) and turns the writer off.
  void flush();

  // False once a write failed: nothing more is written.
  bool ok() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }

 private:
  std::unique_ptr<WritableFile> file_;
  std::string path_;
  std::string queued_;  // framed records not yet written
};

// A logged step's metrics as one batch, flushed: train/loss, train/lr, train/grad_norm,
// train/tokens_per_s, train/mfu and memory/<kind>_bytes (with total) from `peak_memory`.
void tensorboard_write_step(TensorBoardWriter& tb, const StepMetrics& m, const MemoryAccount& peak_memory);
// An evaluation as one batch, flushed: val/loss, val/ppl.
void tensorboard_write_eval(TensorBoardWriter& tb, const EvalMetrics& m);

// Seconds since the Unix epoch, the events' wall_time.
double tensorboard_wall_time();

// The encoding, exposed for tests.
// CRC-32C of `data` masked as TFRecord stores it.
uint32_t tfrecord_masked_crc(const void* data, size_t size);
// One TFRecord record around `data`.
std::string tfrecord_frame(std::string_view data);
// Serialized Events: a scalar, the file_version event, a SessionLog START at `step`.
std::string tensorboard_scalar_event(double wall_time, int64_t step, std::string_view tag, float value);
std::string tensorboard_file_version_event(double wall_time);
std::string tensorboard_session_start_event(double wall_time, int64_t step);

}  // namespace llmtrain::trainer
