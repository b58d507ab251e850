#!/usr/bin/env bash
# The optimizer state in bf16 (optimizer.state_dtype) against fp32, in one invocation: the demo's
# run (recipes/tiny.yaml: 500 steps on Debian's fortunes) with fp32 and bf16 moments, in fp32 and
# in bf16 training, and bf16 training without the fp32 master (optimizer.master false: stochastic
# rounding) with either moments. Per run: the validation loss at the end (and its ratio to the
# same precision's fp32-state run with a master), the optimizer memory from the run's own "peaks over the run" line (and its
# ratio), and the median step time.
#
#   scripts/bench/state_dtype.sh [STEPS]    (default 500, the demo's; build/llmtrain must exist)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
steps=${1:-500}
llmtrain=$root/${LLMTRAIN_BUILD_DIR:-build}/llmtrain
[[ -x $llmtrain ]] || { echo "build llmtrain first (cmake --build build)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
mapfile -t corpus < <(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese)
"$llmtrain" prep --input "${corpus[@]}" --separator % --tokenizer byte --output data/ --valid-fraction 0.05 >/dev/null 2>&1
common=(--set data.train=data/train --set data.valid=data/valid --set train.steps="$steps" --set eval.every="$steps"
        --set checkpoint.every=0 --set checkpoint.resume=none --set log.every=1)
echo "# $(date -u +%FT%TZ) commit $(git -C "$root" rev-parse --short HEAD), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
runs=("fp32-fp32-true" "fp32-bf16-true" "bf16-fp32-true" "bf16-bf16-true" "bf16-fp32-false" "bf16-bf16-false")
for name in "${runs[@]}"; do
  IFS=- read -r precision state master <<<"$name"
  "$llmtrain" run "$root/recipes/tiny.yaml" "${common[@]}" --set train.precision=$precision \
    --set optimizer.state_dtype=$state --set optimizer.master=$master --set log.dir="$name" >"$name.log" 2>&1 ||
    { echo "$name failed:"; tail -5 "$name.log"; exit 1; }
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$steps" "${runs[@]}" <<'PY'
import json, re, statistics, sys
unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
rows = {}
for name in sys.argv[2:]:
    log = open(f"{name}.log", errors="replace").read()
    v, u = re.search(r"peaks over the run: .*optimizer ([0-9.]+) (\w+),", log).groups()
    recs = [json.loads(l) for l in open(f"{name}/metrics.jsonl")]
    steps = [r for r in recs if "loss" in r]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(steps, steps[1:])]
    rows[name] = dict(val=[r["val_loss"] for r in recs if "val_loss" in r][-1], opt=float(v) * unit[u],
                      step=statistics.median(times))
print(f"\n{sys.argv[1]} steps of recipes/tiny.yaml; ratios against the same precision's fp32 moments with a master")
print("| precision | moments | master | validation loss | optimizer MiB | step s |")
print("| --- | --- | --- | --- | --- | --- |")
for name, r in rows.items():
    precision, state, master = name.split("-")
    base = rows[precision + "-fp32-true"]
    master = "yes" if master == "true" else "no"
    print(f"| {precision} | {state} | {master} | {r['val']:.4f} ({r['val'] / base['val']:.4f}) | {r['opt'] / 2**20:.2f} "
          f"({r['opt'] / base['opt']:.3f}) | {r['step']:.4f} ({r['step'] / base['step']:.2f}) |")
PY
