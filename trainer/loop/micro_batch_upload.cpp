#include "trainer/loop/micro_batch_upload.h"

#include <fmt/format.h>

#include <cstring>

#include "common/error.h"
#include "common/strings.h"
#include "parallel/comm/wait_poll.h"

namespace llmtrain::trainer {

using kernels::Tensor;

struct MicroBatchUpload::Slot {
  kernels::PinnedBuffer host;
  kernels::DeviceEvent copied;  // recorded behind the model's copies out of `host`
  bool in_flight = false;
};

MicroBatchUpload::MicroBatchUpload(kernels::Device device, int slots, double timeout_s)
    : device_(device), timeout_s_(timeout_s) {
  LT_CHECK(slots >= 1, "{} upload slots", slots);
  if (device_ == kernels::Device::cuda)
    for (int i = 0; i < slots; ++i) slots_.push_back(std::make_unique<Slot>());
}

MicroBatchUpload::~MicroBatchUpload() = default;

MicroBatch MicroBatchUpload::stage(const MicroBatch& mb) {
  if (device_ != kernels::Device::cuda) return mb;
  LT_CHECK(staged_ == nullptr, "a micro-batch staged twice without used()");
  Slot& slot = *slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  if (slot.in_flight && !slot.copied.done()) {
    const double waited = parallel::wait_poll(
        [&] { return slot.copied.done() ? parallel::Poll::done : parallel::Poll::pending; }, timeout_s_);
    if (waited < 0)
      throw environment_error(
          fmt::format("timed out after {} waiting for the device to copy a micro-batch's tokens",
                      format_duration(timeout_s_)),
          "the device did not finish the work queued before the copy within parallel.timeout: a kernel is stuck "
          "or the device failed (see `nvidia-smi`)");
  }
  slot.in_flight = false;
  const size_t bytes = (mb.tokens.defined() ? mb.tokens.bytes() : 0) + (mb.targets.defined() ? mb.targets.bytes() : 0);
  if (slot.host.bytes() < bytes) slot.host = kernels::PinnedBuffer(bytes);
  auto* base = static_cast<char*>(slot.host.tensor(kernels::DType::uint8, {int64_t(bytes)}).data);
  MicroBatch out;
  size_t at = 0;
  for (const auto& [from, to] : {std::pair{&mb.tokens, &out.tokens}, std::pair{&mb.targets, &out.targets}}) {
    if (!from->defined()) continue;
    LT_CHECK(from->device == kernels::Device::cpu, "a micro-batch staged from the device");
    std::memcpy(base + at, from->data, from->bytes());
    *to = Tensor(base + at, from->dtype, from->shape);
    at += from->bytes();
  }
  staged_ = &slot;
  return out;
}

void MicroBatchUpload::used() {
  if (device_ != kernels::Device::cuda) return;
  LT_CHECK(staged_ != nullptr, "used() without a staged micro-batch");
  staged_->copied.record_compute();
  staged_->in_flight = true;
  staged_ = nullptr;
}

}  // namespace llmtrain::trainer
