#include "trainer/checkpoint/async_checkpoint.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <thread>

#include "common/checkpoint_dir.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/strings.h"
#include "kernels/ops.h"

namespace llmtrain::trainer {
namespace fs = std::filesystem;

// One save in flight: what the writer thread reads (the snapshot, the metadata) and what it hands
// back. Shared between the training thread and the writer, so that neither outlives the other's view.
struct AsyncCheckpointWriter::Job {
  CheckpointMeta meta;
  std::string partial;
  std::vector<CheckpointSlice> slices;  // host views of `buffers`
  std::vector<kernels::Buffer> buffers;
  double held_s = 0;
  std::thread thread;

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;    // the writer finished (result and write_s are set)
  bool waited = false;  // the training thread waits for it (finish())
  ShardWrite result;
  double write_s = 0;
};

namespace {

constexpr int kWriterNice = 10;

// The writer thread's body: never throws (checkpoint_save_write captures every failure, the hook's
// included), never logs, never communicates.
template <typename Job>
void write_job(Job& job, const AsyncCheckpointWriter::WriterHook& hook, FileSystem& fsys, int rank,
               bool own_thread) noexcept {
  const double t0 = now_s();
  // Behind training: the writer's CPU work (checksums, copies into the page cache) yields to the
  // step's threads where the cores are all busy. On Linux a thread's nice value is its own (and
  // the training thread's, when it writes for want of a thread, stays as it is).
  if (own_thread) (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kWriterNice);
  std::function<void()> before;
  if (hook)
    before = [&] {
      hook(job.meta.step, [&job](double seconds) {
        std::unique_lock<std::mutex> lock(job.mu);
        return job.cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return job.waited; });
      });
    };
  ShardWrite result = checkpoint_save_write(fsys, job.partial, job.meta, job.slices, rank, before);
  {
    std::lock_guard<std::mutex> lock(job.mu);
    job.result = std::move(result);
    job.write_s = now_s() - t0;
    job.done = true;
  }
  job.cv.notify_all();
}

}  // namespace

AsyncCheckpointWriter::AsyncCheckpointWriter(FileSystem& fs, std::string dir, int keep, parallel::Comm& world,
                                             double timeout_s)
    : fs_(fs), dir_(std::move(dir)), keep_(keep), world_(world), timeout_s_(timeout_s) {}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  if (!job_) return;
  bool done;
  {
    std::unique_lock<std::mutex> lock(job_->mu);
    done = job_->cv.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] { return job_->done; });
  }
  if (!job_->thread.joinable()) return;  // written on the training thread, or joined by a commit that threw
  if (done)
    job_->thread.join();
  else
    job_->thread.detach();  // it holds the job (and so the snapshot) itself
}

int64_t AsyncCheckpointWriter::snapshot_bytes_of(const std::vector<CheckpointSlice>& slices) {
  int64_t bytes = 0;
  for (const CheckpointSlice& s : slices)
    if (s.write) bytes += s.slice.numel() * int64_t(sizeof(float));
  return bytes;
}

void AsyncCheckpointWriter::reserve(const std::vector<CheckpointSlice>& slices) {
  LT_CHECK(!job_, "the snapshot is reserved while step {} is in flight", job_->meta.step);
  spare_.clear();
  for (const CheckpointSlice& s : slices)
    if (s.write) spare_.emplace_back(s.data.dtype, s.data.shape, kernels::Device::cpu, kernels::MemoryKind::other);
  snapshot_bytes_ = snapshot_bytes_of(slices);
}

int64_t AsyncCheckpointWriter::in_flight_step() const { return job_ ? job_->meta.step : -1; }

AsyncSaveResult AsyncCheckpointWriter::start(const CheckpointMeta& meta, const std::vector<CheckpointSlice>& live) {
  LT_CHECK(!job_, "checkpoint step {} started while step {} is in flight", meta.step, job_->meta.step);
  const double t0 = now_s();
  AsyncSaveResult out;
  out.step = meta.step;
  auto job = std::make_shared<Job>();
  job->meta = meta;
  try {
    job->partial = checkpoint_save_prepare(fs_, dir_, meta.step, world_);
  } catch (const Error& e) {
    out.error = fmt::format("checkpoint {} was not started: {}",
                            (fs::path(dir_) / checkpoint_step_dir(meta.step)).string() + kPartialSuffix, e.what());
    out.held_s = now_s() - t0;
    return out;
  }
  // The snapshot: the slices this rank writes, copied to host memory (from a device through
  // kernels::copy). The buffers of the previous save are reused; their sizes do not change
  // within a run.
  size_t next = 0;
  for (const CheckpointSlice& s : live) {
    if (!s.write) continue;
    kernels::Buffer buffer;
    if (next < spare_.size() && spare_[next].numel() == s.data.numel() && spare_[next].dtype() == s.data.dtype)
      buffer = std::move(spare_[next]);
    else
      buffer = kernels::Buffer(s.data.dtype, s.data.shape, kernels::Device::cpu, kernels::MemoryKind::other);
    ++next;
    kernels::Tensor host = buffer.tensor();
    host.shape = s.data.shape;
    slice_to_host(s, host);
    CheckpointSlice copy = s;
    copy.data = host;
    copy.fetch = copy.store = nullptr;
    job->slices.push_back(std::move(copy));
    job->buffers.push_back(std::move(buffer));
  }
  spare_.clear();
  snapshot_bytes_ = snapshot_bytes_of(job->slices);
  job->held_s = now_s() - t0;
  out.held_s = job->held_s;
  try {
    job->thread = std::thread(
        [job, hook = hook_, &fsys = fs_, rank = world_.rank()] { write_job(*job, hook, fsys, rank, true); });
  } catch (const std::system_error&) {
    // No thread to be had: write on this one (the commit's agreement is the same).
    write_job(*job, hook_, fs_, world_.rank(), false);
  }
  job_ = std::move(job);
  return out;
}

std::optional<AsyncSaveResult> AsyncCheckpointWriter::poll() {
  if (!job_) return std::nullopt;
  int32_t writing;  // a max over the world: 0 when every writer is done
  {
    std::lock_guard<std::mutex> lock(job_->mu);
    writing = job_->done ? 0 : 1;
  }
  world_.all_reduce(kernels::Tensor(&writing, kernels::DType::int32, {1}), parallel::ReduceOp::max);
  if (writing) return std::nullopt;
  return commit();
}

std::optional<AsyncSaveResult> AsyncCheckpointWriter::finish() {
  if (!job_) return std::nullopt;
  const double t0 = now_s();
  {
    std::unique_lock<std::mutex> lock(job_->mu);
    job_->waited = true;
    job_->cv.notify_all();
    if (!job_->cv.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] { return job_->done; })) {
      lock.unlock();
      const std::string partial = job_->partial;
      if (job_->thread.joinable()) job_->thread.detach();  // it holds the job (and so the snapshot) itself
      job_.reset();
      throw environment_error(
          fmt::format("the background write of checkpoint {} did not finish within checkpoint.timeout ({})", partial,
                      format_duration(timeout_s_)),
          "the disk is slower than checkpoint.timeout allows for this model's shards: raise checkpoint.timeout, or "
          "check the file system (a hung network mount stops writes without an error)");
    }
  }
  AsyncSaveResult out = commit();
  out.commit_s = now_s() - t0;
  return out;
}

AsyncSaveResult AsyncCheckpointWriter::commit() {
  const double t0 = now_s();
  Job& job = *job_;
  if (job.thread.joinable()) job.thread.join();
  AsyncSaveResult out;
  out.step = job.meta.step;
  out.held_s = job.held_s;
  out.write_s = job.write_s;
  try {
    out.path = checkpoint_save_commit(fs_, dir_, job.meta, job.result, world_, keep_);
  } catch (const Error& e) {
    out.error = fmt::format("checkpoint {} was not written: {}", job.partial, e.what());
    if (!e.hint().empty()) out.error += fmt::format(" ({})", e.hint());
    // Every rank agreed on the failure: nothing was committed. The failed directory would only
    // take space (a full disk is the likeliest cause); retention never removes `.partial`.
    if (world_.rank() == 0) {
      try {
        fs_.remove_all(job.partial);
      } catch (const Error&) {
      }
    }
  }
  spare_ = std::move(job.buffers);
  job_.reset();
  out.commit_s = now_s() - t0;
  return out;
}

}  // namespace llmtrain::trainer
