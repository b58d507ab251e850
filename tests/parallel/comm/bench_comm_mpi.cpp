// Benchmark (not a test) for scripts/bench/comm_mpi.sh, run under mpirun:
//  1. MpiComm::all_reduce (nonblocking + polled wait) against a plain blocking MPI_Allreduce on
//     the same data, for several sizes: the price of bounded waits, as a ratio.
//  2. The gradient bucket reducer with a simulated backward (compute between mark_ready calls):
//     the share of communication left exposed in finish(), against reducing everything after
//     backward (no overlap) and against one blocking MPI_Allreduce, measured in the same run.
//  3. The CPU a rank uses while it waits for a peer that computes.
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "parallel/bootstrap.h"
#include "parallel/comm/comm_mpi.h"
#include "parallel/grad_buckets.h"

using namespace llmtrain;
using namespace llmtrain::parallel;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// About `ms` milliseconds of arithmetic, standing in for one parameter's backward.
double compute(double ms) {
  const double end = now() + ms / 1000;
  volatile double x = 0;
  while (now() < end)
    for (int i = 0; i < 1000; ++i) x = x + std::sqrt(double(i));
  return x;
}

void bench_all_reduce(MpiComm& c) {
  if (c.rank() == 0) std::printf("all_reduce fp32 sum, median of runs (ours = nonblocking + polled wait)\n");
  for (int64_t n : {int64_t(1), int64_t(1024), int64_t(262144), int64_t(4194304)}) {
    std::vector<float> a(n, 1.0f);
    const int reps = n >= 262144 ? 20 : 200;
    std::vector<double> ours, raw;
    for (int r = 0; r < reps; ++r) {
      c.barrier();
      double t = now();
      c.all_reduce(kernels::host_tensor(a.data(), {n}), ReduceOp::sum);
      ours.push_back(now() - t);
      c.barrier();
      t = now();
      MPI_Allreduce(MPI_IN_PLACE, a.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, c.handle());
      raw.push_back(now() - t);
    }
    if (c.rank() == 0)
      std::printf("  %8lld floats: ours %9.1f us, MPI_Allreduce %9.1f us, ratio %.2f\n", static_cast<long long>(n),
                  median(ours) * 1e6, median(raw) * 1e6, median(ours) / median(raw));
  }
}

void bench_buckets(MpiComm& c) {
  const int params = 24;
  const int64_t each = 1 << 20;  // 4 MiB of fp32 per parameter, 96 MiB in all
  const double backward_ms = 4;  // per parameter
  std::vector<float> grads(params * each, 1.0f);
  std::vector<ParamRange> ranges;
  for (int p = 0; p < params; ++p) ranges.push_back({p * each, each});
  GradBuckets gb(c, kernels::host_tensor(grads.data(), {params * each}), ranges, 25.0);

  auto step = [&](bool overlap) {
    c.barrier();
    const double t0 = now();
    for (int p = params - 1; p >= 0; --p) {
      compute(backward_ms);
      if (overlap) gb.mark_ready(p);
    }
    const double t1 = now();
    gb.finish();  // without overlap: marks and sends everything here
    return std::pair(t1 - t0, now() - t1);
  };
  step(true);  // warm-up
  std::vector<double> exposed_overlap, exposed_after, backward, raw;
  for (int r = 0; r < 5; ++r) {
    auto [b1, e1] = step(true);
    auto [b2, e2] = step(false);
    backward.push_back((b1 + b2) / 2);
    exposed_overlap.push_back(e1);
    exposed_after.push_back(e2);
    c.barrier();
    const double t = now();
    MPI_Allreduce(MPI_IN_PLACE, grads.data(), static_cast<int>(grads.size()), MPI_FLOAT, MPI_SUM, c.handle());
    raw.push_back(now() - t);
  }
  if (c.rank() == 0)
    std::printf(
        "gradient buckets: %d params x %lld floats (%.0f MiB), bucket 25 MiB, %d buckets, backward %.0f ms\n"
        "  communication exposed after backward: overlapped %.1f ms, all after backward %.1f ms, ratio %.2f\n"
        "  reference: one blocking MPI_Allreduce of all gradients %.1f ms (overlapped exposed / it: %.2f)\n",
        params, static_cast<long long>(each), params * each * 4.0 / (1 << 20), static_cast<int>(gb.buckets().size()),
        median(backward) * 1e3, median(exposed_overlap) * 1e3, median(exposed_after) * 1e3,
        median(exposed_overlap) / median(exposed_after), median(raw) * 1e3, median(exposed_overlap) / median(raw));
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// A rank waiting in a collective for a peer that is still computing must not burn a core.
void bench_idle_wait(MpiComm& c) {
  float x = 1;
  c.barrier();
  const double cpu0 = cpu_seconds(), t0 = now();
  if (c.rank() == 0) compute(1000);
  c.all_reduce(kernels::host_tensor(&x, {1}), ReduceOp::sum);
  const double cpu = cpu_seconds() - cpu0, wall = now() - t0;
  if (c.rank() == 1)
    std::printf(
        "waiting 1 s in all_reduce for a rank that computes: the waiter used %.1f ms of CPU (%.1f%% of a core)\n",
        cpu * 1e3, 100 * cpu / wall);
}

}  // namespace

int main() {
  return rank_main(detect_launch_env(), {.timeout_s = 120.0, .flight_recorder = false}, [](Runtime& rt) {
    auto world = rt.take_world();
    auto& c = static_cast<MpiComm&>(*world);
    if (c.rank() == 0) std::printf("%d ranks\n", c.size());
    bench_all_reduce(c);
    bench_buckets(c);
    bench_idle_wait(c);
    return 0;
  });
}
