// Our side of scripts/bench/cpu_step.sh: times full training steps (zero grads, forward, backward,
// global grad norm + clip, AdamW) of a model shape, or OpenBLAS sgemm for the MFU ceiling.
//   step_bench step --shape tiny|gpt2-124m [--batch B] [--seq T] [--steps N] [--warmup W] [--ckpt 0|1]
//                   [--profile 1]   (the timed steps' time per op, as log.profile: ops prints it)
//   step_bench sgemm [--size N] [--reps R]
//   step_bench attention [--batch B --seq T --heads H --dim D --reps R --isa automatic|blas|avx2|avx512]
// Threads come from OMP_NUM_THREADS. Prints one line of key=value pairs. A benchmark tool, not a
// user command.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/op_profile.h"
#include "kernels/ops.h"
#include "parallel/comm/comm.h"
#include "trainer/model/model.h"
#include "trainer/optim/lr_schedule.h"
#include "trainer/optim/optimizer.h"
#include "trainer/report/op_profile_report.h"

using namespace llmtrain;
using namespace llmtrain;
using namespace llmtrain::trainer;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU time of the whole process (all threads): with one thread, a load-independent measure.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

ModelConfig shape(const std::string& name) {
  ModelConfig m;
  m.family = ModelFamily::gpt2;
  if (name == "tiny") {
    m.layers = 4, m.hidden = 128, m.heads = 4, m.vocab = 257, m.seq_len = 256, m.max_positions = 256;
  } else if (name == "gpt2-124m") {
    m.layers = 12, m.hidden = 768, m.heads = 12, m.vocab = 50257, m.seq_len = 1024, m.max_positions = 1024;
  } else {
    throw Error("unknown shape " + name + " (tiny, gpt2-124m)");
  }
  m.kv_heads = m.heads;
  m.ffn_hidden = 4 * m.hidden;
  m.tie_embeddings = true;
  return m;
}

int run_step(std::map<std::string, std::string>& f) {
  ModelConfig m = shape(f.count("shape") ? f["shape"] : "tiny");
  const int batch = f.count("batch") ? std::stoi(f["batch"]) : 8;
  if (f.count("seq")) m.seq_len = std::stoi(f["seq"]);
  const int steps = f.count("steps") ? std::stoi(f["steps"]) : 10;
  const int warmup = f.count("warmup") ? std::stoi(f["warmup"]) : 2;
  ModelOptions mo;
  mo.micro_batch = batch;
  mo.checkpointing =
      f.count("ckpt") && f["ckpt"] == "1" ? ActivationCheckpointing::full : ActivationCheckpointing::none;
  auto tp = parallel::make_local_comm("tp");
  Model model(m, mo, *tp);
  model.init_parameters(1234);
  OptimizerConfig opt;
  opt.lr = 6e-4, opt.min_lr = 6e-5, opt.warmup = 10, opt.decay_steps = 1000;
  AdamW adamw(opt, decay_ranges(model.parameters()), {{0, model.numel()}});
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, m.vocab - 1);
  const int64_t n = int64_t(batch) * m.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n));
  std::vector<double> times, cpu;
  float loss = 0;
  const bool profiled = f.count("profile") && f["profile"] == "1";
  kernels::OpProfile profile(kernels::Device::cpu);
  if (profiled) profile.reserve(1 << 16);
  for (int s = 0; s < warmup + steps; ++s) {
    if (profiled && s >= warmup) profile.begin_timing();
    for (auto& t : tokens) t = tok(rng);
    for (auto& t : targets) t = tok(rng);
    const MicroBatch mb{kernels::host_tensor(tokens.data(), {batch, m.seq_len}),
                        kernels::host_tensor(targets.data(), {batch, m.seq_len})};
    const auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    model.zero_grads();
    loss = model.forward_backward(mb, 1.0f);
    const double norm = std::sqrt(grad_sum_squares(model.parameters(), 0));
    adamw.step(model.params(), model.grads(), lr_at(opt, s), clip_factor(norm, 1.0));
    if (s >= warmup) {
      times.push_back(seconds_since(t0));
      cpu.push_back(cpu_seconds() - c0);
    }
    if (profile.active()) profile.end();
  }
  if (profiled) {
    OpProfileSummary summary{"cpu", 0, warmup + 1, steps, 0.0, profile.dropped(), {}};
    for (double t : times) summary.step_seconds += t;
    for (const kernels::OpTotal& t : profile.totals())
      summary.rows.push_back({t.name, t.inside ? t.inside : "", t.side_stream, t.calls, t.seconds});
    for (const std::string& line : op_profile_table(summary)) std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::sort(times.begin(), times.end());
  std::sort(cpu.begin(), cpu.end());
  const double median = times[times.size() / 2], best = times.front();
  const double flops = training_flops_per_token(m) * double(n);
  std::printf(
      "step threads=%d params=%lld tokens=%lld median_s=%.5f best_s=%.5f tokens_per_s=%.1f gflops_per_step=%.3f "
      "achieved_gflops=%.1f cpu_s=%.5f loss=%.4f\n",
      omp_get_max_threads(), (long long)model.numel(), (long long)n, median, best, double(n) / median, flops / 1e9,
      flops / median / 1e9, cpu[cpu.size() / 2], loss);
  return 0;
}

int run_sgemm(std::map<std::string, std::string>& f) {
  const int size = f.count("size") ? std::stoi(f["size"]) : 2048;
  const int reps = f.count("reps") ? std::stoi(f["reps"]) : 5;
  std::vector<float> a(size_t(size) * size, 0.5f), b(a), c(a);
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, size, size, size, 1.0f, a.data(), size, b.data(), size, 0.0f,
                c.data(), size);
    const double t = seconds_since(t0);
    if (r > 0) best = std::min(best, t);
  }
  std::printf("sgemm threads=%d size=%d gflops=%.1f\n", omp_get_max_threads(), size,
              2.0 * double(size) * size * size / best / 1e9);
  return 0;
}

// Attention alone, forward + backward, on a [B, T, 3H, D] packed projection (tuning aid).
int run_attention(std::map<std::string, std::string>& f) {
  const int64_t b = f.count("batch") ? std::stoi(f["batch"]) : 8, t = f.count("seq") ? std::stoi(f["seq"]) : 256;
  const int64_t h = f.count("heads") ? std::stoi(f["heads"]) : 4, d = f.count("dim") ? std::stoi(f["dim"]) : 32;
  const int reps = f.count("reps") ? std::stoi(f["reps"]) : 20;
  const std::string isa = f.count("isa") ? f["isa"] : "automatic";
  kernels::cpu::set_attention_isa(isa == "blas"     ? kernels::cpu::AttentionIsa::blas
                                  : isa == "avx2"   ? kernels::cpu::AttentionIsa::avx2
                                  : isa == "avx512" ? kernels::cpu::AttentionIsa::avx512
                                                    : kernels::cpu::AttentionIsa::automatic);
  std::vector<float> qkv(size_t(b * t * 3 * h * d)), dqkv(qkv.size()), out(size_t(b * t * h * d)), dout(out.size()),
      lse(size_t(b * h * t));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& x : qkv) x = nd(rng);
  for (auto& x : dout) x = nd(rng);
  auto qkv_t = kernels::host_tensor(qkv.data(), {b, t, 3 * h, d}),
       out_t = kernels::host_tensor(out.data(), {b, t, h, d});
  double fwd = 1e30, bwd = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    kernels::attention_forward(out_t, kernels::host_tensor(lse.data(), {b * h * t}), qkv_t, h, h);
    fwd = std::min(fwd, seconds_since(t0));
    t0 = Clock::now();
    kernels::attention_backward(kernels::host_tensor(dqkv.data(), {b, t, 3 * h, d}),
                                kernels::host_tensor(dout.data(), {b, t, h, d}), qkv_t, out_t,
                                kernels::host_tensor(lse.data(), {b * h * t}), h, h);
    bwd = std::min(bwd, seconds_since(t0));
  }
  const double causal = double(b * h) * double(t) * double(t + 1) / 2 * double(d) * 2;  // one causal matmul
  std::printf(
      "attention isa=%s threads=%d b=%lld t=%lld h=%lld d=%lld fwd_ms=%.3f bwd_ms=%.3f fwd_gflops=%.1f "
      "bwd_gflops=%.1f\n",
      isa.c_str(), omp_get_max_threads(), (long long)b, (long long)t, (long long)h, (long long)d, fwd * 1e3, bwd * 1e3,
      2 * causal / fwd / 1e9, 4 * causal / bwd / 1e9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 2) throw Error("usage: step_bench step|sgemm [--flag value]...");
  std::map<std::string, std::string> f;
  for (int i = 2; i + 1 < argc; i += 2) f[std::string(argv[i]).substr(2)] = argv[i + 1];
  const std::string mode = argv[1];
  if (mode == "step") return run_step(f);
  if (mode == "sgemm") return run_sgemm(f);
  if (mode == "attention") return run_attention(f);
  throw Error("unknown mode " + mode);
} catch (const Error& e) {
  std::fprintf(stderr, "%s\n", format_error(e).c_str());
  return 2;
}
