#!/usr/bin/env bash
# parallel.offload: nvme on this machine's CPU ranks (docs/offload.md, figures in docs/benchmarks.md).
#
#   scripts/bench/offload.sh big [STEPS]       the gpt2-1.5b recipe's model (48 × 1600, GPT-2's 50257-token
#                                              vocabulary, bf16, full recomputation) on one CPU rank with its
#                                              optimizer state in a file under $OFFLOAD_DIR (default: a
#                                              temporary directory): STEPS (default 3) steps of 64-token
#                                              sequences, one per step. Prints the peak resident memory
#                                              (/usr/bin/time) against the memory account (the run's own
#                                              line) and against what the model states would need in
#                                              memory without offload (the same recipe's --dry-run)
#   scripts/bench/offload.sh overhead [STEPS]  a model that fits (recipes/tiny.yaml at 8 × 1024, 122M
#                                              parameters, bf16): STEPS (default 6) steps without offload,
#                                              then with nvme, in this invocation; prints each run's median
#                                              step time (steps 2.., the first warms up), their ratio, and
#                                              how much of the file I/O the read-ahead and write-behind hid
#   scripts/bench/offload.sh params [STEPS]    ZeRO 3 on 2 CPU ranks (recipes/tiny.yaml at 8 × 512, 26M
#                                              parameters, fp32, `llmtrain run --nproc 2`): STEPS (default 8)
#                                              steps in memory, with nvme, and with nvme + offload_params
#                                              (each gather reads its unit's values from the file, the
#                                              unit after the next read ahead), in this invocation; prints
#                                              each run's median step, forward and backward times and the
#                                              ratios to the in-memory run
#
# build/llmtrain must exist (LLMTRAIN_BUILD_DIR for another build directory).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
part=${1:-}
llmtrain=$root/${LLMTRAIN_BUILD_DIR:-build}/llmtrain
[[ -x $llmtrain ]] || { echo "build llmtrain first (scripts/test.sh or cmake --build build)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
offload_dir=${OFFLOAD_DIR:-$work/offload}
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB," \
  "load: $(cut -d' ' -f1-3 /proc/loadavg); offload_path on $(df -h --output=source,fstype,avail "$(dirname "$offload_dir")" | tail -1)"
cd "$work"
mapfile -t corpus < <(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese)
"$llmtrain" prep --input "${corpus[@]}" --separator % --tokenizer byte --output data/ --valid-fraction 0.05 >/dev/null 2>&1
common=(--set data.train=data/train --set data.valid=data/valid --set data.tokenizer=byte --set eval.every=0
        --set checkpoint.every=0 --set checkpoint.resume=none --set train.device=cpu --set optimizer.warmup=1
        --set log.every=1)
nvme=(--set parallel.offload=nvme --set parallel.offload_path="$offload_dir")

# median_ms METRICS KEY SCALE: the median of KEY over the steps after the first (the first warms up),
# in ms; elapsed_s (the run's time so far) as each step's difference.
median_ms() {
  python3 - "$@" <<'PY'
import json, sys, statistics
t = [json.loads(l)[sys.argv[2]] for l in open(sys.argv[1]) if f'"{sys.argv[2]}"' in l]
if sys.argv[2] == "elapsed_s":
    t = [b - a for a, b in zip(t, t[1:])]
else:
    t = t[1:]
print(f"{float(sys.argv[3]) * statistics.median(t):.0f}")
PY
}

case $part in
big)
  steps=${2:-3}
  xl=(--set model.vocab=50257 --set model.seq_len=64 --set train.micro_batch=1 --set train.global_batch=1
      --set parallel.dp=1 --set parallel.zero=0 --set launch.procs_per_node=1 --set launch.nodes=1
      --set train.threads="$(nproc)" --set train.steps="$steps" --set optimizer.decay_steps="$steps")
  without=$("$llmtrain" run "$root/recipes/gpt2-1.5b.yaml" "${common[@]}" "${xl[@]}" --dry-run | grep -m1 'memory per rank')
  echo "without offload (--dry-run): $without"
  /usr/bin/time -f "rss_kb %M" "$llmtrain" run "$root/recipes/gpt2-1.5b.yaml" "${common[@]}" "${xl[@]}" "${nvme[@]}" \
    --set log.dir=xl >xl.log 2>&1 || { tail -20 xl.log; exit 1; }
  grep -E "^model:|offloaded|step [0-9]+/|checkpoint .* written|offload file|done:" xl.log | cut -c1-300
  rss=$(grep -o 'rss_kb [0-9]*' xl.log | awk '{print $2}')
  account=$(grep -m1 -o 'total [0-9.]* [KMGT]iB' xl.log | awk '{print $2, $3}')
  awk -v k="$rss" -v a="$account" -v w="$(grep -o 'total [0-9.]* [KMGT]iB' <<<"$without" | awk '{print $2, $3}')" \
    'BEGIN {printf "peak RSS %.2f GiB; the memory account (in memory) %s; in memory without offload %s\n", k / 1048576, a, w}'
  ;;
overhead)
  steps=${2:-6}
  tiny=(--set model.layers=8 --set model.hidden=1024 --set model.heads=16 --set model.ffn_hidden=4096
        --set train.precision=bf16 --set train.steps="$steps" --set optimizer.decay_steps="$steps"
        --set train.threads="$(nproc)")
  "$llmtrain" run "$root/recipes/tiny.yaml" "${common[@]}" "${tiny[@]}" --set log.dir=mem >mem.log 2>&1 ||
    { tail -20 mem.log; exit 1; }
  "$llmtrain" run "$root/recipes/tiny.yaml" "${common[@]}" "${tiny[@]}" "${nvme[@]}" --set log.dir=nvme >nvme.log 2>&1 ||
    { tail -20 nvme.log; exit 1; }
  a=$(median_ms mem/metrics.jsonl elapsed_s 1000) b=$(median_ms nvme/metrics.jsonl elapsed_s 1000)
  oa=$(median_ms mem/metrics.jsonl t_optimizer_ms 1) ob=$(median_ms nvme/metrics.jsonl t_optimizer_ms 1)
  grep -m1 'memory per rank' mem.log | sed 's/^/in memory: /'
  grep -m1 'memory per rank' nvme.log | sed 's/^/nvme:      /'
  grep -m1 'offload file' nvme.log
  awk -v a="$a" -v b="$b" -v oa="$oa" -v ob="$ob" 'BEGIN {printf "median step: in memory %d ms (optimizer %d), nvme %d ms (optimizer %d): nvme / in memory %.2f\n", a, oa, b, ob, b / a}'
  ;;
params)
  steps=${2:-8}
  z3=(--set model.layers=8 --set model.hidden=512 --set model.heads=8 --set model.kv_heads=8 --set model.seq_len=128
      --set train.micro_batch=1 --set train.global_batch=2 --set train.threads=1 --set train.steps="$steps"
      --set optimizer.decay_steps="$steps" --set parallel.zero=3 --set parallel.bucket_mb=2 --nproc 2)
  declare -A ms
  for kind in mem nvme params; do
    extra=()
    [[ $kind != mem ]] && extra=("${nvme[@]}")
    [[ $kind == params ]] && extra+=(--set parallel.offload_params=true)
    "$llmtrain" run "$root/recipes/tiny.yaml" "${common[@]}" "${z3[@]}" "${extra[@]}" --set log.dir="$kind" \
      >"$kind.log" 2>&1 || { tail -20 "$kind.log"; exit 1; }
    ms[$kind]=$(median_ms "$kind/metrics.jsonl" elapsed_s 1000)
    echo "$kind: median step ${ms[$kind]} ms (forward $(median_ms "$kind/metrics.jsonl" t_forward_ms 1)," \
      "backward $(median_ms "$kind/metrics.jsonl" t_backward_ms 1), optimizer $(median_ms "$kind/metrics.jsonl" t_optimizer_ms 1))"
  done
  awk -v a="${ms[mem]}" -v b="${ms[nvme]}" -v c="${ms[params]}" \
    'BEGIN {printf "step time / in memory: nvme %.2f, nvme + offload_params %.2f\n", b / a, c / a}'
  ;;
*)
  sed -n '2,27p' "$0"
  exit 2
  ;;
esac
