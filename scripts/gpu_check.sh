#!/usr/bin/env bash
# For anyone with an NVIDIA GPU: checks llmtrain's CUDA backend on the real device and prints a
# report (docs/cuda.md, "On a GPU"). Whoever runs it records the report in docs/benchmarks.md with
# the GPU's name; nothing in the test suite waits for it.
#
#   scripts/gpu_check.sh          builds build-gpu/ for this GPU's architecture, then checks:
#
#   1. the op harness: every op case of tests/kernels on the device against the CPU (fp32 ≤ 1e-5
#      per tensor, 16-bit tolerances per op, as in the simulator);
#   2. tiny (model.seq_len 64, micro_batch 1, global_batch 2) for STEPS (50) steps on cuda and on
#      cpu: the worst relative loss difference per step, and the final parameters' ||a-b||/||b||;
#   3. step time: the GPT-2 "tiny" benchmark shape (4 layers, hidden 128, seq 256, batch 8) and GPT-2
#      124M (seq 1024, batch 8, fp32 and bf16) on cuda, llmtrain's tokens/s against PyTorch's
#      (scripts/bench/torch_step.py --device cuda) when a python3 with CUDA-enabled torch is there;
#   4. several ranks (scripts/gpu_check_ranks.sh): dp 2, ZeRO 3 at dp 2, tp 2, pp 2 and tp 2 × pp 2
#      against the one-rank run (fp32, losses and final parameters within 1e-5), through NCCL where
#      it can serve them (one GPU: NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1; else the staged
#      path, said so); compute-sanitizer on a 2-rank run; with several GPUs, dp scaling of GPT-2 124M
#      in bf16 (tokens/s at dp N over N × dp 1);
#   5. offload (docs/offload.md): tiny in bf16 with parallel.offload host (AdamW on the CPU) and nvme
#      against the same run in memory (10 steps: worst loss difference, final parameters); on a real
#      GPU, a Llama model sized so that its model states do NOT fit the GPU (about 18 bytes per
#      parameter with activations) but its page-locked state fits the host, trained 3 steps with
#      host: its memory line and step time (skipped, said so, where the host is too small).
#
# Environment: STEPS (default 50); PARTS (default "1 2 3 4 5": the parts to run); BUILD=DIR uses an
# existing CUDA or simulator build instead of building (BUILD=build-sim STEPS=3 runs parts 1, 2 and
# 4 on the simulator, to check this script without a GPU; part 3 runs only on a real device);
# NCCL_LIB_DIR: a folder with a newer libnccl.so.2 for part 4 (otherwise the script looks for the
# one of python3's nvidia-nccl package and takes it when it is 2.30 or later). The report also goes
# to DIR/gpu_check/report.md. Exit status 1 when a check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-50}
parts=" ${PARTS:-1 2 3 4 5} "
part() { [[ $parts == *" $1 "* ]]; }
if [[ -n ${BUILD:-} ]]; then
  build=$BUILD
else
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi lists none): nothing to check" >&2
    exit 1
  fi
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
  build=build-gpu
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLMTRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${arch}-real" \
    -DLLMTRAIN_TESTS=ON >/dev/null || exit 1
  cmake --build "$build" -j "$(nproc)" --target llmtrain test_kernels device_rates >/dev/null || exit 1
fi
L=$PWD/$build/llmtrain
work=$PWD/$build/gpu_check
rm -rf "$work" && mkdir -p "$work"
py=$(command -v python3 || echo /usr/bin/python3)
[[ -x .venv/bin/python ]] && py=$PWD/.venv/bin/python
simulator=0
"$L" env 2>&1 | grep -q '^cuda: *simulator' && simulator=1
status=0
report() { echo "$*" | tee -a "$work/report.md"; }

report "# llmtrain gpu_check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
report "device: $("$L" env 2>&1 | grep -E '^(cuda|devices):' | tr -s ' ' | paste -sd ';' -)"

# 1. The op harness on the device (the linear layer through cuBLASLt on a GPU), then on a GPU the
#    linear cases again through llmtrain's own tiled GEMM (LLMTRAIN_CUDA_GEMM=tiled).
if part 1; then
LLMTRAIN_OP_VERBOSE=1 "$build/tests/test_kernels" --gtest_brief=1 >"$work/ops.log" 2>&1
ops=$?
cuda_cases=$(grep -c 'cuda vs cpu' "$work/ops.log" || true)
failed=$(grep -c '^\[  FAILED  \]' "$work/ops.log" || true)
skipped=$(grep -c 'SKIPPED' "$work/ops.log" || true)
report "ops: test_kernels exit $ops; $cuda_cases op cases compared on the device; $failed failed lines; $skipped skipped (log: $work/ops.log)"
report "  gemm: $("$L" env 2>&1 | sed -n 's/^gemm: *//p')"
((ops == 0)) || status=1
if ((simulator == 0)); then
  LLMTRAIN_CUDA_GEMM=tiled LLMTRAIN_OP_VERBOSE=1 "$build/tests/test_kernels" --gtest_brief=1 --gtest_filter='*Linear*' \
    >"$work/ops-tiled.log" 2>&1
  tiled=$?
  report "ops, linear through the tiled GEMM: exit $tiled; $(grep -c 'cuda vs cpu' "$work/ops-tiled.log" || true) cases (log: $work/ops-tiled.log)"
  ((tiled == 0)) || status=1
fi
fi

# 2. tiny on cuda against cpu: the first 10 steps must match (losses and step-10 parameters within
#    1e-5, docs/cuda.md); over all STEPS, the worst loss difference is reported against a control,
#    the cpu run again with OpenBLAS's Haswell kernels (another summation order in every product):
#    this batch-of-2 run amplifies rounding differences after its loss spike near step 20, and the
#    control shows how far a change of summation order alone moves it.
"$L" prep --input README.md docs/*.md --tokenizer byte --output "$work/data/" --valid-fraction 0.2 >/dev/null 2>&1 ||
  { report "prep failed"; exit 1; }
if part 2; then
for dev in cpu cuda cpu-haswell; do
  blas=()
  [[ $dev == cpu-haswell ]] && blas=(env OPENBLAS_CORETYPE=Haswell)
  "${blas[@]}" "$L" run recipes/tiny.yaml --set data.train="$work/data/train" --set data.valid="$work/data/valid" \
    --set model.seq_len=64 --set train.micro_batch=1 --set train.global_batch=2 --set train.steps="$steps" \
    --set optimizer.warmup=$((steps / 5)) --set train.device=${dev%-haswell} --set checkpoint.every=10 \
    --set checkpoint.keep=100 --set eval.every=0 --set log.every=1 \
    --set log.dir="$work/tiny-$dev" >"$work/tiny-$dev.log" 2>&1 || { report "tiny on $dev failed: $work/tiny-$dev.log"; status=1; }
done
if out=$("$py" tests/e2e/compare_runs.py "$work/tiny-cuda" "$work/tiny-cpu" --last 10 --tol 1e-5 2>&1); then
  report "tiny, 10 steps, cuda against cpu: $out"
else
  report "tiny, 10 steps, cuda against cpu: DIFFERS: $(tail -1 <<<"$out")"
  status=1
fi
worst() {
  "$py" - "$1" "$2" <<'PY'
import json, sys
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
rel = {s: abs(a[s] - b[s]) / abs(b[s]) for s in b if s in a}
first = min((s for s in rel if rel[s] > 1e-5), default=None)
print(f"worst loss difference {max(rel.values()):.1e} over {len(rel)} steps; first step above 1e-5: {first}")
PY
}
report "tiny, $steps steps, cuda against cpu: $(worst "$work/tiny-cuda" "$work/tiny-cpu" 2>&1)"
report "  control, cpu with OpenBLAS's Haswell kernels against cpu: $(worst "$work/tiny-cpu-haswell" "$work/tiny-cpu" 2>&1)"
fi

# 3. Step time against PyTorch: median tokens/s over steps 6-30 of `llmtrain run` (a repeated
#    batch: the byte-level data; the vocabulary set to the shape's), against the reference model in
#    PyTorch (scripts/bench/torch_step.py) at the same shape, batch and precision, with its fused
#    attention (--sdpa 1) for the larger shape.
speed() {  # NAME TORCH_ARGS -- LLMTRAIN_SETS...
  local name=$1 torch_args=$2
  shift 3
  "$L" run recipes/tiny.yaml --set model.family=gpt2 --set train.steps=30 --set optimizer.warmup=5 \
    --set train.device=cuda --set data.train="$work/data/train" --set data.valid="$work/data/valid" \
    --set eval.every=0 --set checkpoint.every=0 --set log.every=1 --set log.dir="$work/speed-$name" "$@" \
    >"$work/speed-$name.log" 2>&1
  local ours theirs
  ours=$("$py" -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(round(statistics.median(x['tokens_per_s'] for x in r if 'tokens_per_s' in x and x['step'] > 5)))" \
    "$work/speed-$name/metrics.jsonl" 2>/dev/null || echo "?")
  # shellcheck disable=SC2086
  theirs=$("$py" scripts/bench/torch_step.py $torch_args --device cuda --steps 20 2>"$work/torch-$name.log" |
    sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p')
  report "step time, $name on cuda: llmtrain ${ours:-?} tokens/s, PyTorch ${theirs:-?} tokens/s" \
    "(ratio $("$py" -c "print(f'{float(\"$ours\")/float(\"$theirs\"):.2f}')" 2>/dev/null || echo '?'))"
  # The planner's prediction for the same recipe on this GPU's catalogue row, against the measurement.
  local predicted tokens
  predicted=$("$L" run recipes/tiny.yaml --set model.family=gpt2 --set train.device=cuda "$@" --dry-run --gpu "$catalog" \
    2>/dev/null | sed -n 's/^predicted step time: \([0-9.e+-]*\) s.*/\1/p')
  local with_rates=""
  [[ -n $rates ]] && with_rates=$("$L" run recipes/tiny.yaml --set model.family=gpt2 --set train.device=cuda "$@" \
    --dry-run --gpu "$catalog" --rates "$rates" 2>/dev/null | sed -n 's/^predicted step time: \([0-9.e+-]*\) s.*/\1/p')
  tokens=$("$py" -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(next(x['tokens'] for x in r if 'tokens' in x))" \
    "$work/speed-$name/metrics.jsonl" 2>/dev/null || echo "?")
  report "  plan ($catalog): predicted ${predicted:-?} s a step with the catalogue's rates, ${with_rates:-?} s with this" \
    "run's (rates.json), measured" \
    "$("$py" -c "m=$tokens/$ours; print(f'{m:.4g} s (predicted / measured {$predicted/m:.2f}, {${with_rates:-0}/m:.2f})')" \
      2>/dev/null || echo '?')"
}
# The planner's catalogue row for this GPU (docs/plan.md §1).
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H200*) catalog=h200 ;;
  *A100*40GB*) catalog=a100-40g ;;
  *A100*) catalog=a100-80g ;;
  *) catalog=h100 ;;
esac
# The planner's rates measured here (tests/bench/device_rates: the attention kernel and the products
# at GPT-2 124M's shapes), for `plan --rates` / `run --dry-run --rates`; docs/plan.md §1 records them.
rates=""
if part 3 && ((simulator == 0)) && [[ -x $build/tests/device_rates ]]; then
  if "$build/tests/device_rates" --output "$work/rates.json" >"$work/rates.log" 2>&1; then
    rates=$work/rates.json
    report "rates: $("$py" -c "import json,sys; r=json.load(open(sys.argv[1])); print(', '.join(f'{k} {r[k]/1e12:.1f} TFLOP/s' for k in ('attention_forward_rate','attention_backward_rate','products_bf16','products_fp32')))" "$rates" 2>&1) ($rates)"
  else
    report "rates: device_rates failed ($work/rates.log)"
  fi
fi
if ! part 3; then
  :
elif ((simulator == 0)) && "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  tiny=(--set model.layers=4 --set model.hidden=128 --set model.heads=4 --set model.kv_heads=4 --set model.seq_len=256
    --set train.micro_batch=8 --set train.global_batch=8)
  gpt2=(--set model.layers=12 --set model.hidden=768 --set model.heads=12 --set model.kv_heads=12 --set model.vocab=50257
    --set model.seq_len=1024 --set model.max_positions=1024 --set train.micro_batch=8 --set train.global_batch=8)
  speed "GPT-2 tiny shape (4x128, seq 256, batch 8) fp32" "--shape tiny --batch 8" -- "${tiny[@]}"
  speed "GPT-2 124M (seq 1024, batch 8) fp32" "--shape gpt2-124m --batch 8 --sdpa 1" -- "${gpt2[@]}"
  speed "GPT-2 124M (seq 1024, batch 8) bf16" "--shape gpt2-124m --batch 8 --sdpa 1 --autocast bf16" -- "${gpt2[@]}" \
    --set train.precision=bf16
else
  report "step time: skipped (no python3 with CUDA-enabled torch, or the simulator)"
fi
if part 4; then
  # shellcheck source=scripts/gpu_check_ranks.sh
  source scripts/gpu_check_ranks.sh
fi
if part 5; then
  # shellcheck source=scripts/gpu_check_offload.sh
  source scripts/gpu_check_offload.sh
fi
report "result: $([[ $status == 0 ]] && echo passed || echo FAILED)"
exit $status
