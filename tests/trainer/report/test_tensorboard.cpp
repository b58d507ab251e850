// TensorBoard event files (trainer/report/tensorboard.h): our encoding against bytes derived by hand from
// the TFRecord and protobuf specs, and our files read by the `tensorboard` package's own loaders
// (tests/trainer/report/tensorboard_oracle.py, run with .venv/bin/python): tags, steps, values, a resumed
// run's second file, what a killed run leaves; and a failing disk that must not stop training.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_io.h"
#include "trainer/report/tensorboard.h"

namespace llmtrain::trainer {
namespace {

namespace fs = std::filesystem;

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(char(x));
  return s;
}

TEST(TensorBoardEncoding, ScalarEventIsTheWireFormat) {
  // Event{wall_time: 1.5, step: 300, summary: {value: [{tag: "train/loss", simple_value: 2.0}]}}
  const std::string expected =
      // field 1 (wall_time), wire type 1 (fixed64): key 1<<3|1 = 0x09; 1.5 = 0x3FF8000000000000, little-endian
      bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f}) +
      // field 2 (step), wire type 0 (varint): key 0x10; 300 = 0b10_0101100 -> 0xAC (low 7 bits | more), 0x02
      bytes({0x10, 0xac, 0x02}) +
      // field 5 (summary), wire type 2: key 5<<3|2 = 0x2A, length 19 (the Summary below)
      bytes({0x2a, 19}) +
      // Summary field 1 (value), wire type 2: key 0x0A, length 17 (the Value below)
      bytes({0x0a, 17}) +
      // Value field 1 (tag), wire type 2: key 0x0A, length 10, "train/loss"
      bytes({0x0a, 10}) + "train/loss" +
      // Value field 2 (simple_value), wire type 5 (fixed32): key 2<<3|5 = 0x15; 2.0f = 0x40000000
      bytes({0x15, 0, 0, 0, 0x40});
  EXPECT_EQ(tensorboard_scalar_event(1.5, 300, "train/loss", 2.0f), expected);
}

TEST(TensorBoardEncoding, FileVersionAndSessionStartEvents) {
  // Event{wall_time: 1.5, file_version: "brain.Event:2"}: step 0 is left out (proto3's default);
  // field 3, wire type 2: key 0x1A, length 13.
  EXPECT_EQ(tensorboard_file_version_event(1.5),
            bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x1a, 13}) + "brain.Event:2");
  // Event{wall_time: 1.5, step: 5, session_log: {status: START = 1}}: field 7, wire type 2: key 0x3A,
  // length 2; SessionLog field 1, varint: key 0x08, value 1.
  EXPECT_EQ(tensorboard_session_start_event(1.5, 5),
            bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10, 5, 0x3a, 2, 0x08, 1}));
}

TEST(TensorBoardEncoding, MaskedCrcOfTheCheckString) {
  // CRC-32C("123456789") is 0xE3069283 (the published check value). Rotated right by 15 bits:
  // 0xE3069283 >> 15 = 0x0001C60D, 0xE3069283 << 17 = 0x25060000 (mod 2^32), together 0x2507C60D;
  // plus 0xA282EAD8 = 0xC78AB0E5 (mod 2^32).
  EXPECT_EQ(tfrecord_masked_crc("123456789", 9), 0xC78AB0E5u);
}

TEST(TensorBoardEncoding, RecordFraming) {
  const std::string r = tfrecord_frame("abc");
  ASSERT_EQ(r.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(r.substr(0, 8), bytes({3, 0, 0, 0, 0, 0, 0, 0}));  // uint64 length, little-endian
  // The masked CRCs of the 8 length bytes and of "abc", as tensorboard's own masked_crc32c computes
  // them (tensorboard.compat.tensorflow_stub.pywrap_tensorflow), little-endian.
  EXPECT_EQ(r.substr(8, 4), bytes({0xb0, 0x99, 0x49, 0x0e}));  // 0x0E4999B0
  EXPECT_EQ(r.substr(12, 3), "abc");
  EXPECT_EQ(r.substr(15, 4), bytes({0x6e, 0x57, 0xf1, 0x21}));  // 0x21F1576E
}

class TensorBoardFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("llmtrain-tb-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string tb_dir() const { return (dir_ / "tensorboard").string(); }
  // What TensorBoard must show, one "tag step value" line each, for the oracle.
  void expect(const std::string& tag, int64_t step, float value) {
    expected_ += fmt::format("{} {} {}\n", tag, step, value);
  }
  // Runs the oracle on tb_dir(): every file's records and CRCs, then the scalars TensorBoard shows.
  void check_with_tensorboard(int files) {
    const std::string expected = (dir_ / "expected.txt").string();
    std::ofstream(expected) << expected_;
    const std::string cmd =
        fmt::format("{0}/.venv/bin/python {0}/tests/trainer/report/tensorboard_oracle.py check {1} {2} {3}",
                    LLMTRAIN_SOURCE_DIR, tb_dir(), expected, files);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n(the oracle's output is above; it needs the tensorboard "
                                           << "package in .venv: scripts/setup.sh installs it)";
  }

  fs::path dir_;
  std::string expected_;
};

TEST_F(TensorBoardFile, TensorBoardReadsOurFile) {
  TensorBoardWriter tb(tb_dir(), 1);
  EXPECT_EQ(fs::path(tb.path()).parent_path(), fs::path(tb_dir()));
  EXPECT_EQ(fs::path(tb.path()).filename().string().rfind("events.out.tfevents.", 0), 0u) << tb.path();

  const double t0 = tensorboard_wall_time();
  for (int64_t step = 1; step <= 3; ++step) {
    StepMetrics m;
    m.step = step * 10;
    m.loss = 5.0 / double(step) + 1e-9;  // not a float: written rounded to one
    m.lr = 3e-4 * double(step);
    m.grad_norm = 0.25 * double(step);
    m.tokens_per_s = 12345.678;
    m.mfu = 0.4321;
    m.per_step = {0.001, 0.02 * double(step), 0.04, 0.003, 0.002, 0.0};
    MemoryAccount mem;
    mem.parameters = 4'456'448;
    mem.gradients = 4'456'448;
    mem.optimizer = 8'912'896;
    mem.activations = 12'582'912 + step;
    mem.communication = 0;
    tensorboard_write_step(tb, m, mem);
    expect("train/loss", m.step, float(m.loss));
    expect("train/lr", m.step, float(m.lr));
    expect("train/grad_norm", m.step, float(m.grad_norm));
    expect("train/tokens_per_s", m.step, float(m.tokens_per_s));
    expect("train/mfu", m.step, float(m.mfu));
    expect("memory/parameters_bytes", m.step, float(mem.parameters));
    expect("memory/gradients_bytes", m.step, float(mem.gradients));
    expect("memory/optimizer_bytes", m.step, float(mem.optimizer));
    expect("memory/activations_bytes", m.step, float(mem.activations));
    expect("memory/communication_bytes", m.step, float(mem.communication));
    expect("memory/total_bytes", m.step, float(mem.total()));
    expect("time/data_ms", m.step, float(1e3 * m.per_step.data));
    expect("time/forward_ms", m.step, float(1e3 * m.per_step.forward));
    expect("time/backward_ms", m.step, float(1e3 * m.per_step.backward));
    expect("time/grad_sync_ms", m.step, float(1e3 * m.per_step.grad_sync));
    expect("time/optimizer_ms", m.step, float(1e3 * m.per_step.optimizer));
    expect("time/checkpoint_ms", m.step, float(1e3 * m.per_step.checkpoint));
  }
  tensorboard_write_eval(tb, EvalMetrics{30, 2.5, 12.182493960703473, 0});
  expect("val/loss", 30, 2.5f);
  expect("val/ppl", 30, 12.182494f);
  // A step number past 2^32 and a negative value survive the varint and the float.
  tb.add_scalar("custom/big_step", int64_t(1) << 40, -7.25f, t0);
  tb.flush();
  expect("custom/big_step", int64_t(1) << 40, -7.25f);
  EXPECT_TRUE(tb.ok());
  // The writer is still open: what a killed run leaves is what was flushed.
  check_with_tensorboard(1);
}

TEST_F(TensorBoardFile, ResumedRunAddsAFileAndReplacesLaterSteps) {
  {
    // A run that logged steps 1..5, then was killed after its checkpoint at step 3.
    TensorBoardWriter first(tb_dir(), 1);
    for (int64_t s = 1; s <= 5; ++s) first.add_scalar("train/loss", s, 10.0f + float(s), tensorboard_wall_time());
    first.add_scalar("val/loss", 5, 9.0f, tensorboard_wall_time());
    first.flush();
  }
  // Its resume from step 3 writes steps 4..6 with other values into a second file.
  TensorBoardWriter second(tb_dir(), 4);
  for (int64_t s = 4; s <= 6; ++s) second.add_scalar("train/loss", s, 20.0f + float(s), tensorboard_wall_time());
  second.flush();
  for (int64_t s = 1; s <= 3; ++s) expect("train/loss", s, 10.0f + float(s));
  for (int64_t s = 4; s <= 6; ++s) expect("train/loss", s, 20.0f + float(s));
  // val/loss at step 5 came after the checkpoint: TensorBoard drops it with the other orphaned points.
  check_with_tensorboard(2);
}

TEST_F(TensorBoardFile, WriteFailureWarnsOnceAndTrainingGoesOn) {
  FaultyFileSystem faulty(default_file_system());
  // Operations 1-3 open the file (make_dirs, create, the opening events); 4 writes the first batch,
  // 5 (the second batch) fails with a full disk.
  faulty.fail_at(5, ENOSPC);
  TensorBoardWriter tb(tb_dir(), 1, faulty);
  tb.add_scalar("train/loss", 1, 3.0f, tensorboard_wall_time());
  tb.flush();
  expect("train/loss", 1, 3.0f);
  EXPECT_TRUE(tb.ok());

  testing::internal::CaptureStderr();
  for (int64_t s = 2; s <= 4; ++s) {
    tb.add_scalar("train/loss", s, 3.0f, tensorboard_wall_time());
    EXPECT_NO_THROW(tb.flush());
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(faulty.failed());
  EXPECT_FALSE(tb.ok());
  size_t warnings = 0;
  for (size_t at = err.find("TensorBoard output stops"); at != std::string::npos;
       at = err.find("TensorBoard output stops", at + 1))
    ++warnings;
  EXPECT_EQ(warnings, 1u) << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_NE(err.find(tb.path()), std::string::npos) << "the warning names the file: " << err;
  // What was written before the failure is still a good file.
  check_with_tensorboard(1);
}

TEST_F(TensorBoardFile, UnwritableDirectoryIsAnErrorNamingIt) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "tensorboard") << "a file where the directory should be";
  try {
    TensorBoardWriter tb(tb_dir(), 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(tb_dir()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace llmtrain::trainer
