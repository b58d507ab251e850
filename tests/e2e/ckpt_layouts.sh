#!/usr/bin/env bash
# Checkpoints under any layout, under real `mpirun`: ten (save -> load) pairs that change tp, pp
# (with the interleaved schedule's virtual stages and gpipe), dp, ZeRO stage and shard group and
# sequence parallelism at once (ZeRO 2 and 3 only where pp = 1: they refuse pipelines). Each source run trains 20 steps and writes a checkpoint at step 10;
# each target loads that checkpoint in another layout, with the optimizer state and the data
# position, and must continue on the source's losses, validation losses and final parameters.
source "$(dirname "$0")/lib.sh"
source "$SRC/tests/parallel/mpi_env.sh"
use_python
prep_fortunes

cat >r.yaml <<'YAML'
name: layouts
model: {family: llama, layers: 4, hidden: 64, heads: 4, kv_heads: 2, seq_len: 32}
data: {tokenizer: byte, train: data/train, valid: data/valid}
train: {steps: 20, micro_batch: 1, global_batch: 8, seed: 11, threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 5}
checkpoint: {every: 10, keep: 5}
eval: {every: 10, batches: 1}
log: {every: 1}
YAML

# layout NAME RANKS SETTINGS...: a named layout, its rank count and its --set arguments.
declare -A sets ranks
layout() {
  local name=$1 np=$2
  shift 2
  ranks[$name]=$np
  sets[$name]="$*"
}
layout one 1
layout tp2-pp2-dp2-z1 8 parallel.tp=2 parallel.pp=2 parallel.zero=1
layout pp2v2-dp2-z1 4 parallel.pp=2 parallel.pp_schedule=interleaved parallel.virtual_stages=2 parallel.zero=1
layout tp2sp-dp2-z3 4 parallel.tp=2 parallel.sequence_parallel=true parallel.zero=3
layout dp4-z1-g2 4 parallel.zero=1 parallel.zero_group=2
layout tp2-pp2 4 parallel.tp=2 parallel.pp=2
layout dp4-z3-g2 4 parallel.zero=3 parallel.zero_group=2
layout pp2v2-dp4 8 parallel.pp=2 parallel.pp_schedule=interleaved parallel.virtual_stages=2
layout tp2-dp2-z2 4 parallel.tp=2 parallel.zero=2
layout pp4-gpipe 4 parallel.pp=4 parallel.pp_schedule=gpipe
layout pp2-dp2 4 parallel.pp=2
layout tp4 4 parallel.tp=4
layout tp2-pp2-dp2-z1sp 8 parallel.tp=2 parallel.pp=2 parallel.zero=1 parallel.sequence_parallel=true

train() {  # train NAME DIR [extra --set ...]
  local name=$1 dir=$2
  shift 2
  local args=()
  for s in ${sets[$name]}; do args+=(--set "$s"); done
  mpi_run 240 "${ranks[$name]}" "$LLMTRAIN" run r.yaml --set log.dir=$dir "${args[@]}" "$@"
}

pairs=(
  "one tp2-pp2" "one dp4-z3-g2"
  "tp2-pp2-dp2-z1 one" "tp2-pp2-dp2-z1 pp2v2-dp4"
  "pp2v2-dp2-z1 tp2-dp2-z2" "pp2v2-dp2-z1 pp4-gpipe"
  "tp2sp-dp2-z3 pp2-dp2" "tp2sp-dp2-z3 tp4"
  "dp4-z1-g2 tp2-pp2-dp2-z1sp" "dp4-z1-g2 one"
)
declare -A trained
for pair in "${pairs[@]}"; do
  set -- $pair
  from=$1 to=$2
  if [[ -z ${trained[$from]:-} ]]; then
    run_cmd "source-$from" train $from src-$from
    expect_status 0
    trained[$from]=1
  fi
  dir=$from-to-$to
  mkdir -p $dir/ckpt
  cp -r src-$from/ckpt/step_00000010 $dir/ckpt/
  echo step_00000010 >$dir/ckpt/latest
  cp src-$from/metrics.jsonl $dir/
  run_cmd "$dir" train $to $dir
  expect_status 0
  expect_out "at step 10"
  out=$($PY "$SRC/tests/e2e/compare_runs.py" $dir src-$from --first 11 --val 2>&1) &&
    pass "$from -> $to continues on $from's run: $out" || fail "$from -> $to diverges: $out"
done

# `ckpt inspect` and `export` read any layout: the step-10 checkpoints of the sharded sources, every
# checksum verified and the layout named; their exports hold exactly the assembled parameters
# (compare_runs.py assembles them from the manifest's slices independently), vocabulary trimmed.
for from in tp2-pp2-dp2-z1 tp2sp-dp2-z3 pp2v2-dp2-z1; do
  run_cmd "inspect-$from" "$LLMTRAIN" ckpt inspect src-$from/ckpt/step_00000010
  expect_status 0; expect_out_re "checksums: all [0-9]+ slices verified"
  run_cmd "export-$from" "$LLMTRAIN" export src-$from/ckpt/step_00000010 --hf hf-$from
  expect_status 0
  out=$($PY - "$SRC/tests/e2e" src-$from hf-$from <<'PY' 2>&1
import sys
sys.path.insert(0, sys.argv[1])
from compare_runs import params
from safetensors.numpy import load_file
ours = params(sys.argv[2], 10)
hf = load_file(sys.argv[3] + "/model.safetensors")
assert sorted(ours) == sorted(hf), (sorted(ours)[:3], sorted(hf)[:3])
for k, v in ours.items():
    rows = hf[k].shape[0]
    assert (v[:rows] == hf[k]).all() and v.shape[1:] == hf[k].shape[1:], k
print(f"{len(hf)} tensors identical")
PY
) && pass "export of $from's checkpoint: $out" || fail "export of $from's checkpoint: $out"
done
run_cmd inspect-layout "$LLMTRAIN" ckpt inspect src-pp2v2-dp2-z1/ckpt/step_00000010
expect_out "layout: tp 1 × pp 2 (interleaved, 2 virtual stages) × dp 2, zero 1"
finish
