#!/usr/bin/env bash
# OpenMP's wait policy and the thread count on a quiet and on a loaded machine: tokens/s of
# `llmtrain run` on the tiny recipe (one rank, fortunes data) with
#   before: idle threads spin as libgomp does by default (GOMP_SPINCOUNT=300000, its default count;
#           llmtrain leaves a policy the user set alone),
#   after:  llmtrain's default (it runs itself with GOMP_SPINCOUNT=1000: a short spin, then sleep),
# each at train.threads auto (every usable core) and 1, first on the machine as it is, then with a
# second process keeping one core busy (a shell loop: what a build, a second job or another rank
# does to a shared machine). Each pair runs REPS times, before and after alternating (a shared
# machine's speed drifts); prints the median over the repetitions of each run's median tokens/s,
# and after/before.
#
#   scripts/bench/cpu_threads.sh [STEPS [REPS]]      (default 40 steps, 3 repetitions; build/llmtrain must exist)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
steps=${1:-40}
reps=${2:-3}
llmtrain=$root/${LLMTRAIN_BUILD_DIR:-build}/llmtrain
[[ -x $llmtrain ]] || { echo "build llmtrain first (scripts/test.sh or cmake --build build)"; exit 1; }
work=$(mktemp -d)
load_pid=
trap '[[ -n $load_pid ]] && kill $load_pid 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"
mapfile -t corpus < <(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese)
"$llmtrain" prep --input "${corpus[@]}" --separator % --tokenizer byte --output data/ --valid-fraction 0.05 >/dev/null 2>&1

median() {
  /usr/bin/python3 - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
v = [json.loads(l)["tokens_per_s"] for l in open(sys.argv[1]) if '"loss"' in l]
print(round(statistics.median(v[len(v) // 5:])))
PY
}
run() {  # NAME POLICY THREADS
  local env=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT)
  [[ $2 == before ]] && env+=(GOMP_SPINCOUNT=300000)
  "${env[@]}" "$llmtrain" run "$root/recipes/tiny.yaml" --set log.dir="$1" --set data.train=data/train \
    --set data.valid=data/valid --set train.steps="$steps" --set log.every=1 --set eval.every=0 \
    --set checkpoint.every=0 --set checkpoint.resume=none --set optimizer.warmup=5 --set train.threads="$3" \
    >"$1.out" 2>&1 || { echo "run $1 failed:"; tail -5 "$1.out"; exit 1; }
  median "$1"
}

echo "cpu_threads: tiny recipe, $steps steps, $reps repetitions, $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %-8s %14s %14s %8s\n' machine threads "before tok/s" "after tok/s" after/before
for machine in quiet loaded; do
  if [[ $machine == loaded ]]; then
    bash -c 'while :; do :; done' &
    load_pid=$!
  fi
  for threads in auto 1; do
    bs=() as=()
    for ((i = 0; i < reps; ++i)); do
      bs+=("$(run "$machine-$threads-before-$i" before "$threads")")
      as+=("$(run "$machine-$threads-after-$i" after "$threads")")
    done
    b=$(printf '%s\n' "${bs[@]}" | sort -n | sed -n "$(((reps + 1) / 2))p")
    a=$(printf '%s\n' "${as[@]}" | sort -n | sed -n "$(((reps + 1) / 2))p")
    printf '%-8s %-8s %14s %14s %8s\n' "$machine" "$threads" "$b" "$a" "$(/usr/bin/python3 -c "print(f'{$a / $b:.2f}')")"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
