#!/usr/bin/env bash
# ZeRO memory and speed at dp 4 on this host: a LLaMA-style model of 54.5M parameters (16 layers,
# hidden 512, byte vocabulary; micro-batches of 4 sequences of 256 tokens) trained for a few steps at each ZeRO stage through mpirun. Per stage:
# the measured per-rank bytes of parameters, gradients and optimizer state (rank 0's peaks over the
# run, from its log), their sum next to the ZeRO paper's model-state formula for fp32 Adam
# (stage 0: 16Ψ, 1: 8Ψ + 8Ψ/N, 2: 4Ψ + 12Ψ/N, 3: 16Ψ/N; Ψ parameters, N = dp), the communication
# scratch and activations (outside the formula), the peak of everything at once, and the median
# step time relative to stage 0 in the same invocation. A stage this build refuses is listed as such.
#
#   scripts/bench/zero_memory.sh [STAGES] [STEPS]   (default "0 1 2 3", 6 steps; build/llmtrain must exist)
#   BUCKET_MB=4 scripts/bench/zero_memory.sh "0 3"   (parallel.bucket_mb for every stage; default 25:
#                                                   smaller units shrink the pools)
#   ROUNDS=3 scripts/bench/zero_memory.sh "0 3"      (runs the stages round-robin ROUNDS times and takes
#                                                   the median step over all rounds: steadier ratios
#                                                   on a shared machine; memory is the first round's)
#   DP=2 scripts/bench/zero_memory.sh "0 3"          (another data-parallel size, e.g. one rank per core)
#   MICRO_BATCH=1 SEQ=128 scripts/bench/zero_memory.sh "0 3"  (tokens per micro-batch; default 4 x 256
#                                                   = 1024. ZeRO 3's extra gathers cost the same whatever
#                                                   the batch, so their share of a step falls as it grows)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
stages=${1:-0 1 2 3}
steps=${2:-6}
bucket_mb=${BUCKET_MB:-25}
rounds=${ROUNDS:-1}
dp=${DP:-4}
micro_batch=${MICRO_BATCH:-4}
seq=${SEQ:-256}
llmtrain=$root/${LLMTRAIN_BUILD_DIR:-build}/llmtrain
[[ -x $llmtrain ]] || { echo "build llmtrain first (scripts/test.sh or cmake --build build)"; exit 1; }
source tests/parallel/mpi_env.sh
mpi_transport_as_llmtrain_run  # what a user's `llmtrain run` gets here
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
mapfile -t corpus < <(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese)
"$llmtrain" prep --input "${corpus[@]}" --separator % --tokenizer byte --output data/ --valid-fraction 0.05 >/dev/null 2>&1

model=(--set model.layers=16 --set model.hidden=512 --set model.heads=8 --set model.kv_heads=8 --set model.seq_len="$seq")
common=(--set data.train=data/train --set data.valid=data/valid --set train.steps="$steps" --set train.micro_batch="$micro_batch"
        --set train.global_batch=$((dp * micro_batch)) --set train.threads=1 --set optimizer.warmup=1 --set log.every=1
        --set eval.every=0 --set eval.batches=1 --set checkpoint.every=0 --set checkpoint.resume=none
        --set parallel.bucket_mb="$bucket_mb")
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((round = 1; round <= rounds; round++)); do
  for z in $stages; do
    status=0
    mpi_run 1200 $dp "$llmtrain" run "$root/recipes/tiny.yaml" "${model[@]}" "${common[@]}" --set parallel.zero="$z" \
      --set log.dir="z$z.r$round" >"z$z.r$round.log" 2>&1 || status=$?
    echo "$status" >"z$z.r$round.status"
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 - "$dp" "$bucket_mb" "$rounds" "$micro_batch x $seq" $stages <<'PY'
import json, re, statistics, sys
dp = int(sys.argv[1]); bucket_mb = sys.argv[2]; rounds = int(sys.argv[3]); tokens = sys.argv[4]
stages = [int(s) for s in sys.argv[5:]]
unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
def size(text):
    v, u = text.split()
    return float(v) * unit[u]
def count(text):
    m = re.match(r"([0-9.]+)([KMBT]?)", text)
    return float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[m.group(2)]
formula = {0: lambda p, n: 16 * p, 1: lambda p, n: 8 * p + 8 * p / n, 2: lambda p, n: 4 * p + 12 * p / n,
           3: lambda p, n: 16 * p / n}
rows, base_step = [], None
for z in stages:
    log = open(f"z{z}.r1.log", errors="replace").read()
    status = max(int(open(f"z{z}.r{k}.status").read()) for k in range(1, rounds + 1))
    if status != 0:
        why = "not supported yet" if "not supported yet" in log else f"exit {status}"
        rows.append((z, None, why)); continue
    psi = count(re.search(r"model: ([0-9.]+[KMBT]?) parameters", log).group(1))
    m = re.search(r"peaks over the run: parameters ([0-9.]+ \w+), gradients ([0-9.]+ \w+), optimizer ([0-9.]+ \w+), "
                  r"activations ([0-9.]+ \w+), communication ([0-9.]+ \w+); total [0-9.]+ \w+; "
                  r"peak of all kinds at once ([0-9.]+ \w+)", log)
    par, grad, opt, act, comm, peak = (size(g) for g in m.groups())
    times = []
    for k in range(1, rounds + 1):
        recs = [json.loads(l) for l in open(f"z{z}.r{k}/metrics.jsonl") if '"loss"' in l]
        times += [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(recs, recs[1:])]
    step = statistics.median(times)
    if z == 0: base_step = step
    rows.append((z, dict(psi=psi, par=par, grad=grad, opt=opt, act=act, comm=comm, peak=peak, step=step,
                         loss=recs[-1]["loss"]), ""))
mib = lambda b: f"{b / 2**20:.1f}"
print(f"\ndp {dp}, micro-batch {tokens} tokens, bucket_mb {bucket_mb}, {rounds} round(s), per rank, MiB (Ψ from the run's parameter count; "
      "formula: fp32 Adam model states; communication: the ZeRO pools, outside the formula)")
print("| zero | parameters | gradients | optimizer | model states | formula | states/formula | communication "
      "| activations | peak, all at once | step time vs zero 0 | last loss |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for z, r, why in rows:
    if r is None:
        print(f"| {z} | {why} | | | | | | | | | | |"); continue
    states = r["par"] + r["grad"] + r["opt"]
    f = formula[z](r["psi"], dp)  # bytes: the formulas count bytes per parameter
    ratio = f"{r['step'] / base_step:.3f}" if base_step else "n/a"
    print(f"| {z} | {mib(r['par'])} | {mib(r['grad'])} | {mib(r['opt'])} | {mib(states)} | {mib(f)} | "
          f"{states / f:.3f} | {mib(r['comm'])} | {mib(r['act'])} | {mib(r['peak'])} | {ratio} | {r['loss']:.4f} |")
PY
