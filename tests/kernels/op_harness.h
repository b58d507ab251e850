// The one harness every op test uses (ggml's test-backend-ops idea): a case names its arguments
// and gives three functions — our forward, our backward, and a naive double-precision reference
// forward written independently in the test. The harness then checks
//  - forward: every output (and saved intermediate) against the reference, ‖a−b‖/‖b‖;
//  - backward: for L = Σ ⟨R, output⟩ with random R, every differentiable argument's gradient
//    against central finite differences of the double reference (a sample of elements, plus one
//    random direction over the whole argument);
//  - the gradient contract of kernels/ops.h: input (activation) gradients are overwritten (their
//    buffers start as NaN), parameter gradients accumulate (theirs start random and the harness
//    subtracts the start).
// Every case then runs again with bf16 and with fp16 storage (kernels/ops.h, "Precision"): the
// float arguments are rounded to the 16-bit dtype (except the case's fp32_args: statistics and
// tables), the reference is fed the same rounded values, and the case's per-dtype tolerances
// apply. A case must state both (an op without 16-bit support says so with fp32_only); they are
// about 3x the largest error measured (LLMTRAIN_OP_VERBOSE=1), against unit roundoffs of 2^-9
// (bf16) and 2^-11 (fp16) for every stored value.
//
// A case whose op has a CUDA kernel (`cuda = true`) runs once more per storage dtype on the CUDA
// device, where the build has one (a GPU, or the simulator of the LLMTRAIN_CUDA=SIM build): the
// same inputs, and every output and gradient compared with the CPU's, ‖cuda − cpu‖/‖cpu‖ ≤ 1e-5
// for fp32 and the case's cuda_bf16 / cuda_fp16 tolerances for 16-bit storage.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/tensor.h"

namespace llmtrain::kernels::test {

enum class Role {
  input,     // float, differentiable; its gradient is overwritten by backward
  param,     // float, differentiable; its gradient accumulates
  constant,  // float, not differentiated (tables, optimizer state)
  index,     // int32 (token ids, targets), in [lo, hi)
  output,    // float output that enters the loss
  saved,     // float output kept for backward (mean, rstd, lse): compared, not differentiated
};

struct Arg {
  std::string name;
  std::vector<int64_t> shape;
  Role role = Role::input;
  int32_t lo = 0, hi = 0;     // index: value range
  double scale = 1.0;         // input/param/constant: values ~ N(0, scale²)
  bool uniform_dout = false;  // output: R is one random constant (ops whose backward takes a scalar)
};

// Our side of a run: tensors over float/int storage the harness owns. With 16-bit storage, t()
// and grad() hand out 16-bit copies of f/g made at the first call (the same copy until sync());
// the harness syncs them back into f/g after setup, forward and backward, and a case that reads
// f/g inside its own forward or backward (in-place variants) calls sync() first.
class OpRun {
 public:
  Tensor t(const std::string& name);     // value of an argument (input, param, constant, index, output)
  Tensor grad(const std::string& name);  // gradient buffer of an input/param, or R for an output
  void sync();                           // 16-bit copies back into f and g (widened exactly)
  // int32 memory of the case's own (a count) as a tensor on the run's device; a device copy is
  // copied back into *p at sync().
  Tensor ints(int32_t* p, int64_t n);

  std::map<std::string, std::vector<float>> f, g;
  std::map<std::string, std::vector<int32_t>> i;
  std::map<std::string, const Arg*> args;

  DType dtype = DType::fp32;        // storage of the float arguments not in fp32_args
  std::set<std::string> fp32_args;  // stay fp32 whatever the storage
  std::map<std::string, std::vector<uint16_t>> hf, hg;
  // Device::cuda: t() and grad() hand out device copies (made at the first call, until sync()).
  Device device = Device::cpu;
  std::map<std::string, Buffer> df, dg;
  std::vector<std::pair<int32_t*, Buffer>> dints;

 private:
  Tensor on_device(const std::string& name, Tensor host, std::map<std::string, Buffer>& d);
  bool half(const std::string& name) const;
  Tensor half_view(const std::string& name, std::vector<float>& from, std::map<std::string, std::vector<uint16_t>>& h);
};

// The reference side: doubles in, doubles out.
class RefRun {
 public:
  const std::vector<double>& in(const std::string& name) const { return x.at(name); }
  const std::vector<int32_t>& ints(const std::string& name) const { return idx.at(name); }
  std::vector<double>& out(const std::string& name) { return y.at(name); }

  std::map<std::string, std::vector<double>> x, y;
  std::map<std::string, std::vector<int32_t>> idx;
};

struct OpCase {
  std::string name;
  std::vector<Arg> args;
  std::function<void(OpRun&)> setup = {};  // optional: fill constants our way (e.g. rope_table)
  std::function<void(OpRun&)> forward = {};
  std::function<void(OpRun&)> backward = {};  // optional
  std::function<void(RefRun&)> reference = {};
  double forward_tol = 1e-5;
  double grad_tol = 3e-5;
  bool check_overwrite = true;  // input gradients must not depend on their buffer's old contents
  // 16-bit storage: the same checks with these tolerances, both > 0 (or fp32_only).
  struct Tolerances {
    double forward = 0, grad = 0;
    // The directional derivative's, where it differs from grad (0: grad): over a large argument a
    // 16-bit gradient's rounding (of the stored output and dout it is computed from) adds up.
    double direction = 0;
  };
  Tolerances bf16 = {}, fp16 = {};
  std::vector<std::string> fp32_args = {};  // statistics (mean, rstd, lse, losses) and tables stay fp32
  bool fp32_only = false;                   // the op takes no 16-bit storage (kernels/ops.h says which)
  // The op has a CUDA kernel: the case also runs on the CUDA device against the CPU (above). The
  // 16-bit tolerances are stated per op: the two devices round the same fp32 math once, but sum in
  // different orders, so a stored value may differ by a unit in its last place.
  bool cuda = false;
  double cuda_bf16 = 0, cuda_fp16 = 0;
  // The CUDA 16-bit runs are also checked against the double reference and finite differences with
  // the case's bf16 / fp16 tolerances (a device kernel that rounds differently from the CPU's, such
  // as the tensor-core attention's 16-bit P and dS).
  bool cuda_reference = false;
  bool cuda_fp32 = true;  // false: the device takes this case in 16-bit storage only
};

// Runs every check of a case, in fp32 and then with bf16 and fp16 storage; failures are reported
// through GoogleTest with the case name and the storage dtype.
void run_case(const OpCase& c, uint64_t seed);

// ‖a − b‖ / ‖b‖ (‖a‖ when b is all zero).
double rel_error(const std::vector<double>& a, const std::vector<double>& b);

// A random size in [lo, hi], for the random shapes (odd sizes included) every case runs over.
inline int64_t rand_dim(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

inline int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace llmtrain::kernels::test
