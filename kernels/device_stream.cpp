// DeviceStream, DeviceEvent and PinnedBuffer (kernels/device_stream.h): CUDA's, or an error in a
// build without the CUDA backend.
#include "kernels/device_stream.h"

#include <cstdio>
#include <utility>

#include "common/error.h"
#include "common/strings.h"

#if LLMTRAIN_CUDA_BACKEND
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/storage.h"
#include "kernels/cuda/stream.h"
#endif

namespace llmtrain::kernels {

#if LLMTRAIN_CUDA_BACKEND
struct ThreadComputeStream::Impl {
  cuda::Stream stream;
  cudaStream_t previous = nullptr;
};
struct DeviceStream::Impl {
  cuda::Stream stream;
};
struct DeviceEvent::Impl {
  cuda::Event event;
};
#else
struct ThreadComputeStream::Impl {};
struct DeviceStream::Impl {};
struct DeviceEvent::Impl {};
namespace {
[[noreturn]] void no_backend() {
  throw Error("not supported yet: device streams in this build (it has no CUDA backend)",
              "use train.device: cpu, or build with the CUDA backend");
}
}  // namespace
#endif

ThreadComputeStream::ThreadComputeStream(Device device) {
  if (device != Device::cuda) return;
#if LLMTRAIN_CUDA_BACKEND
  impl_ = std::make_unique<Impl>();
  impl_->previous = cuda::exchange_thread_compute_stream(impl_->stream.get());
#else
  no_backend();
#endif
}

ThreadComputeStream::~ThreadComputeStream() {
#if LLMTRAIN_CUDA_BACKEND
  if (impl_) cuda::exchange_thread_compute_stream(impl_->previous);
#endif
}

DeviceStream::DeviceStream() {
#if LLMTRAIN_CUDA_BACKEND
  impl_ = std::make_unique<Impl>();
#else
  no_backend();
#endif
}

DeviceStream::~DeviceStream() = default;

void DeviceStream::copy_async(Tensor out, Tensor in) {
  LT_CHECK(out.bytes() == in.bytes(), "device stream copy of {} bytes into {}", in.bytes(), out.bytes());
  LT_CHECK(out.device == Device::cuda || in.device == Device::cuda, "device stream copy between host tensors");
#if LLMTRAIN_CUDA_BACKEND
  if (out.bytes() == 0) return;
  cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
  if (out.device == Device::cpu) kind = cudaMemcpyDeviceToHost;
  if (in.device == Device::cpu) kind = cudaMemcpyHostToDevice;
  LT_CUDA(cudaMemcpyAsync(out.data, in.data, out.bytes(), kind, impl_->stream.get()));
#endif
}

DeviceEvent::DeviceEvent() {
#if LLMTRAIN_CUDA_BACKEND
  impl_ = std::make_unique<Impl>();
#else
  no_backend();
#endif
}

DeviceEvent::~DeviceEvent() = default;

#if LLMTRAIN_CUDA_BACKEND
void DeviceEvent::record_compute() { impl_->event.record(); }
void DeviceEvent::record(DeviceStream& stream) { impl_->event.record(stream.impl_->stream); }
void DeviceEvent::make_compute_wait() const { impl_->event.make_compute_wait(); }
void DeviceEvent::make_wait(DeviceStream& stream) const { impl_->event.wait_on(stream.impl_->stream); }
bool DeviceEvent::done() const { return impl_->event.done(); }
#else
void DeviceEvent::record_compute() {}
void DeviceEvent::record(DeviceStream&) {}
void DeviceEvent::make_compute_wait() const {}
void DeviceEvent::make_wait(DeviceStream&) const {}
bool DeviceEvent::done() const { return true; }
#endif

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
#if LLMTRAIN_CUDA_BACKEND
  const cudaError_t e = cudaMallocHost(&data_, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw environment_error(fmt::format("cannot allocate {} of pinned host memory (cudaMallocHost: {})",
                                        format_bytes(double(bytes)), cuda::cuda_error_text(e)),
                            "the host is short of page-locked memory: check `ulimit -l` and the node's free memory");
  }
#else
  no_backend();
#endif
}

PinnedBuffer::~PinnedBuffer() {
#if LLMTRAIN_CUDA_BACKEND
  if (data_ != nullptr && cudaFreeHost(data_) != cudaSuccess) std::fprintf(stderr, "warning: cudaFreeHost failed\n");
#endif
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    PinnedBuffer old(std::move(*this));
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

Tensor PinnedBuffer::tensor(DType dtype, Shape shape) const {
  Tensor t(data_, dtype, std::move(shape), Device::cpu);
  LT_CHECK(t.bytes() <= bytes_, "a pinned view of {} bytes in {}", t.bytes(), bytes_);
  return t;
}

}  // namespace llmtrain::kernels
