// The rates the planner's performance model reads for a GPU (planner/device_catalog.h), measured on
// the device this process sees: llmtrain's attention kernels forward and backward (the CUDA cores'
// in fp32 storage: attention_*; the tensor cores' in bf16: attention_tc_*), and the matrix
// products (kernels::linear_forward: cuBLASLt on a GPU) in bf16 and fp32, at one model's shapes.
// scripts/gpu_check.sh runs it and hands the file to `llmtrain plan --rates` / `run --dry-run
// --rates`, so the prediction it prints next to each measured step uses this run's rates. A
// benchmark tool, not a user command.
//
//   device_rates [--batch B] [--seq T] [--heads H] [--dim D] [--hidden C] [--reps R] [--output FILE]
//
// Defaults: GPT-2 124M's attention (8 × 1024, 12 heads of 64) and its MLP product (8192 × 768 →
// 3072). Rates count the FLOPs the performance model counts: attention 4·H·D·T per token forward
// (no causal halving), twice that backward; a product 2·N·I·O. Each op is timed over R repetitions
// after one warm-up, the device synchronized around them. The output is one JSON object (the
// format planner::apply_measured_rates reads).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "common/file_io.h"
#include "kernels/backend_info.h"
#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "llmtrain_version.h"

using namespace llmtrain;
using kernels::Buffer;
using kernels::Device;
using kernels::DType;

namespace {

// Seconds per call of `op` on the device: one warm-up, then `reps` calls between two
// synchronizations.
double seconds_per_call(int reps, const std::function<void()>& op) {
  op();
  kernels::synchronize(Device::cuda);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) op();
  kernels::synchronize(Device::cuda);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// A device buffer filled with small values (the rates do not depend on them, but NaNs could).
Buffer filled(DType dtype, kernels::Shape shape, float value) {
  Buffer host(DType::fp32, shape);
  float* p = host.tensor().ptr<float>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = value * float((i * 7919) % 17 - 8) / 8.0f;
  Buffer wide(DType::fp32, shape, Device::cuda);
  kernels::copy(wide.tensor(), host.tensor());
  if (dtype == DType::fp32) return wide;
  Buffer out(dtype, shape, Device::cuda);
  kernels::convert(out.tensor(), wide.tensor());
  return out;
}

int run(int argc, char** argv) {
  int64_t batch = 8, seq = 1024, heads = 12, dim = 64, hidden = 768;
  int reps = 10;
  std::string output;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw Error(fmt::format("{} needs a value", a));
    const std::string v = argv[++i];
    if (a == "--batch")
      batch = std::stoll(v);
    else if (a == "--seq")
      seq = std::stoll(v);
    else if (a == "--heads")
      heads = std::stoll(v);
    else if (a == "--dim")
      dim = std::stoll(v);
    else if (a == "--hidden")
      hidden = std::stoll(v);
    else if (a == "--reps")
      reps = std::stoi(v);
    else if (a == "--output")
      output = v;
    else
      throw Error(fmt::format("unknown option {}", a), "see the comment at the top of tests/bench/device_rates.cpp");
  }
  for (const auto& [name, v] :
       {std::pair{"--batch", batch}, std::pair{"--seq", seq}, std::pair{"--heads", heads}, std::pair{"--dim", dim},
        std::pair{"--hidden", hidden}, std::pair{"--reps", int64_t(reps)}})
    if (v < 1 || v > (int64_t(1) << 20)) throw Error(fmt::format("{} {}: expected 1 to 2^20", name, v));
  const kernels::CudaInfo cuda = kernels::cuda_info();
  if (cuda.devices.empty()) throw environment_error("no CUDA device: " + cuda.unavailable_reason);

  nlohmann::json out;
  out["llmtrain_device_rates"] = 1;
  out["device"] = cuda.devices.front().name;
  out["simulator"] = cuda.simulator;
  out["commit"] = LLMTRAIN_GIT_COMMIT;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  out["date"] = date;
  out["shape"] = fmt::format("attention {} x {}, {} heads of {}; product {} x {} -> {}", batch, seq, heads, dim,
                             batch * seq, hidden, 4 * hidden);

  // Attention over a packed qkv: in fp32 storage (the CUDA cores' kernel) and in bf16 (the tensor
  // cores' where kernels::cuda_attention_on_tensor_cores takes the head dim).
  const double attention_flops = double(batch) * seq * 4.0 * heads * dim * seq;
  for (const auto& [dtype, prefix] : {std::pair{DType::fp32, "attention_"}, std::pair{DType::bf16, "attention_tc_"}}) {
    if (dtype == DType::bf16 && !kernels::cuda_attention_on_tensor_cores(dtype, dim)) continue;
    if (dtype == DType::fp32 && dim > 128) continue;  // the CUDA cores' kernel stops at 128
    const Buffer qkv = filled(dtype, {batch, seq, 3 * heads, dim}, 0.5f);
    Buffer o(dtype, {batch, seq, heads, dim}, Device::cuda), dout = filled(dtype, o.tensor().shape, 0.1f);
    Buffer lse(DType::fp32, {batch, heads, seq}, Device::cuda);
    Buffer dqkv(dtype, {batch, seq, 3 * heads, dim}, Device::cuda);
    const auto spec = kernels::AttentionSpec::packed(heads, heads);
    const double fwd = seconds_per_call(reps, [&] {
      kernels::attention_forward(o.tensor(), lse.tensor(), qkv.tensor(), qkv.tensor(), qkv.tensor(), kernels::Tensor{},
                                 spec);
    });
    const double bwd = seconds_per_call(reps, [&] {
      kernels::attention_backward(dqkv.tensor(), dqkv.tensor(), dqkv.tensor(), kernels::Tensor{}, dout.tensor(),
                                  qkv.tensor(), qkv.tensor(), qkv.tensor(), o.tensor(), lse.tensor(), kernels::Tensor{},
                                  spec);
    });
    out[std::string(prefix) + "forward_rate"] = attention_flops / fwd;
    out[std::string(prefix) + "backward_rate"] = 2 * attention_flops / bwd;
  }
  // The products, at the MLP's first linear.
  const int64_t rows = batch * seq;
  const double product_flops = 2.0 * double(rows) * hidden * 4 * hidden;
  for (const auto& [dtype, key] : {std::pair{DType::bf16, "products_bf16"}, std::pair{DType::fp32, "products_fp32"}}) {
    const Buffer in = filled(dtype, {rows, hidden}, 0.5f), w = filled(dtype, {4 * hidden, hidden}, 0.05f);
    Buffer o(dtype, {rows, 4 * hidden}, Device::cuda);
    const double t = seconds_per_call(reps, [&] { kernels::linear_forward(o.tensor(), in.tensor(), w.tensor(), {}); });
    out[key] = product_flops / t;
  }
  const std::string text = out.dump(2) + "\n";
  if (output.empty())
    std::fputs(text.c_str(), stdout);
  else
    write_file_atomic(default_file_system(), output, text);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "device_rates: %s\n", e.what());
    return 1;
  }
}
