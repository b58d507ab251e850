#!/usr/bin/env bash
# Before/after check for a change that must not change behaviour: builds another revision of this
# repository and the current tree, and compares the two `llmtrain` binaries on recipes/tiny.yaml
# (the current tree's copy, for both):
#   (a) step time: N runs of each binary, strictly alternating (baseline, current, baseline, ...),
#       so that a drift in the machine's load hits both alike. A run's step time is the median
#       per-step wall time after its first 20% of steps (metrics.jsonl `elapsed_s` differences,
#       `log.every: 1`); the script prints, per binary, the median over its runs with min and max,
#       and the ratio current/baseline;
#   (b) losses: one run of each binary at dp = 1 (one process, T threads) and dp = 2 (two ranks
#       through mpirun, one thread each), with evaluations at the middle and the end; the `loss`,
#       `grad_norm` and `val_loss` values of metrics.jsonl must be the same strings, record for record.
#
#   scripts/bench/step_compare.sh --baseline REV [--runs N] [--steps S] [--threads T]
#   scripts/bench/step_compare.sh --baseline REV --layouts [--steps S]
#
# --layouts replaces (a) and (b) by the losses of a matrix of layouts, each row against the
# baseline's same row, bitwise (a reshaping of the code must leave every one unchanged): dp 1, dp 2
# with ZeRO 1, dp 2 at ZeRO 3 with nvme offload and offload_params, tp 2 with sequence parallelism,
# pp 2 interleaved (2 virtual stages), pp 2 zero-bubble, cp 2, ep 2 with a MoE model (two ranks of
# one thread each through mpirun), bf16 on one rank, and one rank on the CUDA backend in the SIMT
# simulator (10 steps at seq 64: a simulated step takes seconds); and each row's final checkpoint,
# every tensor slice's checksum in the manifest and the shard files' bytes. That last row needs a
# simulator build of both revisions (cmake -DLLMTRAIN_CUDA=SIM; the current one in
# ${LLMTRAIN_SIM_BUILD_DIR:-build-sim}).
#
# REV is any git revision (hash, tag, HEAD~3). It is built once into .cache/step_compare/<full hash>/
# (git-ignored) from a temporary git worktree that is removed again, and reused by later
# invocations (its simulator build into .cache/step_compare/<full hash>-sim/). The current tree is built in ${LLMTRAIN_BUILD_DIR:-build}. Both use scripts/test.sh's
# cmake flags and build only the `llmtrain` target.
#
# The rule a reader could get wrong: the timing is a report, not a test. Nothing here judges
# "faster" or "slower" by a threshold for its exit status; it is 0 unless a build or run failed (1)
# or the losses differ (1). Fewer than 5 runs are accepted for trying the script out, with a
# warning: they are not the documented measurement. On a shared machine, read the min/max spread
# of each binary before reading the ratio.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

usage() { echo "usage: $0 --baseline REV [--runs N] [--steps S] [--threads T] [--layouts]" >&2; exit 2; }
baseline="" runs=5 steps=60 threads=$(nproc) layouts=0
while (($#)); do
  case $1 in
    --baseline) baseline=${2:-}; shift 2 || usage ;;
    --layouts) layouts=1; shift ;;
    --runs) runs=${2:-}; shift 2 || usage ;;
    --steps) steps=${2:-}; shift 2 || usage ;;
    --threads) threads=${2:-}; shift 2 || usage ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
  esac
done
[[ -n $baseline ]] || usage
for v in runs steps threads; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "step_compare: --$v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
((steps >= 5)) || { echo "step_compare: --steps must be at least 5 (the first 20% are not timed)" >&2; exit 2; }

python=/usr/bin/python3
jobs=${LLMTRAIN_JOBS:-$(nproc)}
cmake_flags=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90-real -DLLMTRAIN_TESTS=ON)
build_limit=${STEP_COMPARE_BUILD_TIMEOUT:-3600}  # seconds for one configure + build
run_limit=$((300 + 10 * steps))                   # seconds for one training run (a busy 2-core machine included)
recipe=$root/recipes/tiny.yaml
cache=$root/.cache/step_compare

say() { echo "step_compare: $*"; }
# Prints what failed and the tail of its log, then exits 1.
fail() {  # message log
  echo "step_compare: FAILED: $1" >&2
  if [[ -f ${2:-} ]]; then
    echo "---- last 40 lines of $2" >&2
    tail -n 40 "$2" >&2
    echo "----" >&2
  fi
  exit 1
}

base_hash=$(git rev-parse --verify --quiet "$baseline^{commit}") ||
  { echo "step_compare: '$baseline' is not a commit of this repository" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/step_compare.XXXXXX")
pending=""  # the cache folder of a baseline being built: its worktree and build folder go on any exit
cleanup() {
  if [[ -n $pending ]]; then
    git worktree remove --force "$pending/src" >/dev/null 2>&1 || rm -rf "$pending/src"
    git worktree prune
    rm -rf "$pending/build"
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# The baseline: a worktree at REV under the cache, built, its binary kept, the worktree and build
# folder removed. A lock per revision keeps two invocations from building the same one at once.
# FLAVOUR "" is scripts/test.sh's build, "sim" the simulator's (-DLLMTRAIN_CUDA=SIM).
build_baseline() {  # [FLAVOUR]
  local flavour=${1:-} dir=$cache/$base_hash flags=("${cmake_flags[@]}")
  if [[ $flavour == sim ]]; then
    dir=$cache/$base_hash-sim
    flags+=(-DLLMTRAIN_CUDA=SIM)
  fi
  local bin=$dir/llmtrain
  mkdir -p "$dir"
  exec 9>"$dir/lock"
  flock -w "$build_limit" 9 || fail "another step_compare held $dir/lock for ${build_limit}s"
  if [[ -x $bin ]]; then
    say "baseline $base_hash${flavour:+ ($flavour)}: reusing $bin"
    exec 9>&-
    built=$bin
    return
  fi
  say "baseline $base_hash${flavour:+ ($flavour)}: building in $dir (log: $dir/build.log)"
  rm -rf "$dir/src" "$dir/build"
  git worktree prune
  pending=$dir
  git worktree add --detach --quiet "$dir/src" "$base_hash" >"$dir/build.log" 2>&1 ||
    fail "git worktree add for $base_hash" "$dir/build.log"
  local status=0
  {
    timeout -k 10 "$build_limit" cmake -S "$dir/src" -B "$dir/build" "${flags[@]}" &&
      timeout -k 10 "$build_limit" nice cmake --build "$dir/build" -j "$jobs" --target llmtrain
  } >>"$dir/build.log" 2>&1 || status=$?
  ((status == 0)) || fail "building baseline $base_hash (status $status)" "$dir/build.log"
  cp "$dir/build/llmtrain" "$bin.partial"
  mv "$bin.partial" "$bin"
  git worktree remove --force "$dir/src"
  git worktree prune
  rm -rf "$dir/build"
  pending=""
  exec 9>&-
  built=$bin
}

build_current() {  # [FLAVOUR]
  local flavour=${1:-} build=${LLMTRAIN_BUILD_DIR:-build} flags=("${cmake_flags[@]}") status=0
  if [[ $flavour == sim ]]; then
    build=${LLMTRAIN_SIM_BUILD_DIR:-build-sim}
    flags+=(-DLLMTRAIN_CUDA=SIM)
  fi
  say "current tree: building $build/llmtrain"
  {
    timeout -k 10 "$build_limit" cmake -S . -B "$build" "${flags[@]}" &&
      timeout -k 10 "$build_limit" nice cmake --build "$build" -j "$jobs" --target llmtrain
  } >"$work/build_current.log" 2>&1 || status=$?
  ((status == 0)) || fail "building the current tree in $build (status $status)" "$work/build_current.log"
  built=$root/$build/llmtrain
}

build_baseline
base_bin=$built
build_current
cur_bin=$built
if ((layouts)); then
  build_baseline sim
  base_sim_bin=$built
  build_current sim
  cur_sim_bin=$built
fi

cur_hash=$(git rev-parse HEAD)
mapfile -t changes < <(git status --porcelain | cut -c4-)
say "baseline: $baseline = $base_hash: $("$base_bin" --version 2>&1 | head -n 1 || echo '?')"
if ((${#changes[@]})); then
  say "current:  $cur_hash WITH ${#changes[@]} uncommitted change(s): $(IFS=,; echo "${changes[*]:0:8}")$( ((${#changes[@]} <= 8)) || echo ', ...')"
else
  say "current:  $cur_hash, no uncommitted changes"
fi
say "          $("$cur_bin" --version 2>&1 | head -n 1 || echo '?')"
[[ $base_hash == "$cur_hash" && ${#changes[@]} == 0 ]] && say "note: the baseline is the current commit (a self-check)"

# The fortunes dataset, prepared as scripts/bench/dp_scaling.sh does, with the current binary.
source tests/parallel/mpi_env.sh
mapfile -t corpus < <(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese)
timeout -k 10 600 "$cur_bin" prep --input "${corpus[@]}" --separator % --tokenizer byte --output "$work/data/" \
  --valid-fraction 0.05 >"$work/prep.log" 2>&1 || fail "llmtrain prep of the fortunes" "$work/prep.log"

common=(--set data.train="$work/data/train" --set data.valid="$work/data/valid" --set train.steps="$steps"
        --set log.every=1 --set checkpoint.every=0 --set checkpoint.resume=none --set optimizer.warmup=5
        # the shape docs/benchmarks.md's figures were measured at (tiny's before the demo was shortened)
        --set model.seq_len=256 --set train.micro_batch=2 --set train.global_batch=8)
timing=(--set eval.every=0 --set eval.batches=1 --set train.threads="$threads")
half=$((steps / 2))
losses=(--set eval.every=$((half > 0 ? half : 1)) --set eval.batches=2)
# --layouts: each run ends in a checkpoint, compared too.
((layouts)) && losses+=(--set checkpoint.every="$steps" --set checkpoint.keep=1)

# One training run of `bin` into $work/NAME (its metrics.jsonl) and $work/NAME.log.
train_run() {  # label bin name [overrides...]
  local label=$1 bin=$2 name=$3 status=0
  shift 3
  timeout -k 10 "$run_limit" "$bin" run "$recipe" "${common[@]}" --set log.dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || status=$?
  ((status == 0)) || fail "$label run $name (status $status)" "$work/$name.log"
}
# Two ranks through mpirun, one thread each.
train_run_dp2() {  # label bin name [overrides...]
  local label=$1 bin=$2 name=$3 status=0
  shift 3
  mpi_run "$run_limit" 2 "$bin" run "$recipe" "${common[@]}" --set log.dir="$work/$name" --set train.threads=1 "$@" \
    >"$work/$name.log" 2>&1 || status=$?
  ((status == 0)) || fail "$label run $name at dp 2 (status $status)" "$work/$name.log"
}

# A run's step time in seconds: the median per-step wall time after its first 20% of steps.
step_time() {
  "$python" - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
recs = [r for r in map(json.loads, open(sys.argv[1])) if "elapsed_s" in r]
dts, prev_step, prev_t = [], 0, 0.0
for r in recs:
    dts.append((r["elapsed_s"] - prev_t) / (r["step"] - prev_step))
    prev_step, prev_t = r["step"], r["elapsed_s"]
if len(dts) < 2:
    sys.exit(f"{sys.argv[1]}: {len(dts)} step records")
print(f"{statistics.median(dts[len(dts) // 5:]):.6f}")
PY
}

if ((!layouts)); then
echo
say "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(lscpu | sed -nE 's/^Model name: +//p')"
say "recipe $recipe, $steps steps, log.every 1, train.threads $threads, $runs alternating runs of each binary"
((runs >= 5)) || say "WARNING: $runs runs of each: fewer than 5 is not the documented measurement (try-out only)"
say "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
base_times=() cur_times=()
for ((i = 1; i <= runs; i++)); do
  train_run baseline "$base_bin" "time_base_$i" "${timing[@]}"
  base_times+=("$(step_time "$work/time_base_$i")")
  train_run current "$cur_bin" "time_cur_$i" "${timing[@]}"
  cur_times+=("$(step_time "$work/time_cur_$i")")
  awk -v i="$i" -v n="$runs" -v b="${base_times[-1]}" -v c="${cur_times[-1]}" \
    'BEGIN { printf "  run %d/%d: baseline %7.1f ms/step   current %7.1f ms/step\n", i, n, 1000 * b, 1000 * c }'
done
say "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
"$python" - "${base_times[*]}" "${cur_times[*]}" <<'PY'
import statistics, sys
base = [float(x) for x in sys.argv[1].split()]
cur = [float(x) for x in sys.argv[2].split()]
mb, mc = statistics.median(base), statistics.median(cur)
print("step time (median over runs of each run's median step after its first 20%):")
for name, ts, m in (("baseline", base, mb), ("current", cur, mc)):
    print(f"  {name:9} {1000 * m:7.1f} ms/step   (min {1000 * min(ts):.1f}, max {1000 * max(ts):.1f}, "
          f"spread {100 * (max(ts) / min(ts) - 1):.1f}%)")
ratio = mc / mb
verdict = "within 3%" if abs(ratio - 1) <= 0.03 else \
    f"NOT within 3% (current {100 * abs(ratio - 1):.1f}% {'slower' if ratio > 1 else 'faster'})"
print(f"  ratio current/baseline {ratio:.3f}: {verdict}")
if max(max(base) / min(base), max(cur) / min(cur)) > 1.03:
    print("  note: one binary's own runs spread more than 3%: the machine was too noisy to resolve 3%")
PY
fi

# Losses: the same strings in both, record for record. A row: its name, its rank count, and its
# overrides; "sim" rows run the simulator builds.
rows=()
if ((layouts)); then
  rows=("dp1|1|"
        "dp2-zero1|2|--set parallel.zero=1"
        "dp2-zero3-nvme|2|--set parallel.zero=3 --set parallel.offload=nvme --set parallel.offload_path=$work/offload --set parallel.offload_params=true"
        "tp2-sp|2|--set parallel.tp=2 --set parallel.sequence_parallel=true"
        "pp2-interleaved|2|--set parallel.pp=2 --set parallel.pp_schedule=interleaved --set parallel.virtual_stages=2"
        "pp2-zero-bubble|2|--set parallel.pp=2 --set parallel.pp_schedule=zero_bubble"
        "cp2|2|--set parallel.cp=2"
        "ep2-moe|2|--set model.moe.experts=4 --set model.moe.top_k=2 --set parallel.ep=2"
        "bf16|1|--set train.precision=bf16"
        "cuda-sim|1|--set train.device=cuda --set model.seq_len=64 --set train.micro_batch=1 --set train.global_batch=2 --set train.steps=10 --set train.threads=1")
else
  rows=("dp1|1|" "dp2|2|")
fi
echo
say "losses: $steps steps (cuda-sim: 10), log.every 1, evaluations at step $half and $steps (eval.batches 2)"
names=()
for row in "${rows[@]}"; do
  IFS='|' read -r name np extra <<<"$row"
  read -r -a overrides <<<"$extra"
  b=$base_bin c=$cur_bin
  [[ $name == cuda-sim ]] && b=$base_sim_bin c=$cur_sim_bin
  for side in base cur; do
    bin=$b label=baseline
    [[ $side == cur ]] && bin=$c label=current
    if ((np == 1)); then
      train_run "$label" "$bin" "loss_${side}_$name" "${losses[@]}" --set train.threads="$threads" "${overrides[@]}"
    else
      train_run_dp2 "$label" "$bin" "loss_${side}_$name" "${losses[@]}" "${overrides[@]}"
    fi
  done
  names+=("$name")
done
status=0
"$python" - "$work" "${names[@]}" <<'PY' || status=$?
import json, sys
work, names = sys.argv[1], sys.argv[2:]
fields = ("loss", "grad_norm", "val_loss")

def values(path):
    # Numbers kept as the text metrics.jsonl holds: equal strings are equal doubles, bit for bit.
    out = []
    for line in open(path):
        rec = json.loads(line, parse_float=str, parse_int=str, parse_constant=str)
        out += [(rec.get("step"), f, "null" if rec[f] is None else rec[f]) for f in fields if f in rec]
    return out

same = True
for name in names:
    base = values(f"{work}/loss_base_{name}/metrics.jsonl")
    cur = values(f"{work}/loss_cur_{name}/metrics.jsonl")
    for side, vals in (("baseline", base), ("current", cur)):
        n_loss = sum(f == "loss" for _, f, _ in vals)
        if n_loss == 0:
            sys.exit(f"step_compare: FAILED: {name} {side}: no loss records")
    differ = next(((b, c) for b, c in zip(base, cur) if b != c), None)
    if differ:
        (sb, fb, vb), (sc, fc, vc) = differ
        print(f"  {name:16} DIFFER: first at step {sb} field {fb}: baseline {vb}, current {vc}")
        same = False
    elif len(base) != len(cur):
        print(f"  {name:16} DIFFER: baseline has {len(base)} values, current {len(cur)}")
        same = False
    else:
        steps = sum(f == "loss" for _, f, _ in base)
        print(f"  {name:16} bitwise identical: {len(base)} values ({steps} steps)")
print("losses: " + ("bitwise identical in every row" if same else "DIFFER"))
sys.exit(0 if same else 1)
PY
if ((layouts)); then
  # Each row's last checkpoint: every slice's checksum in its manifest and every shard file's
  # bytes (the manifest's recipe names each run's own paths, so its other fields are not compared).
  "$python" - "$work" "${names[@]}" <<'PY' || status=1
import glob, hashlib, json, os, sys
work, names = sys.argv[1], sys.argv[2:]

def checkpoint(run):
    steps = sorted(glob.glob(f"{work}/{run}/ckpt/step_*"))
    if not steps:
        sys.exit(f"step_compare: FAILED: {run}: no checkpoint")
    d = steps[-1]
    m = json.load(open(f"{d}/manifest.json"))
    sums = json.dumps(m.get("tensors", m), sort_keys=True)
    files = {os.path.basename(f): hashlib.sha256(open(f, "rb").read()).hexdigest()
             for f in glob.glob(f"{d}/*.safetensors")}
    return os.path.basename(d), sums, files

same = True
for name in names:
    bs, bsum, bfiles = checkpoint(f"loss_base_{name}")
    cs, csum, cfiles = checkpoint(f"loss_cur_{name}")
    if bs != cs or bsum != csum or bfiles != cfiles:
        print(f"  {name:16} checkpoint DIFFERS ({bs} / {cs}: manifest tensors {'equal' if bsum == csum else 'differ'},"
              f" shard files {'equal' if bfiles == cfiles else 'differ'})")
        same = False
    else:
        print(f"  {name:16} checkpoint {bs} bitwise identical: {len(bfiles)} shard file(s), every slice's checksum")
print("checkpoints: " + ("bitwise identical in every row" if same else "DIFFER"))
sys.exit(0 if same else 1)
PY
fi
exit $status
