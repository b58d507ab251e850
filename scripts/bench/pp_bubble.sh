#!/usr/bin/env bash
# Pipeline bubble at pp 2 (one core per stage: one thread per rank, two ranks through mpirun): for
# each schedule and m ∈ {2, 4, 8} micro-batches per step, the idle time each stage measured in the
# schedule (logged at the end of a run: per step, the part of the slowest stage's time in the
# schedule that the stage did not spend computing or reading data), next to the schedule's formula
# (p − 1)/(m + p − 1) of the stage-time (for GPipe and 1F1B it holds for any forward:backward time
# ratio, as long as every micro-batch takes the same time); interleaved with two virtual chunks per
# stage (two blocks each), (p − 1)/(v·m + p − 1); zero_bubble (ZB-H1), (p − 1)/(3m + p − 1), which
# assumes forward, input-gradient and weight-gradient work take equal time (next to 1F1B's
# (p − 1)/(m + p − 1) with backward = 2 forwards: a third of 1F1B's idle time). Those formulas
# assume equal stages and, for zero_bubble, equal F, I and W; "op times" is the same schedule
# replayed step by step with the time each op took in that step and no cost for communication
# (parallel::simulate_step): the bubble the schedule leaves on these stages. What the run measures
# above it is the cost of moving the activations and gradients.
#
#   scripts/bench/pp_bubble.sh [STEPS]      (default 30 steps; build/llmtrain must exist)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
steps=${1:-30}
llmtrain=$root/${LLMTRAIN_BUILD_DIR:-build}/llmtrain
[[ -x $llmtrain ]] || { echo "build llmtrain first (cmake --build build)"; exit 1; }
source tests/parallel/mpi_env.sh
mpi_transport_as_llmtrain_run  # what a user's `llmtrain run` gets here
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
mapfile -t corpus < <(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese)
"$llmtrain" prep --input "${corpus[@]}" --separator % --tokenizer byte --output data/ --valid-fraction 0.05 >/dev/null 2>&1

common=(--set data.train=data/train --set data.valid=data/valid --set train.steps=$steps --set log.every=10
        --set eval.every=0 --set checkpoint.every=0 --set checkpoint.resume=none --set optimizer.warmup=5
        --set train.threads=1 --set train.micro_batch=2 --set parallel.pp=2
        # wider than tiny, so that compute dominates the per-micro-batch transfers, and deeper (4 blocks
        # a stage), so that the last stage's head makes the stages less unequal (the formulas assume
        # equal stages)
        --set model.hidden=256 --set model.heads=8 --set model.kv_heads=8 --set model.layers=8)
echo "# $(date -u +%FT%TZ) $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "recipes/tiny.yaml at hidden 256 (8 layers, 4 per stage), pp 2, micro_batch 2, $steps steps"
printf '%-12s %3s %10s %10s %10s %10s %10s %8s %8s\n' schedule m formula "op times" measured "stage 0" "stage 1" \
  "/formula" "/op times"
for schedule in gpipe 1f1b interleaved zero_bubble; do
  v=1
  [[ $schedule == interleaved ]] && v=2
  for m in 2 4 8; do
    name=$schedule-m$m
    mpi_run 900 2 "$llmtrain" run "$root/recipes/tiny.yaml" "${common[@]}" --set log.dir=$name \
      --set parallel.pp_schedule=$schedule --set parallel.virtual_stages=$v --set train.global_batch=$((2 * m)) \
      >$name.log 2>&1 || { echo "$name failed:"; tail -5 $name.log; exit 1; }
    line=$(grep -o 'pipeline idle time per stage (measured): .*' $name.log)
    /usr/bin/python3 - "$schedule" "$m" "$line" "$v" <<'PY'
import re, sys
schedule, m, line, v = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
stages = [float(x) for x in re.findall(r"stage \d+ ([0-9.]+)%", line)]
mean = float(re.search(r"mean ([0-9.]+)%", line).group(1))
at_op_times = float(re.search(r"at the measured op times ([0-9.]+)%", line).group(1))
formula = 100.0 * (2 - 1) / ((3 if schedule == "zero_bubble" else v) * m + 2 - 1)
print(f"{schedule:<12} {m:3d} {formula:9.1f}% {at_op_times:9.1f}% {mean:9.1f}% {stages[0]:9.1f}% {stages[1]:9.1f}% "
      f"{mean / formula:8.2f} {mean / at_op_times:8.2f}")
PY
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
