#include "trainer/loop/fault_injection.h"

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <set>
#include <string_view>
#include <thread>

#include "common/checkpoint_dir.h"
#include "common/error.h"
#include "common/strings.h"

namespace llmtrain::trainer {

Fault fault_from_env() {
  const char* v = std::getenv("LLMTRAIN_FAULT");
  if (!v || !*v) return {};
  // <kind>@<step>[:<rank>]
  const std::string_view s = v;
  const size_t at = s.find('@');
  const size_t colon = s.find(':', at == std::string_view::npos ? s.size() : at);
  const std::string_view kind = s.substr(0, at);
  const std::string_view step = at == std::string_view::npos ? "" : s.substr(at + 1, colon - at - 1);
  const std::string_view rank = colon == std::string_view::npos ? "" : s.substr(colon + 1);
  static const std::set<std::string_view> kinds = {"kill",
                                                   "segv",
                                                   "exit",
                                                   "throw",
                                                   "hang",
                                                   "slow",
                                                   "kill-in-save",
                                                   "term",
                                                   "term-in-save",
                                                   "full-disk-in-save",
                                                   "offload-io-error"};
  Fault f{std::string(kind), 0, -1};
  const bool ok =
      kinds.count(kind) && is_digits(step) &&
      std::from_chars(step.data(), step.data() + step.size(), f.step).ec == std::errc() &&
      (colon == std::string_view::npos ||
       (is_digits(rank) && std::from_chars(rank.data(), rank.data() + rank.size(), f.rank).ec == std::errc()));
  if (!ok)
    throw Error(fmt::format("LLMTRAIN_FAULT={}: expected <kind>@<step>[:<rank>]", v),
                "kinds: kill, segv, exit, throw, hang, slow, kill-in-save, term, term-in-save, full-disk-in-save, "
                "offload-io-error (a test hook; unset it for real runs)");
  return f;
}

namespace {

// Forwards to `base`; a file written inside `<dir>/step_<N>.partial/` is killed at its first sync
// (kill-in-save), or cannot be created: the disk is full (full-disk-in-save).
class SaveKiller final : public FileSystem {
  class File final : public WritableFile {
   public:
    File(std::unique_ptr<WritableFile> base, bool armed) : base_(std::move(base)), armed_(armed) {}
    void append(const void* data, size_t size) override { base_->append(data, size); }
    void sync() override {
      if (armed_) std::raise(SIGKILL);  // written, not yet on stable storage
      base_->sync();
    }
    void close() override { base_->close(); }
    const std::string& path() const override { return base_->path(); }

   private:
    std::unique_ptr<WritableFile> base_;
    bool armed_;
  };

 public:
  SaveKiller(FileSystem& base, std::string marker, bool full_disk)
      : base_(base), marker_(std::move(marker)), full_disk_(full_disk) {}
  std::unique_ptr<WritableFile> create(const std::string& path) override {
    const bool armed = path.find(marker_) != std::string::npos;
    if (armed && full_disk_) {
      FaultyFileSystem full(base_);  // the error a full disk gives, worded as the real one is
      full.fail_at(1, ENOSPC);
      return full.create(path);
    }
    return std::make_unique<File>(base_.create(path), armed);
  }
  void rename(const std::string& from, const std::string& to) override { base_.rename(from, to); }
  void exchange(const std::string& a, const std::string& b) override { base_.exchange(a, b); }
  void sync_dir(const std::string& dir) override { base_.sync_dir(dir); }
  void make_dirs(const std::string& dir) override { base_.make_dirs(dir); }
  void remove_all(const std::string& path) override { base_.remove_all(path); }

 private:
  FileSystem& base_;
  std::string marker_;
  bool full_disk_;
};

}  // namespace

std::unique_ptr<FileSystem> fault_file_system(const Fault& f, int rank, FileSystem& base) {
  if ((f.kind != "kill-in-save" && f.kind != "full-disk-in-save") || (f.rank >= 0 && f.rank != rank)) return nullptr;
  return std::make_unique<SaveKiller>(base, "/" + checkpoint_step_dir(f.step) + kPartialSuffix + "/",
                                      f.kind == "full-disk-in-save");
}

std::function<void(int64_t, const std::function<bool(double)>&)> fault_writer_hook(const Fault& f, int rank,
                                                                                   bool async) {
  if (f.kind != "term-in-save") return {};
  if (!async)
    throw Error(fmt::format("LLMTRAIN_FAULT={}@{}: term-in-save stops a background write, and checkpoint.async is "
                            "false",
                            f.kind, f.step),
                "set checkpoint.async: true (--set checkpoint.async=true), or use kill-in-save or term");
  if (f.rank >= 0 && f.rank != rank) return {};
  return [step = f.step](int64_t saving, const std::function<bool(double)>& wait_for_waiter) {
    if (saving != step) return;
    std::raise(SIGTERM);  // handled as a scheduler's would be: stop_requested(), on this thread
    // Held until the loop has agreed on the stop and waits for this write; a bound (not a timing)
    // only so that a broken loop fails the test instead of hanging it.
    if (!wait_for_waiter(600))
      throw environment_error(
          fmt::format("injected fault term-in-save@{}: the training loop did not wait for the "
                      "background write within 600 s",
                      step));
  };
}

double fault_slow_down(const Fault& f, int64_t step, int rank, double compute_s) {
  if (f.kind != "slow" || step < f.step || (f.rank >= 0 && f.rank != rank)) return 0;
  const double seconds = 9 * compute_s;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  return seconds;
}

bool fault_offload_io_error(const Fault& f, int64_t step, int rank) {
  return f.kind == "offload-io-error" && f.step == step && (f.rank < 0 || f.rank == rank);
}

void fault_maybe_fire(const Fault& f, int64_t step, int rank) {
  if (f.kind.empty() || f.step != step || (f.rank >= 0 && f.rank != rank)) return;
  if (f.kind == "kill") std::raise(SIGKILL);
  if (f.kind == "segv") std::raise(SIGSEGV);
  if (f.kind == "exit") std::exit(3);
  if (f.kind == "hang") std::raise(SIGSTOP);
  if (f.kind == "term") std::raise(SIGTERM);  // handled as a user's would be: stop_requested()
  if (f.kind == "throw") throw environment_error(fmt::format("injected fault (LLMTRAIN_FAULT) after step {}", step));
}

FaultInjector::FaultInjector(int rank, OffloadStore* offload)
    : fault_(fault_from_env()), rank_(rank), offload_(offload) {}

FileSystem& FaultInjector::file_system(FileSystem& base) {
  fs_ = fault_file_system(fault_, rank_, base);
  return fs_ ? *fs_ : base;
}

std::function<void(int64_t, const std::function<bool(double)>&)> FaultInjector::writer_hook(bool async) const {
  return fault_writer_hook(fault_, rank_, async);
}

void FaultInjector::step_done(int64_t step, StepOutcome& outcome) {
  outcome.times.forward += fault_slow_down(fault_, step, rank_, outcome.times.compute());
}

void FaultInjector::step_boundary(int64_t step) {
  fault_maybe_fire(fault_, step, rank_);
  if (fault_offload_io_error(fault_, step, rank_)) {
    if (!offload_) throw Error("LLMTRAIN_FAULT=offload-io-error without an offload file", "set parallel.offload: nvme");
    offload_->inject_write_error();
  }
}

}  // namespace llmtrain::trainer
