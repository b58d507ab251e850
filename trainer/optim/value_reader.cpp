// ValueReader (trainer/optim/value_reader.h).
#include "trainer/optim/value_reader.h"

#include <fmt/format.h>

#include <chrono>
#include <utility>

#include "common/error.h"
#include "kernels/ops.h"

namespace llmtrain::trainer {

using kernels::Tensor;

ValueReader::ValueReader(std::function<void(int64_t, Tensor)> read, int64_t chunk, double timeout_s)
    : read_(std::move(read)),
      host_(kernels::DType::fp32, {std::max<int64_t>(chunk, 1)}, kernels::Device::cpu, kernels::MemoryKind::other),
      timeout_s_(timeout_s) {
  thread_ = std::thread([this] { run(); });
}

ValueReader::~ValueReader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ValueReader::ahead(int unit, int64_t begin, int64_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_ || unit_ >= 0) return;
    unit_ = unit, begin_ = begin, n_ = n, busy_ = true;
  }
  cv_.notify_all();
}

void ValueReader::take(int unit, int64_t begin, Tensor out) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_idle(lock, unit);
  const bool ahead = unit_ == unit && begin_ == begin && n_ == out.numel();
  unit_ = -1;
  if (ahead) {
    kernels::copy(out, host_.tensor().flat(0, out.numel()));
    return;
  }
  lock.unlock();
  read_(begin, out);
}

void ValueReader::drop() {
  std::unique_lock<std::mutex> lock(mu_);
  wait_idle(lock, unit_);
  unit_ = -1;
}

void ValueReader::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return quit_ || busy_; });
    if (quit_) return;
    const int64_t begin = begin_, n = n_;
    lock.unlock();
    std::exception_ptr error;
    try {
      read_(begin, host_.tensor().flat(0, n));
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    busy_ = false;
    cv_.notify_all();
  }
}

void ValueReader::wait_idle(std::unique_lock<std::mutex>& lock, int unit) {
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] { return !busy_; }))
    throw environment_error(
        fmt::format("reading unit {}'s offloaded parameter values took longer than {} s (parallel.timeout)", unit,
                    timeout_s_),
        "the disk under parallel.offload_path stopped responding or is very slow: see the rank's log");
  if (error_) {
    unit_ = -1;
    std::rethrow_exception(std::exchange(error_, nullptr));
  }
}

}  // namespace llmtrain::trainer
