// Benchmark (not a test) for scripts/bench/cp_ring.sh, run under mpirun with N ranks as one cp
// group: how much of ring attention's transfer time hides behind the attention of the block a rank
// holds. Three timings per rank, each the median of several runs after a barrier:
//   ring      ring_attention_forward (transfers started before each step's attention, waited after)
//   compute   the same attention calls on blocks of the same shapes and positions, no transfer
//   transfer  the ring's cp − 1 block exchanges alone, back to back
// hidden = (compute + transfer − ring) / transfer: 1 when every transfer overlapped attention, 0
// when none did. On the CPU Open MPI moves a message only while a rank is inside an MPI call (we
// poll with progress() between attention blocks), so little overlap is expected.
//
//   bench_cp_ring [SEQ] [HEADS] [HEAD_DIM] [REPS]   (default 16384 4 16 5)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/ops.h"
#include "parallel/bootstrap.h"
#include "parallel/context_parallel.h"

using namespace llmtrain;
using namespace llmtrain::parallel;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t seq = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int64_t heads = argc > 2 ? std::atoll(argv[2]) : 4;
  const int64_t d = argc > 3 ? std::atoll(argv[3]) : 16;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 5;
  return rank_main(detect_launch_env(), {.timeout_s = 600.0, .flight_recorder = false}, [&](Runtime& rt) {
    auto world = rt.take_world();
    Comm& cp = *world;
    const int p = cp.size(), r = cp.rank();
    const int64_t rows = seq / p, c = rows / 2, w = 3 * heads;
    const RingScratchSizes z = ring_scratch_sizes(1, rows, heads, heads, d);
    std::vector<float> qkv(size_t(z.kv)), out(size_t(rows * heads * d)), lse(size_t(rows * heads));
    std::vector<float> kv0(size_t(z.kv)), kv1(size_t(z.kv)), po(size_t(z.part_out)), pl(size_t(z.part_lse));
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    RingScratch scratch;
    scratch.kv[0] = kernels::host_tensor(kv0.data(), {z.kv});
    scratch.kv[1] = kernels::host_tensor(kv1.data(), {z.kv});
    scratch.part_out = kernels::host_tensor(po.data(), {z.part_out});
    scratch.part_lse = kernels::host_tensor(pl.data(), {z.part_lse});
    const Tensor q4 = kernels::host_tensor(qkv.data(), {1, rows, w, d});
    const Tensor o = kernels::host_tensor(out.data(), {rows, heads * d});
    const Tensor l = kernels::host_tensor(lse.data(), {rows * heads});
    auto block = [&](const Tensor& t, int half) { return t.flat(half * c * w * d, c * w * d).view({1, c, w, d}); };
    auto part_out = scratch.part_out.view({1, c, heads, d});
    auto part_lse = scratch.part_lse.view({1, heads, c});
    std::vector<double> ring, compute, transfer;
    for (int rep = 0; rep < reps; ++rep) {
      cp.barrier();
      double t = now();
      ring_attention_forward(cp, o, l, q4, heads, heads, scratch);
      ring.push_back(now() - t);
      cp.barrier();
      t = now();
      for (int s = 0; s < p; ++s) {
        const int src = (r - s + p) % p;
        for (int qh = 0; qh < 2; ++qh)
          for (int kh = 0; kh < 2; ++kh) {
            const int qc = cp_chunk(r, qh, p), kc = cp_chunk(src, kh, p);
            if (kc > qc) continue;
            kernels::attention_forward(part_out, part_lse, block(q4, qh), block(q4, kh), block(q4, kh),
                                       kernels::Tensor{},
                                       {.heads = heads,
                                        .kv_heads = heads,
                                        .q_head = 0,
                                        .k_head = heads,
                                        .v_head = 2 * heads,
                                        .q_begin = qc * c,
                                        .kv_begin = kc * c,
                                        .causal = true});
          }
      }
      compute.push_back(now() - t);
      cp.barrier();
      t = now();
      for (int s = 0; s + 1 < p; ++s) {
        const Tensor from = s == 0 ? q4.flat(0, z.kv) : scratch.kv[(s - 1) % 2], to = scratch.kv[s % 2];
        cp.exchange_async(
              {{Transfer::Kind::send, from, (r + 1) % p, 1}, {Transfer::Kind::recv, to, (r + p - 1) % p, 1}})
            ->wait();
      }
      transfer.push_back(now() - t);
    }
    const double tr = median(ring), tc = median(compute), tx = median(transfer);
    std::vector<float> mine{float(tr), float(tc), float(tx)}, all(size_t(3 * p));
    cp.all_gather(kernels::Tensor(mine.data(), kernels::DType::fp32, {3}),
                  kernels::Tensor(all.data(), kernels::DType::fp32, {int64_t(3 * p)}));
    if (r == 0) {
      std::printf(
          "ring attention forward, cp %d, one sequence of %lld tokens, %lld heads of %lld, fp32; block %.1f MiB\n", p,
          static_cast<long long>(seq), static_cast<long long>(heads), static_cast<long long>(d),
          double(z.kv) * 4 / (1 << 20));
      std::printf("%5s %10s %10s %10s %8s\n", "rank", "ring ms", "compute", "transfer", "hidden");
      for (int i = 0; i < p; ++i) {
        const double a = all[size_t(3 * i)], b = all[size_t(3 * i + 1)], x = all[size_t(3 * i + 2)];
        std::printf("%5d %10.1f %10.1f %10.1f %7.0f%%\n", i, a * 1e3, b * 1e3, x * 1e3,
                    x > 0 ? 100 * std::clamp((b + x - a) / x, -1.0, 1.0) : 0.0);
      }
    }
    return 0;
  });
}
