// What the multi-rank tests share: the job's Runtime and world communicator, set up once by
// mpi_test_main.cpp (every rank runs every test, in the same order, so collectives match), and a
// deterministic data generator every rank can evaluate for every other rank.
#pragma once

#include <cstdint>

#include "parallel/bootstrap.h"
#include "parallel/comm/comm_mpi.h"

namespace llmtrain::parallel::mpitest {

Runtime& runtime();
MpiComm& world();

// A deterministic 64-bit hash of (seed, rank, index): the same on every rank.
inline uint64_t mix(uint64_t seed, uint64_t rank, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + rank * 0xBF58476D1CE4E5B9ull + i * 0x94D049BB133111EBull + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// A small integer in [lo, hi].
inline int64_t small_int(uint64_t seed, int rank, int64_t i, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(mix(seed, static_cast<uint64_t>(rank), static_cast<uint64_t>(i)) %
                                   static_cast<uint64_t>(hi - lo + 1));
}
// A float in [-1, 1).
inline float unit_float(uint64_t seed, int rank, int64_t i) {
  return static_cast<float>(
      static_cast<double>(mix(seed, static_cast<uint64_t>(rank), static_cast<uint64_t>(i)) >> 11) / 9007199254740992.0 *
          2.0 -
      1.0);
}

}  // namespace llmtrain::parallel::mpitest
