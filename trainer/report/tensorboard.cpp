#include "trainer/report/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "common/crc32c.h"
#include "common/error.h"
#include "common/log.h"

namespace llmtrain::trainer {
namespace {

// Protocol buffers' wire format, the part an Event needs. A field is its key, varint(number << 3 |
// wire type), then the value: wire type 0 a varint (7 bits a byte, low first, high bit = more), 1
// eight little-endian bytes, 2 a varint length and that many bytes (strings, nested messages), 5
// four little-endian bytes. Fields are written in number order, zero scalars left out (proto3's
// canonical form; readers accept either).
class ProtoOut {
 public:
  void varint_field(int field, uint64_t v) {
    key(field, 0);
    raw_varint(v);
  }
  void fixed64_field(int field, uint64_t bits) {
    key(field, 1);
    raw_le(bits, 8);
  }
  void fixed32_field(int field, uint32_t bits) {
    key(field, 5);
    raw_le(bits, 4);
  }
  void bytes_field(int field, std::string_view b) {
    key(field, 2);
    raw_varint(b.size());
    out_.append(b);
  }
  void double_field(int field, double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    fixed64_field(field, bits);
  }
  void float_field(int field, float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    fixed32_field(field, bits);
  }
  std::string take() { return std::move(out_); }

 private:
  void key(int field, int wire_type) { raw_varint(uint64_t(field) << 3 | uint64_t(wire_type)); }
  void raw_varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(char(uint8_t(v) | 0x80));
      v >>= 7;
    }
    out_.push_back(char(v));
  }
  void raw_le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(char(uint8_t(v >> (8 * i))));
  }
  std::string out_;
};

// Field numbers of TensorBoard's event.proto and summary.proto.
enum EventField { kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 7 };
enum SummaryField { kSummaryValue = 1 };
enum ValueField { kValueTag = 1, kValueSimpleValue = 2 };
enum SessionLogField { kSessionStatus = 1 };
constexpr uint64_t kSessionStart = 1;  // SessionLog.SessionStatus.START

// An Event's header fields; the caller adds the one payload field (fields stay in number order).
ProtoOut event_head(double wall_time, int64_t step) {
  ProtoOut e;
  e.double_field(kWallTime, wall_time);
  if (step != 0) e.varint_field(kStep, uint64_t(step));  // int64: a negative step is ten bytes
  return e;
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf.data();
}

// A name TensorBoard reads in order: its readers sort a directory's files by name, so the Unix time
// is zero-padded, and a second file in the same second gets a suffix that sorts after the first.
std::string new_events_path(const std::string& dir) {
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string base = fmt::format("{}/events.out.tfevents.{:010d}.{}", dir, seconds, host_name());
  std::string path = base;
  std::error_code ec;  // an unreadable directory fails at create(), with a message naming the path
  for (int n = 1; std::filesystem::exists(path, ec); ++n) path = fmt::format("{}.{}", base, n);
  return path;
}

}  // namespace

uint32_t tfrecord_masked_crc(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  auto put_le = [&out](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(char(uint8_t(v >> (8 * i))));
  };
  put_le(data.size(), 8);
  put_le(tfrecord_masked_crc(out.data(), 8), 4);
  out.append(data);
  put_le(tfrecord_masked_crc(data.data(), data.size()), 4);
  return out;
}

std::string tensorboard_scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  ProtoOut v;
  v.bytes_field(kValueTag, tag);
  v.float_field(kValueSimpleValue, value);
  ProtoOut summary;
  summary.bytes_field(kSummaryValue, v.take());
  ProtoOut e = event_head(wall_time, step);
  e.bytes_field(kSummary, summary.take());
  return e.take();
}

std::string tensorboard_file_version_event(double wall_time) {
  ProtoOut e = event_head(wall_time, 0);
  e.bytes_field(kFileVersion, "brain.Event:2");
  return e.take();
}

std::string tensorboard_session_start_event(double wall_time, int64_t step) {
  ProtoOut log;
  log.varint_field(kSessionStatus, kSessionStart);
  ProtoOut e = event_head(wall_time, step);
  e.bytes_field(kSessionLog, log.take());
  return e.take();
}

double tensorboard_wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step, FileSystem& fs) {
  fs.make_dirs(dir);
  path_ = new_events_path(dir);
  file_ = fs.create(path_);
  const double now = tensorboard_wall_time();
  queued_ = tfrecord_frame(tensorboard_file_version_event(now)) +
            tfrecord_frame(tensorboard_session_start_event(now, first_step));
  file_->append(queued_.data(), queued_.size());  // throws here, before training, when it cannot
  queued_.clear();
}

TensorBoardWriter::~TensorBoardWriter() { flush(); }

void TensorBoardWriter::add_scalar(std::string_view tag, int64_t step, float value, double wall_time) {
  if (!file_) return;
  queued_ += tfrecord_frame(tensorboard_scalar_event(wall_time, step, tag, value));
}

void TensorBoardWriter::flush() {
  if (!file_ || queued_.empty()) return;
  try {
    file_->append(queued_.data(), queued_.size());
  } catch (const std::exception& e) {
    log_warn("TensorBoard output stops here (training goes on): {}", e.what());
    file_.reset();
  }
  queued_.clear();
}

void tensorboard_write_step(TensorBoardWriter& tb, const StepMetrics& m, const MemoryAccount& peak_memory) {
  const double t = tensorboard_wall_time();
  auto scalar = [&](std::string_view tag, double v) { tb.add_scalar(tag, m.step, float(v), t); };
  scalar("train/loss", m.loss);
  scalar("train/lr", m.lr);
  scalar("train/grad_norm", m.grad_norm);
  scalar("train/tokens_per_s", m.tokens_per_s);
  scalar("train/mfu", m.mfu);
  if (m.loss_scale > 0) scalar("train/loss_scale", m.loss_scale);  // fp16's loss scaling
  scalar("memory/parameters_bytes", double(peak_memory.parameters));
  scalar("memory/gradients_bytes", double(peak_memory.gradients));
  scalar("memory/optimizer_bytes", double(peak_memory.optimizer));
  scalar("memory/activations_bytes", double(peak_memory.activations));
  scalar("memory/communication_bytes", double(peak_memory.communication));
  scalar("memory/total_bytes", double(peak_memory.total()));
  const PhaseTimes& p = m.per_step;
  scalar("time/data_ms", 1e3 * p.data);
  scalar("time/forward_ms", 1e3 * p.forward);
  scalar("time/backward_ms", 1e3 * p.backward);
  scalar("time/grad_sync_ms", 1e3 * p.grad_sync);
  scalar("time/optimizer_ms", 1e3 * p.optimizer);
  scalar("time/checkpoint_ms", 1e3 * p.checkpoint);
  for (const MoeLayerStats& l : m.moe) {
    const std::string tag = fmt::format("moe/layer_{}/", l.layer);
    scalar(tag + "tokens_min", l.tokens_min());
    scalar(tag + "tokens_max", l.tokens_max());
    scalar(tag + "tokens_cv", l.tokens_cv());
    scalar(tag + "dropped", l.dropped);
    scalar(tag + "aux_loss", l.aux_loss);
    scalar(tag + "z_loss", l.z_loss);
  }
  tb.flush();
}

void tensorboard_write_eval(TensorBoardWriter& tb, const EvalMetrics& m) {
  const double t = tensorboard_wall_time();
  tb.add_scalar("val/loss", m.step, float(m.val_loss), t);
  tb.add_scalar("val/ppl", m.step, float(m.val_ppl), t);
  tb.flush();
}

}  // namespace llmtrain::trainer
