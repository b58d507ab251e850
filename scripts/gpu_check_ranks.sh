# Part 4 of scripts/gpu_check.sh (sourced there: uses its L, work, py, simulator, report and status):
# several ranks on the device.
#
#   - Which NCCL: the build's, or a newer libnccl.so.2 (NCCL_LIB_DIR, else python3's nvidia-nccl
#     package) when that is 2.30 or later; `llmtrain env` prints the one that loads.
#   - One GPU: ranks share it (launch.share_devices). NCCL >= 2.30 takes several ranks of one
#     communicator on one GPU with NCCL_MULTI_RANK_GPU_ENABLE=1 (experimental; NVLS off, fewer
#     CTAs); older NCCL refuses ("Duplicate GPU detected"), so the layouts go through the staged
#     path and the report says NCCL was not exercised. Without CUDA MPS the sharing ranks are
#     time-sliced (slow, so the shapes are small); the report says whether MPS runs.
#   - Several GPUs: one rank per GPU through NCCL, and dp scaling of GPT-2 124M in bf16.
#   - Every layout (dp 2, ZeRO 3 at dp 2, tp 2, pp 2, tp 2 × pp 2) against the one-rank run on the
#     device: losses per step and the final parameters within 1e-5 (fp32), by
#     tests/e2e/compare_runs.py; the run's exposed communication (the step timer's "comm exposed")
#     is reported beside each, the overlap measured rather than assumed.
#   - compute-sanitizer memcheck on each rank of a 2-rank run, where the tool works.
# RANK_STEPS (default 10; 3 on the simulator) steps each.

ranks_steps=${RANK_STEPS:-$((simulator ? 3 : 10))}
version_number() { awk -F. '{ printf "%d", $1 * 10000 + $2 * 100 + $3 }' <<<"$1"; }
nccl=$("$L" env 2>&1 | sed -n 's/^nccl: *//p')
nccl_dir=${NCCL_LIB_DIR:-}
if [[ -z $nccl_dir ]]; then
  nccl_dir=$("$py" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' \
    2>/dev/null || true)
fi
if ((simulator == 0)) && [[ -n $nccl_dir && -e $nccl_dir/libnccl.so.2 ]]; then
  other=$(LD_LIBRARY_PATH="$nccl_dir:${LD_LIBRARY_PATH:-}" "$L" env 2>&1 | sed -n 's/^nccl: *//p')
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
sharing=(--set launch.share_devices=true)
if ((gpus >= 4)); then
  sharing=()
  device_comm=nccl
  how="NCCL $nccl, one rank per GPU ($gpus GPUs)"
elif ((simulator == 0 && nccl_code >= 23000)); then
  export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0 NCCL_MAX_CTAS=${NCCL_MAX_CTAS:-8}
  device_comm=nccl
  how="NCCL $nccl, ranks sharing $gpus GPU(s) (NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL_MAX_CTAS=$NCCL_MAX_CTAS, NVLS off)"
elif ((simulator)); then
  device_comm=staged
  how="the staged path (device -> pinned host -> MPI) on the simulator (a build without NCCL)"
else
  device_comm=staged
  how="the staged path (device -> pinned host -> MPI): NCCL ${nccl:-?} cannot put several ranks of one communicator on one GPU (2.30 or later can), so NCCL itself is not exercised here"
fi
if ((simulator == 0)); then
  if pgrep -f nvidia-cuda-mps >/dev/null 2>&1; then
    how="$how; CUDA MPS runs"
  elif ((gpus < 4)); then
    how="$how; no CUDA MPS: the ranks sharing a GPU are time-sliced"
  fi
fi
report "ranks: $how"

ranks_common=(--set model.seq_len=64 --set train.micro_batch=1 --set train.global_batch=4 --set train.steps="$ranks_steps"
  --set optimizer.warmup=1 --set train.device=cuda --set data.train="$work/data/train" --set data.valid="$work/data/valid"
  --set eval.every=0 --set checkpoint.every="$ranks_steps" --set checkpoint.resume=none --set log.every=1
  --set parallel.device_comm="$device_comm" "${sharing[@]}")
ranks_run() {  # NAME NPROC SETS...
  local name=$1 np=$2
  shift 2
  timeout 240 "$L" run recipes/tiny.yaml --nproc "$np" "${ranks_common[@]}" --set log.dir="$work/ranks-$name" "$@" \
    >"$work/ranks-$name.log" 2>&1
}
if ranks_run one 1; then
  for layout in "dp2:2" "dp2-zero3:2:--set parallel.zero=3" "tp2:2:--set parallel.tp=2" "pp2:2:--set parallel.pp=2" \
    "tp2xpp2:4:--set parallel.tp=2 --set parallel.pp=2"; do
    IFS=: read -r name np sets <<<"$layout"
    # shellcheck disable=SC2086
    if ! ranks_run "$name" "$np" $sets; then
      report "ranks, $name: FAILED ($work/ranks-$name.log: $(grep -m1 -i 'error' "$work/ranks-$name.log"))"
      status=1
      continue
    fi
    used=$(grep -m1 -o 'device communication: .*' "$work/ranks-$name.log" | cut -c23-)
    # dp's gradient sync reports its exposed share; other layouts' communication is inside fwd/bwd.
    exposed=$(grep -o 'comm exposed [0-9.]*%' "$work/ranks-$name.log" | tail -1)
    [[ -n $exposed ]] || exposed=$(grep -o 'ms/step: [^|]*' "$work/ranks-$name.log" | tail -1)
    if out=$("$py" tests/e2e/compare_runs.py "$work/ranks-$name" "$work/ranks-one" --last "$ranks_steps" \
      --tol 1e-5 2>&1); then
      report "ranks, $name against one rank: $out; ${exposed:-?}; ${used:-?}"
    else
      report "ranks, $name against one rank: DIFFERS: $(tail -1 <<<"$out"); ${used:-?}"
      status=1
    fi
  done
else
  report "ranks: the one-rank run failed ($work/ranks-one.log)"
  status=1
fi

# compute-sanitizer on both ranks of a dp 2 run, under a plain mpirun (the ranks' own launcher).
if ((simulator == 0)) && command -v compute-sanitizer >/dev/null && command -v mpirun >/dev/null; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    timeout 300 mpirun -np 2 -x LD_LIBRARY_PATH -x NCCL_MULTI_RANK_GPU_ENABLE -x NCCL_NVLS_ENABLE -x NCCL_MAX_CTAS \
    compute-sanitizer --tool memcheck --error-exitcode 9 "$L" run recipes/tiny.yaml "${ranks_common[@]}" \
    --set train.steps=2 --set checkpoint.every=0 --set launch.procs_per_node=2 --set log.dir="$work/ranks-sanitizer" \
    >"$work/ranks-sanitizer.log" 2>&1
  report "ranks, compute-sanitizer memcheck on dp 2: exit $? ($(grep -o 'ERROR SUMMARY: [0-9]* error' "$work/ranks-sanitizer.log" | sort | uniq -c | paste -sd, -))"
else
  report "ranks, compute-sanitizer: skipped (the simulator, or no compute-sanitizer or mpirun here)"
fi

# dp scaling with a GPU per rank: GPT-2 124M in bf16, tokens/s at dp N over N × dp 1.
if ((gpus >= 2)); then
  scale_run() {  # NAME NPROC
    timeout 300 "$L" run recipes/tiny.yaml --nproc "$2" --set model.family=gpt2 --set model.layers=12 --set model.hidden=768 \
      --set model.heads=12 --set model.kv_heads=12 --set model.vocab=50257 --set model.seq_len=1024 \
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
