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
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

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

// Our side of a run: tensors over float/int storage the harness owns.
class OpRun {
 public:
  Tensor t(const std::string& name);     // value of an argument (input, param, constant, index, output)
  Tensor grad(const std::string& name);  // gradient buffer of an input/param, or R for an output
  float* data(const std::string& name) { return t(name).ptr<float>(); }

  std::map<std::string, std::vector<float>> f, g;
  std::map<std::string, std::vector<int32_t>> i;
  std::map<std::string, const Arg*> args;
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
};

// Runs every check of a case; failures are reported through GoogleTest with the case name.
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
