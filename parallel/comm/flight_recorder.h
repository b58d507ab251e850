// The flight recorder: this rank's last communication operations, for finding out who a hung job
// waits for (PyTorch's NCCL flight recorder does the same for NCCL).
//
// Every operation on a communicator that bootstrap hands out under a launcher (the world and every
// group split from it, parallel/mesh_comms.h) is recorded by with_flight_recorder(): a sequence
// number, the operation, the group's name and size, the bytes of this rank's buffer, the peer of
// a send or receive, and when it started and ended (an asynchronous one ends when a wait() or
// done() first sees it complete). The last kFlightEntries are kept.
//
// The record goes to `<log.dir>/flight/rank_<N>.txt` (the supervisor names the folder in
// LLMTRAIN_FLIGHT_DIR) when the rank ends through abort_job (a timed-out collective, any error),
// on a fatal signal, and when the supervisor asks because the job stopped making progress
// (parallel/progress.h). The supervisor's hang report quotes each rank's operation in flight.
//
// Rules a reader could get wrong:
//  - Recording takes a mutex per operation (the progress reporter reads from its own thread); a
//    collective costs microseconds at least, so this is noise.
//  - The fatal-signal dump cannot take the mutex or allocate: it writes what the ring holds with
//    write(2) and hand-formatted numbers, and may show an entry half-updated.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "parallel/comm/comm.h"

namespace llmtrain::parallel {

inline constexpr int kFlightEntries = 256;
inline constexpr const char* kFlightDirEnv = "LLMTRAIN_FLIGHT_DIR";

struct FlightEntry {
  uint64_t seq = 0;     // 1, 2, ... in the order this rank started operations; 0 = empty slot
  const char* op = "";  // "all_reduce", "send_async", ... (static strings)
  char group[32] = {};  // the communicator's name, truncated
  int group_size = 0;
  int64_t bytes = 0;   // this rank's input buffer
  int peer = -1;       // send/recv peer within the group, else -1
  double start_s = 0;  // seconds since the recorder was created
  double end_s = -1;   // -1 while in flight
};

class FlightRecorder {
 public:
  FlightRecorder();
  uint64_t begin(const char* op, const std::string& group, int group_size, int64_t bytes, int peer);
  void end(uint64_t seq);

  // The oldest operation still in flight, as "all_reduce #345 on group 'dp' (4 ranks, 4.0 MiB) for
  // 12.3s", or "" when none is; and the last finished one the same way (without the duration).
  std::string in_flight() const;
  std::string last_finished() const;
  // Every entry kept, oldest first, one per line, with a header naming the rank.
  std::string text(int rank) const;

  // Where dump() writes: `<dir>/rank_<8 digits>.txt`. Without a directory, dumps do nothing.
  void set_dump_dir(const std::string& dir, int rank);
  // Writes text() there (atomically, rename). Returns the path, "" when nothing was written.
  std::string dump() const;
  // From a signal handler: async-signal-safe, best effort.
  void dump_from_signal() const;

 private:
  double now() const;

  struct State;
  std::unique_ptr<State> s_;
};

// The process's recorder.
FlightRecorder& flight_recorder();

// `inner` with every operation recorded in flight_recorder(); splits are recorded too.
std::unique_ptr<Comm> with_flight_recorder(std::unique_ptr<Comm> inner);

}  // namespace llmtrain::parallel
