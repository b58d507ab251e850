#include "op_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "kernels/backend_info.h"
#include "kernels/dtype_convert.h"
#include "kernels/ops.h"

namespace llmtrain::kernels::test {

namespace {

uint16_t round_to(DType t, float x) { return t == DType::bf16 ? fp32_to_bf16(x) : fp32_to_fp16(x); }
float widen(DType t, uint16_t h) { return t == DType::bf16 ? bf16_to_fp32(h) : fp16_to_fp32(h); }
// x rounded to the 16-bit dtype t and back (exact); x itself for fp32.
float rounded(DType t, float x) { return t == DType::fp32 ? x : widen(t, round_to(t, x)); }

}  // namespace

bool OpRun::half(const std::string& name) const {
  return dtype != DType::fp32 && args.at(name)->role != Role::index && !fp32_args.count(name);
}

Tensor OpRun::half_view(const std::string& name, std::vector<float>& from,
                        std::map<std::string, std::vector<uint16_t>>& h) {
  const Arg* a = args.at(name);
  auto it = h.find(name);
  if (it == h.end()) {
    std::vector<uint16_t> v(from.size());
    for (size_t k = 0; k < v.size(); ++k) v[k] = round_to(dtype, from[k]);
    it = h.emplace(name, std::move(v)).first;
  }
  return Tensor(it->second.data(), dtype, Shape(std::span<const int64_t>(a->shape)));
}

Tensor OpRun::on_device(const std::string& name, Tensor host, std::map<std::string, Buffer>& d) {
  if (device == Device::cpu) return host;
  auto it = d.find(name);
  if (it == d.end()) {
    it = d.emplace(name, Buffer(host.dtype, host.shape, device)).first;
    copy(it->second.tensor(), host);
  }
  return it->second.tensor();
}

Tensor OpRun::t(const std::string& name) {
  const Arg* a = args.at(name);
  Shape shape(std::span<const int64_t>(a->shape));
  if (a->role == Role::index) return on_device(name, Tensor(i.at(name).data(), DType::int32, shape), df);
  if (half(name)) return on_device(name, half_view(name, f.at(name), hf), df);
  return on_device(name, Tensor(f.at(name).data(), DType::fp32, shape), df);
}

Tensor OpRun::grad(const std::string& name) {
  const Arg* a = args.at(name);
  if (half(name)) return on_device(name, half_view(name, g.at(name), hg), dg);
  return on_device(name, Tensor(g.at(name).data(), DType::fp32, Shape(std::span<const int64_t>(a->shape))), dg);
}

Tensor OpRun::ints(int32_t* p, int64_t n) {
  Tensor host(p, DType::int32, {n});
  if (device == Device::cpu) return host;
  Buffer b(DType::int32, {n}, device);
  copy(b.tensor(), host);
  dints.emplace_back(p, std::move(b));
  return dints.back().second.tensor();
}

void OpRun::sync() {
  for (auto& [p, buf] : dints) copy(Tensor(p, DType::int32, buf.tensor().shape), buf.tensor());
  dints.clear();
  // Device copies back into the host storage they were made from (16-bit copies included).
  for (auto* pair : {&df, &dg}) {
    for (auto& [name, buf] : *pair) {
      const bool is_f = pair == &df;
      void* host = nullptr;
      if (args.at(name)->role == Role::index)
        host = i.at(name).data();
      else if (half(name))
        host = (is_f ? hf : hg).at(name).data();
      else
        host = (is_f ? f : g).at(name).data();
      copy(Tensor(host, buf.dtype(), buf.tensor().shape), buf.tensor());
    }
    pair->clear();
  }
  for (auto* pair : {&hf, &hg}) {
    for (auto& [name, v] : *pair) {
      auto& to = (pair == &hf ? f : g)[name];
      to.resize(v.size());
      for (size_t k = 0; k < v.size(); ++k) to[k] = widen(dtype, v[k]);
    }
    pair->clear();
  }
}

// The bound for fp32: the CUDA kernels against the CPU's, per tensor.
constexpr double kCudaFp32Tolerance = 1e-5;

double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0, na = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    num += (a[k] - b[k]) * (a[k] - b[k]);
    den += b[k] * b[k];
    na += a[k] * a[k];
  }
  if (den == 0) return std::sqrt(na);
  return std::sqrt(num / den);
}

namespace {

// LLMTRAIN_OP_VERBOSE=1 prints every measured error (to see the margin under each tolerance).
bool verbose() {
  static const bool v = std::getenv("LLMTRAIN_OP_VERBOSE") != nullptr;
  return v;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

bool differentiable(Role r) { return r == Role::input || r == Role::param; }
bool is_output(Role r) { return r == Role::output || r == Role::saved; }

RefRun make_ref(const OpCase& c, OpRun& ours) {
  RefRun ref;
  for (const Arg& a : c.args) {
    if (a.role == Role::index)
      ref.idx[a.name] = ours.i.at(a.name);
    else if (is_output(a.role))
      ref.y[a.name].assign(size_t(numel(a.shape)), 0.0);
    else
      ref.x[a.name] = to_double(ours.f.at(a.name));
  }
  return ref;
}

// L = Σ over loss outputs of ⟨R, y⟩, from the reference.
double ref_loss(const OpCase& c, RefRun& ref, const std::map<std::string, std::vector<double>>& r) {
  for (auto& [name, y] : ref.y) std::fill(y.begin(), y.end(), 0.0);
  c.reference(ref);
  double l = 0;
  for (const Arg& a : c.args)
    if (a.role == Role::output) {
      const auto& y = ref.y.at(a.name);
      const auto& ra = r.at(a.name);
      for (size_t k = 0; k < y.size(); ++k) l += ra[k] * y[k];
    }
  return l;
}

}  // namespace

namespace {

// What one run computed: every output after forward, every gradient after backward.
struct RunResult {
  std::map<std::string, std::vector<float>> outputs, grads;
};

// Every check against the reference, with these tolerances; none where they are 0 (a CUDA run whose
// case compares it only with the CPU's run, run_case).
RunResult run_case_as(const OpCase& c, uint64_t seed, DType dtype, const OpCase::Tolerances& tol,
                      Device device = Device::cpu) {
  const double forward_tol = tol.forward, grad_tol = tol.grad;
  const double direction_tol = tol.direction > 0 ? tol.direction : tol.grad;
  SCOPED_TRACE(std::string("storage ") + to_string(dtype) + " on " + to_string(device));
  const std::string label = c.name + (dtype == DType::fp32 ? "" : std::string(" ") + to_string(dtype)) +
                            (device == Device::cpu ? "" : " on cuda");
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  RunResult result;
  OpRun ours;
  ours.dtype = dtype;
  ours.device = device;
  ours.fp32_args.insert(c.fp32_args.begin(), c.fp32_args.end());
  // The values an argument of this run can hold: rounded to its storage.
  auto representable = [&](const std::string& name, std::vector<float>& v) {
    const DType t = ours.fp32_args.count(name) ? DType::fp32 : dtype;
    for (auto& x : v) x = rounded(t, x);
  };
  for (const Arg& a : c.args) {
    ours.args[a.name] = &a;
    const size_t n = size_t(numel(a.shape));
    if (a.role == Role::index) {
      std::uniform_int_distribution<int32_t> pick(a.lo, a.hi - 1);
      auto& v = ours.i[a.name];
      v.resize(n);
      for (auto& x : v) x = pick(rng);
    } else {
      auto& v = ours.f[a.name];
      v.assign(n, 0.0f);
      if (!is_output(a.role))
        for (auto& x : v) x = float(a.scale) * normal(rng);
      representable(a.name, v);
    }
  }
  if (c.setup) c.setup(ours);
  ours.sync();

  // Forward against the reference (fed the same, rounded, inputs).
  c.forward(ours);
  ours.sync();
  for (const Arg& a : c.args)
    if (is_output(a.role)) result.outputs[a.name] = ours.f.at(a.name);
  RefRun ref = make_ref(c, ours);
  c.reference(ref);
  for (const Arg& a : c.args) {
    if (!is_output(a.role) || forward_tol == 0) continue;
    double err = rel_error(to_double(ours.f.at(a.name)), ref.y.at(a.name));
    if (verbose()) std::printf("%-60s forward %-10s %.2e\n", label.c_str(), a.name.c_str(), err);
    EXPECT_LE(err, forward_tol) << "forward output " << a.name << " differs from the double reference";
  }
  if (!c.backward) return result;

  // Backward: R for outputs, NaN-filled input gradients, random-filled parameter gradients.
  std::map<std::string, std::vector<double>> r;
  std::map<std::string, std::vector<float>> start;
  for (const Arg& a : c.args) {
    const size_t n = size_t(numel(a.shape));
    auto& g = ours.g[a.name];
    if (a.role == Role::output) {
      g.resize(n);
      float u = normal(rng);
      for (auto& x : g) x = a.uniform_dout ? u : normal(rng);
      representable(a.name, g);
      r[a.name] = to_double(g);
    } else if (a.role == Role::input) {
      g.assign(n, c.check_overwrite ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
    } else if (a.role == Role::param) {
      // 16-bit: a smaller start, so that rounding start + gradient loses little of the gradient.
      g.resize(n);
      for (auto& x : g) x = (dtype == DType::fp32 ? 1.0f : 0.125f) * normal(rng);
      representable(a.name, g);
      start[a.name] = g;
    }
  }
  c.backward(ours);
  ours.sync();
  for (const Arg& a : c.args)
    if (differentiable(a.role)) result.grads[a.name] = ours.g.at(a.name);
  if (grad_tol == 0) return result;

  const double l0 = ref_loss(c, ref, r);
  (void)l0;
  for (const Arg& a : c.args) {
    if (!differentiable(a.role)) continue;
    SCOPED_TRACE("gradient of " + a.name);
    std::vector<double> got = to_double(ours.g.at(a.name));
    if (a.role == Role::param)
      for (size_t k = 0; k < got.size(); ++k) got[k] -= start.at(a.name)[k];
    for (double v : got) {
      if (!std::isfinite(v)) {
        ADD_FAILURE() << "gradient not fully written (or not finite)";
        return result;
      }
    }

    auto& x = ref.x.at(a.name);
    const size_t n = x.size();
    // A sample of single elements (all of them for small arguments).
    std::vector<size_t> picks;
    if (n <= 48) {
      for (size_t k = 0; k < n; ++k) picks.push_back(k);
    } else {
      std::uniform_int_distribution<size_t> pick(0, n - 1);
      for (int k = 0; k < 48; ++k) picks.push_back(pick(rng));
    }
    std::vector<double> fd, mine;
    for (size_t k : picks) {
      const double keep = x[k], h = 1e-5 * std::max(1.0, std::abs(keep));
      x[k] = keep + h;
      const double lp = ref_loss(c, ref, r);
      x[k] = keep - h;
      const double lm = ref_loss(c, ref, r);
      x[k] = keep;
      fd.push_back((lp - lm) / (2 * h));
      mine.push_back(got[k]);
    }
    const double elem_err = rel_error(mine, fd);
    EXPECT_LE(elem_err, grad_tol) << "element-wise finite differences disagree";

    // One random direction over the whole argument.
    std::vector<double> dir(n);
    double dot = 0;
    for (size_t k = 0; k < n; ++k) {
      dir[k] = normal(rng);
      dot += dir[k] * got[k];
    }
    const double h = 1e-5;
    std::vector<double> keep = x;
    for (size_t k = 0; k < n; ++k) x[k] = keep[k] + h * dir[k];
    const double lp = ref_loss(c, ref, r);
    for (size_t k = 0; k < n; ++k) x[k] = keep[k] - h * dir[k];
    const double lm = ref_loss(c, ref, r);
    x = keep;
    const double fd_dir = (lp - lm) / (2 * h);
    if (verbose())
      std::printf("%-60s grad    %-10s %.2e  direction %.2e\n", label.c_str(), a.name.c_str(), elem_err,
                  std::abs(dot - fd_dir) / std::max(1.0, std::abs(fd_dir)));
    EXPECT_LE(std::abs(dot - fd_dir), direction_tol * std::max(1.0, std::abs(fd_dir)))
        << "directional derivative: ours " << dot << ", finite differences " << fd_dir;
  }
  return result;
}

bool have_cuda_device() {
  static const bool have = [] {
    const CudaInfo c = cuda_info();
    return c.built && !c.devices.empty();
  }();
  return have;
}

// The CUDA run of a case against the CPU run: every output and gradient, one tolerance.
void compare_devices(const OpCase& c, const std::string& what, const RunResult& cuda, const RunResult& cpu,
                     double tol) {
  for (auto pair : {&RunResult::outputs, &RunResult::grads}) {
    for (const auto& [name, want] : cpu.*pair) {
      const double err = rel_error(to_double((cuda.*pair).at(name)), to_double(want));
      if (verbose())
        std::printf("%-60s cuda vs cpu %-5s %-10s %.2e\n", c.name.c_str(), what.c_str(), name.c_str(), err);
      EXPECT_LE(err, tol) << (pair == &RunResult::outputs ? "output " : "gradient of ") << name << " (" << what
                          << ") on the CUDA device differs from the CPU's";
    }
  }
}

}  // namespace

void run_case(const OpCase& c, uint64_t seed) {
  SCOPED_TRACE("op case: " + c.name);
  const bool on_cuda = c.cuda && have_cuda_device();
  const RunResult cpu32 = run_case_as(c, seed, DType::fp32, {c.forward_tol, c.grad_tol});
  if (on_cuda && c.cuda_fp32)
    compare_devices(c, "fp32", run_case_as(c, seed, DType::fp32, {}, Device::cuda), cpu32, kCudaFp32Tolerance);
  if (c.fp32_only) return;
  ASSERT_TRUE(c.bf16.forward > 0 && c.bf16.grad > 0 && c.fp16.forward > 0 && c.fp16.grad > 0)
      << "the case states no 16-bit tolerances (or fp32_only)";
  if (on_cuda) {
    ASSERT_TRUE(c.cuda_bf16 > 0 && c.cuda_fp16 > 0) << "the case states no 16-bit CUDA tolerances";
  }
  // The CUDA run's own checks against the reference, where the case asks for them.
  auto on_device = [&](DType dtype, const OpCase::Tolerances& t) {
    return run_case_as(c, seed, dtype, c.cuda_reference ? t : OpCase::Tolerances{}, Device::cuda);
  };
  const RunResult cpu_bf16 = run_case_as(c, seed, DType::bf16, c.bf16);
  if (on_cuda) compare_devices(c, "bf16", on_device(DType::bf16, c.bf16), cpu_bf16, c.cuda_bf16);
  const RunResult cpu_fp16 = run_case_as(c, seed, DType::fp16, c.fp16);
  if (on_cuda) compare_devices(c, "fp16", on_device(DType::fp16, c.fp16), cpu_fp16, c.cuda_fp16);
}

}  // namespace llmtrain::kernels::test
