// The simulator's rules that a test may relax, for the tests of CUDA's own semantics (the sim's
// tests of the legacy default stream) and for planted bugs that show a rule catches what it should.
//
// The rule a reader could get wrong: llmtrain puts every kernel, copy, memset, event and library
// call (cuBLASLt, NCCL) on a stream it created, so the simulator refuses the legacy default stream
// (stream 0, cudaStreamLegacy, cudaStreamPerThread) and any stream the runtime did not make or has
// destroyed: the call fails (cudaErrorInvalidResourceHandle, CUBLAS_STATUS_INVALID_VALUE,
// ncclInvalidUsage) with the reason in its error text. With LegacyStreamAllowed alive, stream 0 is
// accepted and behaves as CUDA's legacy stream does (sim_streams.cpp): that is how a test shows the
// wrong results a product on stream 0 would give on a GPU.
#pragma once

namespace llmtrain::cuda_sim {

// While one exists (process-wide), the legacy default stream is accepted.
class LegacyStreamAllowed {
 public:
  LegacyStreamAllowed();
  ~LegacyStreamAllowed();
  LegacyStreamAllowed(const LegacyStreamAllowed&) = delete;
  LegacyStreamAllowed& operator=(const LegacyStreamAllowed&) = delete;
};
bool legacy_stream_allowed();

}  // namespace llmtrain::cuda_sim
