#!/usr/bin/env bash
# Step time and memory of fp32, bf16 and fp16 training on this host, in one invocation: the same
# LLaMA-style model (recipes/tiny.yaml's shape, wider by default) trained for a few steps in each
# precision on one rank. Per precision: the median step time and tokens/s (from metrics.jsonl), the
# rank's peak bytes by kind (parameters, gradients, optimizer, activations: the run's own
# "peaks over the run" line) and the peak of all kinds at once, each as a ratio against fp32's in
# the same run. On the CPU 16-bit storage computes in fp32 (kernels/ops.h): it saves memory, and
# pays for widening and rounding every operand, so its step is slower, not faster.
#
#   scripts/bench/precision.sh [STEPS] [HIDDEN]   (default 8 steps, hidden 512; build/llmtrain must exist)
#   THREADS=2 scripts/bench/precision.sh          (train.threads; default 1, the steadiest on a shared VM)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
steps=${1:-8}
hidden=${2:-512}
threads=${THREADS:-1}
llmtrain=$root/${LLMTRAIN_BUILD_DIR:-build}/llmtrain
[[ -x $llmtrain ]] || { echo "build llmtrain first (cmake --build build)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
mapfile -t corpus < <(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese)
"$llmtrain" prep --input "${corpus[@]}" --separator % --tokenizer byte --output data/ --valid-fraction 0.05 >/dev/null 2>&1

common=(--set model.layers=4 --set model.hidden="$hidden" --set model.heads=8 --set model.kv_heads=8
        --set model.seq_len=128 --set data.train=data/train --set data.valid=data/valid --set train.steps="$steps"
        --set train.micro_batch=4 --set train.global_batch=16 --set optimizer.warmup=1 --set log.every=1
        --set eval.every=0 --set eval.batches=1 --set checkpoint.every=0 --set checkpoint.resume=none
        --set parallel.dp=1 --set train.threads="$threads" --set train.loss_scale.initial=1024)
echo "# $(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for p in fp32 bf16 fp16; do
  "$llmtrain" run "$root/recipes/tiny.yaml" "${common[@]}" --set train.precision=$p --set log.dir="$p" >"$p.log" 2>&1 ||
    { echo "$p failed:"; tail -5 "$p.log"; exit 1; }
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 - "$steps" "$hidden" "$threads" <<'PY'
import json, re, statistics, sys
unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
def size(text):
    v, u = text.split()
    return float(v) * unit[u]
rows = {}
for p in ("fp32", "bf16", "fp16"):
    log = open(f"{p}.log", errors="replace").read()
    m = re.search(r"peaks over the run: parameters ([0-9.]+ \w+), gradients ([0-9.]+ \w+), optimizer ([0-9.]+ \w+), "
                  r"activations ([0-9.]+ \w+), communication ([0-9.]+ \w+); total [0-9.]+ \w+; "
                  r"peak of all kinds at once ([0-9.]+ \w+)", log)
    par, grad, opt, act, comm, peak = (size(g) for g in m.groups())
    recs = [json.loads(l) for l in open(f"{p}/metrics.jsonl") if '"loss"' in l]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(recs, recs[1:])]
    rows[p] = dict(step=statistics.median(times), tps=statistics.median(r["tokens_per_s"] for r in recs[1:]),
                   par=par, grad=grad, opt=opt, act=act, peak=peak, loss=recs[-1]["loss"])
base = rows["fp32"]
mib = lambda b: f"{b / 2**20:.2f}"
print(f"\n{sys.argv[1]} steps, hidden {sys.argv[2]}, one rank of {sys.argv[3]} thread(s); MiB, and (ratio to fp32)")
print("| precision | step s | tokens/s | parameters | gradients | optimizer | activations | peak, all at once | last loss |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for p, r in rows.items():
    cell = lambda k: f"{mib(r[k])} ({r[k] / base[k]:.3f})"
    print(f"| {p} | {r['step']:.3f} ({r['step'] / base['step']:.2f}) | {r['tps']:.0f} | {cell('par')} | {cell('grad')} "
          f"| {cell('opt')} | {cell('act')} | {cell('peak')} | {r['loss']:.4f} |")
PY
