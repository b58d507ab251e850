# shellcheck shell=bash
# Part 4 of scripts/gpu_check.sh (sourced there: uses its L, build, work, py, simulator, report,
# status and bounded, which runs a command within the part's time limit; binaries at the build's
# paths under $build, the build or the unpacked bundle): several ranks on the device, as threads of
# ONE process (tests/bench/ranks_in_process: no mpirun needed, the lent machine has none), each rank
# with the device path's streams and events as in training (a compute stream of its own), against
# the one-rank run.
#
#   - Which NCCL: the build's, or a newer libnccl.so.2 (NCCL_LIB_DIR, else python3's nvidia-nccl
#     package) when that is 2.30 or later; `llmtrain env` prints the one that loads.
#   - One GPU: the ranks share it. NCCL >= 2.30 takes several ranks of one communicator on one GPU
#     with NCCL_MULTI_RANK_GPU_ENABLE=1 (experimental; NVLS off, fewer CTAs); older NCCL refuses
#     ("Duplicate GPU detected"), so device tensors go through the staged communicator over the
#     in-process world and the report says NCCL was not exercised.
#   - Several GPUs: a rank per GPU through NCCL (threads of one process, as NCCL allows), and dp
#     scaling of GPT-2 124M in bf16.
#   - Each layout of RANK_LAYOUTS (default: dp2 dp2-zero3 tp2 pp2 tp2xpp2) against the one-rank run
#     on the device: losses per step and the final parameters within 1e-5 (fp32), by
#     tests/e2e/compare_runs.py; with the communicator each rank used (the tool prints it) and the
#     run's exposed communication.
#   - compute-sanitizer memcheck on a 2-rank run, where the tool works.
# RANK_STEPS (default 10; 3 on the simulator) steps each.

ranks_steps=${RANK_STEPS:-$((simulator ? 3 : 10))}
ranks_tool=$build/tests/ranks_in_process
[[ -x $ranks_tool ]] || ranks_tool=$(find "$build" -name ranks_in_process -type f -perm -u+x 2>/dev/null | head -1)
version_number() { awk -F. '{ printf "%d", $1 * 10000 + $2 * 100 + $3 }' <<<"$1"; }
nccl=$(bounded "$L" env 2>&1 | sed -n 's/^nccl: *//p')
nccl_dir=${NCCL_LIB_DIR:-}
if [[ -z $nccl_dir ]]; then
  nccl_dir=$("$py" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' \
    2>/dev/null || true)
fi
if ((simulator == 0)) && [[ -n $nccl_dir && -e $nccl_dir/libnccl.so.2 ]]; then
  other=$(bounded env LD_LIBRARY_PATH="$nccl_dir:${LD_LIBRARY_PATH:-}" "$L" env 2>&1 | sed -n 's/^nccl: *//p')
  if (($(version_number "$other") >= 23000 && $(version_number "$other") > $(version_number "$nccl"))); then
    export LD_LIBRARY_PATH="$nccl_dir:${LD_LIBRARY_PATH:-}"
    nccl="$other (from $nccl_dir)"
  fi
fi
nccl_code=$(version_number "${nccl%% *}")

if ((simulator)); then
  gpus=1
  export LLMTRAIN_SIM_DEVICES=1  # one simulated device, shared, as on a one-GPU machine
else
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
if ((simulator == 0 && gpus < 4 && nccl_code >= 23000)); then
  export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0 NCCL_MAX_CTAS=${NCCL_MAX_CTAS:-8}
fi
how="ranks as threads of one process (tests/bench/ranks_in_process) on $gpus GPU(s); NCCL ${nccl:-?}"
((simulator)) && how="ranks as threads of one process on one shared simulated device"
if ((simulator == 0 && gpus < 4)); then
  if pgrep -f nvidia-cuda-mps >/dev/null 2>&1; then how="$how; CUDA MPS runs"; fi
fi
report "ranks: $how"

if [[ -z $ranks_tool ]]; then
  report "ranks: FAILED: no ranks_in_process in $build (build it, or a bundle of scripts/gpu_bundle.sh)"
  status=1
  return 0 2>/dev/null || exit 1
fi

ranks_common=(--set model.seq_len=64 --set train.micro_batch=1 --set train.global_batch=4 --set train.steps="$ranks_steps"
  --set optimizer.warmup=1 --set train.device=cuda --set data.train="$work/data/train" --set data.valid="$work/data/valid"
  --set eval.every=0 --set eval.batches=1 --set checkpoint.every="$ranks_steps" --set checkpoint.resume=none --set log.every=1)
ranks_run() {  # NAME RANKS SETS...
  local name=$1 n=$2
  shift 2
  bounded timeout 240 "$ranks_tool" recipes/tiny.yaml --ranks "$n" "${ranks_common[@]}" --set log.dir="$work/ranks-$name" \
    "$@" >"$work/ranks-$name.log" 2>&1
}
if bounded timeout 240 "$L" run recipes/tiny.yaml "${ranks_common[@]}" --set log.dir="$work/ranks-one" \
  >"$work/ranks-one.log" 2>&1; then
  declare -A layouts=([dp2]="2" [dp2-zero3]="2 --set parallel.zero=3" [tp2]="2 --set parallel.tp=2"
    [pp2]="2 --set parallel.pp=2" [tp2xpp2]="4 --set parallel.tp=2 --set parallel.pp=2")
  for name in ${RANK_LAYOUTS:-dp2 dp2-zero3 tp2 pp2 tp2xpp2}; do
    [[ -n ${layouts[$name]:-} ]] || { report "ranks: no layout $name (RANK_LAYOUTS)"; status=1; continue; }
    read -r np sets <<<"${layouts[$name]}"
    # shellcheck disable=SC2086
    if ! ranks_run "$name" "$np" $sets; then
      report "ranks, $name: FAILED ($work/ranks-$name.log: $(grep -m1 -iE 'error|failed' "$work/ranks-$name.log"))"
      status=1
      continue
    fi
    # The tool's last lines, one per rank ("rank N: DEVICE; device communication: COMM (why)").
    used=$(grep -E '^rank [0-9]+: ' "$work/ranks-$name.log" | grep -o 'device communication: [a-z]*' | sort | uniq -c |
      sed 's/device communication: //' |
      awk '{ printf "%s%s on %s rank(s)", (NR > 1 ? ", " : ""), $2, $1 }')
    # dp's gradient sync reports its exposed share; other layouts' communication is inside fwd/bwd.
    exposed=$(grep -o 'comm exposed [0-9.]*%' "$work/ranks-$name.log" | tail -1)
    [[ -n $exposed ]] || exposed=$(grep -o 'ms/step: [^|]*' "$work/ranks-$name.log" | tail -1)
    if out=$("$py" tests/e2e/compare_runs.py "$work/ranks-$name" "$work/ranks-one" --last "$ranks_steps" \
      --tol 1e-5 2>&1); then
      report "ranks, $name ($np threads) against one rank: $out; ${exposed:-?}; device communication: ${used:-?}"
    else
      report "ranks, $name ($np threads) against one rank: DIFFERS: $(tail -1 <<<"$out"); device communication: ${used:-?}"
      status=1
    fi
  done
else
  report "ranks: the one-rank run failed ($work/ranks-one.log)"
  status=1
fi

# compute-sanitizer on a 2-rank run (both ranks are threads of the one process it watches).
if ((simulator == 0)) && command -v compute-sanitizer >/dev/null; then
  bounded timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$ranks_tool" recipes/tiny.yaml --ranks 2 \
    "${ranks_common[@]}" --set train.steps=2 --set checkpoint.every=0 --set log.dir="$work/ranks-sanitizer" \
    >"$work/ranks-sanitizer.log" 2>&1
  report "ranks, compute-sanitizer memcheck on dp 2: exit $? ($(grep -o 'ERROR SUMMARY: [0-9]* error' "$work/ranks-sanitizer.log" | sort | uniq -c | paste -sd, -))"
else
  report "ranks, compute-sanitizer: skipped (the simulator, or no compute-sanitizer here)"
fi

# dp scaling with a GPU per rank: GPT-2 124M in bf16, tokens/s at dp N over N × dp 1.
if ((gpus >= 2)); then
  scale_run() {  # NAME RANKS
    bounded timeout 300 "$ranks_tool" recipes/tiny.yaml --ranks "$2" --set model.family=gpt2 --set model.layers=12 \
      --set model.hidden=768 --set model.heads=12 --set model.kv_heads=12 --set model.vocab=50257 --set model.seq_len=1024 \
      --set model.max_positions=1024 --set train.micro_batch=8 --set train.global_batch=$((8 * $2)) --set train.steps=20 \
      --set optimizer.warmup=5 --set train.precision=bf16 --set train.device=cuda --set data.train="$work/data/train" \
      --set data.valid="$work/data/valid" --set eval.every=0 --set checkpoint.every=0 --set log.every=1 \
      --set log.dir="$work/scale-$1" >"$work/scale-$1.log" 2>&1
    "$py" -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(round(statistics.median(x['tokens_per_s'] for x in r if 'tokens_per_s' in x and x['step'] > 5)))" \
      "$work/scale-$1/metrics.jsonl" 2>/dev/null || echo "?"
  }
  one=$(scale_run 1 1)
  many=$(scale_run "$gpus" "$gpus")
  report "dp scaling, GPT-2 124M bf16: dp 1 $one tokens/s, dp $gpus $many tokens/s:" \
    "$("$py" -c "print(f'{float(\"$many\") / ($gpus * float(\"$one\")):.2f}')" 2>/dev/null || echo '?') of linear"
fi
