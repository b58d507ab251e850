#!/usr/bin/env bash
# For anyone with an NVIDIA GPU: checks llmtrain's CUDA backend on the real device and prints a
# report (docs/cuda.md, "On a GPU"). Whoever runs it records the report in docs/benchmarks.md with
# the GPU's name; nothing in the test suite waits for it.
#
#   BUNDLE=bundle/llmtrain-gpu.tar.xz scripts/gpu_check.sh   (from scripts/gpu_bundle.sh), or
#   scripts/gpu_check.sh          builds build-gpu/ for this GPU's architecture, then checks:
#
#   1. the op harness: every op case of tests/kernels on the device against the CPU (fp32 ≤ 1e-5
#      per tensor, 16-bit tolerances per op, as in the simulator), but the tests without a device
#      side (the CPU attention's avx2/avx512 forms, CpuPeak); the linear cases again through the
#      tiled GEMM;
#   2. tiny (model.seq_len 64, micro_batch 1, global_batch 2) for STEPS (50) steps on cuda and on
#      cpu: the worst relative loss difference per step, and the final parameters' ||a-b||/||b||;
#   3. step time: the GPT-2 "tiny" benchmark shape (4 layers, hidden 128, seq 256, batch 8) and GPT-2
#      124M (seq 1024, batch 8, fp32 and bf16) on cuda, llmtrain's median tokens/s over steps 6-20
#      against PyTorch's over 10 steps (scripts/bench/torch_step.py --device cuda) when a python3
#      with CUDA-enabled torch is there, and the bf16 124M step against torch.compile's; the 124M
#      runs also time every op and library call of steps 2-4 (log.profile: ops) and report the
#      heaviest (the tensor-core attention's rows: "attention_forward: tensor cores");
#   4. several ranks (scripts/gpu_check_ranks.sh) as threads of ONE process (tests/bench/ranks_in_process:
#      no mpirun needed): dp 2, ZeRO 3 at dp 2, tp 2, pp 2 and tp 2 × pp 2 (RANK_LAYOUTS) against the
#      one-rank run (fp32, losses and final parameters within 1e-5), through NCCL where it can serve
#      them (one GPU: NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1; else the staged communicator,
#      said so: the report names each rank's communicator); compute-sanitizer on a 2-rank run; with
#      several GPUs, dp scaling of GPT-2 124M in bf16 (tokens/s at dp N over N × dp 1);
#   5. offload (docs/offload.md): tiny in bf16 with parallel.offload host (AdamW on the CPU) and nvme
#      against the same run in memory (10 steps: worst loss difference, final parameters); on a real
#      GPU, a Llama model sized so that its model states do NOT fit the GPU (about 18 bytes per
#      parameter with activations) but its page-locked state fits the host, trained 3 steps with
#      host: its memory line and step time (skipped, said so, where the host is too small).
#
# Where the binaries come from (one of):
#   BUNDLE=FILE   an archive made by scripts/gpu_bundle.sh elsewhere (nothing is built here): unpacked
#                 into a temporary folder, its lib/ first on LD_LIBRARY_PATH, then /usr/local/cuda/lib64
#                 and python3's nvidia/*/lib folders (libcudart, libcublas, libnccl of this machine);
#                 every binary's libraries must resolve (what is missing is named), and a bundle built
#                 for another architecture than this GPU's is warned about;
#   BUILD=DIR     an existing CUDA or simulator build (BUILD=build-sim STEPS=3 runs parts 1, 2 and 4
#                 on the simulator, to check this script without a GPU; part 3 runs only on a device;
#                 a BUNDLE of the SIM build does the same);
#   neither       builds build-gpu/ for this GPU's architecture first.
# Time bounds: each part's long commands run under coreutils `timeout` with what is left of the
# part's limit (LIMIT_SETUP 30 s: unpacking, `llmtrain env`, the data; LIMIT_PART1 120, LIMIT_PART2
# 60, LIMIT_PART3 160, LIMIT_PART4 180, LIMIT_PART5 600): a part that runs out is reported as "part
# N: timed out after X s" (a failure) and the next part starts. PARTS="1 2 3" fits 6½ minutes: 370 s
# of limits, 2 s each for a command that ignores SIGTERM, the few short commands outside them;
# PARTS="1 2 3 4" fits 9½ minutes (550 s), within one 10-minute command of a lent machine.
# Environment: STEPS (default 50); PARTS (default "1 2 3 4 5": the parts to run); OPS_FILTER: part 1's
# gtest filter (default: every test but the CPU-only ones); PYTHON: the python3 with numpy and
# safetensors (default: the checkout's .venv, else python3); NCCL_LIB_DIR: a folder with a newer
# libnccl.so.2 for part 4 (otherwise the script looks for the one of python3's nvidia-nccl package
# and takes it when it is 2.30 or later); LOGS_TO=DIR: where the report, the logs and rates.json are
# copied at the end (on a lent machine, its $OUT). The report also goes to DIR/gpu_check/report.md
# (DIR: the build, or the unpacked bundle). Exit status 1 when a check fails.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
t_start=$SECONDS
steps=${STEPS:-50}
parts=" ${PARTS:-1 2 3 4 5} "
part() { [[ $parts == *" $1 "* ]]; }
status=0

# The time bounds (header). bounded CMD... runs CMD under what is left of the current part's limit
# (and its children: timeout signals the process group it makes); once the part has run out it runs
# nothing and returns 124, so the part's later commands are skipped.
declare -A limit=([setup]=${LIMIT_SETUP:-30} [1]=${LIMIT_PART1:-120} [2]=${LIMIT_PART2:-60} [3]=${LIMIT_PART3:-160}
  [4]=${LIMIT_PART4:-180} [5]=${LIMIT_PART5:-600})
part_begin() {
  current=$1
  deadline=$((SECONDS + limit[$1]))
}
expired() { ((SECONDS >= deadline)); }
bounded() {
  local left=$((deadline - SECONDS))
  ((left > 0)) || return 124
  timeout -k 2 "$left" "$@"
}
part_end() {  # reports the part's time, or that it ran out
  if expired; then
    report "part $current: timed out after ${limit[$current]} s"
    status=1
  else
    echo "gpu_check: part $current took $((SECONDS - deadline + limit[$current])) s (limit ${limit[$current]} s)" >&2
  fi
}
early_report=()
report() {
  if [[ -n ${work:-} ]]; then echo "$*" | tee -a "$work/report.md"; else early_report+=("$*") && echo "$*"; fi
}
give_up() {
  report "$*"
  report "result: FAILED"
  exit 1
}

part_begin setup
py=$(command -v python3 || echo /usr/bin/python3)
[[ -x .venv/bin/python ]] && py=$PWD/.venv/bin/python
py=${PYTHON:-$py}
has_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }
bundle_info=""
if [[ -n ${BUNDLE:-} ]]; then
  # The bundle: unpacked into a temporary folder (kept: the logs and runs are there), never built.
  [[ -f $BUNDLE ]] || give_up "bundle: no file $BUNDLE"
  unpacked=$(mktemp -d "${TMPDIR:-/tmp}/llmtrain-gpu-check.XXXXXX")
  if ! bounded tar -xf "$BUNDLE" -C "$unpacked" 2>"$unpacked/unpack.log"; then
    # Where xz itself is missing, Python's tarfile reads the archive.
    bounded "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$BUNDLE" "$unpacked" \
      2>>"$unpacked/unpack.log" || give_up "bundle: could not unpack $BUNDLE ($(tail -1 "$unpacked/unpack.log"))"
  fi
  build=$unpacked/llmtrain-bundle
  [[ -f $build/README ]] || give_up "bundle: $BUNDLE holds no llmtrain-bundle/README: not made by scripts/gpu_bundle.sh"
  bundle_key() { sed -n "s/^$1=//p" "$build/README"; }
  bundle_commit=$(bundle_key commit)
  bundle_sim=$(bundle_key simulator)
  bundle_archs=$(bundle_key cuda_archs)
  bundle_info="$(basename "$BUNDLE"): commit ${bundle_commit:0:9} ($(bundle_key tree)), $(bundle_key build_type),"
  bundle_info+=" archs $bundle_archs, simulator $bundle_sim, made $(bundle_key made)"
  # This machine's CUDA libraries after the bundle's own: the toolkit's, then python3's nvidia/*/lib
  # folders (the pip packages' libnccl, libcublas), then whatever LD_LIBRARY_PATH held.
  nvidia_libs=$("$py" -c 'import glob, os, nvidia; print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))' 2>/dev/null || true)
  outer_ld=${LD_LIBRARY_PATH-}
  LD_LIBRARY_PATH=$build/lib:/usr/local/cuda/lib64${nvidia_libs:+:$nvidia_libs}${outer_ld:+:$outer_ld}
  export LD_LIBRARY_PATH
  # Python keeps this machine's libraries (the bundle's libstdc++ or libz are not its own).
  real_py=$py
  py=$unpacked/python3
  if [[ -n $outer_ld ]]; then
    printf '#!/usr/bin/env bash\nLD_LIBRARY_PATH=%q exec %q "$@"\n' "$outer_ld" "$real_py" >"$py"
  else
    printf '#!/usr/bin/env bash\nunset LD_LIBRARY_PATH\nexec %q "$@"\n' "$real_py" >"$py"
  fi
  chmod +x "$py"
  # Every binary's libraries must resolve (ldd says "not found", or a symbol version is missing).
  missing=()
  for b in $(bundle_key binaries); do
    out=$(ldd "$build/$b" 2>&1)
    while read -r name; do missing+=("$b: $name"); done < <(sed -n 's/^[[:space:]]*\([^ ]*\) => not found.*/\1/p' <<<"$out")
    while read -r what; do missing+=("$b: $what"); done < <(grep -o "[^ ]*: version \`[^']*' not found (required by [^)]*)" <<<"$out")
  done
  ((${#missing[@]} == 0)) || give_up "bundle: libraries missing on this machine (LD_LIBRARY_PATH=$LD_LIBRARY_PATH): $(printf '%s; ' "${missing[@]}")"
  if [[ $bundle_sim != yes ]]; then
    has_gpu || give_up "gpu_check: no NVIDIA GPU here (nvidia-smi lists none) for a GPU bundle: nothing to check"
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
    numbers=${bundle_archs//-real/}
    if [[ " ${numbers//-virtual/} " != *" $cap "* ]]; then
      report "bundle: WARNING: built for $bundle_archs, this GPU is sm_$cap: its kernels load only through a PTX" \
        "architecture at or below sm_$cap (rebuild with CUDA_ARCHS=${cap}-real scripts/gpu_bundle.sh)"
    fi
  fi
elif [[ -n ${BUILD:-} ]]; then
  build=$(cd "$BUILD" && pwd) || give_up "gpu_check: no build directory $BUILD"
else
  has_gpu || give_up "gpu_check: no NVIDIA GPU here (nvidia-smi lists none): nothing to check"
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
  build=$PWD/build-gpu
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLMTRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${arch}-real" \
    -DLLMTRAIN_TESTS=ON >/dev/null || exit 1
  cmake --build "$build" -j "$(nproc)" --target llmtrain test_kernels device_rates >/dev/null || exit 1
  part_begin setup  # the build is not part of the bounds
fi
L=$build/llmtrain
work=$build/gpu_check
rm -rf "$work" && mkdir -p "$work"
for line in "${early_report[@]}"; do echo "$line" >>"$work/report.md"; done
env_out=$(bounded "$L" env 2>&1)
simulator=0
grep -q '^cuda: *simulator' <<<"$env_out" && simulator=1

tree_commit=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
report "# llmtrain gpu_check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $tree_commit"
[[ -n $bundle_info ]] && report "bundle: $bundle_info"
if [[ -n ${bundle_commit:-} && $tree_commit != '?' && $bundle_commit != "$(git rev-parse HEAD)" ]]; then
  report "bundle: WARNING: its binaries are of commit ${bundle_commit:0:9}, the scripts, recipes and data here of $tree_commit"
fi
report "device: $(grep -E '^(cuda|devices):' <<<"$env_out" | tr -s ' ' | paste -sd ';' -)"
# The planner's catalogue row for this GPU (docs/plan.md §1), for parts 3 and 5.
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H200*) catalog=h200 ;;
  *A100*40GB*) catalog=a100-40g ;;
  *A100*) catalog=a100-80g ;;
  *) catalog=h100 ;;
esac
# The data of parts 2-5: this repository's Markdown, byte tokenizer.
bounded "$L" prep --input README.md docs/*.md --tokenizer byte --output "$work/data/" --valid-fraction 0.2 \
  >"$work/prep.log" 2>&1 || give_up "prep failed ($work/prep.log)"
expired && give_up "setup: timed out after ${limit[setup]} s"

# 1. The op harness on the device (the linear layer through cuBLASLt on a GPU), then on a GPU the
#    linear cases again through llmtrain's own tiled GEMM (LLMTRAIN_CUDA_GEMM=tiled). The tests
#    without a device side are left out (they run in CI): the CPU attention's avx2 and avx512 forms
#    (the blas form carries the device's cases) and the CPU peak table.
part_1() {
  local filter=${OPS_FILTER:--Forms/Attention.*/avx2:Forms/Attention.*/avx512:CpuPeak.*}
  bounded env LLMTRAIN_OP_VERBOSE=1 "$build/tests/test_kernels" --gtest_brief=1 --gtest_filter="$filter" \
    >"$work/ops.log" 2>&1
  local ops=$?
  expired && return
  local cuda_cases failed skipped
  cuda_cases=$(grep -c 'cuda vs cpu' "$work/ops.log")
  failed=$(grep -c '^\[  FAILED  \]' "$work/ops.log")
  skipped=$(grep -c 'SKIPPED' "$work/ops.log")
  report "ops: test_kernels exit $ops; $cuda_cases op cases compared on the device; $failed failed lines; $skipped skipped" \
    "(filter $filter; log: $work/ops.log)"
  report "  gemm: $(sed -n 's/^gemm: *//p' <<<"$env_out")"
  ((ops == 0)) || status=1
  if ((simulator == 0)); then
    bounded env LLMTRAIN_CUDA_GEMM=tiled LLMTRAIN_OP_VERBOSE=1 "$build/tests/test_kernels" --gtest_brief=1 \
      --gtest_filter='*Linear*' >"$work/ops-tiled.log" 2>&1
    local tiled=$?
    expired && return
    report "ops, linear through the tiled GEMM: exit $tiled; $(grep -c 'cuda vs cpu' "$work/ops-tiled.log") cases (log: $work/ops-tiled.log)"
    ((tiled == 0)) || status=1
  fi
}

# 2. tiny on cuda against cpu: the first 10 steps must match (losses and step-10 parameters within
#    1e-5, docs/cuda.md; all of them when STEPS is below 10); over all STEPS, the worst loss difference is reported against a control,
#    the cpu run again with OpenBLAS's Haswell kernels (another summation order in every product):
#    this batch-of-2 run amplifies rounding differences after its loss spike near step 20, and the
#    control shows how far a change of summation order alone moves it. The final evaluation takes
#    one batch (it is not compared).
part_2() {
  local dev blas out
  for dev in cpu cuda cpu-haswell; do
    blas=()
    [[ $dev == cpu-haswell ]] && blas=(env OPENBLAS_CORETYPE=Haswell)
    bounded "${blas[@]}" "$L" run recipes/tiny.yaml --set data.train="$work/data/train" --set data.valid="$work/data/valid" \
      --set model.seq_len=64 --set train.micro_batch=1 --set train.global_batch=2 --set train.steps="$steps" \
      --set optimizer.warmup=$((steps / 5)) --set train.device="${dev%-haswell}" --set checkpoint.every=10 \
      --set checkpoint.keep=100 --set eval.every=0 --set eval.batches=1 --set log.every=1 \
      --set log.dir="$work/tiny-$dev" >"$work/tiny-$dev.log" 2>&1 && continue
    expired && return
    report "tiny on $dev failed: $work/tiny-$dev.log"
    status=1
  done
  local first=$((steps < 10 ? steps : 10))  # fewer on the simulator (STEPS=3)
  if out=$(bounded "$py" tests/e2e/compare_runs.py "$work/tiny-cuda" "$work/tiny-cpu" --last "$first" --tol 1e-5 2>&1); then
    report "tiny, $first steps, cuda against cpu: $out"
  else
    expired && return
    report "tiny, $first steps, cuda against cpu: DIFFERS: $(tail -1 <<<"$out")"
    status=1
  fi
  report "tiny, $steps steps, cuda against cpu: $(worst "$work/tiny-cuda" "$work/tiny-cpu" 2>&1)"
  report "  control, cpu with OpenBLAS's Haswell kernels against cpu: $(worst "$work/tiny-cpu-haswell" "$work/tiny-cpu" 2>&1)"
}
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

# 3. Step time against PyTorch: median tokens/s over steps 6-20 of `llmtrain run` (a repeated
#    batch: the byte-level data; the vocabulary set to the shape's), against the reference model in
#    PyTorch (scripts/bench/torch_step.py, its median of 10 steps) at the same shape, batch and
#    precision, with its fused attention (--sdpa 1) for the larger shape. Trimmed to fit the part's
#    limit: 20 steps (were 30), PyTorch's 10 (were 20), one batch for the final evaluation.
speed() {  # NAME TORCH_ARGS -- LLMTRAIN_SETS...
  local name=$1 torch_args=$2
  shift 3
  bounded "$L" run recipes/tiny.yaml --set model.family=gpt2 --set train.steps=20 --set optimizer.warmup=5 \
    --set train.device=cuda --set data.train="$work/data/train" --set data.valid="$work/data/valid" \
    --set eval.every=0 --set eval.batches=1 --set checkpoint.every=0 --set log.every=1 --set log.dir="$work/speed-$name" \
    "$@" >"$work/speed-$name.log" 2>&1
  expired && return
  local ours theirs
  ours=$("$py" -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(round(statistics.median(x['tokens_per_s'] for x in r if 'tokens_per_s' in x and x['step'] > 5)))" \
    "$work/speed-$name/metrics.jsonl" 2>/dev/null || echo "?")
  # shellcheck disable=SC2086
  theirs=$(bounded "$py" scripts/bench/torch_step.py $torch_args --device cuda --steps 10 2>"$work/torch-$name.log" |
    sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p')
  expired && return
  report "step time, $name on cuda: llmtrain ${ours:-?} tokens/s, PyTorch ${theirs:-?} tokens/s" \
    "(ratio $("$py" -c "print(f'{float(\"$ours\")/float(\"$theirs\"):.2f}')" 2>/dev/null || echo '?'))"
  # The planner's prediction for the same recipe on this GPU's catalogue row, against the measurement.
  local predicted tokens
  predicted=$(bounded "$L" run recipes/tiny.yaml --set model.family=gpt2 --set train.device=cuda "$@" --dry-run \
    --gpu "$catalog" 2>/dev/null | sed -n 's/^predicted step time: \([0-9.e+-]*\) s.*/\1/p')
  local with_rates=""
  [[ -n $rates ]] && with_rates=$(bounded "$L" run recipes/tiny.yaml --set model.family=gpt2 --set train.device=cuda "$@" \
    --dry-run --gpu "$catalog" --rates "$rates" 2>/dev/null | sed -n 's/^predicted step time: \([0-9.e+-]*\) s.*/\1/p')
  tokens=$("$py" -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(next(x['tokens'] for x in r if 'tokens' in x))" \
    "$work/speed-$name/metrics.jsonl" 2>/dev/null || echo "?")
  report "  plan ($catalog): predicted ${predicted:-?} s a step with the catalogue's rates, ${with_rates:-?} s with this" \
    "run's (rates.json), measured" \
    "$("$py" -c "m=$tokens/$ours; print(f'{m:.4g} s (predicted / measured {$predicted/m:.2f}, {${with_rates:-0}/m:.2f})')" \
      2>/dev/null || echo '?')"
}
rates=""
part_3() {
  if ((simulator)) || ! bounded "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    expired && return
    report "step time: skipped (no python3 with CUDA-enabled torch, or the simulator)"
    return
  fi
  # The planner's rates measured here (tests/bench/device_rates: the attention kernel and the
  # products at GPT-2 124M's shapes), for `plan --rates` / `run --dry-run --rates`; docs/plan.md §1
  # records them.
  if [[ -x $build/tests/device_rates ]]; then
    if bounded "$build/tests/device_rates" --output "$work/rates.json" >"$work/rates.log" 2>&1; then
      rates=$work/rates.json
      report "rates: $("$py" -c "import json,sys; r=json.load(open(sys.argv[1])); print(', '.join(f'{k} {r[k]/1e12:.1f} TFLOP/s' for k in ('attention_forward_rate','attention_backward_rate','attention_tc_forward_rate','attention_tc_backward_rate','products_bf16','products_fp32') if k in r))" "$rates" 2>&1) ($rates)"
    else
      expired && return
      report "rates: device_rates failed ($work/rates.log)"
    fi
  fi
  local tiny=(--set model.layers=4 --set model.hidden=128 --set model.heads=4 --set model.kv_heads=4
    --set model.seq_len=256 --set train.micro_batch=8 --set train.global_batch=8)
  local gpt2=(--set model.layers=12 --set model.hidden=768 --set model.heads=12 --set model.kv_heads=12
    --set model.vocab=50257 --set model.seq_len=1024 --set model.max_positions=1024 --set train.micro_batch=8
    --set train.global_batch=8)
  speed "GPT-2 tiny shape (4x128, seq 256, batch 8) fp32" "--shape tiny --batch 8" -- "${tiny[@]}"
  # The two GPT-2 124M runs also time every op and library call of steps 2-4 (log.profile: ops; the
  # median above is of steps 6-20): where the device time goes, without a profiler.
  speed "GPT-2 124M (seq 1024, batch 8) fp32" "--shape gpt2-124m --batch 8 --sdpa 1" -- "${gpt2[@]}" \
    --set log.profile=ops
  op_rows "GPT-2 124M (seq 1024, batch 8) fp32"
  speed "GPT-2 124M (seq 1024, batch 8) bf16" "--shape gpt2-124m --batch 8 --sdpa 1 --autocast bf16" -- "${gpt2[@]}" \
    --set train.precision=bf16 --set log.profile=ops
  op_rows "GPT-2 124M (seq 1024, batch 8) bf16"
  # The same bf16 step against torch.compile (the issue's second bar), llmtrain's figure from the run above.
  local ours compiled
  ours=$("$py" -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(round(statistics.median(x['tokens_per_s'] for x in r if 'tokens_per_s' in x and x['step'] > 5)))" \
    "$work/speed-GPT-2 124M (seq 1024, batch 8) bf16/metrics.jsonl" 2>/dev/null || echo "?")
  compiled=$(bounded "$py" scripts/bench/torch_step.py --shape gpt2-124m --batch 8 --sdpa 1 --autocast bf16 --compile 1 \
    --device cuda --steps 10 --warmup 3 2>"$work/torch-compile.log" | sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p')
  expired && return
  report "step time, GPT-2 124M (seq 1024, batch 8) bf16 on cuda: llmtrain ${ours:-?} tokens/s, PyTorch torch.compile" \
    "${compiled:-?} tokens/s (ratio $("$py" -c "print(f'{float(\"$ours\")/float(\"$compiled\"):.2f}')" 2>/dev/null || echo '?'))"
}
# op_rows NAME: the speed run's heaviest ops from its op_profile.json (the whole table is in its log).
op_rows() {
  local file="$work/speed-$1/op_profile.json"
  [[ -f $file ]] || { report "  ops, $1: no op_profile.json (log: $work/speed-$1.log)"; return; }
  report "  ops, $1 (log.profile: ops): $("$py" -c "import json,sys; p=json.load(open(sys.argv[1])); rows=sorted((o for o in p['ops'] if o['depth']==0), key=lambda o: -o['total_ms'])[:8]; print(f\"{p['step_ms_per_step']:.1f} ms a step; \" + ', '.join(f\"{o['name']} {o['ms_per_step']:.2f} ms ({100*o['share']:.0f}%)\" for o in rows))" "$file" 2>&1)"
}
# shellcheck source=scripts/gpu_check_ranks.sh
part_4() { source scripts/gpu_check_ranks.sh; }
# shellcheck source=scripts/gpu_check_offload.sh
part_5() { source scripts/gpu_check_offload.sh; }

for p in 1 2 3 4 5; do
  part "$p" || continue
  part_begin "$p"
  "part_$p"
  part_end
done
if [[ -n ${LOGS_TO:-} ]]; then
  mkdir -p "$LOGS_TO" && cp "$work"/*.log "$work"/report.md "$LOGS_TO"/ && { [[ -z $rates ]] || cp "$rates" "$LOGS_TO"/; }
fi
report "result: $([[ $status == 0 ]] && echo passed || echo FAILED) ($((SECONDS - t_start)) s; work: $work)"
exit $status
