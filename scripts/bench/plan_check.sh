#!/usr/bin/env bash
# Predicted against measured step time for CPU layouts of dp, tp, pp and ZeRO on this host (a
# benchmark, not a test; docs/plan.md §4 and docs/benchmarks.md record a run). Each layout: the
# prediction is `llmtrain run --dry-run`'s "predicted step time" (the performance model with the
# cpu row of the catalogue: this machine's measured sgemm rate shared by its ranks); the
# measurement is the median time between consecutive steps of a short run of the same recipe
# through `llmtrain run --nproc N` (each rank one thread when N > 1), after the first step.
#
#   scripts/bench/plan_check.sh [STEPS]     (default 12; build/llmtrain must exist)
#   ROUNDS=3 scripts/bench/plan_check.sh    (every layout predicted and run 3 times, round-robin; the
#                                            medians, and the predictions' range: each dry run
#                                            measures the sgemm rates again, so load moves them)
#   LAYERS=8 HIDDEN=256 SEQ=256 MICRO_BATCH=4 scripts/bench/plan_check.sh   (the model; these are the defaults)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
steps=${1:-12}
layers=${LAYERS:-8}
hidden=${HIDDEN:-256}
seq=${SEQ:-256}
micro_batch=${MICRO_BATCH:-4}
rounds=${ROUNDS:-1}
llmtrain=$root/${LLMTRAIN_BUILD_DIR:-build}/llmtrain
[[ -x $llmtrain ]] || { echo "build llmtrain first (scripts/test.sh or cmake --build build)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
mapfile -t corpus < <(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese)
"$llmtrain" prep --input "${corpus[@]}" --separator % --tokenizer byte --output data/ --valid-fraction 0.05 >/dev/null 2>&1

common=(--set model.layers="$layers" --set model.hidden="$hidden" --set model.heads=8 --set model.kv_heads=8
        --set model.seq_len="$seq" --set data.train=data/train --set data.valid=data/valid --set train.steps="$steps"
        --set train.micro_batch="$micro_batch" --set train.global_batch=$((4 * micro_batch)) --set optimizer.warmup=1
        --set log.every=1 --set eval.every=0 --set eval.batches=1 --set checkpoint.every=0 --set checkpoint.resume=none)
# name | ranks | overrides
layouts=(
  "one rank|1|"
  "dp 2|2|"
  "dp 2 zero 1|2|--set parallel.zero=1"
  "dp 2 zero 2|2|--set parallel.zero=2"
  "dp 2 zero 3|2|--set parallel.zero=3"
  "tp 2|2|--set parallel.tp=2"
  "tp 2 sp|2|--set parallel.tp=2 --set parallel.sequence_parallel=true"
  "pp 2 1f1b|2|--set parallel.pp=2"
  "pp 2 gpipe|2|--set parallel.pp=2 --set parallel.pp_schedule=gpipe"
)
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| layout | ranks | predicted step (s) | measured step (s) | predicted / measured | limit (predicted) |"
echo "| --- | --- | --- | --- | --- | --- |"
for ((round = 1; round <= rounds; round++)); do
  i=0
  for entry in "${layouts[@]}"; do
    IFS='|' read -r name ranks sets <<<"$entry"
    i=$((i + 1))
    threads=$((ranks > 1 ? 1 : 2))
    # shellcheck disable=SC2086
    args=("$root/recipes/tiny.yaml" "${common[@]}" $sets --set train.threads=$threads --set log.dir="run$i.$round")
    nproc=()
    ((ranks > 1)) && nproc=(--nproc "$ranks")
    "$llmtrain" run "${args[@]}" "${nproc[@]}" --dry-run | grep '^predicted step time: ' >"predicted$i.$round"
    "$llmtrain" run "${args[@]}" "${nproc[@]}" >"run$i.$round.log" 2>&1 || echo failed >"run$i.$round.failed"
  done
done
i=0
for entry in "${layouts[@]}"; do
  IFS='|' read -r name ranks sets <<<"$entry"
  i=$((i + 1))
  /usr/bin/python3 - "$name" "$ranks" "$i" "$rounds" <<'PY'
import glob, json, os, re, statistics, sys
name, ranks, i, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
pred, meas, limit = [], [], ""
for r in range(1, rounds + 1):
    line = open(f"predicted{i}.{r}").read()
    pred.append(float(re.match(r"predicted step time: ([0-9.e+-]+) s", line).group(1)))
    limit = re.search(r"; limit: (.*) \(docs", line).group(1)
    if os.path.exists(f"run{i}.{r}.failed"):
        print(f"| {name} | {ranks} | failed: " + open(f"run{i}.{r}.log").read()[-300:].replace("\n", " ") + " | | | |")
        sys.exit(0)
    recs = [json.loads(l) for l in open(f"run{i}.{r}/metrics.jsonl") if '"loss"' in l]
    meas += [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(recs[1:], recs[2:])]
p, m = statistics.median(pred), statistics.median(meas)
spread = f" ({min(pred):.3f}-{max(pred):.3f})" if rounds > 1 else ""
print(f"| {name} | {ranks} | {p:.3f}{spread} | {m:.3f} | {p / m:.2f} | {limit} |")
PY
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
