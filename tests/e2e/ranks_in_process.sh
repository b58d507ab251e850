#!/usr/bin/env bash
# Several ranks as threads of one process (tests/bench/ranks_in_process, gpu_check part 4 where a
# machine has no mpirun) on the CUDA backend in the SIM build: each rank on a simulated device and a
# compute stream of its own, device tensors through the simulator's NCCL (its real call sites,
# parallel/comm/comm_nccl.cpp) or the staged communicator over the in-process world, against the
# one-rank CPU run of the same recipe (losses per step and final parameters within 1e-5), and the
# report naming the communicator each rank used.
#
#   ranks_in_process.sh BUILD SRC ci     dp 2 through NCCL
#   ranks_in_process.sh BUILD SRC full   also tp 2 + sequence parallelism, pp 2 (1F1B), ZeRO 3 at dp 2
#                                        and Muon at ZeRO 2 through NCCL, dp 2 staged
#
# tiny at seq 64, micro-batch 1, global batch 2, 2 steps, a checkpoint at the end.
source "$(dirname "$0")/lib.sh"
use_python
prep_fortunes
mode=${3:-ci}
RANKS=$BUILD/tests/ranks_in_process
[[ -x $RANKS ]] || { echo "FAIL: $RANKS is not built"; exit 1; }
export LLMTRAIN_SIM_DEVICES=4

common=(--set model.seq_len=64 --set train.micro_batch=1 --set train.global_batch=2 --set train.steps=2
        --set train.threads=1 --set parallel.dp=auto --set data.train=data/train --set data.valid=data/valid
        --set eval.every=0 --set eval.batches=1 --set checkpoint.every=2 --set checkpoint.keep=1 --set log.every=1
        --set optimizer.warmup=1 --set checkpoint.resume=none)
compare() { # NAME A B ARGS...: compare_runs.py A B ARGS, one line of figures
  local name=$1 o
  o=$($PY "$SRC/tests/e2e/compare_runs.py" "${@:2}" 2>&1) && pass "$name: $o" || fail "$name: $o"
}
# layout NAME COMM RANKS ARGS...: NAME as RANKS threads on cuda through COMM, against the CPU run.
layout() {
  local name=$1 comm=$2 n=$3
  shift 3
  SECONDS=0
  run_cmd "$name" timeout 400 "$RANKS" "$SRC/recipes/tiny.yaml" --ranks "$n" "${common[@]}" --set log.dir="$name" \
    --set train.device=cuda --set parallel.device_comm="$comm" "$@"
  expect_status 0
  echo "   $name: ${SECONDS}s"
  local said
  said=$(grep -cE "^rank [0-9]+: .*device communication: $comm" <<<"$out")
  ((said == n)) && pass "$name: every rank says it used $comm" || fail "$name: expected $n ranks on $comm; output:
$out"
  compare "$name as threads on cuda takes the one-rank cpu run's steps" "$name" "${against:-cpu}" --last 2 --tol 1e-5
}

run_cmd cpu "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" "${common[@]}" --set log.dir=cpu --set train.device=cpu
expect_status 0

layout dp2-nccl nccl 2
if [[ $mode == full ]]; then
  layout tp2-sp-nccl nccl 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
  layout pp2-nccl nccl 2 --set parallel.pp=2 --set parallel.pp_schedule=1f1b
  layout zero3-nccl nccl 2 --set parallel.zero=3
  layout dp2-staged staged 2
  # Muon at ZeRO 2, its units cut inside matrices: each cut matrix's update summed over the shard
  # group through NCCL, Newton–Schulz through the simulated cuBLASLt on each rank's stream.
  muon=(--set optimizer.name=muon --set optimizer.lr=0.02 --set optimizer.muon.ns_dtype=fp32)
  run_cmd muon-cpu "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" "${common[@]}" --set log.dir=muon-cpu \
    --set train.device=cpu "${muon[@]}"
  expect_status 0
  against=muon-cpu layout muon-zero2-nccl nccl 2 --set parallel.zero=2 --set parallel.bucket_mb=0.01 "${muon[@]}"
fi

# A bad argument is named.
run_cmd "bad --ranks" "$RANKS" "$SRC/recipes/tiny.yaml" --ranks 0
expect_status 2
expect_out "--ranks takes a whole number from 1 to 64"
finish
