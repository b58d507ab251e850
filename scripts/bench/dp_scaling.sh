#!/usr/bin/env bash
# Data-parallel scaling on one 2-core machine: tokens/s of the `tiny` recipe at dp = 1 and dp = 2
# (one thread per rank, ranks through mpirun), the scaling efficiency, and the share of step time
# spent waiting for gradient all-reduces that backward did not hide (metrics.jsonl comm_exposed).
# For reference it also runs dp = 1 with two threads (both cores in one process).
#
#   scripts/bench/dp_scaling.sh [STEPS]      (default 60 steps; build/llmtrain must exist)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
steps=${1:-60}
llmtrain=$root/${LLMTRAIN_BUILD_DIR:-build}/llmtrain
[[ -x $llmtrain ]] || { echo "build llmtrain first (scripts/test.sh or cmake --build build)"; exit 1; }
source tests/parallel/mpi_env.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
mapfile -t corpus < <(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese)
"$llmtrain" prep --input "${corpus[@]}" --separator % --tokenizer byte --output data/ --valid-fraction 0.05 >/dev/null 2>&1

common=(--set data.train=data/train --set data.valid=data/valid --set train.steps=$steps --set log.every=5
        --set eval.every=0 --set eval.batches=1 --set checkpoint.every=0 --set checkpoint.resume=none
        --set optimizer.warmup=5
        # the shape docs/benchmarks.md's figures were measured at (tiny's before the demo was shortened)
        --set model.seq_len=256 --set train.micro_batch=2 --set train.global_batch=8)
# Median tokens/s and comm_exposed over the records after the first 20% of the run.
summary() {
  /usr/bin/python3 - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
recs = recs[len(recs) // 5:]
tps = statistics.median(r["tokens_per_s"] for r in recs)
exp = [r["comm_exposed"] for r in recs if "comm_exposed" in r]
print(f"{tps:.0f} {statistics.median(exp) if exp else 0:.4f}")
PY
}
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$llmtrain" run "$root/recipes/tiny.yaml" "${common[@]}" --set log.dir=dp1t1 --set train.threads=1 >dp1t1.log 2>&1
"$llmtrain" run "$root/recipes/tiny.yaml" "${common[@]}" --set log.dir=dp1t2 --set train.threads=2 >dp1t2.log 2>&1
mpi_run 900 2 "$llmtrain" run "$root/recipes/tiny.yaml" "${common[@]}" --set log.dir=dp2t1 --set train.threads=1 >dp2t1.log 2>&1
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
read -r t11 _ < <(summary dp1t1)
read -r t12 _ < <(summary dp1t2)
read -r t21 e21 < <(summary dp2t1)
/usr/bin/python3 - "$t11" "$t12" "$t21" "$e21" <<'PY'
import sys
t11, t12, t21, e21 = map(float, sys.argv[1:])
print("recipes/tiny.yaml (its global batch split over the ranks):")
print(f"  dp=1, 1 thread      {t11:8.0f} tok/s")
print(f"  dp=1, 2 threads     {t12:8.0f} tok/s   ({t12 / t11:.2f}× dp=1/1 thread)")
print(f"  dp=2, 1 thread each {t21:8.0f} tok/s   ({t21 / t11:.2f}× dp=1/1 thread: scaling efficiency {t21 / (2 * t11):.0%})")
print(f"  dp=2 communication not hidden by backward: {100 * e21:.1f}% of step time")
PY
