// The staged device communicator: device memory moved by a host communicator (MPI), through pinned
// host memory, on a communication stream of its own. It serves the simulated device and any MPI
// that is not CUDA-aware, and is what CI runs; NCCL takes its place on GPUs (the "NCCL" issue).
//
// One operation on device tensors goes:
//   1. an event recorded on the compute stream behind the work queued so far, which the
//      communication stream waits for: the input is written, and nothing queued before the call
//      (a new output buffer's zero fill, say) lands on the output after step 4;
//   2. the input copied to pinned host memory on the communication stream, and an event behind it;
//   3. once that event is done (progress() polls it, never blocking), the host operation starts;
//   4. once the host operation is done, the result copied back on the communication stream, and an
//      event behind it that wait() makes the compute stream wait for. wait() returns without
//      waiting for the device: the compute stream's later work sees the result.
// Host tensors go straight to the host communicator. Host operations start in the order the
// operations were called, whatever their tensors, so every rank runs the same host operations in
// the same order (a host communicator without tags that runs one group's operations in order could
// sit beneath it).
//
// Rules a reader could get wrong:
//  - The Comm contract holds (parallel/comm/comm.h): a buffer passed to an asynchronous call stays
//    untouched until its wait() returns — including by kernels queued on the compute stream after
//    the call, which the copy of step 2 may not have read yet.
//  - Pinned staging memory is pooled per communicator and reused once an operation's copy back has
//    completed; it is freed with the communicator.
//  - A host operation starts only inside a call on a staged communicator, so every wait, done() and
//    progress() on one advances every staged communicator of the thread (as any MPI call
//    progresses all of a process's requests): a rank blocked on one group's operation still starts
//    its other groups' — without it, a pipeline stage waiting for a receive on one link would never
//    start its send on the other, which its peer waits for (parallel/pipe_links.h).
#pragma once

#include <memory>

#include "parallel/comm/comm.h"

namespace llmtrain::parallel {

// Wraps `host` (kept) in the staged communicator. Its split() wraps the host's split.
std::unique_ptr<Comm> make_staged_comm(std::unique_ptr<Comm> host);

}  // namespace llmtrain::parallel
