// The optimizer's state away from the compute device's memory (parallel.offload, docs/offload.md):
// in page-locked host memory (`host`, cuda ranks) or in a file under parallel.offload_path (`nvme`,
// cuda and cpu ranks), brought to the compute device a unit at a time around each update.
//
// Rules a reader could get wrong:
//  - The state is `arrays` fp32 arrays of `numel` elements each (AdamW's two moments, and its fp32
//    master with 16-bit parameters), cut into units of unit() elements. Unit u of array a sits at
//    element (u·arrays + a)·unit() of the store, so one unit's whole state is one contiguous read.
//  - for_each_unit is how an update sees the state: with `nvme`, one I/O thread reads unit u+1 while
//    the caller's function runs on unit u, and writes unit u back behind it, first in first out over
//    three host slots (a slot is read into again only after its write, queued earlier, is done).
//    It returns once every write has reached the file (not fsynced: the file is scratch; the
//    checkpoint holds the state). On cuda ranks each unit goes to a device slot and back; copies
//    to and from page-locked memory run behind the host, so for_each_unit waits for the device
//    before a slot is written to the file (nvme) and before it returns (host).
//  - The file has no name (O_TMPFILE) or, where the file system cannot do that, is created afresh
//    (never through an existing name or link) and unlinked as soon as it is open: it goes with the
//    process, crash included. Its space is reserved at construction (fallocate; else the free space
//    is checked), so a full disk shows before training, not in the middle of a step.
//  - An I/O failure, or a wait longer than the timeout, throws an environment Error that names the
//    file; the state is then unusable and the run ends (its last checkpoint is untouched).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "common/recipe/recipe.h"
#include "kernels/tensor.h"

namespace llmtrain::trainer {

struct OffloadConfig {
  OffloadKind kind = OffloadKind::none;
  std::string dir;                                // nvme: where the file goes (created if needed)
  int rank = 0;                                   // names the file
  kernels::Device device = kernels::Device::cpu;  // where the update runs
  double timeout_s = 300;                         // bound on each wait for the I/O thread
  // ZeRO 3 with parallel.offload_params: AdamW's third array holds the owned parameter values
  // (which are the fp32 master there) instead of the sync's memory.
  bool params = false;
  // `host` on a cuda rank: AdamW runs on the CPU over the page-locked state, the gradients copied
  // down and the updated values up (the placement decides: Placement::update,
  // trainer/placement/placement.h).
  bool cpu_update = false;
};

// The unit offload_unit chooses for `numel` elements: about an eighth of them, a multiple of 1024
// (4 KiB of fp32, so that units stay aligned for direct I/O), at least 1024 and at most 2^22 (16 MiB
// per array).
int64_t offload_unit(int64_t numel);

// Bytes an OffloadStore of `arrays` arrays of `numel` elements holds where it keeps the state (its
// file, or its page-locked host memory), and the bytes of its staging slots: in host memory (nvme)
// and on the compute device (cuda ranks).
struct OffloadBytes {
  int64_t store = 0, host_slots = 0, device_slots = 0;
};
OffloadBytes offload_bytes(OffloadKind kind, kernels::Device device, int arrays, int64_t numel);

class OffloadStore {
 public:
  // Makes the store (zero-filled) and, for nvme, its file; throws a user Error when the directory
  // cannot be made or its file system lacks the room.
  OffloadStore(const OffloadConfig& config, int arrays, int64_t numel);
  ~OffloadStore();
  OffloadStore(const OffloadStore&) = delete;
  OffloadStore& operator=(const OffloadStore&) = delete;

  int arrays() const { return arrays_; }
  int64_t numel() const { return numel_; }
  int64_t unit() const { return unit_; }
  int64_t units() const { return units_; }
  // "page-locked host memory", or the file's path.
  const std::string& where() const { return where_; }

  // fn(u, begin, count, state) for u = 0, 1, ...: `state` holds the arrays' elements
  // [begin, begin + count) as fp32 tensors on the compute device. With write_back, what fn leaves
  // there is stored.
  using UnitFn = std::function<void(int64_t u, int64_t begin, int64_t count, std::span<const kernels::Tensor> state)>;
  void for_each_unit(const UnitFn& fn, bool write_back);

  // `host`: unit u's arrays in the page-locked store, host fp32 tensors (the CPU update's operands).
  std::vector<kernels::Tensor> host_unit(int64_t u) const;

  // Elements [begin, begin + n) of array `a` to or from a host fp32 tensor of n elements
  // (checkpoints, ZeRO 3's offloaded values): synchronous, not while for_each_unit runs; calls from
  // two threads take turns.
  void read(int a, int64_t begin, kernels::Tensor host) const;
  void write(int a, int64_t begin, kernels::Tensor host);

  // What the I/O has cost so far (nvme): bytes moved, the I/O thread's busy seconds, and the seconds
  // for_each_unit's caller waited for it (the part of the I/O the overlap did not hide).
  struct Stats {
    int64_t read_bytes = 0, written_bytes = 0;
    double io_s = 0, waited_s = 0;
  };
  Stats stats() const;

  // Fault injection (LLMTRAIN_FAULT=offload-io-error): the next write to the file fails with EIO,
  // as from the disk.
  void inject_write_error();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int arrays_ = 0;
  int64_t numel_ = 0, unit_ = 0, units_ = 0;
  std::string where_;
};

}  // namespace llmtrain::trainer
