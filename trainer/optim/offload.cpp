#include "trainer/optim/offload.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/strings.h"
#include "kernels/buffer.h"
#include "kernels/device_stream.h"
#include "kernels/ops.h"

namespace llmtrain::trainer {

namespace fs = std::filesystem;
using kernels::Device;
using kernels::DType;
using kernels::Tensor;

namespace {

constexpr int64_t kAlignElems = 1024;  // 4 KiB of fp32: direct I/O's alignment
constexpr int64_t kMaxUnit = int64_t(1) << 22;
constexpr int kSlots = 3;  // the unit being updated, the one read ahead, the one being written

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

}  // namespace

int64_t offload_unit(int64_t numel) {
  return std::clamp(round_up(std::max<int64_t>(numel, 1) / 8 + 1, kAlignElems), kAlignElems, kMaxUnit);
}

OffloadBytes offload_bytes(OffloadKind kind, Device device, int arrays, int64_t numel) {
  if (kind == OffloadKind::none) return {};
  const int64_t unit = offload_unit(numel), units = (numel + unit - 1) / unit;
  const int64_t slot = int64_t(arrays) * unit * int64_t(sizeof(float));
  OffloadBytes b;
  b.store = units * slot;
  if (kind == OffloadKind::nvme) b.host_slots = kSlots * (slot + (device == Device::cpu ? 4096 : 0));
  if (device == Device::cuda) b.device_slots = slot;
  return b;
}

namespace offload_detail {

// Host memory for a staging slot, aligned for direct I/O: page-locked on cuda ranks (copies to and
// from the device), else a counted host Buffer with room to align its start.
class HostSlot {
 public:
  HostSlot(Device device, int64_t floats, kernels::MemoryKind kind = kernels::MemoryKind::optimizer) {
    if (device == Device::cuda) {
      pinned_ = kernels::PinnedBuffer(size_t(floats) * sizeof(float));
      tensor_ = pinned_.tensor(DType::fp32, {floats});
    } else {
      plain_ = kernels::Buffer(DType::fp32, {floats + kAlignElems}, Device::cpu, kind);
      const auto at = reinterpret_cast<uintptr_t>(plain_.data());
      const int64_t skip = int64_t((round_up(int64_t(at), 4096) - int64_t(at)) / sizeof(float));
      tensor_ = plain_.tensor().flat(skip, floats);
    }
  }
  Tensor tensor() const { return tensor_; }

 private:
  kernels::PinnedBuffer pinned_;
  kernels::Buffer plain_;
  Tensor tensor_;
};

}  // namespace offload_detail

using offload_detail::HostSlot;

struct OffloadStore::Impl {
  OffloadKind kind;
  Device device;
  double timeout_s;
  int arrays = 0;
  int64_t numel = 0, unit = 0;
  int64_t slot_floats = 0;  // arrays · unit
  std::string path;

  // host: the whole state, page-locked.
  kernels::PinnedBuffer whole;
  // cuda ranks: the unit being updated, on the device.
  kernels::Buffer device_slot;
  // nvme: the file, its slots, and the I/O thread's queue.
  int fd = -1;
  bool direct = false;
  std::vector<HostSlot> slots;
  struct Job {
    bool write = false;
    int64_t unit = 0;
    int slot = 0;
  };
  std::mutex mu;
  std::condition_variable wake, finished;
  std::deque<Job> queue;
  int64_t posted = 0, done = 0;
  std::string error;          // the first I/O failure
  OffloadStore::Stats stats;  // under mu
  bool stop = false;
  std::atomic<bool> fail_next_write{false};
  std::thread io;
  // nvme's random access (checkpoints): an aligned span of one array, kept between calls (a save
  // streams a slice in many small pieces), outside the memory account's kinds.
  std::unique_ptr<HostSlot> scratch;
  int64_t scratch_floats = 0;
  std::mutex scratch_mu;  // move() from two threads (a checkpoint's, stage 3's read ahead) takes turns

  ~Impl() {
    if (io.joinable()) {
      {
        std::lock_guard lock(mu);
        stop = true;
      }
      wake.notify_all();
      io.join();
    }
    if (fd >= 0) ::close(fd);
  }

  // `bytes` at `offset` of the file, to or from `data`; "" or what failed (`what` names the part).
  std::string transfer_bytes(bool write, off_t offset, size_t bytes, void* data, const std::string& what) {
    size_t moved = 0;
    while (moved < bytes) {
      ssize_t n;
      if (write && fail_next_write.exchange(false)) {
        n = -1;
        errno = EIO;
      } else {
        char* p = static_cast<char*>(data) + moved;
        n = write ? ::pwrite(fd, p, bytes - moved, offset + off_t(moved))
                  : ::pread(fd, p, bytes - moved, offset + off_t(moved));
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL && direct) {
        // The file system takes O_DIRECT at open but not these alignments: buffered I/O instead.
        direct = false;
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT);
        continue;
      }
      if (n <= 0)
        return fmt::format("{} {} ({} bytes at offset {}) failed: {}", write ? "writing" : "reading", what, bytes,
                           int64_t(offset), n == 0 ? "unexpected end of file" : std::strerror(errno));
      moved += size_t(n);
    }
    return "";
  }

  // One unit's whole state at its place in the file.
  std::string transfer(bool write, int64_t u, void* data) {
    const size_t bytes = size_t(slot_floats) * sizeof(float);
    return transfer_bytes(write, off_t(u) * off_t(bytes), bytes, data, fmt::format("unit {}", u));
  }

  void run() {
    std::unique_lock lock(mu);
    for (;;) {
      wake.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;
      const Job job = queue.front();
      queue.pop_front();
      if (error.empty()) {
        lock.unlock();
        const auto t0 = std::chrono::steady_clock::now();
        const std::string failed = transfer(job.write, job.unit, slots[size_t(job.slot)].tensor().data);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        lock.lock();
        if (!failed.empty() && error.empty()) error = failed;
        stats.io_s += seconds;
        (job.write ? stats.written_bytes : stats.read_bytes) += slot_floats * int64_t(sizeof(float));
      }
      ++done;
      finished.notify_all();
    }
  }

  int64_t post(bool write, int64_t unit, int slot) {
    int64_t seq;
    {
      std::lock_guard lock(mu);
      queue.push_back({write, unit, slot});
      seq = ++posted;
    }
    wake.notify_one();
    return seq;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw environment_error(
        fmt::format("parallel.offload nvme: the optimizer state file {}: {}", path, what),
        "check the disk under parallel.offload_path (dmesg for I/O errors, df for space); the last checkpoint "
        "is intact: resume from it");
  }

  // Elements [begin, begin + host.numel()) of array a to (store) or from the host tensor. In the
  // file, each unit's part of the array is contiguous: only that part is read (rounded out to 4 KiB
  // for direct I/O) and, to store, written back.
  void move(bool store, int a, int64_t begin, Tensor host) {
    const int64_t n = host.numel(), units = (numel + unit - 1) / unit;
    LT_CHECK(a >= 0 && a < arrays && begin >= 0 && begin + n <= numel && host.device == Device::cpu &&
                 host.dtype == DType::fp32,
             "offload access to array {} [{}, +{}) of {}", a, begin, n, numel);
    for (int64_t at = begin; at < begin + n;) {
      const int64_t u = at / unit, in_unit = at - u * unit, count = std::min(unit - in_unit, begin + n - at);
      const int64_t first = (u * arrays + a) * unit + in_unit;  // the element's place in the store
      float* mine = host.ptr<float>() + (at - begin);
      if (kind == OffloadKind::host) {
        float* theirs = whole.tensor(DType::fp32, {units * slot_floats}).ptr<float>() + first;
        std::memcpy(store ? theirs : mine, store ? mine : theirs, size_t(count) * sizeof(float));
        at += count;
        continue;
      }
      const int64_t span_first = first / kAlignElems * kAlignElems;
      const int64_t span_end = round_up(first + count, kAlignElems);
      std::lock_guard scratch_lock(scratch_mu);
      if (span_end - span_first > scratch_floats) {
        scratch_floats = span_end - span_first;
        scratch = std::make_unique<HostSlot>(Device::cpu, scratch_floats, kernels::MemoryKind::other);
      }
      const off_t offset = off_t(span_first) * off_t(sizeof(float));
      const size_t bytes = size_t(span_end - span_first) * sizeof(float);
      const std::string what = fmt::format("unit {}", u);
      float* span = scratch->tensor().ptr<float>();
      check(transfer_bytes(false, offset, bytes, span, what));
      float* theirs = span + (first - span_first);
      std::memcpy(store ? theirs : mine, store ? mine : theirs, size_t(count) * sizeof(float));
      if (store) check(transfer_bytes(true, offset, bytes, span, what));
      at += count;
    }
  }
  void check(const std::string& failed) const {
    if (!failed.empty()) fail(failed);
  }

  // Until the job numbered `seq` (post's return) is done.
  void wait(int64_t seq, const char* what, int64_t unit) {
    std::unique_lock lock(mu);
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = finished.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                      [&] { return done >= seq || !error.empty(); });
    stats.waited_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!error.empty()) fail(error);
    if (!ok) fail(fmt::format("{} unit {} has not finished after {} (parallel.timeout)", what, unit, timeout_s));
  }
};

OffloadStore::OffloadStore(const OffloadConfig& config, int arrays, int64_t numel)
    : impl_(std::make_unique<Impl>()),
      arrays_(arrays),
      numel_(numel),
      unit_(offload_unit(numel)),
      units_((numel + unit_ - 1) / unit_) {
  LT_CHECK(config.kind != OffloadKind::none && arrays >= 1 && numel >= 0, "offload store of {} arrays of {}", arrays,
           numel);
  LT_CHECK(config.kind != OffloadKind::host || config.device == Device::cuda, "host offload on a cpu rank");
  Impl& m = *impl_;
  m.kind = config.kind;
  m.device = config.device;
  m.timeout_s = config.timeout_s;
  m.arrays = arrays;
  m.numel = numel;
  m.unit = unit_;
  m.slot_floats = int64_t(arrays) * unit_;
  const int64_t store_bytes = units_ * m.slot_floats * int64_t(sizeof(float));
  if (config.device == Device::cuda)
    m.device_slot = kernels::Buffer(DType::fp32, {m.slot_floats}, config.device, kernels::MemoryKind::optimizer);
  if (config.kind == OffloadKind::host) {
    where_ = "page-locked host memory";
    m.whole = kernels::PinnedBuffer(size_t(std::max<int64_t>(store_bytes, 4)));
    std::memset(m.whole.tensor(DType::uint8, {store_bytes}).data, 0, size_t(store_bytes));
    return;
  }
  std::error_code ec;
  fs::create_directories(config.dir, ec);
  if (ec)
    throw Error(fmt::format("parallel.offload_path {}: cannot make the directory: {}", config.dir, ec.message()),
                "set offload_path to a writable directory on a local disk");
  const std::string name = fmt::format("llmtrain-offload-rank{}-pid{}.state", config.rank, ::getpid());
  // Unnamed where the file system allows it (O_TMPFILE: no name to plant a link at or to delete);
  // else created under a fresh name (never through an existing one or a link) and unlinked at once.
  // Direct I/O where the file system takes it.
  for (const int direct : {O_DIRECT, 0}) {
    m.fd = ::open(config.dir.c_str(), O_RDWR | O_TMPFILE | O_CLOEXEC | direct, 0600);
    m.direct = direct != 0;
    if (m.fd >= 0) break;
  }
  if (m.fd >= 0) {
    m.path = (fs::path(config.dir) / name).string() + " (unnamed, O_TMPFILE)";
  } else {
    m.path = (fs::path(config.dir) / name).string();
    const int flags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    m.fd = ::open(m.path.c_str(), flags | O_DIRECT, 0600);
    m.direct = m.fd >= 0;
    if (m.fd < 0 && errno == EINVAL) m.fd = ::open(m.path.c_str(), flags, 0600);  // no direct I/O there
    if (m.fd < 0)
      throw Error(
          fmt::format("parallel.offload_path {}: cannot create {}: {}", config.dir, m.path, std::strerror(errno)),
          "set offload_path to a writable directory on a local disk (a file of that name must not exist)");
    ::unlink(m.path.c_str());  // scratch: it goes with the process
  }
  where_ = m.path;
  if (store_bytes > 0) {
    struct statvfs st {};
    const int64_t free_bytes = ::fstatvfs(m.fd, &st) == 0 ? int64_t(st.f_bavail) * int64_t(st.f_frsize) : int64_t(-1);
    int rc = ::posix_fallocate(m.fd, 0, off_t(store_bytes));
    if (rc == EOPNOTSUPP || rc == EINVAL) {
      // No reservation on this file system: a sparse file, with the free space checked instead.
      rc = free_bytes >= 0 && free_bytes < store_bytes  ? ENOSPC
           : ::ftruncate(m.fd, off_t(store_bytes)) == 0 ? 0
                                                        : errno;
    }
    if (rc != 0) {
      throw Error(fmt::format("parallel.offload_path {}: rank {}'s optimizer state needs {} there, {}: {}", config.dir,
                              config.rank, format_bytes(double(store_bytes)),
                              free_bytes >= 0 ? "the file system has " + format_bytes(double(free_bytes)) + " free"
                                              : std::string("its free space is unknown"),
                              std::strerror(rc)),
                  "free space there, point offload_path at a larger disk, or shard the state over more ranks "
                  "(parallel.zero)");
    }
  }
  for (int i = 0; i < kSlots; ++i) m.slots.emplace_back(config.device, m.slot_floats);
  m.io = std::thread([&m] { m.run(); });
}

OffloadStore::~OffloadStore() = default;

std::vector<Tensor> OffloadStore::host_unit(int64_t u) const {
  const Impl& m = *impl_;
  LT_CHECK(m.kind == OffloadKind::host && u >= 0 && u < units_, "host_unit {} of {} ({})", u, units_, where_);
  const Tensor whole = m.whole.tensor(DType::fp32, {units_ * m.slot_floats});
  const int64_t count = std::min(unit_, numel_ - u * unit_);
  std::vector<Tensor> out;
  for (int a = 0; a < arrays_; ++a) out.push_back(whole.flat(u * m.slot_floats + int64_t(a) * unit_, count));
  return out;
}

OffloadStore::Stats OffloadStore::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

void OffloadStore::inject_write_error() { impl_->fail_next_write = true; }

void OffloadStore::for_each_unit(const UnitFn& fn, bool write_back) {
  Impl& m = *impl_;
  std::vector<Tensor> state(static_cast<size_t>(arrays_));
  // The unit's arrays inside a slot (host or device).
  auto bind = [&](Tensor slot, int64_t count) {
    for (int a = 0; a < arrays_; ++a) state[size_t(a)] = slot.flat(int64_t(a) * unit_, count);
  };
  if (m.kind == OffloadKind::host) {
    const Tensor whole = m.whole.tensor(DType::fp32, {units_ * m.slot_floats});
    for (int64_t u = 0; u < units_; ++u) {
      const int64_t begin = u * unit_, count = std::min(unit_, numel_ - begin);
      const Tensor host = whole.flat(u * m.slot_floats, m.slot_floats);
      kernels::copy(m.device_slot.tensor(), host);
      bind(m.device_slot.tensor(), count);
      fn(u, begin, count, state);
      if (write_back) kernels::copy(host, m.device_slot.tensor());
    }
    // Copies between page-locked memory and the device run behind the host: the state is the host's
    // to read (checkpoints, the gathers of offloaded parameters) once they are done.
    if (write_back) kernels::synchronize(m.device);
    return;
  }
  std::vector<int64_t> read_seq(size_t(units_), 0);
  int64_t last_write = 0;
  for (int64_t u = 0; u < std::min<int64_t>(units_, 2); ++u) read_seq[size_t(u)] = m.post(false, u, int(u % kSlots));
  for (int64_t u = 0; u < units_; ++u) {
    const int slot = int(u % kSlots);
    m.wait(read_seq[size_t(u)], "reading", u);
    const int64_t begin = u * unit_, count = std::min(unit_, numel_ - begin);
    const Tensor host = m.slots[size_t(slot)].tensor();
    if (m.device == Device::cuda) {
      kernels::copy(m.device_slot.tensor(), host);
      bind(m.device_slot.tensor(), count);
    } else {
      bind(host, count);
    }
    fn(u, begin, count, state);
    if (write_back) {
      if (m.device == Device::cuda) {
        kernels::copy(host, m.device_slot.tensor());
        kernels::synchronize(m.device);  // the copy into page-locked memory is done before the write
      }
      last_write = m.post(true, u, slot);
    }
    // Unit u+2 goes into the slot of unit u-1, whose write (if any) was queued before it.
    if (u + 2 < units_) read_seq[size_t(u + 2)] = m.post(false, u + 2, int((u + 2) % kSlots));
  }
  if (last_write > 0) m.wait(last_write, "writing", units_ - 1);
}

void OffloadStore::read(int a, int64_t begin, Tensor host) const { impl_->move(false, a, begin, host); }

void OffloadStore::write(int a, int64_t begin, Tensor host) { impl_->move(true, a, begin, host); }

}  // namespace llmtrain::trainer
