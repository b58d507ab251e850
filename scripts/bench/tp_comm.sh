#!/usr/bin/env bash
# Tensor-parallel communication volume per training step: the bytes each tp rank sends, counted by
# the communicator (tests/parallel/comm/comm_counting.h around the mesh's tp group; ring volumes, so the same
# on any backend), next to Megatron-LM's formula: per layer and micro-batch, two all-reduces of
# b·s·h in forward and two in backward (a ring all-reduce sends 2(n−1)/n of the buffer per rank),
# and with sequence parallelism the same volume as reduce-scatters + all-gathers. Our model also
# crosses at the embedding and the head (one all-reduce's worth each per micro-batch), the
# vocab-parallel loss all-reduces 3 floats per token, and with sequence parallelism the replicated
# norm/bias gradients are all-reduced (one packed all-reduce per layer and one for the final norm).
# The script checks that the count equals that sum exactly.
#
#   scripts/bench/tp_comm.sh [FAMILY] [LAYERS] [HIDDEN] [HEADS] [SEQ] [MICRO_BATCH] [MICRO_BATCHES]
#   (default gpt2 4 512 8 256 2 2; build/tests/tp_comm_bench must exist)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${LLMTRAIN_BUILD_DIR:-build}
bench=$build/tests/tp_comm_bench
# Not part of the default build (scripts/test.sh): built here.
cmake --build "$build" --target tp_comm_bench -j "$(nproc)" >/dev/null
family=${1:-gpt2} layers=${2:-4} hidden=${3:-512} heads=${4:-8} seq=${5:-256} mb=${6:-2} m=${7:-2}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for tp in 2 4; do
  for sp in 0 1; do
    "$bench" --family "$family" --layers "$layers" --hidden "$hidden" --heads "$heads" --seq "$seq" \
      --micro-batch "$mb" --micro-batches "$m" --tp $tp --sp $sp --steps 1 >>"$out"
  done
done
/usr/bin/python3 - "$out" <<'PY'
import sys
rows = [dict(kv.split("=") for kv in line.split()) for line in open(sys.argv[1])]
def mib(x): return f"{x / 2**20:9.3f}"
print(f"family {rows[0]['family']}, layers {rows[0]['layers']}, hidden {rows[0]['hidden']}, seq {rows[0]['seq']}, "
      f"micro_batch {rows[0]['micro_batch']}, {rows[0]['micro_batches']} micro-batches per step; fp32; MiB sent per rank per step")
print(f"{'tp':>3} {'sp':>3} {'counted':>9} {'Megatron':>9} {'emb+head':>9} {'loss':>9} {'sp grads':>9} {'sum':>9}  "
      f"{'AR / RS / AG calls':>18}  check")
bad = 0
for r in rows:
    n, L, d, s, b, m = (int(r[k]) for k in ("tp", "layers", "hidden", "seq", "micro_batch", "micro_batches"))
    sp, llama = r["sp"] == "1", r["family"] == "llama"
    bsh = b * s * d * 4                       # bytes of one [b·s, h] fp32 activation
    ar = lambda B: 2 * (n - 1) * B // n       # ring all-reduce: bytes each rank sends
    megatron = m * L * 4 * ar(bsh)            # 2 forward + 2 backward all-reduces per layer
    ends = m * 2 * ar(bsh)                    # embedding (forward) and head (backward) crossings
    loss = m * ar(3 * b * s * 4)              # row maxima (N) and [Σ exp, target logit] (2N)
    grads = m * (L * ar((2 if llama else 6) * d * 4) + ar((1 if llama else 2) * d * 4)) if sp else 0
    total = megatron + ends + loss + grads
    counted = int(r["bytes_per_step"])
    ok = counted == total
    bad += not ok
    calls = f"{r['all_reduce_calls']} / {r['reduce_scatter_calls']} / {r['all_gather_calls']}"
    print(f"{n:>3} {'on' if sp else 'off':>3} {mib(counted)} {mib(megatron)} {mib(ends)} {mib(loss)} {mib(grads)} "
          f"{mib(total)}  {calls:>18}  {'= sum' if ok else f'DIFFERS by {counted - total} B'}")
sys.exit(1 if bad else 0)
PY
