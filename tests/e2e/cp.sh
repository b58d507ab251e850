#!/usr/bin/env bash
# Context parallelism under real `mpirun` (ring attention's K/V blocks and their gradients between
# ranks, the chunk split of every sequence, gradients reduced over dp × cp): GPT-2 (learned positions)
# and LLaMA (RoPE, grouped-query kv_heads 2) on fortunes at cp 2 and cp 4 with cp_comm ring and
# all_to_all (Ulysses; LLaMA with 2 key/value heads at cp 2, with 4 at cp 4), cp 2 ×
# tp 2 with sequence parallelism, cp 2 × pp 2, cp 2 × dp 2 with ZeRO 1 and cp 2 with ZeRO 3, each against cp 1: the
# losses per step (relative ≤ 1e-5 over 15 steps), the validation losses and the final parameters
# (assembled from the checkpoint's slices, ‖a − b‖ / ‖b‖ ≤ 1e-5); measured memory equals the plan;
# a cp 4 checkpoint resumes at cp 1 on cp 4's trajectory and a cp 1 one at cp 2 × dp 2 (ZeRO 1);
# `ckpt inspect` names cp 4 and `generate` runs from that checkpoint at cp 1; all_to_all with heads cp does not divide is
# refused before any rank starts.
source "$(dirname "$0")/lib.sh"
source "$SRC/tests/parallel/mpi_env.sh"
use_python
prep_fortunes

cat >r.yaml <<'YAML'
name: cp
model: {family: gpt2, layers: 2, hidden: 64, heads: 4, seq_len: 64}
data: {tokenizer: byte, train: data/train, valid: data/valid}
train: {steps: 15, micro_batch: 2, global_batch: 4, seed: 7, threads: 1, grad_clip: 1.0}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 5}
checkpoint: {every: 10, keep: 5}
eval: {every: 10, batches: 1}
log: {every: 1}
YAML

compare() {
  $PY "$SRC/tests/e2e/compare_runs.py" "$1" "$2" --first "${3:-1}" --last 15 --val
}

# llama (kv_heads 2) covers every layout but all_to_all at cp 4, which its 2 key/value heads do not
# divide over; llama-mha (kv_heads 4) runs that one.
for family in gpt2 llama llama-mha; do
  fam=(--set model.family=${family%-mha})
  [[ $family == llama ]] && fam+=(--set model.kv_heads=2)
  [[ $family == llama-mha ]] && fam+=(--set model.kv_heads=4)
  run_cmd $family-cp1 mpi_run 180 1 "$LLMTRAIN" run r.yaml --set log.dir=$family-cp1 "${fam[@]}"
  expect_status 0
  # ranks cp tp pp zero sequence_parallel cp_comm
  cfgs=("2 2 1 1 0 false ring" "4 4 1 1 0 false ring" "4 2 2 1 0 true ring" "4 2 1 2 0 false ring"
    "4 2 1 1 1 false ring" "2 2 1 1 3 false ring" "2 2 1 1 0 false all_to_all")
  [[ $family == gpt2 ]] && cfgs+=("4 4 1 1 0 false all_to_all")
  [[ $family == llama-mha ]] && cfgs=("4 4 1 1 0 false all_to_all")
  for cfg in "${cfgs[@]}"; do
    set -- $cfg
    name=$family-cp$2-tp$3-pp$4-zero$5-$7
    run_cmd $name mpi_run 180 $1 "$LLMTRAIN" run r.yaml --set log.dir=$name "${fam[@]}" --set parallel.cp=$2 \
      --set parallel.tp=$3 --set parallel.pp=$4 --set parallel.zero=$5 --set parallel.sequence_parallel=$6 \
      --set parallel.cp_comm=$7
    expect_status 0
    expect_out "[rank 0] done: 15 steps"
    if [[ $4 == 1 ]]; then  # the pipeline's stages differ: tp.sh and pp.sh check those plans
      plan=$(grep -o 'memory per rank: .*' <<<"$out" | sed 's/memory per rank: //')
      measured=$(grep -o 'measured after the first step: .*' <<<"$out" | sed 's/.*first step: //')
      [[ -n $plan && $plan == "$measured" ]] && pass "$name: measured memory is the plan ($plan)" ||
        fail "$name: plan '$plan', measured '$measured'"
    fi
    out=$(compare $name $family-cp1 2>&1) && pass "$name matches cp 1: $out" || fail "$name differs from cp 1: $out"
  done
done

# A checkpoint written at cp 4 resumes at cp 1 and continues cp 4's trajectory.
mkdir -p resume1/ckpt
cp -r gpt2-cp4-tp1-pp1-zero0-ring/ckpt/step_00000010 resume1/ckpt/
echo step_00000010 >resume1/ckpt/latest
cp gpt2-cp4-tp1-pp1-zero0-ring/metrics.jsonl resume1/
run_cmd resume-cp1 mpi_run 180 1 "$LLMTRAIN" run r.yaml --set log.dir=resume1
expect_status 0
expect_out "at step 10"
out=$(compare resume1 gpt2-cp4-tp1-pp1-zero0-ring 11 2>&1) && pass "cp 4 checkpoint resumed at cp 1: $out" ||
  fail "cp 4 checkpoint resumed at cp 1 diverges: $out"

# And a cp 1 checkpoint resumes at cp 2 × dp 2 with ZeRO 1, on cp 1's trajectory.
mkdir -p resume2/ckpt
cp -r gpt2-cp1/ckpt/step_00000010 resume2/ckpt/
echo step_00000010 >resume2/ckpt/latest
cp gpt2-cp1/metrics.jsonl resume2/
run_cmd resume-cp2 mpi_run 180 4 "$LLMTRAIN" run r.yaml --set log.dir=resume2 --set parallel.cp=2 --set parallel.zero=1
expect_status 0
expect_out "at step 10"
out=$(compare resume2 gpt2-cp1 11 2>&1) && pass "cp 1 checkpoint resumed at cp 2 × dp 2, ZeRO 1: $out" ||
  fail "cp 1 checkpoint resumed at cp 2 × dp 2 diverges: $out"

# The manifest records the layout; generation runs at cp 1 from a cp 4 checkpoint.
run_cmd inspect-cp4 "$LLMTRAIN" ckpt inspect gpt2-cp4-tp1-pp1-zero0-ring/ckpt/step_00000015
expect_status 0
expect_out "tp 1 × cp 4 × pp 1"
run_cmd generate-cp4 "$LLMTRAIN" generate gpt2-cp4-tp1-pp1-zero0-ring --prompt "The " --temperature 0 --max-tokens 8
expect_status 0

# Ulysses needs cp to divide the (key/value) heads: refused before any rank starts, naming the key.
run_cmd all-to-all-heads "$LLMTRAIN" run r.yaml --nproc 4 --set parallel.cp=4 --set parallel.cp_comm=all_to_all \
  --set model.family=llama --set model.kv_heads=2
expect_status 2
expect_out "parallel.cp_comm"
expect_out "all_to_all gives each of cp 4 ranks heads / cp of a tp rank's 4 query and 2 key/value heads"

finish
