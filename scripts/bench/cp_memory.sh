#!/usr/bin/env bash
# Context parallelism's activation memory per rank: a 16K-token sequence (one per micro-batch) of a
# small GPT-2 (or LLaMA) trained one step under mpirun at cp 1, 2 and 4 (cp_comm ring), printing
# for each the activations the memory account plans (trainer/loop/memory.h, what `--dry-run`
# prints) and those the allocator measured at the step's peak, and both against cp 1's / cp (the
# ideal 1/cp scaling; the ring's block buffers and the replicated RoPE table come on top).
#
#   scripts/bench/cp_memory.sh [FAMILY] [SEQ] [LAYERS] [HIDDEN] [HEADS]   (default gpt2 16384 2 64 4)
#   (build/llmtrain must exist; LLMTRAIN_BUILD_DIR overrides the build folder)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${LLMTRAIN_BUILD_DIR:-$src/build}" && pwd)
llmtrain=$build/llmtrain
source "$src/tests/parallel/mpi_env.sh"
family=${1:-gpt2} seq=${2:-16384} layers=${3:-2} hidden=${4:-64} heads=${5:-4}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$llmtrain" prep --input $(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese) --separator % \
  --tokenizer byte --output data/ --valid-fraction 0.05 >/dev/null
cat >r.yaml <<YAML
name: cp-memory
model: {family: $family, layers: $layers, hidden: $hidden, heads: $heads, seq_len: $seq}
data: {tokenizer: byte, train: data/train}
train: {steps: 1, micro_batch: 1, global_batch: 1, seed: 7, threads: 1}
optimizer: {lr: 1.0e-3}
checkpoint: {every: 0}
eval: {every: 0}
log: {every: 1}
YAML
# "activations 1.2 MiB" -> bytes
bytes() { /usr/bin/python3 -c "import sys; v, u = sys.argv[1], sys.argv[2]; print(int(float(v) * {'B': 1, 'KiB': 2**10, 'MiB': 2**20, 'GiB': 2**30}[u]))" $1 $2; }
echo "$family, $layers layers, hidden $hidden, $heads heads, one sequence of $seq tokens per step, fp32, cp_comm ring"
printf "%3s %8s %14s %14s %14s %10s %10s\n" cp seconds planned measured "cp 1 / cp" "meas/plan" "meas/ideal"
base=0
for cp in 1 2 4; do
  start=$(date +%s.%N)
  out=$(mpi_run 1200 $cp "$llmtrain" run r.yaml --set log.dir=cp$cp --set parallel.cp=$cp --set checkpoint.dir=ckpt$cp 2>&1) ||
    { echo "$out" | tail -20; exit 1; }
  secs=$(/usr/bin/python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" $start $(date +%s.%N))
  plan=$(grep -o 'memory per rank: .*' <<<"$out" | head -1 | grep -o 'activations [0-9.]* [KMG]*i*B')
  meas=$(grep -o 'measured after the first step: .*' <<<"$out" | head -1 | grep -o 'activations [0-9.]* [KMG]*i*B')
  p=$(bytes $(awk '{print $2, $3}' <<<"$plan")) m=$(bytes $(awk '{print $2, $3}' <<<"$meas"))
  ((cp == 1)) && base=$m
  ideal=$((base / cp))
  printf "%3d %8s %14s %14s %14s %10.3f %10.3f\n" $cp "$secs" "$(awk '{print $2, $3}' <<<"$plan")" \
    "$(awk '{print $2, $3}' <<<"$meas")" "$(/usr/bin/python3 -c "print(f'{$ideal / 2**20:.1f} MiB')")" \
    "$(/usr/bin/python3 -c "print($m / $p)")" "$(/usr/bin/python3 -c "print($m / $ideal)")"
done
