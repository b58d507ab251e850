#!/usr/bin/env bash
# CPU training-step benchmark: llmtrain against the PyTorch reference, in one invocation and one
# environment (docs/benchmarks.md records the figures).
#
#   scripts/bench/cpu_step.sh [--build DIR] [--steps N] [--threads N]
#
# For each of (a) the tiny shape (4 layers, hidden 128, 4 heads, byte vocabulary 257 padded to
# 384) at batch 8 × seq 256 and (b) GPT-2 124M at batch 4 × seq 64, it times full training steps
# (zero grads, forward, backward, grad-norm clipping, AdamW) of llmtrain (tests/bench/step_bench,
# all cores) and of the PyTorch reference (scripts/bench/torch_step.py, float32, at its better
# thread count 1 or 2 and its faster AdamW implementation), and prints step time, tokens/s, MFU
# against an OpenBLAS sgemm ceiling measured here at the same thread count, and the ratio.
# Everything runs twice: with OPENBLAS_CORETYPE=Haswell (what these machines' environment sets;
# it limits OpenBLAS to AVX2 kernels) and with it unset.
#
# Both sides get PyTorch's best CPU environment: OMP_WAIT_POLICY=PASSIVE (OpenMP and BLAS threads
# must not spin against each other on 2 cores) and glibc thresholds that stop freed activations
# being unmapped every step. Timings on a shared machine are noisy: the load average is printed
# before and after, each figure is the median step, and "CPU" is the process's CPU time per step
# (all threads; on an otherwise idle machine it is about threads × step time).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build steps=8 threads=$(nproc)
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--steps N] [--threads N]" >&2; exit 2 ;;
  esac
done
python=/usr/bin/python3
bench=$build/tests/step_bench
# Not part of the default build (scripts/test.sh): built (or brought up to date) here.
cmake --build "$build" --target step_bench -j "$(nproc)" >/dev/null
export OMP_WAIT_POLICY=PASSIVE MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS

field() { sed -E "s/.*\\b$1=([^ ]+).*/\\1/" <<<"$2"; }

echo "cpu_step: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(lscpu | sed -nE 's/^Model name: +//p')"
echo "cpu_step: load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "cpu_step: llmtrain $(git rev-parse --short HEAD 2>/dev/null || echo '?'), torch $($python -c 'import torch; print(torch.__version__)')"

run_case() {  # name shape batch seq torch_steps
  local name=$1 shape=$2 batch=$3 seq=$4 tsteps=$5
  local ours ours_s ours_tps flops ceil_ours mfu_ours best_t="" best_line="" t line s
  ours=$(OMP_NUM_THREADS=$threads "$bench" step --shape "$shape" --batch "$batch" --seq "$seq" --steps "$steps" --warmup 2)
  # One thread too: per-core efficiency, which a busy machine disturbs less than two-thread runs.
  local ours1
  ours1=$(OMP_NUM_THREADS=1 "$bench" step --shape "$shape" --batch "$batch" --seq "$seq" --steps "$tsteps" --warmup 2)
  ours_s=$(field median_s "$ours")
  ours_tps=$(field tokens_per_s "$ours")
  flops=$(field gflops_per_step "$ours")
  ceil_ours=${ceiling[$threads]}
  for t in 1 2; do
    for fe in 1 0; do
      line=$(OMP_NUM_THREADS=$t $python scripts/bench/torch_step.py --shape "$shape" --batch "$batch" --seq "$seq" \
        --threads $t --steps "$tsteps" --warmup 2 --foreach $fe)
      s=$(field median_s "$line")
      if [[ -z $best_t ]] || awk "BEGIN{exit !($s < $(field median_s "$best_line"))}"; then
        best_t=$t best_line=$line
      fi
    done
  done
  local torch_s torch_tps ceil_torch
  torch_s=$(field median_s "$best_line")
  torch_tps=$(field tokens_per_s "$best_line")
  ceil_torch=${ceiling[$best_t]}
  awk -v n="$name" -v os="$ours_s" -v ot="$ours_tps" -v f="$flops" -v oc="$ceil_ours" -v th="$threads" \
      -v ts="$torch_s" -v tt="$torch_tps" -v tc="$ceil_torch" -v tth="$best_t" -v fe="$(field foreach "$best_line")" \
      -v ocpu="$(field cpu_s "$ours")" -v tcpu="$(field cpu_s "$best_line")" -v o1s="$(field median_s "$ours1")" \
      -v o1cpu="$(field cpu_s "$ours1")" -v c1="${ceiling[1]}" 'BEGIN {
    printf "  %-22s llmtrain: %7.1f ms/step %9.0f tokens/s  MFU %4.1f%% (%d threads, ceiling %.0f GFLOP/s; CPU %.0f ms/step)\n", n, os*1000, ot, 100*f/os/oc, th, oc, ocpu*1000
    printf "  %-22s pytorch:  %7.1f ms/step %9.0f tokens/s  MFU %4.1f%% (%d threads, ceiling %.0f GFLOP/s; CPU %.0f ms/step, foreach=%d)\n", "", ts*1000, tt, 100*f/ts/tc, tth, tc, tcpu*1000, fe
    printf "  %-22s ratio llmtrain/pytorch tokens/s: %.2fx  (%.2f GFLOP per step)\n", "", ot/tt, f
    printf "  %-22s (llmtrain on 1 thread: %.1f ms/step, MFU %.1f%% of %.0f GFLOP/s; CPU %.0f ms/step)\n", "", o1s*1000, 100*f/o1s/c1, c1, o1cpu*1000
  }'
}

for coretype in Haswell unset; do
  if [[ $coretype == unset ]]; then unset OPENBLAS_CORETYPE; else export OPENBLAS_CORETYPE=$coretype; fi
  declare -A ceiling=()
  for t in $(printf '%s\n' 1 2 "$threads" | sort -un); do
    ceiling[$t]=$(field gflops "$(OMP_NUM_THREADS=$t "$bench" sgemm --size 2048 --reps 5)")
  done
  echo
  echo "OPENBLAS_CORETYPE=$coretype: sgemm ceiling ${ceiling[1]} GFLOP/s on 1 thread, ${ceiling[2]} on 2"
  run_case "tiny 8x256" tiny 8 256 "$steps"
  run_case "gpt2-124m 4x64" gpt2-124m 4 64 4
done
echo
echo "cpu_step: load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
